"""Micro-benchmark: the group aggregate kernel against the per-key path (not a test).

One 60,000-change batch of W1's aggregate (``SUM(quantity) GROUP BY product_id`` over
append-only orders: 5,000 products, quantities 1-5), processed against a bucket already
holding state for half of the products, by ``AggregateKernel`` and by ``PerKeyAdapter``
around the same stage, alternately, medians of ``--repeats`` runs each. Two input forms: a
batch built from ``Change`` tuples (what the replay host passes today) and one built from
Arrow columns (what a columnar source passes).

``--shape cdc``: ``MIN(price), MAX(price), COUNT(*) GROUP BY product_id`` over a changelog
instead: four rows per product stored, the batch updates random stored rows (``-U``/``+U``
of a new price at one position), a tenth of its records deletes or inserts, so most groups
retract values of their multisets, extremes included.

``--shape last-value``: ``LAST_VALUE(price), COUNT(*) GROUP BY product_id`` over the same
changelog: an update retracts a row's price, and where that was the latest one the result
rolls back to the price before it.

Run:  .venv/bin/python tests/bench/bench_aggregate_kernel.py [--changes 60000] [--repeats 5] [--shape cdc|last-value]
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections import Counter

from bench_materializer_kernel import timed  # sibling script: run from this directory's path
from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change
from tidemark.engine.driver import Bucket, PerKeyAdapter
from tidemark.engine.kernels.aggregate import AggregateKernel
from tidemark.engine.stage import BatchContext
from tidemark.engine.stages.aggregate import AggCall, GroupAggregate
from tidemark.engine.types import make_type

PRODUCTS = 5_000


def workload(n_changes: int, seed: int) -> tuple[list[Change], list[Change]]:
    """(warm-up orders for half of the products, the measured batch of orders)."""
    rng = random.Random(seed)
    warm = [Change("+I", (pid, rng.randint(1, 5)), (0, pid)) for pid in range(0, PRODUCTS, 2)]
    batch = [Change("+I", (rng.randrange(PRODUCTS), rng.randint(1, 5)), (1, i)) for i in range(n_changes)]
    return warm, batch


def cdc_workload(n_changes: int, seed: int) -> tuple[list[Change], list[Change]]:
    """(four rows per product, the measured batch: updates, deletes and inserts of rows)."""
    rng = random.Random(seed)
    active = [(pid, k, rng.randint(1, 1_000)) for pid in range(PRODUCTS) for k in range(4)]
    warm = [Change("+I", row, (0, i)) for i, row in enumerate(active)]
    batch: list[Change] = []
    pos = 0
    while len(batch) < n_changes:
        pos += 1
        draw = rng.random()
        if draw < 0.05 and active:
            batch.append(Change("-D", active.pop(rng.randrange(len(active))), (1, pos)))
        elif draw < 0.1:
            row = (rng.randrange(PRODUCTS), 4 + pos, rng.randint(1, 1_000))
            active.append(row)
            batch.append(Change("+I", row, (1, pos)))
        else:
            at = rng.randrange(len(active))
            old = active[at]
            new = active[at] = (old[0], old[1], rng.randint(1, 1_000))
            batch += [Change("-U", old, (1, pos)), Change("+U", new, (1, pos))]
    rng.shuffle(batch)
    return warm, batch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, default in (("--changes", 60_000), ("--repeats", 5), ("--seed", 7)):
        ap.add_argument(flag, type=int, default=default)
    ap.add_argument("--shape", choices=("w1", "cdc", "last-value"), default="w1")
    args = ap.parse_args()
    if args.shape in ("cdc", "last-value"):
        warm, changes = cdc_workload(args.changes, args.seed)
        types = [make_type("BIGINT")] * 3
        if args.shape == "cdc":
            aggs = [AggCall("MIN", 2), AggCall("MAX", 2), AggCall("COUNT_STAR")]
        else:
            aggs = [AggCall("LAST_VALUE", 2), AggCall("COUNT_STAR")]
        title = f"{'/'.join(a.func for a in aggs)} over a changelog"
        stage = GroupAggregate((0,), aggs, input_types=types)
    else:
        warm, changes = workload(args.changes, args.seed)
        stage = GroupAggregate((0,), [AggCall("SUM", 1)], input_types=[make_type("BIGINT"), make_type("BIGINT")])
        title = "W1 aggregate"
    kernel, per_key = AggregateKernel(stage), PerKeyAdapter(stage)
    warm_bucket, _ = per_key.process_batch([ChangeBatch(changes=warm)], Bucket(), BatchContext(metrics=Counter()))
    table = ChangeBatch.from_changes(changes, stage.input_schema).table()
    print(f"{title}: {len(changes)} changes over {PRODUCTS} products, medians of {args.repeats}")
    print(f"{'input':<8} {'per-key s':>10} {'kernel s':>10} {'speedup':>8}")
    forms = (("changes", lambda: ChangeBatch(changes=changes)), ("arrow", lambda: ChangeBatch.from_table(table)))
    for form, make in forms:
        runs = [(timed(per_key, warm_bucket, make()), timed(kernel, warm_bucket, make())) for _ in range(args.repeats)]
        pk_s, k_s = (statistics.median(r[side] for r in runs) for side in (0, 1))
        print(f"{form:<8} {pk_s:>10.3f} {k_s:>10.3f} {pk_s / k_s:>7.2f}x")


if __name__ == "__main__":
    main()
