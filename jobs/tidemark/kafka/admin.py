"""Topic administration through confluent-kafka's AdminClient.

Only what the job and tests need: make sure topics exist (with partitions and, for
upsert/registry topics, ``cleanup.policy=compact``), read partition counts and end
offsets. Creating an existing topic is not an error, so callers can ensure topics on every
start without racing each other.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tidemark.engine.errors import TidemarkError

COMPACTED = {"cleanup.policy": "compact"}


class KafkaAdminError(TidemarkError):
    exit_status = 5


def admin_client(bootstrap: str) -> AdminClient:
    # errors surface through the futures; librdkafka's own connection logs would only be
    # noise from clients that outlive a stopped test broker
    return AdminClient({"bootstrap.servers": bootstrap, "log_level": 2})


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


def end_offsets(
    bootstrap: str, topics: Iterable[str], *, committed_only: bool = True, timeout_s: float = 10.0
) -> dict[str, dict[int, int]]:
    """``{topic: {partition: end offset}}``. With ``committed_only`` the end is the last
    stable offset (records of open transactions are not counted)."""
    counts = partition_counts(bootstrap, topics, timeout_s)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "tidemark-admin",
            "enable.auto.commit": False,
            "isolation.level": "read_committed" if committed_only else "read_uncommitted",
        }
    )
    try:
        return {
            topic: {
                p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)[1]
                for p in range(n)
            }
            for topic, n in counts.items()
        }
    finally:
        consumer.close()


def describe_cleanup_policy(bootstrap: str, topic: str, timeout_s: float = 10.0) -> str | None:
    """The topic's ``cleanup.policy`` (``compact`` for upsert sinks and registries)."""
    from confluent_kafka.admin import ConfigResource

    admin = admin_client(bootstrap)  # keep a reference: a collected client cancels its futures
    futures = admin.describe_configs([ConfigResource("topic", topic)])
    for future in futures.values():
        entry = future.result(timeout=timeout_s).get("cleanup.policy")
        return entry.value if entry is not None else None
    return None
