"""Kafka helpers for the tests that run the real job: produce Debezium records, read an upsert
sink topic back as a table, and compute the expected table with the in-process ReplayHost."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from confluent_kafka import KafkaException, Producer

from tidemark.engine.pipeline import compile_sql
from tidemark.engine.replay import ReplayHost
from tidemark.formats.codecs import decoder_for

Records = list[tuple[dict, dict | None]]


def produce(broker: str, topic: str, records: Records) -> None:
    p = Producer({"bootstrap.servers": broker})
    for key, value in records:
        p.produce(topic, key=json.dumps(key).encode(),
                  value=None if value is None else json.dumps(value).encode())
        p.flush(10)  # in order, every record its own offset


def materialize(broker: str, topic: str) -> dict:
    """Read an upsert topic from the start to its end: key -> last value (tombstone deletes).
    Empty while the topic does not exist yet."""
    from tidemark.kafka.admin import KafkaAdminError
    from tidemark.kafka.read import read_topic

    try:
        records = read_topic(broker, topic, timeout_s=30)
    except (KafkaAdminError, TimeoutError, KafkaException):
        return {}
    table: dict = {}
    for m in records:  # partition by partition, each in offset order; a key lives in one partition
        key = json.loads(m.key)
        k = tuple(sorted(key.items())) if isinstance(key, dict) else key
        if m.value is None:
            table.pop(k, None)
        else:
            table[k] = json.loads(m.value)
    return table


def dbz(op: str, before: dict | None, after: dict | None, ts: int) -> tuple[dict, dict]:
    """One Debezium record keyed by ``id``."""
    row = after if after is not None else before
    assert row is not None
    return {"id": row["id"]}, {"before": before, "after": after, "op": op, "ts_ms": ts}


def replay_table(sql: str, batches: Sequence[Mapping[str, Records]]) -> dict:
    """The sink table the ReplayHost computes from the same records, one run_batch per
    phase, as ``materialize`` shows it (key items -> row as a dict)."""
    pipeline = compile_sql(sql)
    host = ReplayHost(pipeline)
    decoders = {name: decoder_for(t) for name, t in pipeline.sources.items()}
    offsets = {name: 0 for name in decoders}
    for batch in batches:
        changes = {}
        for table, records in batch.items():
            out = []
            for key, value in records:
                pos = (offsets[table],)
                offsets[table] += 1
                out += decoders[table].decode(json.dumps(key).encode(),
                                              None if value is None else json.dumps(value).encode(), pos)
            changes[table] = out
        host.run_batch(changes)
    sink = pipeline.sink
    names = sink.column_names
    pk_names = sink.primary_key
    return {tuple(sorted((n, row[names.index(n)]) for n in pk_names)): dict(zip(names, row))
            for row in host.table().values()}
