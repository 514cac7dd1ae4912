"""Kafka as a Spark streaming source, as a Python data source on confluent-kafka.

Why not Spark's own Kafka connector: it needs the ``spark-sql-kafka`` jars, which a plain
``pip install pyspark`` does not have. This source needs nothing but confluent-kafka.

How it stays exactly-once on the read side:

- An offset is ``{topic: {partition: next offset}}`` (partitions as strings: the offset
  travels through JSON). Spark writes the end offset of every micro-batch to its
  checkpoint *before* running the batch, so a restarted query re-plans the one batch that
  was not committed with the very same ``[start, end)`` ranges and reads exactly those
  records again; nothing here keeps offsets anywhere else (no consumer group commits).
- One input partition per topic-partition range. A task ``assign()``s its partition at
  ``start`` (group ``subscribe()`` would rebalance, and is slow on the Tansu broker), reads
  until its position reaches ``end``, skips anything past ``end`` and closes.
- ``read_committed``: the end of a range is the last stable offset, so records of open
  transactions are never planned; transaction markers occupy offsets but are never
  returned, which is why a range ends on the consumer position, not on a record's offset.
  (The Tansu broker returns records of *aborted* transactions to read_committed consumers;
  Apache Kafka does not.)
- Rate limit: ``maxRecordsPerTrigger`` caps the offsets one micro-batch spans, split over
  partitions in proportion to their backlog, so a backlog becomes many bounded batches.
  While the ends seen last still hold a full batch, the next batch is planned from them
  without asking the broker again.
  ``Trigger.AvailableNow`` is supported (a fixed target, reached in rate-limited steps).
- Bounded (``endingOffsets`` = ``latest``, a table's ``'scan.bounded.mode' =
  'latest-offset'``): the source never reads past the offsets that were latest when the
  query started, and once every partition is read up to them it ends with one more batch
  that reads nothing but carries an end row (``END_PARTITION``), from which the decode
  pass raises the table's watermark to ``END_OF_INPUT``: replay's ``finish``. Both the
  stopping offsets and "ended" are part of the offset (``STOP_KEY``, ``ENDED_KEY`` beside
  the topics), so they live in Spark's offset log: a restarted query stops where the first
  start said and never ends twice. Why the driver decides the end rather than the tasks
  that read the last records: only the driver sees every partition at once (a partition
  that is empty, or ends on a transaction marker, has no last record to see), and an
  offset that changes is what makes Spark plan the batch that fires the windows.

Output columns: ``topic, partition, offset, timestamp, key, value`` (bytes). A job's query
reads through ``decoded_stream`` instead: the reader hands those columns, as Arrow batches,
to the query's decode function in the same Python worker and returns its change blobs.
Decoding stays a step of its own (``decode_columnar``, ``decode_records``) so that an
undecodable record is routed to the dead-letter topic, never a failed read.
"""

from __future__ import annotations

import pickle
import time
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from tidemark.engine.batch import ChangeBatch
from tidemark.engine.catalog import TableDef

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

SOURCE_NAME = "tidemark-kafka"
SCHEMA = "topic string, partition int, offset bigint, timestamp timestamp, key binary, value binary"
#: a task that sees no progress for this long fails (naming its range) instead of hanging
STALL_TIMEOUT_S = 120.0
ARROW_BATCH_ROWS = 10_000
#: bytes a fetch asks for. A consumer reads one partition, and Apache Kafka hands it at most
#: ``max.partition.fetch.bytes`` (1 MiB) a fetch; brokers that cap a response by the whole
#: fetch's 50 MiB instead (the embedded Tansu) had librdkafka parse the partition far past a
#: range before its first record was returned (docs/benchmarks.md, "The source's fetches")
FETCH_MAX_BYTES = 1_048_576
#: librdkafka's own bound on the records a consumer queues ahead of its reader
QUEUED_MIN_MESSAGES_MAX = 100_000

Offsets = dict[str, dict[str, int]]
#: a bounded source's offset keys beside its topics (never a topic name: Kafka allows only
#: ``[a-zA-Z0-9._-]``): the stopping offsets as ``[[topic, partition, offset], ...]`` (a
#: list, so readers of ``{topic: {partition: offset}}`` pass it by), and ``true`` once the
#: source has ended
STOP_KEY = "#stop"
ENDED_KEY = "#ended"
#: the ``partition`` (and ``offset``) of the one row the end batch reads per topic
END_PARTITION = -1
#: the reader's ``startingOffsets``; a table's ``scan.startup.mode`` maps onto them
STARTING_OFFSETS = ("earliest", "latest", "timestamp")
_STARTUP_MODES = {"earliest-offset": "earliest", "latest-offset": "latest", "timestamp": "timestamp"}


class KafkaSourceError(RuntimeError):
    pass


def consumer_config(options: dict[str, str]) -> dict[str, Any]:
    bootstrap = options.get("bootstrap.servers") or options.get("kafka.bootstrap.servers")
    if not bootstrap:
        raise KafkaSourceError("the tidemark-kafka source needs the 'bootstrap.servers' option")
    # the fetch size, then the pass-through of librdkafka settings (``client_options``,
    # which may change it), then what the source's exactly-once reading depends on
    passed = {key[len("kafka."):]: value for key, value in options.items()
              if key.startswith("kafka.") and key != "kafka.bootstrap.servers"}
    # librdkafka refuses a fetch smaller than the largest message a client setting allows
    sizes = [int(passed[k]) for k in ("message.max.bytes", "max.partition.fetch.bytes") if k in passed]
    conf: dict[str, Any] = {"fetch.max.bytes": max([FETCH_MAX_BYTES, *sizes]), **passed}
    conf |= {
        "bootstrap.servers": bootstrap,
        "group.id": options.get("group.id", "tidemark-source"),  # required, never committed
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": options.get("isolation.level", "read_committed"),
        "enable.partition.eof": True,
        "fetch.wait.max.ms": 100,
        "log_level": 3,
    }
    return conf


def client_options(table: Any) -> dict[str, str]:
    """The operator's and ``table``'s client settings (``tidemark.kafka.config``) as this
    source's ``kafka.*`` options, resolved on the driver so executors need no settings file."""
    from tidemark.kafka.config import file_settings, table_properties

    return {f"kafka.{k}": str(v) for k, v in {**file_settings(), **table_properties(table.options)}.items()}


def plan_limit(start: Offsets, end: Offsets, max_rows: int) -> Offsets:
    """Cap the span ``start -> end`` at ``max_rows`` offsets in total, shared over the
    partitions in proportion to their backlog (the remainder goes one offset at a time to
    the partitions in sorted order). Deterministic, and always makes progress."""
    backlog = {
        (t, p): end[t][p] - start.get(t, {}).get(p, 0) for t in end for p in end[t]
    }
    total = sum(n for n in backlog.values() if n > 0)
    if total <= max_rows:
        return end
    take = {tp: (n * max_rows) // total if n > 0 else 0 for tp, n in backlog.items()}
    left = max_rows - sum(take.values())
    for tp in sorted(backlog):
        if left <= 0:
            break
        if backlog[tp] > take[tp]:
            take[tp] += 1
            left -= 1
    return {
        t: {p: start.get(t, {}).get(p, 0) + take[(t, p)] for p in end[t]} for t in end
    }


def topic_offsets(offset: dict[str, Any]) -> Offsets:
    """An offset without a bounded source's keys: ``{topic: {partition: offset}}``."""
    return {t: parts for t, parts in offset.items() if t not in (STOP_KEY, ENDED_KEY)}


def stop_of(offset: dict[str, Any]) -> Offsets | None:
    """The stopping offsets an offset carries (None: an unbounded source's offset)."""
    rows = offset.get(STOP_KEY)
    if rows is None:
        return None
    out: Offsets = {}
    for topic, partition, off in rows:
        out.setdefault(topic, {})[str(partition)] = int(off)
    return out


def has_ended(offset: dict[str, Any] | None) -> bool:
    return bool(offset and offset.get(ENDED_KEY))


def at_stop(end: Offsets, stop: Offsets, pos: Offsets) -> Offsets:
    """``end`` with no partition past ``stop``, nor past ``pos`` (where the query is) for a
    partition the stop does not list (created after it was taken)."""
    return {
        t: {p: min(o, max(stop.get(t, {}).get(p, 0), pos.get(t, {}).get(p, 0))) for p, o in parts.items()}
        for t, parts in end.items()
    }


def bounded_offset(start: dict[str, Any], end: Offsets, stop: Offsets) -> dict[str, Any]:
    """A bounded source's next offset: ``end`` (already ``at_stop``) with the stop, and
    ended once ``start`` had every partition at its stop, so that the batch that ends the
    source reads no record (replay's ``finish``)."""
    pos = topic_offsets(start)
    out: dict[str, Any] = {**end, STOP_KEY: [[t, int(p), o] for t in sorted(stop) for p, o in sorted(stop[t].items())]}
    if has_ended(start) or all(pos.get(t, {}).get(p, 0) >= o for t, parts in stop.items() for p, o in parts.items()):
        out[ENDED_KEY] = True
    return out


def capped(end: Offsets, cap: Offsets | None) -> Offsets:
    """``end`` with no partition past ``cap`` (None: no cap)."""
    if cap is None:
        return end
    return {t: {p: min(o, cap.get(t, {}).get(p, o)) for p, o in parts.items()} for t, parts in end.items()}


def open_bounded_sources(end_offsets: list[Any]) -> int:
    """How many of a query's source end offsets (parsed JSON, as a progress reports them)
    belong to a bounded source that has not ended yet."""
    return sum(1 for o in end_offsets if isinstance(o, dict) and STOP_KEY in o and not has_ended(o))


class KafkaRange(InputPartition):
    """One topic-partition's ``[start, end)`` of one micro-batch."""

    def __init__(self, topic: str, partition: int, start: int, end: int):
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


class SourceEnd(InputPartition):
    """The end of a bounded source: one row per topic, ``partition`` and ``offset``
    ``END_PARTITION`` (no record has them), and nothing else to read."""

    def __init__(self, topics: list[str]):
        super().__init__(tuple(topics))
        self.topics = topics


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, schema: StructType, options: dict[str, str]):
        self.schema = schema
        # Spark hands options over case-insensitively; look them up lower-cased.
        self.options = {k.lower(): v for k, v in options.items()}
        topics = self.options.get("topics") or self.options.get("subscribe") or ""
        self.topics = [t.strip() for t in topics.split(",") if t.strip()]
        if not self.topics:
            raise KafkaSourceError("the tidemark-kafka source needs the 'topics' option")
        self.conf = consumer_config(self.options)
        limit = self.options.get("maxrecordspertrigger") or self.options.get("maxoffsetspertrigger")
        self.max_records = int(limit) if limit else None
        if self.max_records is not None and self.max_records < 1:
            raise KafkaSourceError(f"maxRecordsPerTrigger must be >= 1, got {limit}")
        starting = self.options.get("startingoffsets", "earliest")
        if starting not in STARTING_OFFSETS:
            raise KafkaSourceError(f"startingOffsets must be one of {', '.join(STARTING_OFFSETS)}, got {starting!r}")
        self.starting = starting
        stamp = self.options.get("startingtimestamp")
        if (starting == "timestamp") != (stamp is not None) or (stamp is not None and not stamp.isdigit()):
            raise KafkaSourceError(
                f"startingTimestamp (epoch milliseconds) goes with startingOffsets 'timestamp', got {stamp!r}"
            )
        self.starting_timestamp = int(stamp) if stamp is not None else None
        self.timeout_s = float(self.options.get("metadatatimeoutseconds", "30"))
        ending = self.options.get("endingoffsets")
        if ending not in (None, "latest"):
            raise KafkaSourceError(f"endingOffsets must be 'latest' (or unset: unbounded), got {ending!r}")
        self.bounded = ending == "latest"
        self._stop: Offsets | None = None
        self._consumer = None
        self._target: Offsets | None = None
        self._last_end: Offsets | None = None

    # Executors get a pickled reader: never ship the driver's consumer.
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_consumer"] = None
        return state

    # ------------------------------------------------------------------ driver side
    def _admin_consumer(self):
        if self._consumer is None:
            from confluent_kafka import Consumer

            from tidemark.kafka.admin import END_PROBE

            self._consumer = Consumer({**self.conf, **END_PROBE})
        return self._consumer

    def _partitions(self) -> dict[str, list[int]]:
        consumer = self._admin_consumer()
        md = consumer.list_topics(timeout=self.timeout_s)
        out: dict[str, list[int]] = {}
        for topic in self.topics:
            meta = md.topics.get(topic)
            if meta is None or meta.error is not None or not meta.partitions:
                raise KafkaSourceError(f"topic '{topic}' does not exist on {self.conf['bootstrap.servers']}")
            out[topic] = sorted(meta.partitions)
        return out

    def _end(self, start: Offsets | None = None) -> Offsets:
        """The last stable offset of every partition (nothing beyond an open transaction
        is ever planned), measured by a fetch from ``start`` on: see
        ``tidemark.kafka.admin.stable_end_offsets``."""
        from tidemark.kafka.admin import stable_end_offsets

        partitions = [(t, p) for t, parts in self._partitions().items() for p in parts]
        known = {(t, p): start[t][str(p)] for t, p in partitions if start and str(p) in start.get(t, {})}
        ends = stable_end_offsets(self._admin_consumer(), partitions, known, self.timeout_s)
        out: Offsets = {}
        for (t, p), off in ends.items():
            out.setdefault(t, {})[str(p)] = off
        return out

    def initialOffset(self) -> Offsets:
        """Where a new query starts (a restarted one resumes from its checkpoint instead):
        the earliest offsets, the end, or the first offset at or after a timestamp."""
        if self.starting == "latest":
            return self._end()
        from confluent_kafka import TopicPartition

        consumer = self._admin_consumer()
        partitions = self._partitions()
        if self.starting == "timestamp":
            return self._offsets_for_time(partitions)
        return {
            t: {str(p): consumer.get_watermark_offsets(TopicPartition(t, p), timeout=self.timeout_s)[0] for p in parts}
            for t, parts in partitions.items()
        }

    def _offsets_for_time(self, partitions: dict[str, list[int]]) -> Offsets:
        """Per partition, the first offset whose record's timestamp is at or after the
        start timestamp (the end when there is none yet). The broker's answer is taken as
        a lower bound and checked by reading forward from it: some brokers (the embedded
        Tansu one) answer offset 0 for every timestamp."""
        from confluent_kafka import TopicPartition

        end = self._end()
        ts = self.starting_timestamp
        asked = [TopicPartition(t, p, ts) for t, parts in partitions.items() for p in parts]
        out: Offsets = {t: {} for t in partitions}
        for tp in self._admin_consumer().offsets_for_times(asked, timeout=self.timeout_s):
            last = end[tp.topic][str(tp.partition)]
            lower = tp.offset if 0 <= tp.offset <= last else last
            records = read_range(self.conf, tp.topic, tp.partition, lower, last)
            try:
                out[tp.topic][str(tp.partition)] = next((r[2] for r in records if (r[3] or 0) >= ts), last)
            finally:
                records.close()
        return out

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        pos = topic_offsets(start)
        if not self._backlog_fills(pos, limit):
            self._last_end = self._end(pos)
        end = capped(self._last_end, self._target)  # Trigger.AvailableNow: never beyond the target
        # a partition never goes backwards (e.g. start already past a reported end)
        end = {t: {p: max(o, pos.get(t, {}).get(p, 0)) for p, o in parts.items()} for t, parts in end.items()}
        if self.bounded:
            # the stop is what was latest at the query's first planning (a checkpoint
            # started unbounded takes it at this start)
            self._stop = stop_of(start) or end
            end = at_stop(end, self._stop, pos)
        if isinstance(limit, ReadMaxRows):
            end = plan_limit(pos, end, limit.max_rows)
        return end if self._stop is None else bounded_offset(start, end, self._stop)

    def _backlog_fills(self, pos: Offsets, limit: ReadLimit) -> bool:
        """Whether the end seen last still holds at least a full batch past ``pos``: then
        the batch is the same whatever the partitions' ends are now, and asking the broker
        (a fetch that waits at each partition's end) is skipped while a backlog drains.
        Partitions created meanwhile are found once the backlog is below a batch."""
        if self._last_end is None or not isinstance(limit, ReadMaxRows):
            return False
        backlog = sum(
            max(0, o - pos.get(t, {}).get(p, 0)) for t, parts in self._last_end.items() for p, o in parts.items()
        )
        return backlog >= limit.max_rows

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_records) if self.max_records else ReadAllAvailable()

    def reportLatestOffset(self) -> Offsets | None:
        """The end the broker gave last (while a backlog of more than a batch drains, that
        can be a few batches old), a bounded source's capped at its stop (Spark reports lag
        with it: a bounded source has none left at its stop)."""
        return None if self._last_end is None else capped(self._last_end, self._stop)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._end(self._last_end)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        ranges: list[InputPartition] = []
        offsets = topic_offsets(end)
        for topic in sorted(offsets):
            for p in sorted(offsets[topic], key=int):
                lo = start.get(topic, {}).get(p, 0)
                hi = offsets[topic][p]
                if hi > lo:
                    ranges.append(KafkaRange(topic, int(p), lo, hi))
        if has_ended(end) and not has_ended(start):
            ranges.append(SourceEnd(sorted(offsets)))
        return ranges

    def commit(self, end: Offsets) -> None:
        """Offsets live in Spark's checkpoint; nothing to commit to Kafka."""

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    # ------------------------------------------------------------------ executor side
    def read(self, partition: KafkaRange | SourceEnd) -> Iterator[Any]:
        return raw_batches(self.conf, partition)


def raw_arrow_schema() -> pa.Schema:
    """``SCHEMA`` as the Arrow schema Spark gives its rows (built without a JVM: an
    executor decoding inside the source has none)."""
    import pyarrow as pa

    return pa.schema([("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
                      ("timestamp", pa.timestamp("us", tz="UTC")), ("key", pa.binary()), ("value", pa.binary())])


def raw_batches(conf: dict[str, Any], partition: KafkaRange | SourceEnd) -> Iterator[pa.RecordBatch]:
    """The records of one input partition as Arrow batches of ``SCHEMA``'s columns."""
    import pyarrow as pa

    arrow_schema = raw_arrow_schema()
    # timestamps travel as epoch milliseconds and become Arrow timestamps in one
    # vectorized cast (a datetime object per record cost ~10% of the read)
    millis = pa.timestamp("ms", tz="UTC")

    def to_batch(columns: tuple[list, ...]) -> pa.RecordBatch:
        arrays = [
            pa.array(c, millis).cast(t.type) if i == 3 else pa.array(c, t.type)
            for i, (c, t) in enumerate(zip(columns, arrow_schema))
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)

    if isinstance(partition, SourceEnd):
        n = len(partition.topics)
        yield to_batch((partition.topics, [END_PARTITION] * n, [END_PARTITION] * n, [None] * n, [None] * n,
                        [None] * n))
        return
    topic, part = partition.topic, partition.partition
    columns: tuple[list, ...] = ([], [], [], [], [], [])
    for messages in read_chunks(conf, topic, part, partition.start, partition.end):
        # a column at a time: a list comprehension per field costs a fraction of
        # appending each record's six values one by one
        stamps = [m.timestamp() for m in messages]
        columns[0].extend([topic] * len(messages))
        columns[1].extend([part] * len(messages))
        columns[2].extend([m.offset() for m in messages])
        columns[3].extend([ts if kind and ts >= 0 else None for kind, ts in stamps])
        columns[4].extend([m.key() for m in messages])
        columns[5].extend([m.value() for m in messages])
        if len(columns[0]) >= ARROW_BATCH_ROWS:
            yield to_batch(columns)
            columns = ([], [], [], [], [], [])
    if columns[0]:
        yield to_batch(columns)


def read_range(
    conf: dict[str, Any], topic: str, partition: int, start: int, end: int, stall_timeout_s: float = STALL_TIMEOUT_S
) -> Iterator[tuple[str, int, int, int | None, bytes | None, bytes | None]]:
    """Yield the records of ``topic[partition]`` with ``start <= offset < end``, as
    ``(topic, partition, offset, timestamp in epoch ms, key, value)``. Ends when the consumer position
    reaches ``end`` (markers and aborted records take offsets but are not returned)."""
    for messages in read_chunks(conf, topic, partition, start, end, stall_timeout_s):
        for m in messages:
            ts_type, ts = m.timestamp()
            yield topic, partition, m.offset(), ts if ts_type and ts >= 0 else None, m.key(), m.value()


def range_consumer_config(conf: dict[str, Any], records: int) -> dict[str, Any]:
    """``conf`` for a consumer that reads ``records`` offsets and closes: it queues no more
    than the range ahead of its reader (librdkafka's default, 100,000 records, fetches and
    parses past a range's end while the range is being read), unless a client setting says
    otherwise."""
    if "queued.min.messages" in conf:
        return conf
    return {**conf, "queued.min.messages": min(max(records, 1), QUEUED_MIN_MESSAGES_MAX)}


def read_chunks(
    conf: dict[str, Any], topic: str, partition: int, start: int, end: int, stall_timeout_s: float = STALL_TIMEOUT_S
) -> Iterator[list[Any]]:
    """``read_range``'s records as the consumer's messages, a list per fetch."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(range_consumer_config(conf, end - start))
    try:
        tp = TopicPartition(topic, partition, start)
        consumer.assign([tp])
        position = start
        last_progress = time.monotonic()
        while position < end:
            # ask for no more than the range holds, so the call returns as soon as it is read
            messages = consumer.consume(num_messages=max(1, min(5000, end - position)), timeout=0.5)
            moved = False
            chunk = []
            for m in messages:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaSourceError(f"reading {topic}[{partition}] at {position}: {err.str()}")
                off = m.offset()
                if off >= end:
                    position = end
                    break
                if off >= position:
                    position = off + 1
                    moved = True
                    chunk.append(m)
            if chunk:
                yield chunk
            if position < end:
                pos = consumer.position([TopicPartition(topic, partition)])[0].offset
                if pos > position:
                    position, moved = pos, True
            if moved:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > stall_timeout_s:
                raise KafkaSourceError(
                    f"no progress reading {topic}[{partition}] offsets [{start}, {end}) for "
                    f"{stall_timeout_s:.0f}s (stuck at {position})"
                )
    finally:
        consumer.close()


class KafkaSource(DataSource):
    """``spark.readStream.format("tidemark-kafka").option("topics", "a,b")
    .option("bootstrap.servers", ...).option("maxRecordsPerTrigger", 10000).load()``"""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        return KafkaStreamReader(schema, dict(self.options))


def startup_options(table: TableDef) -> dict[str, str]:
    """The reader options of a table's ``scan.startup.mode`` (Flink's names; planning has
    checked the mode and its timestamp)."""
    mode = table.options.get("scan.startup.mode", "earliest-offset").lower()
    out = {"startingOffsets": _STARTUP_MODES[mode]}
    if mode == "timestamp":
        out["startingTimestamp"] = table.options["scan.startup.timestamp-millis"].strip()
    if table.options.get("scan.bounded.mode", "unbounded").lower() == "latest-offset":
        out["endingOffsets"] = "latest"
    return out


def without_end_rows(batch: Any) -> tuple[Any, bool]:
    """A raw Arrow batch without the end rows of a bounded source (``SourceEnd``), and
    whether it had one: the decode pass then raises the table's watermark to the end."""
    import pyarrow.compute as pc

    ends = pc.equal(batch.column("partition"), END_PARTITION)
    if not pc.any(ends).as_py():
        return batch, False
    return batch.filter(pc.invert(ends)), True


#: what a ``DecodingReader`` runs on one input partition: its raw record batches in, the
#: query's first pass's output batches out
DecodeFunction = Callable[[Iterator["pa.RecordBatch"]], Iterator["pa.RecordBatch"]]


class DecodingReader(KafkaStreamReader):
    """A reader that hands its partition's raw record batches straight to its decode function
    and returns what that yields, so a query's first pass runs inside the scan: no raw record
    becomes a Spark row, and no second Python worker receives them again.

    The function travels pickled (``decode_payload``) and is unpickled in ``read`` only. The
    reader is also unpickled by the driver's Python processes that plan and track the scan
    (Spark's data source planners and the streaming source runner, one per source table,
    alive for the query's life), and the function's stages would import pandas and polars
    into each of them. Unpickled per ``read``, never cached: the function's accumulators
    (records read, dead letters) register with the task that unpickles them, which is what
    sends their values back."""

    def __init__(self, schema: StructType, options: dict[str, str], decode_payload: bytes):
        super().__init__(schema, options)
        self.decode_payload = decode_payload

    def read(self, partition: KafkaRange | SourceEnd) -> Iterator[Any]:
        decode: DecodeFunction = pickle.loads(self.decode_payload)
        return decode(raw_batches(self.conf, partition))


def decoding_source(decode: DecodeFunction, schema: str) -> type[DataSource]:
    """A data source class of its own (a unique name) whose reader runs ``decode`` over the
    raw records and yields rows of ``schema``. One per decode pass: Spark instantiates a
    data source from its registered class, so the function travels as part of the class,
    pickled (``DecodingReader``)."""
    from pyspark import cloudpickle

    name = f"{SOURCE_NAME}-decoding-{uuid.uuid4().hex}"
    payload = cloudpickle.dumps(decode)

    class Decoding(KafkaSource):
        @classmethod
        def name(cls) -> str:
            return name

        def schema(self) -> str:
            return schema

        def streamReader(self, schema: StructType) -> DecodingReader:
            return DecodingReader(schema, dict(self.options), payload)

    return Decoding


def register(spark: SparkSession) -> None:
    spark.dataSource.register(KafkaSource)


def read_stream(
    spark: SparkSession, topics: list[str] | str, bootstrap: str, max_records_per_trigger: int | None = None, **options: str
) -> DataFrame:
    """The streaming DataFrame of raw records of ``topics`` (registers the source)."""
    register(spark)
    return _load(spark, SOURCE_NAME, topics, bootstrap, max_records_per_trigger, options)


def decoded_stream(spark: SparkSession, topics: list[str] | str, bootstrap: str,
                   decode: DecodeFunction, schema: str,
                   max_records_per_trigger: int | None = None, **options: str) -> DataFrame:
    """The streaming DataFrame of what ``decode`` makes of the raw records of ``topics``
    (Arrow batches of ``SCHEMA``'s columns in, of ``schema``'s out), run in the scan's own
    Python worker (``DecodingReader``)."""
    source = decoding_source(decode, schema)
    spark.dataSource.register(source)
    return _load(spark, source.name(), topics, bootstrap, max_records_per_trigger, options)


def _load(spark: SparkSession, fmt: str, topics: list[str] | str, bootstrap: str, max_records_per_trigger: int | None,
          options: dict[str, str]) -> DataFrame:
    reader = (
        spark.readStream.format(fmt)
        .option("topics", topics if isinstance(topics, str) else ",".join(topics))
        .option("bootstrap.servers", bootstrap)
    )
    if max_records_per_trigger:
        reader = reader.option("maxRecordsPerTrigger", str(max_records_per_trigger))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


# ---------------------------------------------------------------------------- decoding

#: ``decode_stream`` output, a frame to inspect decoding with (tests, benchmarks), never part
#: of a job's query: a decoded change has ``kind``/``row``/``pos`` (``row`` pickled: the
#: frame holds several tables' rows; ``decode_row`` reads it) and a null ``error_kind``; a
#: bad record has ``error_kind`` and ``reason`` set and keeps its original coordinates and
#: bytes for the dead-letter topic.
DECODED_SCHEMA = (
    "table string, kind string, row binary, pos array<bigint>, format string, topic string, "
    "partition int, offset bigint, timestamp timestamp, key binary, value binary, "
    "error_kind string, reason string"
)


class SourceTable:
    """What the decode step needs to know about one source table (picklable)."""

    def __init__(self, table, source_index: int, registry_url: str | None = None):
        self.table = table
        self.source_index = source_index
        self.registry_url = registry_url
        self.topic = table.options.get("topic", table.name)


def _batch_id() -> int:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    value = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
    return int(value) if value is not None else 0


def decode_records(
    records: dict[str, list[Any]], by_topic: dict[str, SourceTable], batch_id: int, decoders: dict[str, Any]
) -> dict[str, list[Any]]:
    """Decode raw records (the source's columns, as lists) into ``DECODED_SCHEMA`` columns
    (``row`` as tuples), each record's outputs in record order. A JSON table's records are decoded a batch per
    topic (``tidemark.formats.batch_decode``), others record by record. Spark-free, so the
    DLQ routing is testable without a session."""
    from tidemark.formats import decoder_for
    from tidemark.formats.batch_decode import batch_decoder_for

    out: dict[str, list[Any]] = {name: [] for name in _OUTPUT_NAMES}
    source: list[int] = []  # the record of each output
    by_record_topic: dict[str, list[int]] = {}
    for i, topic in enumerate(records["topic"]):
        by_record_topic.setdefault(topic, []).append(i)
    for topic, idx in by_record_topic.items():
        src = by_topic.get(topic)
        if src is None:
            _extend(out, source, idx, table=None, format=None, error_kind="bad_envelope",
                    reason=[f"no source table reads topic '{topic}'"] * len(idx))
            continue
        decoder = decoders.get(topic)
        if decoder is None:
            decoder = decoders[topic] = batch_decoder_for(src.table, src.registry_url) or decoder_for(src.table, src.registry_url)
        _decode_topic(decoder, src, topic, idx, records, batch_id, out, source)
    if any(a > b for a, b in zip(source, source[1:])):  # several topics: back to record order
        order = sorted(range(len(source)), key=source.__getitem__)
        source = [source[j] for j in order]
        out = {name: [col[j] for j in order] for name, col in out.items()}
    for name in RAW_COLUMNS:
        column = records[name]
        out[name] = [column[i] for i in source]
    return out


RAW_COLUMNS = ("topic", "partition", "offset", "timestamp", "key", "value")
_OUTPUT_NAMES = ("table", "format", "kind", "row", "pos", "error_kind", "reason")


def _extend(out: dict[str, list[Any]], source: list[int], idx: list[int], **columns: Any) -> None:
    """Append outputs of the records ``idx``: a column given as a list holds one value per
    output, any other value is every output's; columns not given are null."""
    source.extend(idx)
    for name in _OUTPUT_NAMES:
        value = columns.get(name)
        out[name].extend(value if isinstance(value, list) else [value] * len(idx))


def _decode_topic(
    decoder: Any, src: SourceTable, topic: str, idx: list[int], records: dict[str, list[Any]], batch_id: int,
    out: dict[str, list[Any]], source: list[int],
) -> None:
    """Append the outputs of one topic's records (``idx``) to ``out``."""
    from tidemark.formats import DecodeError
    from tidemark.formats.batch_decode import BatchDecoder

    meta = {"table": src.table.name, "format": decoder.spec.name}
    partitions, offsets = records["partition"], records["offset"]
    dead: list[tuple[int, DecodeError]] = []
    changed: list[int] = []
    kinds: list[str] = []
    rows: list[tuple] = []
    keys, values = records["key"], records["value"]
    if isinstance(decoder, BatchDecoder):
        decoded = decoder.decode([keys[i] for i in idx], [values[i] for i in idx], topic)
        dead = [(idx[j], err) for j, err in decoded.dead]
        changed = [idx[j] for j in decoded.record.to_pylist()]
        kinds, rows = decoded.kinds.to_pylist(), decoded.row_tuples()
    else:
        for i in idx:
            try:
                changes = decoder.decode(keys[i], values[i], (), topic)
            except DecodeError as err:
                dead.append((i, err))
                continue
            changed.extend(i for _ in changes)
            kinds.extend(c.kind for c in changes)
            rows.extend(c.row for c in changes)
    _extend_dead(out, source, dead, meta, topic, records)
    pos = [[batch_id, src.source_index, partitions[i], offsets[i]] for i in changed]
    _extend(out, source, changed, **meta, kind=kinds, row=rows, pos=pos)


def _extend_dead(
    out: dict[str, list[Any]], source: list[int], dead: list[tuple[int, Any]], meta: dict[str, str], topic: str,
    records: dict[str, list[Any]],
) -> None:
    """Append the outputs of the bad records ``dead`` (``(record index, DecodeError)``);
    ``meta``: their ``table`` and ``format``."""
    if not dead:
        return
    partitions, offsets = records["partition"], records["offset"]
    _extend(out, source, [i for i, _ in dead], **meta, error_kind=[err.kind for _, err in dead],
            reason=[f"{meta['table']} @ {topic}/{partitions[i]}/{offsets[i]}: {err.reason}" for i, err in dead])


def decode_columnar(
    records: pa.RecordBatch, src: SourceTable, batch_id: int, decoders: dict[str, Any]
) -> tuple[ChangeBatch, dict[str, list[Any]]] | None:
    """One table's raw records (all of its topic; the source's ``RAW_COLUMNS`` as Arrow
    columns) as a columnar ``ChangeBatch`` built straight from the batch decoder's columns,
    and the ``decode_records`` outputs of its bad records (still found record by record by
    the decoder), their source timestamps included; None when the table's format has no
    batch decoder (``decode_records`` then). Only a bad record's columns become Python
    values."""
    import pyarrow as pa

    from tidemark.formats import decoder_for
    from tidemark.formats.batch_decode import BatchDecoder, batch_decoder_for

    decoder = decoders.get(src.topic)
    if decoder is None:
        decoder = decoders[src.topic] = batch_decoder_for(src.table, src.registry_url) or decoder_for(src.table, src.registry_url)
    if not isinstance(decoder, BatchDecoder):
        return None
    decoded = decoder.decode(records.column("key"), records.column("value"), src.topic)
    record = decoded.record
    n = len(record)
    positions = [
        pa.array([batch_id] * n, pa.int64()),
        pa.array([src.source_index] * n, pa.int64()),
        records.column("partition").cast(pa.int64()).take(record),
        records.column("offset").cast(pa.int64()).take(record),
    ]
    batch = ChangeBatch.from_arrow(decoded.rows, decoded.kinds, positions)
    out: dict[str, list[Any]] = {name: [] for name in _OUTPUT_NAMES}
    bad = pa.array([i for i, _ in decoded.dead], pa.int64())
    raw = {name: records.column(name).take(bad).to_pylist() for name in RAW_COLUMNS}
    dead = [(j, err) for j, (_, err) in enumerate(decoded.dead)]  # indexes into ``raw``
    _extend_dead(out, [], dead, {"table": src.table.name, "format": decoder.spec.name}, src.topic, raw)
    return batch, {**out, **raw}


def decode_stream(raw: DataFrame, tables: list[SourceTable]) -> DataFrame:
    """Decode the source's raw records (``read_stream``) of several tables into
    ``DECODED_SCHEMA``: good changes and bad records side by side, so the job can route
    the bad ones to the dead-letter topic instead of failing. ``pos`` is ``(batch id,
    source index, partition, offset)``."""
    from pyspark.sql.types import _parse_datatype_string

    by_topic = {t.topic: t for t in tables}
    struct = _parse_datatype_string(DECODED_SCHEMA)  # parsing needs the driver's JVM

    def run(batches):
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema

        schema = to_arrow_schema(struct, timezone="UTC")
        decoders: dict[str, Any] = {}
        batch_id = _batch_id()
        for batch in batches:
            out = decode_records(batch.to_pydict(), by_topic, batch_id, decoders)
            out["row"] = [None if r is None else pickle.dumps(r, pickle.HIGHEST_PROTOCOL) for r in out["row"]]
            yield pa.RecordBatch.from_arrays([pa.array(out[n], type=schema.field(n).type) for n in schema.names], schema=schema)

    return raw.mapInArrow(run, struct)


def decode_row(data: bytes) -> tuple:
    """The row of a ``DECODED_SCHEMA`` row's ``row`` cell."""
    return pickle.loads(data)


def good_changes(decoded: DataFrame, table_name: str) -> DataFrame:
    """One table's decoded changes: ``kind``, ``row`` (``decode_row`` reads it), ``pos``."""
    from pyspark.sql import functions as F

    return decoded.where((F.col("table") == table_name) & F.col("error_kind").isNull()).select("kind", "row", "pos")


def bad_records(decoded: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    return decoded.where(F.col("error_kind").isNotNull())
