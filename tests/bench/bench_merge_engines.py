"""Merge engine sink stage: rows/s per engine and state bytes per primary key.

Drives the stage through the hosts' driver loop (group a batch by key, one ``process_key`` per key,
state in a dict) with a fixed pseudo-random workload, and reports the throughput of the
stage alone and the pickled size of one key's state (what Spark's state store would keep).

    .venv/bin/python tests/bench/bench_merge_engines.py [--rows 200000] [--keys 10000]
"""

from __future__ import annotations

import argparse
import pickle
import random
import statistics
import time

from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change
from tidemark.engine.driver import Bucket, PerKeyAdapter
from tidemark.engine.stage import BatchContext
from tidemark.engine.stages.merge_engine import build_merge_engine

COLUMNS = ["id", "ts", "price", "qty", "name", "flag"]

SCENARIOS: dict[str, tuple[dict[str, str], bool]] = {
    "deduplicate": ({"merge-engine": "deduplicate"}, False),
    "deduplicate + sequence.field": ({"merge-engine": "deduplicate", "sequence.field": "ts"}, False),
    "partial-update": ({"merge-engine": "partial-update"}, False),
    "partial-update + 2 sequence groups": ({
        "merge-engine": "partial-update",
        "fields.ts.sequence-group": "price,qty",
        "fields.qty.aggregate-function": "sum",
        "fields.flag.sequence-group": "name",
    }, False),
    "aggregation (sum, max, listagg, bool_or)": ({
        "merge-engine": "aggregation",
        "fields.ts.aggregate-function": "max",
        "fields.price.aggregate-function": "max",
        "fields.qty.aggregate-function": "sum",
        "fields.name.aggregate-function": "listagg",
        "fields.name.distinct": "true",
        "fields.flag.aggregate-function": "bool_or",
    }, False),
    "aggregation with retractions (sum, last_value)": ({
        "merge-engine": "aggregation",
        "fields.ts.aggregate-function": "last_value",
        "fields.price.aggregate-function": "sum",
        "fields.qty.aggregate-function": "sum",
        "fields.name.aggregate-function": "last_value",
        "fields.flag.aggregate-function": "last_non_null_value",
    }, True),
    "first-row": ({"merge-engine": "first-row"}, False),
    "partial-update, changelog-producer lookup": ({
        "merge-engine": "partial-update", "changelog-producer": "lookup"}, False),
}


def workload(rows: int, keys: int, batch_size: int, retracts: bool, seed: int = 1) -> list[list[Change]]:
    r = random.Random(seed)
    batches, batch = [], []
    for i in range(rows):
        k = r.randrange(keys)
        row = (k, r.randrange(1_000_000), r.choice([None, round(r.random() * 100, 2)]),
               r.choice([None, r.randrange(10)]), r.choice([None, "a", "b", "c"]),
               r.choice([None, True, False]))
        kind = "+I"
        if retracts and r.random() < 0.2:
            kind = "-D"
        batch.append(Change(kind, row, (i,)))
        if len(batch) == batch_size:
            batches.append(batch)
            batch = []
    if batch:
        batches.append(batch)
    return batches


def run(options: dict[str, str], retracts: bool, batches: list[list[Change]]) -> tuple[float, dict]:
    stage = build_merge_engine("bench", COLUMNS, (0,), options, retracts)
    adapter, bucket = PerKeyAdapter(stage), Bucket()
    start = time.perf_counter()
    for batch_id, batch in enumerate(batches):
        bucket, _ = adapter.process_batch([ChangeBatch(changes=batch)], bucket, BatchContext(batch_id=batch_id))
    return time.perf_counter() - start, bucket.states


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--batch", type=int, default=5_000)
    args = ap.parse_args()
    print(f"{args.rows} rows, {args.keys} keys, batches of {args.batch}")
    print("| scenario | rows/s | state bytes per PK (pickle, median) |")
    print("|---|---:|---:|")
    for name, (options, retracts) in SCENARIOS.items():
        batches = workload(args.rows, args.keys, args.batch, retracts)
        seconds, state = run(options, retracts, batches)
        sizes = [len(pickle.dumps(s)) for s in state.values()] or [0]
        print(f"| {name} | {args.rows / seconds:,.0f} | {statistics.median(sizes):.0f} |")


if __name__ == "__main__":
    main()
