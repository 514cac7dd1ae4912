"""Read a topic to its end and fold it into what a downstream consumer would see.

"The end" is where the broker reports end-of-partition on a fetch, not what ListOffsets
says: the Tansu broker answers ListOffsets with the base offset of the last record batch
plus one (measured), which would cut off the tail of the last batch.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, TopicPartition

from tidemark.kafka.admin import partition_counts
from tidemark.kafka.config import client_config


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()

    def header(self, name: str) -> bytes | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None


def read_topic(
    bootstrap: str, topic: str, *, committed_only: bool = True, timeout_s: float = 60.0
) -> list[Record]:
    """Every record of every partition of ``topic``, partition by partition in offset
    order. ``committed_only`` reads with ``read_committed`` isolation."""
    out = list(records(bootstrap, topic, committed_only=committed_only, timeout_s=timeout_s))
    out.sort(key=lambda r: (r.partition, r.offset))
    return out


def records(
    bootstrap: str, topic: str, *, committed_only: bool = True, follow: bool = False, timeout_s: float = 60.0
) -> Iterator[Record]:
    """The records of ``topic`` from its beginning, as they are fetched (each partition in
    offset order). At the end of every partition: return, or with ``follow`` wait for more
    until the caller stops iterating. ``assign()``, no consumer group: nothing here needs
    committed offsets, and a group join is slow on the embedded broker."""
    n = partition_counts(bootstrap, [topic], timeout_s)[topic]
    consumer = Consumer(
        {
            **client_config(bootstrap),
            "group.id": f"tidemark-read-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed" if committed_only else "read_uncommitted",
            "fetch.wait.max.ms": 50,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(n)])
        pending = set(range(n))
        deadline = time.monotonic() + timeout_s
        while follow or pending:
            if not follow and time.monotonic() > deadline:
                raise TimeoutError(f"reading topic '{topic}' did not reach its end in {timeout_s:.0f}s")
            for m in consumer.consume(num_messages=10_000, timeout=0.2):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(m.partition())
                        continue
                    raise RuntimeError(f"reading topic '{topic}': {err.str()}")
                yield Record(m.topic(), m.partition(), m.offset(), m.key(), m.value(), tuple(m.headers() or ()))
    finally:
        consumer.close()


def materialize_upsert(records: list[Record]) -> dict[bytes, bytes]:
    """The table an upsert topic stands for: last value per key, tombstones delete."""
    table: dict[bytes, bytes] = {}
    for r in records:  # per partition in offset order; one key lives in one partition
        if r.key is None:
            continue
        if r.value is None:
            table.pop(r.key, None)
        else:
            table[r.key] = r.value
    return table
