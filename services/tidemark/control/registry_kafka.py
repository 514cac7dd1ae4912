"""The registry topic on Kafka: create it, load it, tail it, write to it.

One partition (the state machine in ``registry_log`` needs one total order), compacted
(key = pipeline name, tombstone on delete). The topic is read with ``assign()`` from
offset 0 -- no consumer group, so no rebalance wait (slow on Tansu) and no committed
offsets: every service always replays the whole (compacted) topic.

Writes are produced one record per request (``batch.num.messages=1``): Tansu reports the
high watermark of a multi-record batch as its base offset + 1, which would make "read up
to the high watermark" stop short.

Every record written is signed (``registry_signing``); a record read back without a valid
signature, or one the state machine finds invalid, is skipped, counted in ``rejected`` and
logged once (each record is read once).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tidemark.control import registry_signing
from tidemark.control.registry_log import RegistryState
from tidemark.control.registry_signing import SigningKey
from tidemark.kafka.config import client_config

log = logging.getLogger("tidemark.control.registry")

T = TypeVar("T")


class RegistryUnavailable(Exception):
    """The broker did not take or return a registry write in time."""


class KafkaRegistry:
    def __init__(self, bootstrap_servers: str, topic: str, key: SigningKey, *, lease_grace_s: float = 2.0,
                 timeout_s: float = 10.0, sql_check: Callable[[str], object] | None = None):
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.timeout_s = timeout_s
        self._key = key
        self.state = RegistryState(grace_s=lease_grace_s, sql_check=sql_check)
        self.rejected = {"signature": 0, "invalid": 0}  # records skipped, by why
        self.loaded = False
        self.load_error: str | None = None
        self._applied = -1  # offset of the last applied record
        self._last_offset_by_key: dict[str, int] = {}
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        common = {"client.id": "tidemark-control", **client_config(bootstrap_servers), "logger": log}
        self._admin = AdminClient(common)
        self._producer = Producer({**common, "acks": "all", "linger.ms": 0, "batch.num.messages": 1,
                                   "message.timeout.ms": int(timeout_s * 1000)})
        self._consumer: Consumer | None = None
        self._reachable_at = 0.0
        self._reachable: str | None = "not checked yet"

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="registry-tail", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(10)
        self._producer.flush(5)
        self._producer.close()
        self._admin = None  # dropping the last reference closes the admin client

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._ensure_topic()
                self._tail()
                return
            except KafkaException as exc:
                self.load_error = f"registry topic '{self.topic}' on {self.bootstrap_servers}: {exc.args[0]}"
                log.warning("%s; retrying", self.load_error)
                self._stop.wait(2.0)

    def _ensure_topic(self) -> None:
        futures = self._admin.create_topics(
            [NewTopic(self.topic, num_partitions=1, replication_factor=-1,
                      config={"cleanup.policy": "compact"})],
            request_timeout=self.timeout_s,
        )
        try:
            futures[self.topic].result()
            log.info("created registry topic %s", self.topic)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
        meta = self._admin.list_topics(self.topic, timeout=self.timeout_s)
        parts = meta.topics[self.topic].partitions
        if len(parts) != 1:
            # not retryable: a registry needs one total order of records
            self.load_error = (f"registry topic '{self.topic}' has {len(parts)} partitions; it needs exactly 1 "
                               "(the order of records decides races between control services)")
            log.error(self.load_error)
            self._stop.set()

    def _tail(self) -> None:
        if self._stop.is_set():
            return
        consumer = Consumer({"client.id": "tidemark-control", **client_config(self.bootstrap_servers),
                             "group.id": "tidemark-control-unused", "enable.auto.commit": False,
                             "enable.partition.eof": False, "logger": log})
        self._consumer = consumer
        tp = TopicPartition(self.topic, 0)
        _, high = consumer.get_watermark_offsets(tp, timeout=self.timeout_s)
        consumer.assign([TopicPartition(self.topic, 0, 0)])
        if high <= 0:
            self._mark_loaded()
        try:
            while not self._stop.is_set():
                msg = consumer.poll(0.2)
                if msg is None:
                    continue
                if msg.error():
                    log.warning("registry read: %s", msg.error())
                    continue
                raw_key = msg.key() or b""
                key = raw_key.decode("utf-8", errors="replace")
                signed = registry_signing.verified(self._key, raw_key, msg.value(), msg.headers())
                with self._cond:
                    why = self.state.apply(key, msg.value()) if signed else "missing or bad signature"
                    if why is not None:
                        self.rejected["invalid" if signed else "signature"] += 1
                    else:  # a skipped record must not stop a repair (see Controller._repair)
                        self._last_offset_by_key[key] = msg.offset()
                    self._applied = msg.offset()
                    self._cond.notify_all()
                if why is not None:
                    log.warning("registry record at offset %d (key %r) skipped: %s", msg.offset(), key[:80], why)
                if not self.loaded and msg.offset() + 1 >= high:
                    self._mark_loaded()
        finally:
            consumer.close()

    def _mark_loaded(self) -> None:
        self.loaded, self.load_error = True, None
        with self._cond:
            n = len(self.state.pipelines)
        log.info("registry loaded from %s: %d pipeline(s)", self.topic, n)

    # -- writes ---------------------------------------------------------------------------

    def write(self, key: str, value: bytes | None) -> int:
        """Produce one record and wait until this service has applied it; returns its offset."""
        result: dict = {}
        done = threading.Event()

        def delivered(err, msg) -> None:
            result["err"], result["offset"] = err, (msg.offset() if msg is not None else None)
            done.set()

        try:
            self._producer.produce(self.topic, key=key.encode(), value=value, partition=0, on_delivery=delivered,
                                   headers=registry_signing.headers(self._key, key.encode(), value))
        except (KafkaException, BufferError) as exc:
            raise RegistryUnavailable(f"registry write failed: {exc}") from exc
        deadline = time.monotonic() + self.timeout_s
        while not done.is_set() and time.monotonic() < deadline:
            self._producer.poll(0.1)
        if not done.is_set() or result["err"] is not None:
            raise RegistryUnavailable(f"registry write to '{self.topic}' failed: {result.get('err') or 'timed out'}")
        offset = int(result["offset"])
        with self._cond:
            if not self._cond.wait_for(lambda: self._applied >= offset, timeout=max(0.1, deadline - time.monotonic())):
                raise RegistryUnavailable(f"registry record {offset} was written but not read back in time")
        return offset

    def outcome(self, request_id: str) -> bool:
        with self._cond:
            return self.state.accepted.get(request_id, False)

    def is_latest(self, key: str, offset: int) -> bool:
        with self._cond:
            return self._last_offset_by_key.get(key) == offset

    def new_request_id(self) -> str:
        return uuid.uuid4().hex

    # -- reads ----------------------------------------------------------------------------

    def read(self, fn: Callable[[RegistryState], T]) -> T:
        """Run ``fn(state)`` under the registry lock (the tail thread mutates the state)."""
        with self._cond:
            return fn(self.state)

    def reachable(self) -> str | None:
        """None when the broker answered a metadata request in the last second, else why not."""
        if self._admin is None:
            return "the control service is shutting down"
        now = time.monotonic()
        if now - self._reachable_at > 1.0:
            try:
                self._admin.list_topics(self.topic, timeout=2.0)
                self._reachable = None
            except KafkaException as exc:
                self._reachable = f"broker {self.bootstrap_servers} unreachable: {exc.args[0]}"
            self._reachable_at = now
        return self._reachable
