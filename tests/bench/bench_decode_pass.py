"""Milliseconds the decode pass spends decoding one raw batch, as the Kafka source hands it
over (an Arrow record batch of ``tidemark.spark.source.SCHEMA``), into a columnar
``ChangeBatch`` (``tidemark.spark.source.decode_columnar``), on W1's and W2's record shapes
(a script, not a test).

    .venv/bin/python tests/bench/bench_decode_pass.py [--records 44000] [--repeats 9]

Medians of ``--repeats`` calls after one warm-up call; docs/benchmarks.md, "JSON decode on
Arrow columns", has the figures.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable

import pyarrow as pa

from tidemark.engine.catalog import Column, TableDef
from tidemark.engine.types import parse_type
from tidemark.spark.source import SourceTable, decode_columnar

SHAPES: dict[str, tuple[list[tuple[str, str]], tuple[str, ...], str, Callable[[random.Random, int], dict]]] = {
    "W1 orders (json)": ([("product_id", "BIGINT"), ("quantity", "BIGINT")], (), "json",
                         lambda rng, i: {"product_id": rng.randint(1, 20_000), "quantity": rng.randint(1, 5)}),
    "W2 s1 (debezium-json updates)": (
        [("id", "BIGINT"), ("level", "BIGINT"), ("attr", "STRING")], ("id",), "debezium-json",
        lambda rng, i: {"before": {"id": i, "level": rng.randint(1, 4_000), "attr": "a1"},
                        "after": {"id": i, "level": rng.randint(1, 4_000), "attr": f"a{i}"}, "op": "u", "ts_ms": 1}),
}


def raw_batch(topic: str, values: list[bytes]) -> pa.RecordBatch:
    n = len(values)
    return pa.RecordBatch.from_arrays(
        [pa.array([topic] * n), pa.array([0] * n, pa.int32()), pa.array(range(n), pa.int64()),
         pa.array([1_795_000_000_000_000] * n, pa.timestamp("us", tz="UTC")), pa.array([None] * n, pa.binary()),
         pa.array(values, pa.binary())],
        names=["topic", "partition", "offset", "timestamp", "key", "value"],
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=44_000)
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    rng = random.Random(1)
    for name, (columns, pk, fmt, make) in SHAPES.items():
        table = TableDef("t", [Column(c, parse_type(t)) for c, t in columns], pk, {"format": fmt, "topic": "t"})
        src = SourceTable(table, 0)
        batch = raw_batch("t", [json.dumps(make(rng, i)).encode() for i in range(args.records)])
        decode_columnar(batch, src, 1, {})
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            changes, _ = decode_columnar(batch, src, 1, {})
            times.append(time.perf_counter() - start)
        print(f"{name}: {args.records:,} records -> {len(changes):,} changes, "
              f"{statistics.median(times) * 1000:.1f} ms (median of {args.repeats})")


if __name__ == "__main__":
    main()
