"""Micro-benchmark of the sink materializer on one PK with a long history (not a test).

Why: Flink's list-based SinkUpsertMaterializer scans its history list on every retraction,
so one hot sink PK with many active upsert keys drops to a few rows per second. Tidemark's
DEDUPLICATE state must cost O(1) per operation. This adds N rows with distinct upsert keys
to ONE sink PK (one batch per change, as the worst case for per-batch overhead), then
retracts them all in random order, timing every ``process_key`` call, and reports the median
(and p99) nanoseconds per add and per retraction for N = 10k, 100k, 1M. Flat medians across
N are the claim. For contrast, ``--baseline`` also times a list-scan materializer like
Flink's SinkUpsertMaterializer (find the upsert key by scanning the history list) on the
last 1,000 adds and 1,000 random retractions at each N.

NOTHING and ERROR keep only the current row, so their cost cannot depend on history; they
are measured too, to show it: NOTHING gets the same N adds (all but the first dropped as
conflicts) and N retractions; ERROR, which would fail on the second active row, gets N
add/retract alternations of distinct upsert keys.

Run:  .venv/bin/python tests/bench/bench_materializer.py [--sizes 10000,100000,1000000]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from collections import Counter

from tidemark.engine.changelog import Change
from tidemark.engine.stage import BatchContext
from tidemark.engine.stages.materializer import SinkMaterializer

PK = ("hot",)


def _time_calls(stage: SinkMaterializer, changes, state, ctx) -> tuple[object, list[int]]:
    clock = time.perf_counter_ns
    process = stage.process_key
    times = []
    for ch in changes:
        batch = [[ch]]
        t0 = clock()
        state, _ = process(PK, batch, state, ctx)
        times.append(clock() - t0)
    return state, times


def run(strategy: str, n: int, upsert_key: bool, seed: int) -> dict:
    stage = SinkMaterializer("t", (0,), ("k",), (1,) if upsert_key else None, strategy)
    ctx = BatchContext(metrics=Counter())
    rng = random.Random(seed)
    rows = [("hot", i, f"v{i}") for i in range(n)]
    if strategy == "ERROR":
        ops = []
        for i, row in enumerate(rows):
            ops += [Change("+I", row, (2 * i,)), Change("-D", row, (2 * i + 1,))]
        state, times = _time_calls(stage, ops, None, ctx)
        return {"add": times[0::2], "retract": times[1::2], "metrics": ctx.metrics}
    adds = (Change("+I", row, (i,)) for i, row in enumerate(rows))
    state, add_times = _time_calls(stage, adds, None, ctx)
    order = list(range(n))
    rng.shuffle(order)
    rets = (Change("-D", rows[i], (n + j,)) for j, i in enumerate(order))
    state, ret_times = _time_calls(stage, rets, state, ctx)
    assert state is None, "every row was retracted: no state may remain"
    return {"add": add_times, "retract": ret_times, "metrics": ctx.metrics}


def list_baseline(n: int, seed: int, sample: int = 1000) -> dict:
    """Flink-SUM-style state: a list of rows, ``findFirst`` by upsert key on every change."""
    clock = time.perf_counter_ns
    rows = [("hot", i, f"v{i}") for i in range(n)]
    history: list[tuple] = []

    def find(key):
        for idx, r in enumerate(history):
            if r[1] == key:
                return idx
        return -1

    history.extend(rows[: n - sample])  # untimed prefix: skip its quadratic build-up
    add_times = []
    for row in rows[n - sample :]:
        t0 = clock()
        idx = find(row[1])
        if idx < 0:
            history.append(row)
        else:
            history[idx] = row
        add_times.append(clock() - t0)
    rng = random.Random(seed)
    ret_times = []
    for i in rng.sample(range(n), min(sample, n)):
        t0 = clock()
        idx = find(i)
        was_last = idx == len(history) - 1
        del history[idx]
        _ = history[-1] if was_last and history else None
        ret_times.append(clock() - t0)
    return {"add": add_times, "retract": ret_times}


def pct(xs: list[int], q: float) -> int:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10000,100000,1000000", help="history lengths (comma-separated)")
    ap.add_argument("--strategies", default="DEDUPLICATE,NOTHING,ERROR")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--baseline", action="store_true", help="also time a Flink-style list scan")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print("| strategy | identity | history N | add median ns | add p99 ns | retract median ns | retract p99 ns |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for strategy in args.strategies.split(","):
        for upsert_key in (True, False):
            for n in sizes:
                gc.collect()
                r = run(strategy, n, upsert_key, args.seed)
                ident = "upsert key" if upsert_key else "full row"
                print(
                    f"| {strategy} | {ident} | {n:,} | {statistics.median(r['add']):,.0f} | "
                    f"{pct(r['add'], 0.99):,} | {statistics.median(r['retract']):,.0f} | "
                    f"{pct(r['retract'], 0.99):,} |",
                    flush=True,
                )
    if args.baseline:
        for n in [n for n in sizes if n <= 100_000]:  # 1M would take minutes per op batch
            r = list_baseline(n, args.seed)
            print(
                f"| list scan (Flink SUM style, 1,000 sampled ops) | upsert key | {n:,} | "
                f"{statistics.median(r['add']):,.0f} | {pct(r['add'], 0.99):,} | "
                f"{statistics.median(r['retract']):,.0f} | {pct(r['retract'], 0.99):,} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
