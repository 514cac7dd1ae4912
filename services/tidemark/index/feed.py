"""One registered table: a consumer thread that follows its topic from the beginning into a
``TableIndex``, and the condition lookups wait on until offsets are applied.

The consumer uses ``assign()`` on every partition (no consumer group: group subscribe is
slow on the Tansu broker and the index needs every partition anyway) and decodes records
with the table's format (``tidemark.formats``), so Debezium envelopes, upsert tombstones
and changelog records mean what they mean to the job. A record that does not decode is
counted and skipped (the job sends it to its dead-letter topic; the index must not stop).
"Caught up" is the end of every partition measured when the feed started.

Measuring that end is retried with capped exponential backoff while it fails (typically:
the topic does not exist yet), so a table registered before its topic starts loading once
the topic appears; meanwhile ``error`` says why, lookups waiting on it fail at once, and
``retry_now()`` (the table registered again) cuts the backoff short. An error after the
load started stops the feed for good (``failed``); registering the table again then
replaces it with a new feed.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Mapping

import tenacity
from confluent_kafka import Consumer, KafkaError, TopicPartition

from tidemark.engine.catalog import TableDef
from tidemark.formats import DecodeError, decoder_for
from tidemark.index_client.local import index_for
from tidemark.index_client.store import TableIndex
from tidemark.kafka.admin import end_offsets
from tidemark.kafka.config import client_config, table_properties

log = logging.getLogger("tidemark.index.feed")


class TableFeed:
    def __init__(self, table: TableDef, topic: str, bootstrap: str, keep_history: bool = True,
                 backoff_s: tuple[float, float] = (0.5, 30.0)):
        self.table = table
        self.topic = topic
        self.bootstrap = bootstrap
        self.index: TableIndex = index_for(table, keep_history)
        self.decoder = decoder_for(table)
        self.cond = threading.Condition()
        self.initial_end: dict[int, int] | None = None
        self.error: str | None = None
        self.records = 0
        self.bad_records = 0
        self.backoff_s = backoff_s
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"index-feed-{table.name}", daemon=True)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def retry_now(self) -> None:
        """End a backoff between attempts to measure the topic's end (no-op otherwise)."""
        self._wake.set()

    @property
    def failed(self) -> bool:
        """Stopped on an error: nothing will be applied any more."""
        return self.error is not None and self._thread.ident is not None and not self._thread.is_alive()

    @property
    def ready(self) -> bool:
        with self.cond:
            return self.initial_end is not None and self.index.caught_up(self.initial_end)

    def _run(self) -> None:
        try:
            ends = self._initial_end_offsets()
            with self.cond:
                self.error = None
                self.initial_end = dict(ends)
                for p in ends:
                    self.index.mark_applied(p, 0)
                self.cond.notify_all()
            consumer = Consumer({
                **client_config(self.bootstrap, table=table_properties(self.table.options)),
                "group.id": f"tidemark-index-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": 20,
                "log_level": 2,
            })  # fmt: skip
            try:
                consumer.assign([TopicPartition(self.topic, p, 0) for p in sorted(ends)])
                while not self._stop.is_set():
                    msgs = consumer.consume(num_messages=5000, timeout=0.1)
                    if msgs:
                        self._apply(msgs)
                    self._advance_to_positions(consumer)
            finally:
                consumer.close()
        except Exception as exc:  # keep serving what is loaded; /readyz reports the failure
            if self._stop.is_set():
                return  # stopped while retrying: the error is no news
            log.exception("index feed of table '%s' failed", self.table.name)
            with self.cond:
                self.error = f"{type(exc).__name__}: {exc}"
                self.cond.notify_all()

    def _initial_end_offsets(self) -> dict[int, int]:
        lo, hi = self.backoff_s
        retrying = tenacity.Retrying(
            stop=lambda _state: self._stop.is_set(),
            wait=tenacity.wait_exponential(multiplier=lo, min=lo, max=hi),
            sleep=self._sleep,
            before_sleep=self._retrying,
            reraise=True,
        )
        return retrying(lambda: end_offsets(self.bootstrap, [self.topic])[self.topic])

    def _sleep(self, seconds: float) -> None:
        self._wake.wait(seconds)
        self._wake.clear()

    def _retrying(self, state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        delay = state.next_action.sleep if state.next_action else 0.0
        log.warning("table '%s': cannot read topic '%s' yet (%s); retry %d in %.1fs",
                    self.table.name, self.topic, exc, state.attempt_number, delay)
        with self.cond:
            self.error = f"{type(exc).__name__}: {exc} (retrying in {delay:.1f}s, or when registered again)"
            self.cond.notify_all()

    def _apply(self, msgs: list) -> None:
        with self.cond:
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        log.warning("table '%s': %s", self.table.name, err.str())
                    continue
                p, off = m.partition(), m.offset()
                try:
                    changes = self.decoder.decode(m.key(), m.value(), (p, off), m.topic())
                except DecodeError as exc:
                    self.bad_records += 1
                    log.warning("table '%s' %s[%d]@%d skipped: %s", self.table.name, self.topic, p, off, exc)
                    changes = []
                self.records += 1
                self.index.apply(changes, p, off)
            self.cond.notify_all()

    def _advance_to_positions(self, consumer: Consumer) -> None:
        """Offsets with no record for us (transaction markers, compacted gaps) count as
        applied once the consumer's position is past them."""
        try:
            positions = consumer.position(consumer.assignment())
        except Exception:
            return
        moved = False
        with self.cond:
            for tp in positions:
                if tp.offset is not None and tp.offset >= 0 and tp.offset > self.index.applied.get(tp.partition, 0):
                    self.index.mark_applied(tp.partition, tp.offset)
                    moved = True
            if moved:
                self.cond.notify_all()

    # ------------------------------------------------------------------ waiting

    def applied_all(self, offsets: Mapping[int, int]) -> bool:
        with self.cond:
            return self.index.caught_up(offsets)

    def wait_applied(self, offsets: Mapping[int, int], timeout_s: float) -> bool:
        """Block until every ``offsets[p]`` is applied (True) or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while not self.index.caught_up(offsets):
                left = deadline - time.monotonic()
                if left <= 0 or self.error is not None:
                    return False
                self.cond.wait(left)
            return True
