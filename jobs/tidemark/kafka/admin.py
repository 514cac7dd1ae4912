"""Topic administration through confluent-kafka's AdminClient.

Only what the job and tests need: make sure topics exist (with partitions and, for
upsert/registry topics, ``cleanup.policy=compact``), read partition counts and end
offsets. Creating an existing topic is not an error, so callers can ensure topics on every
start without racing each other.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tidemark.engine.errors import TidemarkError
from tidemark.kafka.config import client_config

COMPACTED = {"cleanup.policy": "compact"}
#: the consumer settings ``stable_end_offsets`` needs. A fetch at the end of a partition
#: waits up to ``fetch.wait.max.ms`` for new records before the broker answers, and that
#: answer is the end of partition the probe waits for when a partition has nothing new.
#: Shorter is not safe on the embedded broker: at 1 ms a busy partition's end was never
#: reported, and at 0 no partition's (docs/benchmarks.md, "The end-of-partition probe").
END_PROBE = {"enable.partition.eof": True, "fetch.wait.max.ms": 10}
#: records (and end-of-partition events) ``stable_end_offsets`` takes from the queue at once
_PROBE_BATCH = 10_000
#: how long ``stable_end_offsets`` still waits for the end-of-partition of a partition that
#: delivered records: a transaction's commit marker after the last record is part of that
#: end, and an end before the marker would make the next batch an empty one
_SETTLE_S = 0.05


class KafkaAdminError(TidemarkError):
    exit_status = 5


def admin_client(bootstrap: str) -> AdminClient:
    # errors surface through the futures; librdkafka's own connection logs would only be
    # noise from clients that outlive a stopped test broker
    return AdminClient({**client_config(bootstrap), "log_level": 2})


def ensure_topics(
    bootstrap: str,
    topics: Mapping[str, int] | Iterable[str],
    *,
    compacted: bool = False,
    config: Mapping[str, str] | None = None,
    timeout_s: float = 30.0,
) -> None:
    """Create each topic that does not exist yet. ``topics`` maps name -> partitions (or
    is a list of names: one partition each). Existing topics are left as they are."""
    wanted = dict(topics) if isinstance(topics, Mapping) else {t: 1 for t in topics}
    if not wanted:
        return
    cfg = dict(COMPACTED if compacted else {})
    cfg.update(config or {})
    admin = admin_client(bootstrap)
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=n, replication_factor=1, config=cfg) for name, n in wanted.items()],
        operation_timeout=timeout_s,
        request_timeout=timeout_s,
    )
    for name, future in futures.items():
        try:
            future.result(timeout=timeout_s)
        except KafkaException as err:
            if err.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise KafkaAdminError(f"cannot create topic '{name}' on {bootstrap}: {err.args[0].str()}") from None


def delete_topics(bootstrap: str, topics: Iterable[str], timeout_s: float = 30.0) -> None:
    names = list(topics)
    if not names:
        return
    admin = admin_client(bootstrap)
    for name, future in admin.delete_topics(names, operation_timeout=timeout_s).items():
        try:
            future.result(timeout=timeout_s)
        except KafkaException as err:
            if err.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise KafkaAdminError(f"cannot delete topic '{name}': {err.args[0].str()}") from None


def partition_counts(bootstrap: str, topics: Iterable[str], timeout_s: float = 10.0) -> dict[str, int]:
    """Partitions per topic; raises KafkaAdminError naming a topic that does not exist."""
    names = list(topics)
    md = admin_client(bootstrap).list_topics(timeout=timeout_s)
    out: dict[str, int] = {}
    for name in names:
        t = md.topics.get(name)
        if t is None or t.error is not None or not t.partitions:
            raise KafkaAdminError(f"topic '{name}' does not exist on {bootstrap}")
        out[name] = len(t.partitions)
    return out


def stable_end_offsets(
    consumer: Consumer,
    partitions: Iterable[tuple[str, int]],
    known: Mapping[tuple[str, int], int] | None = None,
    timeout_s: float = 30.0,
) -> dict[tuple[str, int], int]:
    """The end of each partition as a ``read_committed`` consumer sees it: the last
    stable offset (nothing of an open transaction), or an offset before it that is stable too.
    ``consumer`` must be configured with ``END_PROBE``; its assignment is replaced and then
    cleared.

    The end is found by a *fetch*, not taken from ListOffsets, because the Tansu broker's
    ListOffsets is wrong (measured: the base offset of the last record batch + 1, and 0 while
    a transaction is open). So one fetch per partition, starting at the later of ``known`` (an
    offset known to be stable, e.g. the previous end) and ListOffsets' answer - 1: on Apache
    Kafka that reads one record, on Tansu at most the last record batch and what is new. The
    end is where the fetch reports end-of-partition; a partition that delivers records first
    ends after the last record delivered with them, since a ``read_committed`` consumer only
    receives stable records, unless its end-of-partition follows within ``_SETTLE_S``. Waiting
    longer on a partition written without pause would chase its writer: each fetch at its end
    waits ``fetch.wait.max.ms`` for new records and gets them. A partition that neither
    delivers records nor reports its end in time keeps its ``known`` offset (or its low
    watermark): it does not advance rather than guess."""
    known = known or {}
    listed = {tp: consumer.get_watermark_offsets(TopicPartition(*tp), timeout=timeout_s) for tp in partitions}
    begin = {tp: max(lo, hi - 1, known.get(tp, lo)) for tp, (lo, hi) in listed.items()}
    if not begin:
        return {}
    consumer.assign([TopicPartition(t, p, off) for (t, p), off in begin.items()])
    ends: dict[tuple[str, int], int] = {}
    delivered: dict[tuple[str, int], int] = {}
    deadline = time.monotonic() + timeout_s
    settling = False  # every partition has an end or records: the deadline is _SETTLE_S away
    try:
        while len(ends) < len(begin) and (left := deadline - time.monotonic()) > 0:
            first = consumer.poll(min(0.2, left))
            if first is None:
                continue
            # with what else is queued: the end-of-partition of a fetch that also delivered records
            for m in (first, *consumer.consume(_PROBE_BATCH, timeout=0)):
                tp = (m.topic(), m.partition())
                if m.error() is None:
                    delivered[tp] = m.offset() + 1
                elif m.error().code() == KafkaError._PARTITION_EOF:
                    ends[tp] = m.offset()
            if not settling and all(tp in ends or tp in delivered for tp in begin):
                settling, deadline = True, min(deadline, time.monotonic() + _SETTLE_S)
    finally:
        consumer.unassign()
    return {tp: ends.get(tp, delivered.get(tp, known.get(tp, listed[tp][0]))) for tp in begin}


def end_offsets(
    bootstrap: str, topics: Iterable[str], *, committed_only: bool = True, timeout_s: float = 10.0
) -> dict[str, dict[int, int]]:
    """``{topic: {partition: end offset}}``. With ``committed_only`` the end is the last
    stable offset (records of open transactions are not counted). See
    ``stable_end_offsets`` for why this fetches rather than trusting ListOffsets."""
    counts = partition_counts(bootstrap, topics, timeout_s)
    consumer = Consumer(
        {
            **client_config(bootstrap),
            "group.id": "tidemark-admin",
            "enable.auto.commit": False,
            **END_PROBE,
            "isolation.level": "read_committed" if committed_only else "read_uncommitted",
        }
    )
    try:
        ends = stable_end_offsets(consumer, [(t, p) for t, n in counts.items() for p in range(n)], timeout_s=timeout_s)
    finally:
        consumer.close()
    out: dict[str, dict[int, int]] = {t: {} for t in counts}
    for (t, p), off in ends.items():
        out[t][p] = off
    return out


def describe_cleanup_policy(bootstrap: str, topic: str, timeout_s: float = 10.0) -> str | None:
    """The topic's ``cleanup.policy`` (``compact`` for upsert sinks and registries)."""
    from confluent_kafka.admin import ConfigResource

    admin = admin_client(bootstrap)  # keep a reference: a collected client cancels its futures
    futures = admin.describe_configs([ConfigResource("topic", topic)])
    for future in futures.values():
        entry = future.result(timeout=timeout_s).get("cleanup.policy")
        return entry.value if entry is not None else None
    return None
