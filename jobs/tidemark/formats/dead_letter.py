"""The dead-letter record (schema: ``proto/dead_letter.avsc``).

A record that cannot be decoded is never dropped: it goes to ``<pipeline>.dlq`` with its
original key and value bytes, where it came from and why. The Kafka key of a dead letter
is the source coordinate ``topic/partition/offset``: unique per source record, so a
consumer (or compaction) can tell a replayed copy from a new bad record.

Encoded as JSON by default (readable with any console consumer; bytes as base64) or as
Avro binary with the same schema (``encoding="avro"``).
"""

from __future__ import annotations

import base64
import io
import json
from dataclasses import asdict, dataclass, fields

from fastavro import schemaless_reader, schemaless_writer

from tidemark.formats.avro_schema import dead_letter_schema

ENCODINGS = ("json", "avro")


@dataclass(frozen=True)
class DeadLetter:
    pipeline: str
    table: str
    format: str
    source_topic: str
    source_partition: int
    source_offset: int
    source_timestamp_ms: int | None
    error_kind: str
    reason: str
    key: bytes | None
    value: bytes | None
    batch_id: int

    @property
    def coordinate(self) -> str:
        return f"{self.source_topic}/{self.source_partition}/{self.source_offset}"


def dlq_topic(pipeline: str) -> str:
    return f"{pipeline}.dlq"


def encode(letter: DeadLetter, encoding: str = "json") -> tuple[bytes, bytes]:
    """(Kafka key, Kafka value) of a dead letter."""
    key = letter.coordinate.encode()
    if encoding == "avro":
        buf = io.BytesIO()
        schemaless_writer(buf, dead_letter_schema(), asdict(letter))
        return key, buf.getvalue()
    if encoding != "json":
        raise ValueError(f"dead-letter encoding {encoding!r}: expected one of {', '.join(ENCODINGS)}")
    obj = asdict(letter)
    for f in ("key", "value"):
        obj[f] = None if obj[f] is None else base64.b64encode(obj[f]).decode()
    return key, json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def decode(value: bytes, encoding: str = "json") -> DeadLetter:
    if encoding == "avro":
        obj = schemaless_reader(io.BytesIO(value), dead_letter_schema(), None)
    else:
        obj = json.loads(value)
        for f in ("key", "value"):
            obj[f] = None if obj[f] is None else base64.b64decode(obj[f])
    names = {f.name for f in fields(DeadLetter)}
    return DeadLetter(**{k: v for k, v in obj.items() if k in names})
