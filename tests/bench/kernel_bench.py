"""What the kernel-vs-per-key micro-benchmarks (``bench_*_kernel.py``) share: their options,
and timing one stored bucket's call on two paths alternately."""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from tidemark.engine import state_codec
from tidemark.engine.batch import ChangeBatch
from tidemark.engine.stage import BatchContext


def parse_args(doc: str) -> argparse.Namespace:
    """``--changes`` in the measured batch, ``--repeats`` per path (medians), ``--seed``."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--changes", type=int, default=60_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=7)
    return ap.parse_args()


def timed_bucket_call(runner: Any, stage: Any, stored: bytes | None, batch: ChangeBatch) -> float:
    """Seconds for what a host does per bucket: decode the stored state, process, encode."""
    t0 = time.perf_counter()
    state = state_codec.decode_state(stage, stored)
    state, _ = runner.process_batch([batch], state, BatchContext(now_ms=1, metrics=Counter()))
    state_codec.encode_state(stage, state)
    return time.perf_counter() - t0


def alternating_medians(
    first: Any, second: Any, stage: Any, stored: bytes | None, batch: Callable[[], ChangeBatch], repeats: int
) -> tuple[float, float]:
    """Median seconds of ``first`` and ``second`` on the same bucket, run in turns so that the
    machine's load falls on both alike."""
    a: list[float] = []
    b: list[float] = []
    for _ in range(repeats):
        a.append(timed_bucket_call(first, stage, stored, batch()))
        b.append(timed_bucket_call(second, stage, stored, batch()))
    return statistics.median(a), statistics.median(b)


def per_key_and_kernel(stage: Any, kernel: Any, schema: Any, warm: list, changes: list, repeats: int) -> tuple[float, float]:
    """Median seconds of the per-key path and of ``kernel`` on one stored bucket: the bucket
    holds what ``warm`` leaves (run per key), the batch is ``changes`` as Arrow columns."""
    from tidemark.engine.driver import PerKeyAdapter

    per_key = PerKeyAdapter(stage)
    state, _ = per_key.process_batch([ChangeBatch.from_changes(warm, schema)], state_codec.empty_state(stage), BatchContext(metrics=Counter()))
    stored = state_codec.encode_state(stage, state)
    table = ChangeBatch.from_changes(changes, schema).table()
    return alternating_medians(per_key, kernel, stage, stored, lambda: ChangeBatch.from_table(table), repeats)
