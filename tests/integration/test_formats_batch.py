"""The Spark source's decode step on a real broker: JSON records decoded a batch at a time
give the changes and dead letters (reason included) the per-record decoder gives, with
bad records scattered among good ones in every micro-batch."""

from __future__ import annotations

import json
import random
import uuid

import pytest
from confluent_kafka import Producer

from tidemark.engine.catalog import Column, TableDef
from tidemark.engine.types import parse_type
from tidemark.formats import DecodeError, decoder_for
from tidemark.kafka.admin import ensure_topics
from tidemark.spark.source import SourceTable, decode_row, decode_stream, read_stream

pytestmark = pytest.mark.integration

COLUMNS = [("id", "BIGINT"), ("name", "STRING"), ("price", "DECIMAL(10, 2)"), ("ts", "TIMESTAMP(3)")]


def table(topic: str) -> TableDef:
    return TableDef("orders", [Column(n, parse_type(t)) for n, t in COLUMNS], ("id",), {"format": "debezium-json", "topic": topic})


def record(i: int, rng: random.Random) -> bytes | None:
    row = {"id": i, "name": f"n{i}", "price": f"{i}.{i % 100:02d}", "ts": 1_700_000_000_000 + i}
    choice = rng.randrange(12)
    if choice == 0:
        return b'{"op": "c", "after": {"id": "not a number"}}'
    if choice == 1:
        return b"{broken"
    if choice == 2:
        return None  # a Debezium tombstone: no change
    if choice == 3:
        return json.dumps({"op": "d", "before": None}).encode()
    if choice == 4:
        return json.dumps({"op": "u", "before": {**row, "price": "0.5"}, "after": {**row, "price": 12.345}}).encode()
    return json.dumps({"op": "c", "after": row, "source": {"db": "shop"}}).encode()


def test_spark_decode_step_equals_the_per_record_decoder(spark, kafka_bootstrap, checkpoint_dir):
    topic = f"batch-decode-{uuid.uuid4().hex[:8]}"
    ensure_topics(kafka_bootstrap, {topic: 2})
    rng = random.Random(13)
    values = [record(i, rng) for i in range(400)]
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i, v in enumerate(values):
        producer.produce(topic, value=v, partition=i % 2)
    producer.flush()

    collected: list = []
    decoded = decode_stream(read_stream(spark, topic, kafka_bootstrap, max_records_per_trigger=150), [SourceTable(table(topic), 0)])
    query = (decoded.writeStream.foreachBatch(lambda df, _: collected.extend(df.collect()))
             .option("checkpointLocation", checkpoint_dir).trigger(availableNow=True).start())
    query.awaitTermination()

    decoder = decoder_for(table(topic))
    expected_changes, expected_dead = [], []
    for i, v in enumerate(values):
        partition, offset = i % 2, i // 2
        try:
            for c in decoder.decode(None, v):
                expected_changes.append((partition, offset, c.kind, c.row))
        except DecodeError as err:
            expected_dead.append((partition, offset, err.kind, f"orders @ {topic}/{partition}/{offset}: {err.reason}"))
    changes = [(r.partition, r.offset, r.kind, decode_row(r.row)) for r in collected if r.error_kind is None]
    dead = [(r.partition, r.offset, r.error_kind, r.reason) for r in collected if r.error_kind is not None]
    assert len(expected_dead) > 20 and len(expected_changes) > 300
    assert sorted(dead) == sorted(expected_dead)
    # a -U/+U pair of one record keeps its order
    assert sorted(changes, key=lambda c: c[:2]) == sorted(expected_changes, key=lambda c: c[:2])
