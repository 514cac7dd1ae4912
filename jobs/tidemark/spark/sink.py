"""Writing a Spark micro-batch of changes to Kafka (call from ``foreachBatch``), and the
dead-letter topic.

Input: a DataFrame of ``BLOB_SCHEMA`` rows (Arrow IPC change batches), the form changes
travel in between stages (``tidemark.spark.keyed``); or, for an upsert sink written by the
keyed stage that feeds it (``UpsertProducer``), the frame of what that stage wrote.

Delivery under replay (Spark re-runs the batch it had not committed after a crash):

- ``UpsertSink`` (``upsert-json`` / ``upsert-avro``): idempotent by construction. The
  batch is consolidated per sink primary key (exact ``+X/-X`` pairs cancel; the latest
  remaining change by source position wins, a retraction before an add at the same
  position) into at most one record per key: the row, or a tombstone. The result depends
  only on the batch's changes, not their order, so a replay writes the same key/value
  pairs and the materialized table does not change. Records are produced from the
  executors with an idempotent producer, keyed by the PK (Java-compatible partitioner),
  and the batch is flushed before ``foreachBatch`` returns, so batch N+1 never overtakes
  batch N. ``-U`` is never written.
- ``ChangelogSink`` (``changelog-json`` / ``changelog-avro``): every change with its kind,
  in source-position order, written exactly once per batch id through a Kafka transaction
  with a commit marker (``tidemark.kafka.transactional``: exactly-once for read_committed
  consumers on Apache Kafka; on Tansu, use ``read_exactly_once``).
- ``DeadLetterSink``: the records ``decode_stream`` could not decode, to
  ``<pipeline>.dlq``, with the same transactional protocol (no dead letter lost or
  duplicated by a replay); ``metrics`` counts them per error kind.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from tidemark.engine.batch import ChangeBatch
from tidemark.engine.catalog import TableDef
from tidemark.engine.changelog import canonical_key
from tidemark.formats import dead_letter
from tidemark.formats.batch_encode import BatchEncoder
from tidemark.formats.codecs import Encoder
from tidemark.kafka.config import table_properties
from tidemark.kafka.transactional import (
    SinkWriteError,
    TransactionalBatchWriter,
    WriteResult,
    producer_config,
)
from tidemark.spark.keyed import WRITTEN_COLUMN, WRITTEN_SCHEMA

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class _SinkProducer(NamedTuple):
    """A producer that reports failed deliveries only, into ``failures``: a delivery report
    per record would cost a Python callback per record, and a per-record callback argument
    an allocation per record, for nothing but the rare failure."""

    producer: Any
    failures: list[str]


#: The upsert sink's producer in each Python worker process (for the last broker list),
#: reused by the tasks of every batch: a new idempotent producer spends ~0.5 s (its
#: producer id, broker metadata) before its first flush returns, a reused one flushes 50
#: records in under 1 ms (measured on the embedded broker); per batch that was most of the
#: sink stage's time.
_PRODUCERS: dict[str, _SinkProducer] = {}


def _producer_key(conf: dict[str, Any]) -> str:
    return json.dumps(conf, sort_keys=True, default=str)


def _shared_producer(conf: dict[str, Any]) -> _SinkProducer:
    """The producer of ``conf`` (built on the driver: an executor needs no settings file)."""
    from confluent_kafka import Producer

    key = _producer_key(conf)
    shared = _PRODUCERS.get(key)
    if shared is None:
        _PRODUCERS.clear()  # one at a time: a producer of a broker gone away only logs
        failures: list[str] = []

        def on_delivery(err: Any, _msg: Any) -> None:
            if err is not None:
                failures.append(err.str())

        producer = Producer({**conf, "delivery.report.only.error": True, "on_delivery": on_delivery})
        shared = _PRODUCERS[key] = _SinkProducer(producer, failures)
    return shared


class _SinkKey:
    """The sink primary key as a keyed stage's ``key_columns``: what splits a batch's blobs
    so that every change of one Kafka key reaches one task."""

    def __init__(self, pk: Sequence[int]):
        self.pk = tuple(pk)

    def key_columns(self, _input: int) -> tuple[int, ...]:
        return self.pk


class UpsertProducer:
    """Nets a batch's changes per sink primary key (``net_upserts``: at most one record per
    key, the row or a tombstone), encodes and produces them, and flushes before returning.
    Built on the driver and pickled into the Python workers: by the upsert sink's own pass,
    or by the keyed stage that feeds the sink when that stage is keyed by the sink's PK
    (``tidemark.spark.query.keyed_by_sink_pk``), so every change of one key is in the batch
    it is given."""

    def __init__(self, conf: dict[str, Any], table: TableDef, registry_url: str | None, topic: str,
                 flush_timeout_s: float):
        self.conf = conf
        self.table = table
        self.registry_url = registry_url
        self.topic = topic
        self.flush_timeout_s = flush_timeout_s

    def write(self, batch: ChangeBatch) -> int:
        """Produce ``batch``; returns the records produced. Raises ``SinkWriteError`` when
        a record is not delivered within the flush timeout."""
        from tidemark.engine.kernels.upsert import net_upserts

        if len(batch) == 0:
            return 0
        producer, failures = _shared_producer(self.conf)
        failures.clear()
        n = 0
        try:
            finals = net_upserts(batch, self.table.pk_indexes).table()
            for key, value in BatchEncoder(self.table, self.registry_url).encode_table(finals, self.topic):
                while True:
                    try:
                        producer.produce(self.topic, value, key)
                        break
                    except BufferError:
                        producer.poll(0.1)
                n += 1
            if producer.flush(self.flush_timeout_s) or failures:
                raise SinkWriteError(f"upsert sink '{self.topic}': {'; '.join(failures[:3]) or 'flush timed out'}")
        except BaseException:
            _PRODUCERS.pop(_producer_key(self.conf), None)  # the task's retry starts with a fresh producer
            raise
        return n


class UpsertSink:
    """Key = sink PK, value = row, tombstone on delete (see module docstring)."""

    def __init__(self, bootstrap: str, table: TableDef, *, topic: str | None = None,
                 registry_url: str | None = None, flush_timeout_s: float = 120.0):
        self.bootstrap = bootstrap
        self.table = table
        self.registry_url = registry_url
        self.topic = topic or table.options.get("topic", table.name)
        if not Encoder(table, registry_url).upsert:  # validates the format on the driver
            raise SinkWriteError(f"sink '{table.name}': format '{table.format}' is not an upsert format")
        self.flush_timeout_s = flush_timeout_s
        self.metrics: Counter = Counter()

    def producer(self) -> UpsertProducer:
        """What writes a batch of this sink's changes in a Python worker."""
        conf = producer_config(self.bootstrap, table_properties(self.table.options))
        return UpsertProducer(conf, self.table, self.registry_url, self.topic, self.flush_timeout_s)

    def write_batch(self, df: DataFrame, batch_id: int, keyed: bool = False) -> int:
        """Write one batch; returns the number of records produced.

        Two Arrow passes: split the batch's changes by sink primary key into one blob per
        task and key bucket, shuffle by bucket, then net each key's changes to one and
        produce (``UpsertProducer``). Both stay on the node's Arrow columns: no row is
        pickled or built as a ``Change``. ``keyed``: every change of one PK is already in
        one partition of ``df`` (``tidemark.spark.query.keyed_by_sink_pk``), so the produce
        pass runs on ``df`` as it stands, in the same Spark stage as the operator that made
        it."""
        from tidemark.engine import batch_ipc
        from tidemark.spark.keyed import BLOB_SCHEMA, arrow_pairs, blob_batch, blob_rows

        table = self.table
        producer = self.producer()
        schema = batch_ipc.schema_of(table.column_names, table.types)
        target = (_SinkKey(table.pk_indexes), 0)
        buckets = max(1, int(df.sparkSession.conf.get("spark.sql.shuffle.partitions")))

        def split(batches: Iterator[Any]) -> Iterator[Any]:
            blobs = [b for _, b in arrow_pairs(batches)]
            rows = blob_rows(batch_ipc.decode_batch(blobs), schema, target, buckets) if blobs else []
            if rows:
                yield blob_batch(rows)

        def produce(batches: Iterator[Any]) -> Iterator[Any]:
            import pyarrow as pa

            blobs = [b for _, b in arrow_pairs(batches)]
            n = producer.write(batch_ipc.decode_batch(blobs)) if blobs else 0
            yield pa.RecordBatch.from_pydict({WRITTEN_COLUMN: pa.array([n], pa.int64())})

        blobs = df.select("bucket", "input", "batch")
        if not keyed:
            blobs = blobs.mapInArrow(split, BLOB_SCHEMA).repartition("bucket")
        return self.count_written(blobs.mapInArrow(produce, WRITTEN_SCHEMA))

    def count_written(self, df: DataFrame) -> int:
        """Run a frame of ``WRITTEN_SCHEMA`` rows (what ``UpsertProducer.write`` returned,
        per call) and return the records written."""
        written = sum(r[WRITTEN_COLUMN] for r in df.collect())
        self.metrics["records_written"] += written
        self.metrics["batches"] += 1
        return written


class ChangelogSink:
    """Every change with its kind, exactly once per batch id (see module docstring).
    ``writer_id`` must be stable across restarts of the same query and unique per sink
    (e.g. ``<pipeline>.<sink table>``)."""

    def __init__(self, bootstrap: str, table: TableDef, writer_id: str, *, topic: str | None = None,
                 registry_url: str | None = None):
        self.table = table
        self.registry_url = registry_url
        self.topic = topic or table.options.get("topic", table.name)
        if Encoder(table, registry_url).upsert:
            raise SinkWriteError(f"sink '{table.name}': format '{table.format}' is not a changelog format")
        self.writer = TransactionalBatchWriter(bootstrap, writer_id, table=table_properties(table.options))
        self.metrics: Counter = Counter()

    def write_batch(self, df: DataFrame, batch_id: int) -> WriteResult:
        table, url, topic = self.table, self.registry_url, self.topic

        def encode(rows: Iterator[Any]) -> Iterator[tuple[tuple, bytes | None, bytes | None]]:
            from tidemark.spark.keyed import changes_of_blobs

            changes = changes_of_blobs([bytes(r["batch"]) for r in rows])
            for c, (key, value) in zip(changes, BatchEncoder(table, url).encode(changes, topic)):
                yield canonical_key(c), key, value

        self.writer.start()
        if batch_id <= self.writer.last_committed:  # replay of a committed batch: no Spark job
            self.metrics["batches_skipped"] += 1
            return WriteResult(batch_id, 0, True)
        encoded = df.select("batch").rdd.mapPartitions(encode).collect()
        # the canonical order: source position, retractions before adds at one position
        # (-U before +U), then the row's repr, as the replay host applies them
        encoded.sort(key=lambda e: e[0])
        result = self.writer.write(batch_id, ((topic, k, v) for _, k, v in encoded))
        self.metrics["batches_skipped" if result.skipped else "batches"] += 1
        self.metrics["records_written"] += result.written
        return result

    def close(self) -> None:
        self.writer.close()


def sink_writer(bootstrap: str, table: TableDef, writer_id: str, registry_url: str | None = None) -> Any:
    """The writer of one sink table: ``UpsertSink`` for an upsert format, else a
    ``ChangelogSink`` with transactional writer ``writer_id``."""
    if table.changelog_mode == "upsert":
        return UpsertSink(bootstrap, table, registry_url=registry_url)
    return ChangelogSink(bootstrap, table, writer_id, registry_url=registry_url)


DEAD_LETTER_COLUMNS = (
    "table", "format", "topic", "partition", "offset", "timestamp", "key", "value", "error_kind", "reason",
)


class DeadLetterSink:
    """Writes undecodable records to ``<pipeline>.dlq`` exactly once per batch id, with
    ``metrics["dlq_records"]`` and ``metrics["dlq_records.<error kind>"]``."""

    def __init__(self, bootstrap: str, pipeline: str, *, encoding: str = "json", writer_id: str | None = None):
        if encoding not in dead_letter.ENCODINGS:
            raise ValueError(f"dead-letter encoding {encoding!r}: expected one of {', '.join(dead_letter.ENCODINGS)}")
        self.pipeline = pipeline
        self.topic = dead_letter.dlq_topic(pipeline)
        self.encoding = encoding
        self.bootstrap = bootstrap
        self.writer = TransactionalBatchWriter(bootstrap, writer_id or f"{pipeline}.dlq")
        self.metrics: Counter = Counter()
        self._topic_ready = False

    def letters(self, rows: Iterable[Any], batch_id: int) -> list[dead_letter.DeadLetter]:
        out = []
        for r in rows:
            ts = r["timestamp"]
            ts_ms = None
            if isinstance(ts, _dt.datetime):
                aware = ts if ts.tzinfo else ts.replace(tzinfo=_dt.timezone.utc)
                ts_ms = int(aware.timestamp() * 1000)
            out.append(dead_letter.DeadLetter(
                pipeline=self.pipeline, table=r["table"] or "", format=r["format"] or "",
                source_topic=r["topic"], source_partition=int(r["partition"]), source_offset=int(r["offset"]),
                source_timestamp_ms=ts_ms, error_kind=r["error_kind"], reason=r["reason"],
                key=None if r["key"] is None else bytes(r["key"]),
                value=None if r["value"] is None else bytes(r["value"]), batch_id=batch_id,
            ))
        out.sort(key=lambda d: (d.source_topic, d.source_partition, d.source_offset))
        return out

    def write_batch(self, bad: DataFrame, batch_id: int) -> WriteResult:
        """``bad``: the rows of ``decode_stream`` whose ``error_kind`` is set."""
        self.writer.start()
        if batch_id <= self.writer.last_committed:
            self.metrics["dlq_batches_skipped"] += 1
            return WriteResult(batch_id, 0, True)
        return self.write_letters(self.letters(bad.select(*DEAD_LETTER_COLUMNS).collect(), batch_id), batch_id)

    def write_letters(self, letters: list[dead_letter.DeadLetter], batch_id: int) -> WriteResult:
        if not self._topic_ready:
            from tidemark.kafka.admin import ensure_topics

            ensure_topics(self.bootstrap, {self.topic: 1})
            self._topic_ready = True
        records = [(self.topic, *dead_letter.encode(d, self.encoding)) for d in letters]
        result = self.writer.write(batch_id, records)
        if not result.skipped:
            self.metrics["dlq_records"] += len(letters)
            for d in letters:
                self.metrics[f"dlq_records.{d.error_kind}"] += 1
        return result

    def close(self) -> None:
        self.writer.close()
