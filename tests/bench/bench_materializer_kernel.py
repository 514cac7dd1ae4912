"""Micro-benchmark: the materializer batch kernel against the per-key path (not a test).

One 60,000-change batch of the W2 shape (sink PK ``id``, upsert key ``k``, which differs from
the PK for a tenth of the PKs: per PK an insert, then updates as ``-U``/``+U`` pairs),
processed against a bucket already holding state for half of the PKs, by
``MaterializerKernel`` and by ``PerKeyAdapter`` around the same stage, alternately, medians of
``--repeats`` runs each. Two input forms: a batch built from ``Change`` tuples (what the replay
host passes today) and one built from Arrow columns (what a columnar source passes).

Run:  .venv/bin/python tests/bench/bench_materializer_kernel.py [--changes 60000] [--repeats 5]
"""

from __future__ import annotations

import copy
import random
import statistics
import time
from collections import Counter

from kernel_bench import parse_args

from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change
from tidemark.engine.driver import Bucket, PerKeyAdapter
from tidemark.engine.kernels.materializer import MaterializerKernel
from tidemark.engine.stage import BatchContext
from tidemark.engine.stages.materializer import SinkMaterializer


def workload(n_changes: int, seed: int) -> tuple[list[Change], list[Change]]:
    """(warm-up changes that fill the state, the measured batch)."""
    rng = random.Random(seed)
    n_keys = n_changes // 6
    warm = [Change("+I", (pk, pk, 0), (0, pk)) for pk in range(0, n_keys, 2)]
    current = {pk: (pk, pk, 0) for pk in range(0, n_keys, 2)}
    batch: list[Change] = []
    pos = 0
    while len(batch) < n_changes:
        pk = rng.randrange(n_keys)
        pos += 1
        row = current.get(pk)
        if row is None:
            upstream = pk if rng.random() < 0.9 else pk + n_keys
            current[pk] = new = (pk, upstream, pos)
            batch.append(Change("+I", new, (1, pos)))
        else:
            current[pk] = new = (pk, row[1], pos)
            batch += [Change("-U", row, (1, pos)), Change("+U", new, (1, pos))]
    return warm, batch


def timed(runner, warm_bucket: Bucket, batch: ChangeBatch) -> float:
    bucket = copy.deepcopy(warm_bucket)
    ctx = BatchContext(now_ms=1, metrics=Counter())
    t0 = time.perf_counter()
    runner.process_batch([batch], bucket, ctx)
    return time.perf_counter() - t0


def main() -> None:
    args = parse_args(__doc__)
    warm, changes = workload(args.changes, args.seed)
    table = ChangeBatch.from_changes(changes).table()
    print(f"{len(changes)} changes, medians of {args.repeats}")
    print(f"{'strategy':<12} {'input':<8} {'per-key s':>10} {'kernel s':>10} {'speedup':>8}")
    for strategy in ("DEDUPLICATE", "NOTHING", "ERROR"):
        stage = SinkMaterializer("t", (0,), ("id",), (1,), strategy)
        kernel, per_key = MaterializerKernel(stage), PerKeyAdapter(stage)
        warm_bucket, _ = per_key.process_batch([ChangeBatch(changes=warm)], Bucket(), BatchContext(metrics=Counter()))
        forms = (("changes", lambda: ChangeBatch(changes=changes)), ("arrow", lambda: ChangeBatch.from_table(table)))
        for form, make in forms:
            t_kernel, t_per_key = [], []
            for _ in range(args.repeats):
                t_per_key.append(timed(per_key, warm_bucket, make()))
                t_kernel.append(timed(kernel, warm_bucket, make()))
            pk_s, k_s = statistics.median(t_per_key), statistics.median(t_kernel)
            print(f"{strategy:<12} {form:<8} {pk_s:>10.3f} {k_s:>10.3f} {pk_s / k_s:>7.2f}x")


if __name__ == "__main__":
    main()
