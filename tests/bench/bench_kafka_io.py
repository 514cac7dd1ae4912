"""Throughput of Tidemark's Kafka I/O on Spark (a script, not a test).

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python tests/bench/bench_kafka_io.py [--records N]

Measures, against the embedded broker (or $KAFKA_BOOTSTRAP_SERVERS):
1. produce: confluent-kafka producer, 100-byte values (the load generator's rate);
2. source: the tidemark-kafka Spark source reading the backlog in rate-limited batches
   (AvailableNow, count per batch) -> records/s;
3. source + decode: the same with debezium-json decoding into changes (``decode_stream``);
4. upsert sink and changelog sink: writing N changes from a DataFrame -> records/s.
Times include Spark's per-batch overhead; the session start-up is excluded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from confluent_kafka import Producer  # noqa: E402

from tidemark.engine.catalog import Column, TableDef  # noqa: E402
from tidemark.engine.changelog import Change  # noqa: E402
from tidemark.engine.types import parse_type  # noqa: E402
from tidemark.kafka.admin import ensure_topics  # noqa: E402
from tidemark.kafka.broker import configured_bootstrap, embedded_broker  # noqa: E402


def table(name: str, fmt: str, topic: str) -> TableDef:
    cols = [("id", "BIGINT"), ("level", "BIGINT"), ("attr", "STRING")]
    return TableDef(name, [Column(n, parse_type(t)) for n, t in cols], ("id",), {"format": fmt, "topic": topic})


def bench(bootstrap: str, n: int, per_trigger: int) -> dict[str, float]:
    from tidemark.spark.keyed import BLOB_SCHEMA, encode_changes
    from tidemark.spark.session import build_session
    from tidemark.spark.sink import ChangelogSink, UpsertSink
    from tidemark.spark.source import SourceTable, decode_stream, read_stream

    results: dict[str, float] = {}
    src = f"bench-src-{int(time.time())}"
    ensure_topics(bootstrap, {src: 4})
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10000})
    t = time.perf_counter()
    for i in range(n):
        value = json.dumps({"op": "c", "after": {"id": i, "level": i % 100, "attr": "x" * 40}, "ts_ms": i}).encode()
        while True:
            try:
                p.produce(src, key=str(i).encode(), value=value, partition=i % 4)
                break
            except BufferError:
                p.poll(0.05)
    p.flush()
    results["produce records/s"] = n / (time.perf_counter() - t)

    spark = build_session(app_name="bench-kafka-io", shuffle_partitions=4)
    counted = []
    with tempfile.TemporaryDirectory() as tmp:
        df = read_stream(spark, src, bootstrap, max_records_per_trigger=per_trigger)
        t = time.perf_counter()
        q = df.writeStream.foreachBatch(lambda d, b: counted.append(d.count())).option(
            "checkpointLocation", f"{tmp}/raw").trigger(availableNow=True).start()
        q.awaitTermination()
        results["source records/s"] = sum(counted) / (time.perf_counter() - t)
        results["source batches"] = len(counted)

        counted.clear()
        decoded = decode_stream(read_stream(spark, src, bootstrap, max_records_per_trigger=per_trigger),
                                [SourceTable(table("s", "debezium-json", src), 0)])
        t = time.perf_counter()
        q = decoded.writeStream.foreachBatch(lambda d, b: counted.append(d.where("error_kind is null").count())).option(
            "checkpointLocation", f"{tmp}/decoded").trigger(availableNow=True).start()
        q.awaitTermination()
        results["source+decode records/s"] = sum(counted) / (time.perf_counter() - t)

    changes = [Change("+I", (i, i % 100, "x" * 40), (0, 0, i % 4, i)) for i in range(n)]
    blobs = [(0, 0, encode_changes(changes[i:i + 10_000])) for i in range(0, n, 10_000)]
    frame = spark.createDataFrame(blobs, BLOB_SCHEMA).cache()
    frame.count()
    up, cl = f"bench-upsert-{int(time.time())}", f"bench-changelog-{int(time.time())}"
    ensure_topics(bootstrap, {up: 4, cl: 4})
    t = time.perf_counter()
    UpsertSink(bootstrap, table("u", "upsert-json", up)).write_batch(frame, 0)
    results["upsert sink records/s"] = n / (time.perf_counter() - t)
    t = time.perf_counter()
    ChangelogSink(bootstrap, table("c", "changelog-json", cl), cl).write_batch(frame, 0)
    results["changelog sink records/s"] = n / (time.perf_counter() - t)
    spark.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--per-trigger", type=int, default=50_000)
    args = parser.parse_args()
    bootstrap = configured_bootstrap()
    if bootstrap:
        results = bench(bootstrap, args.records, args.per_trigger)
    else:
        with embedded_broker() as bootstrap:
            results = bench(bootstrap, args.records, args.per_trigger)
    print(f"records={args.records} per_trigger={args.per_trigger} cpus={os.cpu_count()} load={os.getloadavg()[0]:.1f}")
    for name, value in results.items():
        print(f"{name:28s} {value:12,.0f}")


if __name__ == "__main__":
    main()
