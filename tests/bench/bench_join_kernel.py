"""Micro-benchmark: the join batch kernel against the per-key path (not a test).

One batch of about 60,000 changes of W1's join (``SUM(quantity) ... GROUP BY product_id``
joined to ``products ON o.product_id = p.id``, inner): the aggregate's output on the left
(per product one ``+I`` of its first sum, or a ``-U``/``+U`` pair when the sum changes; the
aggregate emits one net change per product and batch) and product inserts on the right,
processed against a bucket already holding half of the products and a quarter of the sums,
by ``JoinKernel`` and by ``PerKeyAdapter`` around the same stage, alternately, medians of
``--repeats`` runs each. Two input forms: a batch built from ``Change`` tuples (what the replay
host passes today) and one built from Arrow columns (what a columnar host passes).

Run:  .venv/bin/python tests/bench/bench_join_kernel.py [--changes 60000] [--repeats 5]
"""

from __future__ import annotations

import copy
import random
import statistics
import time
from collections import Counter

import pyarrow as pa

from kernel_bench import parse_args

from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change
from tidemark.engine.driver import Bucket, PerKeyAdapter
from tidemark.engine.kernels.join import JoinKernel
from tidemark.engine.stage import BatchContext
from tidemark.engine.stages.join import Join

SUMS = pa.schema([("product_id", pa.int64()), ("quantity", pa.int64())])
PRODUCTS = pa.schema([("id", pa.int64()), ("name", pa.string())])


def workload(n_changes: int, seed: int) -> tuple[tuple[list, list], tuple[list, list]]:
    """((warm left, warm right), (batch left, batch right)): ``n_changes`` in the batch."""
    rng = random.Random(seed)
    n_products = n_changes * 4 // 7
    warm_sums = {p: rng.randint(1, 9) for p in range(n_products // 4)}
    warm = (
        [Change("+I", (p, q), (0, p)) for p, q in warm_sums.items()],
        [Change("+I", (p, f"product-{p // 4:06d}"), (0, p)) for p in range(n_products // 2)],
    )
    left: list[Change] = []
    for p in range(n_products):
        pos = (1, n_products + p)
        new = (p, rng.randint(1, 20))
        if p in warm_sums:
            left += [Change("-U", (p, warm_sums[p]), pos), Change("+U", new, pos)]
        else:
            left.append(Change("+I", new, pos))
    right = [Change("+I", (p, f"product-{p // 4:06d}"), (1, p)) for p in range(n_products // 2, n_products)]
    return warm, (left, right)


def timed(runner, state, batches: list[ChangeBatch]) -> tuple[float, int]:
    ctx = BatchContext(metrics=Counter())
    t0 = time.perf_counter()
    _, out = runner.process_batch(batches, state, ctx)
    elapsed = time.perf_counter() - t0
    return elapsed, len(out)


def main() -> None:
    args = parse_args(__doc__)
    (warm_l, warm_r), (left, right) = workload(args.changes, args.seed)
    stage = Join("inner", (0,), (0,), 2, 2, input_schemas=(SUMS, PRODUCTS))
    kernel, per_key = JoinKernel(stage, (SUMS, PRODUCTS)), PerKeyAdapter(stage)
    warm = [ChangeBatch(changes=warm_l), ChangeBatch(changes=warm_r)]
    warm_bucket, _ = per_key.process_batch(warm, Bucket(), BatchContext(metrics=Counter()))
    warm_state, _ = kernel.process_batch(warm, kernel.empty_state(), BatchContext(metrics=Counter()))
    tables = [ChangeBatch.from_changes(left, SUMS).table(), ChangeBatch.from_changes(right, PRODUCTS).table()]
    forms = (
        ("changes", lambda: [ChangeBatch(changes=left), ChangeBatch(changes=right)]),
        ("arrow", lambda: [ChangeBatch.from_table(t) for t in tables]),
    )
    print(f"{len(left) + len(right)} changes ({len(left)} left, {len(right)} right), medians of {args.repeats}")
    print(f"{'input':<8} {'per-key s':>10} {'kernel s':>10} {'speedup':>8} {'out':>7}")
    for form, make in forms:
        t_kernel, t_per_key = [], []
        for _ in range(args.repeats):
            t, n_per_key = timed(per_key, copy.deepcopy(warm_bucket), make())
            t_per_key.append(t)
            t, n_kernel = timed(kernel, warm_state, make())  # the kernel never mutates a state it reads
            t_kernel.append(t)
            assert n_kernel == n_per_key, (n_kernel, n_per_key)
        pk_s, k_s = statistics.median(t_per_key), statistics.median(t_kernel)
        print(f"{form:<8} {pk_s:>10.3f} {k_s:>10.3f} {pk_s / k_s:>7.2f}x {n_kernel:>7}")


if __name__ == "__main__":
    main()
