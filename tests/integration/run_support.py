"""Helpers for the ``tidemark run`` tests: give a pipeline's topics unique names, turn
changelog records into the bytes of a source format, produce them (per key partition,
optionally one transaction per record), read the sink topic back as a table, and replay
exactly the batches the Spark job ran through the in-process ``ReplayHost``.

The replay reference is built from what the job itself reports: each ``BatchReport``
carries the source offset range of its micro-batch, so the reference host gets the same
records in the same batches with the same source positions ``(batch id, source index,
partition, offset)``. Any difference in the sink table is then the Spark hosting's fault.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from tidemark.engine.catalog import TableDef
from tidemark.engine.changelog import Change
from tidemark.engine.pipeline import Pipeline
from tidemark.engine.replay import ReplayHost, apply_to_table
from tidemark.formats import decoder_for
from tidemark.kafka.admin import ensure_topics
from tidemark.kafka.read import Record, read_topic
from tidemark.kafka.transactional import BATCH_HEADER, read_exactly_once
from tidemark.spark.job import run_pipeline
from tidemark.spark.progress import BatchReport
from tidemark.spark.query import decode_batch, source_tables

_TOPIC = re.compile(r"'topic'\s*=\s*'([^']+)'")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example_sql(file: str, topics: Mapping[str, str]) -> str:
    """A pipeline of ``examples/`` with its ``'topic' = 'x'`` options renamed by ``topics``
    (x -> new name; others kept): tests run the documented SQL, not a copy of it."""
    sql = (EXAMPLES / file).read_text(encoding="utf-8")
    return _TOPIC.sub(lambda m: f"'topic' = '{topics.get(m.group(1), m.group(1))}'", sql)


def unique_topics(sql: str, tag: str = "") -> tuple[str, dict[str, str]]:
    """Rewrite every ``'topic' = 'x'`` to a name unique to this call; returns the new SQL
    and old -> new names (tests share one broker, never a topic)."""
    suffix = (tag + "-" if tag else "") + uuid.uuid4().hex[:8]
    names: dict[str, str] = {}

    def sub(m: re.Match) -> str:
        names.setdefault(m.group(1), f"{m.group(1)}-{suffix}")
        return f"'topic' = '{names[m.group(1)]}'"

    return _TOPIC.sub(sub, sql), names


def topic_of(table: TableDef) -> str:
    return table.options.get("topic", table.name)


# ---------------------------------------------------------------------------- source records


def _pk_json(table: TableDef, row: dict) -> bytes | None:
    if not table.primary_key:
        return None
    return json.dumps({k: row[k] for k in table.primary_key}).encode()


def encode_source(table: TableDef, records: Sequence[dict]) -> list[tuple[bytes | None, bytes | None]]:
    """Changelog records ``{"kind", "row"}`` (in source order) as Kafka (key, value) in the
    table's format. Debezium: a ``-U`` directly followed by the ``+U`` of the same key is
    one ``u`` message, as Debezium writes an update."""
    fmt = table.format
    out: list[tuple[bytes | None, bytes | None]] = []
    i = 0
    while i < len(records):
        kind, row = records[i]["kind"], records[i]["row"]
        key = _pk_json(table, row)
        if fmt == "debezium-json":
            if kind == "-U":
                nxt = records[i + 1]
                assert nxt["kind"] == "+U", f"a -U must be followed by its +U: {records[i:i + 2]}"
                value = {"before": row, "after": nxt["row"], "op": "u"}
                i += 1
            elif kind == "-D":
                value = {"before": row, "after": None, "op": "d"}
            else:
                value = {"before": None, "after": row, "op": "c"}
            out.append((key, json.dumps(value).encode()))
        elif fmt == "upsert-json":
            if kind == "-U":
                pass  # an upsert topic carries only the new row
            elif kind == "-D":
                out.append((key, None))
            else:
                out.append((key, json.dumps(row).encode()))
        elif fmt == "changelog-json":
            out.append((key, json.dumps({"op": kind, **row}).encode()))
        elif fmt == "json":
            assert kind == "+I", f"append-only table {table.name} got {kind}"
            out.append((None, json.dumps(row).encode()))
        else:
            raise AssertionError(f"no test encoder for format {fmt}")
        i += 1
    return out


def produce(
    bootstrap: str,
    topic: str,
    records: Iterable[tuple[bytes | None, bytes | None]],
    *,
    partitions: int = 1,
    partition_of: Any = None,
    transactional: bool = False,
) -> None:
    """Produce (key, value) records in order. ``partition_of(key) -> int`` or a stable hash
    of the key picks the partition (one key stays in one partition, in order); with
    ``transactional`` each record is its own committed transaction."""
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "enable.idempotence": True, "log_level": 3}
    if transactional:
        conf["transactional.id"] = f"test-{uuid.uuid4().hex[:10]}"
    p = Producer(conf)
    if transactional:
        p.init_transactions(30)
    for key, value in records:
        if partition_of is not None:
            part = partition_of(key)
        else:
            part = (sum(key) if key else 0) % partitions
        if transactional:
            p.begin_transaction()
        p.produce(topic, key=key, value=value, partition=part)
        if transactional:
            p.commit_transaction(30)
    assert p.flush(30) == 0


# ---------------------------------------------------------------------------- sink topic


def sink_records(bootstrap: str, pipeline: Pipeline, writer_id: str | None = None,
                 timeout_s: float = 60.0, sink: TableDef | None = None) -> list[Record]:
    """The sink topic's records as a consumer sees them (changelog sinks: exactly once).
    ``timeout_s``: how long an upsert sink's topic may take to read to its end (benchmarks
    read large ones). ``sink``: which sink of a statement set (default: the first)."""
    sink = sink or pipeline.sink
    topic = topic_of(sink)
    if sink.changelog_mode == "upsert":
        return read_topic(bootstrap, topic, timeout_s=timeout_s)
    assert writer_id, "a changelog sink is read exactly once by its writer id"
    return read_exactly_once(bootstrap, topic, writer_id)


def sink_changes(pipeline: Pipeline, records: Sequence[Record], sink: TableDef | None = None) -> list[Change]:
    decoder = decoder_for(sink or pipeline.sink)
    out: list[Change] = []
    for r in records:
        out.extend(decoder.decode(r.key, r.value, (r.partition, r.offset), r.topic))
    return out


def sink_table(bootstrap: str, pipeline: Pipeline, writer_id: str | None = None,
               timeout_s: float = 60.0, sink: TableDef | None = None) -> dict[tuple, tuple]:
    """The table the sink topic stands for, sink PK -> row (typed as the sink's columns)."""
    sink = sink or pipeline.sink
    records = sink_records(bootstrap, pipeline, writer_id, timeout_s, sink)
    pk = sink.pk_indexes
    table: dict[tuple, tuple] = {}
    if sink.changelog_mode == "upsert":
        for c in sink_changes(pipeline, records, sink):
            key = tuple(c.row[i] for i in pk)
            if c.kind == "-D":
                table.pop(key, None)
            else:
                table[key] = c.row
        return table
    by_batch: dict[int, list[Record]] = {}
    for r in records:
        by_batch.setdefault(int(r.header(BATCH_HEADER) or -1), []).append(r)
    for batch in sorted(by_batch):
        apply_to_table(table, sink_changes(pipeline, by_batch[batch], sink), pk)
    return table


# ---------------------------------------------------------------------------- the reference


def replay_batches(bootstrap: str, pipeline: Pipeline, reports: Sequence[BatchReport]) -> list[dict[str, list[Change]]]:
    """The source changes of every batch the job ran, rebuilt from the offsets it reported,
    decoded as the job decodes them (same positions)."""
    tables = source_tables(pipeline)
    by_topic = {t.topic: t for t in tables}
    records = {t.topic: read_topic(bootstrap, t.topic) for t in tables}
    out = []
    for report in sorted(reports, key=lambda r: r.batch_id):
        batch: dict[str, list[Change]] = {}
        for topic, parts in report.end_offsets.items():
            src = by_topic[topic]
            start = report.start_offsets.get(topic, {})
            chosen = [
                {"topic": r.topic, "partition": r.partition, "offset": r.offset, "timestamp": None,
                 "key": r.key, "value": r.value}
                for r in records[topic]
                if start.get(str(r.partition), 0) <= r.offset < parts.get(str(r.partition), 0)
            ]
            changes, _bad = decode_batch(chosen, src, decoder_for(src.table), report.batch_id)
            batch[src.table.name] = changes
        out.append(batch)
    return out


def replay_reference(bootstrap: str, pipeline: Pipeline, reports: Sequence[BatchReport]) -> ReplayHost:
    """A ReplayHost that ran the job's batches (raises what the pipeline raises)."""
    host = ReplayHost(pipeline, clock=lambda: 0)
    for batch in replay_batches(bootstrap, pipeline, reports):
        host.run_batch(batch)
    return host


class PartRunner:
    """Runs a pipeline part by part on one checkpoint, as a job restarted between parts:
    each part's records go to their tables' topics (2 partitions, records alternating
    between them, so two tasks read every batch) and the job drains them in about three
    micro-batches (``run_pipeline``, ``until_idle``)."""

    def __init__(self, spark: Any, bootstrap: str, pipeline: Pipeline, checkpoint: str, name: str) -> None:
        self.spark, self.bootstrap, self.pipeline = spark, bootstrap, pipeline
        self.checkpoint, self.name = checkpoint, name
        self._spread = itertools.cycle([0, 1])
        for table in pipeline.sources.values():
            ensure_topics(bootstrap, {topic_of(table): 2})

    def run(self, part: Mapping[str, Sequence[dict]]) -> Any:
        """Produce ``part`` (table -> ``{"kind", "row"}`` records) and drain it; the job's result."""
        for name, recs in part.items():
            table = self.pipeline.sources[name]
            produce(self.bootstrap, topic_of(table), encode_source(table, recs), partition_of=lambda _k: next(self._spread))
        largest = max((len(recs) for recs in part.values()), default=0)
        return run_pipeline(self.spark, self.pipeline, self.bootstrap, self.checkpoint, name=self.name,
                            max_records_per_trigger=math.ceil(largest / 3) or 1)
