"""Write one micro-batch's records to Kafka at most once per batch id, in one transaction.

Used by the changelog sinks and the dead-letter writer, where a replayed batch written
twice would be visible as duplicates (an upsert sink is idempotent by construction and
does not need this).

Protocol, per writer id (stable per query and sink, e.g. ``<pipeline>.<sink table>``):

1. ``transactional.id = tidemark-<writer id>``. ``init_transactions`` fences any older
   producer of the same id (a zombie driver) and aborts its open transaction.
2. The last committed batch id is read back from the compacted topic ``_tidemark_commits``
   (key = writer id, value = ``{"batch_id", "attempt", "records"}``).
3. ``write(batch_id, records)``: a batch id at or below the last committed one is skipped
   (Spark replays the batch it had not marked done; its records are already in Kafka).
   Otherwise, in ONE transaction: every record (headers ``tidemark.batch`` and
   ``tidemark.attempt``), a flush, then the commit marker, then commit.

Guarantee: on Apache Kafka, a ``read_committed`` consumer sees every batch's records
exactly once: a batch's records and its marker commit or abort together, and a committed
batch is never written again. The Tansu broker (the no-Docker embedded default) returns
records of aborted transactions to read_committed consumers too (measured), so there a
crash mid-batch leaves the aborted attempt's records visible beside the rewritten ones;
``read_exactly_once`` drops them using the headers (per batch, only the last attempt --
attempt ids start with a nanosecond timestamp -- and only batches up to the last committed
marker), which is exact on both brokers because records are flushed before the marker and
a batch is rewritten only when its marker is not visible.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from confluent_kafka import KafkaException, Producer

from tidemark.kafka.admin import ensure_topics
from tidemark.kafka.config import client_config
from tidemark.kafka.read import Record, read_topic

COMMITS_TOPIC = "_tidemark_commits"
BATCH_HEADER = "tidemark.batch"
ATTEMPT_HEADER = "tidemark.attempt"

OutRecord = tuple[str, bytes | None, bytes | None]  # (topic, key, value)


class SinkWriteError(RuntimeError):
    pass


@dataclass(frozen=True)
class WriteResult:
    batch_id: int
    written: int
    skipped: bool


def producer_config(bootstrap: str, table: Mapping[str, str] | None = None, **extra: object) -> dict[str, object]:
    """Settings every Tidemark producer shares: the operator's and the table's client
    settings (``tidemark.kafka.config``), idempotent, acks=all, and the Java client's
    partitioner, so a key lands where Java producers/consumers expect it."""
    conf: dict[str, object] = {
        **client_config(bootstrap, table=table),
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "partitioner": "murmur2_random",
        "log_level": 3,
    }
    conf.update(extra)
    return conf


class TransactionalBatchWriter:
    def __init__(self, bootstrap: str, writer_id: str, *, commits_topic: str = COMMITS_TOPIC, timeout_s: float = 60.0,
                 table: Mapping[str, str] | None = None):
        self.bootstrap = bootstrap
        self.table = table  # the sink table's client settings (``properties.*``)
        self.writer_id = writer_id
        self.commits_topic = commits_topic
        self.timeout_s = timeout_s
        self._producer: Producer | None = None
        self.last_committed = -1

    def start(self) -> Producer:
        """Initialize transactions (fencing older producers of this id) and read back the
        last committed batch id; idempotent."""
        if self._producer is None:
            ensure_topics(self.bootstrap, {self.commits_topic: 1}, compacted=True)
            producer = Producer(
                producer_config(self.bootstrap, self.table, **{"transactional.id": f"tidemark-{self.writer_id}",
                                                   "transaction.timeout.ms": int(self.timeout_s * 1000)})
            )
            producer.init_transactions(self.timeout_s)
            self.last_committed = committed_batch(self.bootstrap, self.writer_id, self.commits_topic)
            self._producer = producer
        return self._producer

    def write(self, batch_id: int, records: Iterable[OutRecord]) -> WriteResult:
        producer = self.start()
        if batch_id <= self.last_committed:
            return WriteResult(batch_id, 0, True)
        # time-ordered, so "the last attempt" is well defined across partitions
        attempt = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"
        headers = [(BATCH_HEADER, str(batch_id).encode()), (ATTEMPT_HEADER, attempt.encode())]
        errors: list[str] = []

        def on_delivery(err, msg) -> None:
            if err is not None:
                errors.append(f"{msg.topic()}: {err.str()}")

        producer.begin_transaction()
        n = 0
        try:
            for topic, key, value in records:
                while True:
                    try:
                        producer.produce(topic, value=value, key=key, headers=headers, on_delivery=on_delivery)
                        break
                    except BufferError:  # local queue full: let deliveries drain
                        producer.poll(0.1)
                n += 1
            # records first, then the marker: a visible marker implies complete records
            if producer.flush(self.timeout_s) or errors:
                raise SinkWriteError(f"batch {batch_id}: records not delivered ({'; '.join(errors[:3]) or 'timeout'})")
            marker = json.dumps({"batch_id": batch_id, "attempt": attempt, "records": n}).encode()
            producer.produce(self.commits_topic, key=self.writer_id.encode(), value=marker, on_delivery=on_delivery)
            producer.commit_transaction(self.timeout_s)
        except BaseException as err:
            try:
                producer.abort_transaction(self.timeout_s)
            except KafkaException:
                self._producer = None  # fenced or fatal: the next write re-initializes
            if isinstance(err, KafkaException):
                raise SinkWriteError(f"writer '{self.writer_id}' batch {batch_id}: {err.args[0].str()}") from None
            raise
        self.last_committed = batch_id
        return WriteResult(batch_id, n, False)

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(self.timeout_s)
            self._producer = None


def committed_batch(bootstrap: str, writer_id: str, commits_topic: str = COMMITS_TOPIC) -> int:
    """The last batch id ``writer_id`` committed (-1 if none)."""
    last = -1
    key = writer_id.encode()
    for r in read_topic(bootstrap, commits_topic):
        if r.key == key and r.value is not None:
            last = max(last, int(json.loads(r.value)["batch_id"]))
    return last


def read_exactly_once(
    bootstrap: str, topic: str, writer_id: str, commits_topic: str = COMMITS_TOPIC
) -> list[Record]:
    """The records of ``topic`` written by ``writer_id`` as an exactly-once consumer must
    see them on any broker (see the module docstring): per batch only its last attempt,
    only batches up to the last commit marker; records without Tidemark headers pass."""
    last = committed_batch(bootstrap, writer_id, commits_topic)
    records = read_topic(bootstrap, topic)
    final_attempt: dict[int, bytes] = {}
    for r in records:
        b = r.header(BATCH_HEADER)
        if b is not None:
            a = r.header(ATTEMPT_HEADER) or b""
            final_attempt[int(b)] = max(a, final_attempt.get(int(b), b""))
    out = []
    for r in records:
        b = r.header(BATCH_HEADER)
        if b is None:
            out.append(r)
        elif int(b) <= last and r.header(ATTEMPT_HEADER) == final_attempt[int(b)]:
            out.append(r)
    return out
