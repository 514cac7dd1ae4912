"""Micro-benchmark: the join kernel reading only the stored rows its batch reaches, against
reading every stored row (not a test).

The latency phase's shape (W2's join, ``s1.level = s2.id``): a bucket holding ``--stored``
left rows over 2,000 right rows, and a batch of ``--changes`` left inserts, as the Spark host
runs it per bucket (decode the stored state, process, encode). The other path is the same
kernel with the split off (``_splittable`` false for every side), alternately, medians of
``--repeats`` calls each. Both store the same bytes (checked).

Run:  .venv/bin/python tests/bench/bench_join_untouched.py [--stored 190000] [--changes 12500]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections import Counter

import pyarrow as pa

import tidemark.engine.kernels.join as join_kernel
from tidemark.engine import state_codec
from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change
from tidemark.engine.kernels.join import JoinKernel
from tidemark.engine.stage import BatchContext
from tidemark.engine.stages.join import Join

S1 = pa.schema([("id", pa.int64()), ("level", pa.int64())])
S2 = pa.schema([("id", pa.int64()), ("attr", pa.string())])
LEVELS = 2_000


def call(kernel: JoinKernel, stored: bytes, batch: list[pa.Table]) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    state = state_codec.decode_state(kernel.stage, stored)
    state, _ = kernel.process_batch([ChangeBatch.from_table(t) for t in batch], state, BatchContext(metrics=Counter()))
    out = state_codec.encode_state(kernel.stage, state)
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stored", type=int, default=190_000)
    ap.add_argument("--changes", type=int, default=12_500)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    rng = random.Random(1)
    stage = Join("inner", (1,), (0,), 2, 2, input_schemas=(S1, S2))
    kernel = JoinKernel(stage, (S1, S2))
    warm = [
        ChangeBatch.from_changes([Change("+I", (i, rng.randint(1, LEVELS)), (0, i)) for i in range(args.stored)], S1),
        ChangeBatch.from_changes([Change("+I", (lv, f"a{lv}"), (0, lv)) for lv in range(1, LEVELS + 1)], S2),
    ]
    state, _ = kernel.process_batch(warm, kernel.empty_state(), BatchContext(metrics=Counter()))
    stored = state_codec.encode_state(stage, state)
    inserts = [Change("+I", (args.stored + i, rng.randint(1, LEVELS)), (1, i)) for i in range(args.changes)]
    batch = [ChangeBatch.from_changes(inserts, S1).table(), ChangeBatch.from_changes([], S2).table()]
    split, whole = [], []
    for _ in range(args.repeats):
        t, a = call(kernel, stored, batch)
        split.append(t)
        original = join_kernel._splittable
        join_kernel._splittable = lambda schema: False
        try:
            t, b = call(kernel, stored, batch)
        finally:
            join_kernel._splittable = original
        whole.append(t)
        assert a == b, "the two paths stored different bytes"
    s, w = statistics.median(split), statistics.median(whole)
    print(f"{args.stored:,} stored left rows, {args.changes:,} inserts, medians of {args.repeats}: "
          f"every stored row {w * 1000:.1f} ms, only those reached {s * 1000:.1f} ms ({w / s:.2f}x)")


if __name__ == "__main__":
    main()
