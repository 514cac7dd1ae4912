"""Kafka records <-> Tidemark changes, per table format (DESIGN.md "Formats").

A format is an *envelope* (what a record means as changes) over a *serde* (how its bytes
decode): ``debezium-json`` = Debezium envelope over JSON, ``upsert-avro`` = upsert
envelope over Avro, and so on. Avro is plain Avro binary with the schema derived from the
table, or Confluent's wire format when a schema registry URL is configured
(``'avro-confluent.url'`` table option, or the pipeline's registry URL) or the format
name ends in ``-confluent``.

In:
- ``debezium-*``: ``op`` c/r -> ``+I after``; u -> ``-U before, +U after``; d ->
  ``-D before``; a null value (Debezium's tombstone after a delete) is no change. The JSON
  converter's ``{"schema": ..., "payload": ...}`` wrapping is accepted.
- ``upsert-*``: key = primary key, value = row -> ``+U``; null value -> ``-D`` of the key.
- ``changelog-*``: ``{"op": "+U", ...row fields}`` (JSON) / ``{op, row}`` (Avro).
- ``json`` / ``avro``: append-only -> ``+I``.

Out (sinks): ``upsert-*`` writes key = sink PK and the row, a tombstone for ``-D`` and
nothing for ``-U`` (the following ``+U`` overwrites the key); ``changelog-*`` writes every
change with its kind, keyed by the PK so one key's changes stay in one partition.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from tidemark.engine.catalog import TableDef
from tidemark.engine.changelog import DELETE, INSERT, KINDS, UPDATE_AFTER, UPDATE_BEFORE, Change
from tidemark.engine.options import REGISTRY_OPTIONS
from tidemark.formats import avro_schema
from tidemark.formats.errors import DecodeError, FormatError
from tidemark.formats.rows import RowCodec
from tidemark.formats.serde import AvroSerde, ConfluentAvroSerde, JsonSerde

ENVELOPES = ("debezium", "upsert", "changelog", "append")
AVRO_KIND = {"INSERT": INSERT, "UPDATE_BEFORE": UPDATE_BEFORE, "UPDATE_AFTER": UPDATE_AFTER, "DELETE": DELETE}
KIND_AVRO = {v: k for k, v in AVRO_KIND.items()}
SINK_FORMATS = ("upsert-json", "upsert-avro", "changelog-json", "changelog-avro")


@dataclass(frozen=True)
class FormatSpec:
    name: str  # as declared, lower-cased
    envelope: str  # debezium | upsert | changelog | append
    encoding: str  # json | avro | avro-confluent


def parse_format(table: TableDef, registry_url: str | None = None) -> tuple[FormatSpec, str | None]:
    """Split a table's format into envelope and encoding, and find its registry URL."""
    fmt = (table.format or "json").lower()
    base, confluent = (fmt[: -len("-confluent")], True) if fmt.endswith("-confluent") else (fmt, False)
    envelopes = {
        "json": ("append", "json"),
        "avro": ("append", "avro"),
        "debezium-json": ("debezium", "json"),
        "debezium-avro": ("debezium", "avro"),
        "upsert-json": ("upsert", "json"),
        "upsert-avro": ("upsert", "avro"),
        "changelog-json": ("changelog", "json"),
        "changelog-avro": ("changelog", "avro"),
    }
    if base not in envelopes or (confluent and envelopes[base][1] != "avro"):
        known = sorted(envelopes) + ["avro-confluent", "debezium-avro-confluent", "upsert-avro-confluent"]
        raise FormatError(
            f"table '{table.name}': format '{fmt}' is not supported on Kafka (supported: {', '.join(known)})"
        )
    envelope, encoding = envelopes[base]
    url = next((table.options[o] for o in REGISTRY_OPTIONS if table.options.get(o)), None)
    url = url or registry_url or os.environ.get("TIDEMARK_SCHEMA_REGISTRY_URL") or None
    if encoding == "avro" and (confluent or url):
        if not url:
            raise FormatError(
                f"table '{table.name}': format '{fmt}' needs a schema registry URL "
                "(set 'avro-confluent.url' in the table's WITH options)"
            )
        encoding = "avro-confluent"
    return FormatSpec(fmt, envelope, encoding), url


def _serdes(table: TableDef, spec: FormatSpec, url: str | None) -> tuple[Any, Any]:
    """(key serde, value serde) for a table."""
    if spec.encoding == "json":
        return JsonSerde(), JsonSerde()
    if spec.envelope == "debezium":
        value_schema = avro_schema.debezium_schema(table)
    elif spec.envelope == "changelog":
        value_schema = avro_schema.changelog_schema(table)
    else:
        value_schema = avro_schema.row_schema(table)
    key_schema = avro_schema.key_schema(table) if table.primary_key else None
    if spec.encoding == "avro":
        return (AvroSerde(key_schema) if key_schema else None), AvroSerde(value_schema)
    assert url is not None
    key = ConfluentAvroSerde(url, key_schema, is_key=True) if key_schema else None
    return key, ConfluentAvroSerde(url, value_schema)


class Decoder:
    """Decodes one Kafka record of a source table into its changes. ``decode`` raises
    ``DecodeError`` for a record that must go to the dead-letter topic."""

    def __init__(self, table: TableDef, registry_url: str | None = None):
        self.table = table
        self.spec, url = parse_format(table, registry_url)
        self.rows = RowCodec(table)
        self.key_serde, self.value_serde = _serdes(table, self.spec, url)
        self.topic = table.options.get("topic", table.name)
        if self.spec.envelope == "upsert" and not table.primary_key:
            raise FormatError(f"table '{table.name}': format '{self.spec.name}' needs a PRIMARY KEY")

    def decode(self, key: bytes | None, value: bytes | None, pos: tuple = (), topic: str | None = None) -> list[Change]:
        topic = topic or self.topic
        envelope = self.spec.envelope
        if envelope == "upsert":
            return self._upsert(key, value, pos, topic)
        if value is None:
            if envelope == "debezium":
                return []  # Debezium's tombstone follows a delete; it carries no change
            raise DecodeError("null value (a tombstone) in a topic that is not upsert or Debezium", "bad_envelope")
        obj = self.value_serde.decode(value, "value", topic)
        if envelope == "debezium":
            return self._debezium(obj, pos)
        if envelope == "changelog":
            return self._changelog(obj, pos)
        return [Change(INSERT, self.rows.row(obj, "value"), pos)]

    # ------------------------------------------------------------------ envelopes
    def _debezium(self, obj: Any, pos: tuple) -> list[Change]:
        if isinstance(obj, dict) and "payload" in obj and "schema" in obj and "op" not in obj:
            obj = obj["payload"]  # JSON converter with schemas.enable=true
        if not isinstance(obj, dict):
            raise DecodeError(f"value: expected a Debezium envelope object, got {type(obj).__name__}", "bad_envelope")
        if "op" not in obj:
            raise DecodeError('value: Debezium envelope without "op"', "unknown_op")
        op = obj["op"]
        ts = obj.get("ts_ms")
        if ts is not None and (isinstance(ts, bool) or not isinstance(ts, int)):
            raise DecodeError(f'value: "ts_ms" must be an integer, got {ts!r}', "wrong_type")
        if op in ("c", "r"):
            return [Change(INSERT, self._image(obj, "after", op), pos)]
        if op == "u":
            return [
                Change(UPDATE_BEFORE, self._image(obj, "before", op), pos),
                Change(UPDATE_AFTER, self._image(obj, "after", op), pos),
            ]
        if op == "d":
            return [Change(DELETE, self._image(obj, "before", op), pos)]
        raise DecodeError(f"value: unknown Debezium op {op!r} (expected c, r, u or d)", "unknown_op")

    def _image(self, obj: dict, field: str, op: str) -> tuple:
        image = obj.get(field)
        if image is None:
            hint = (
                " (for Postgres, set the table's REPLICA IDENTITY to FULL)" if field == "before" else ""
            )
            raise DecodeError(f'value: Debezium op "{op}" without "{field}"{hint}', "bad_envelope")
        return self.rows.row(image, field)

    def _changelog(self, obj: Any, pos: tuple) -> list[Change]:
        if not isinstance(obj, dict):
            raise DecodeError(f"value: expected an object, got {type(obj).__name__}", "bad_envelope")
        if self.spec.encoding == "json":
            if "op" not in obj:
                raise DecodeError('value: changelog record without "op"', "unknown_op")
            kind = obj["op"]
            row_obj = {k: v for k, v in obj.items() if k != "op"}
        else:
            kind = AVRO_KIND.get(obj.get("op"), obj.get("op"))
            row_obj = obj.get("row")
        if kind not in KINDS:
            raise DecodeError(f"value: unknown op {kind!r} (expected one of {', '.join(KINDS)})", "unknown_op")
        return [Change(kind, self.rows.row(row_obj, "value"), pos)]

    def _upsert(self, key: bytes | None, value: bytes | None, pos: tuple, topic: str) -> list[Change]:
        key_obj = None
        if key is not None:
            key_obj = self.key_serde.decode(key, "key", topic)
            if not isinstance(key_obj, dict) and len(self.rows.pk) == 1:
                key_obj = {self.rows.pk_names[0]: key_obj}  # a bare scalar key of a one-column PK
        if value is None:
            if key_obj is None:
                raise DecodeError("tombstone (null value) without a key: nothing to delete", "missing_pk")
            return [Change(DELETE, self.rows.key_row(key_obj, "key"), pos)]
        obj = self.value_serde.decode(value, "value", topic)
        if isinstance(obj, dict) and isinstance(key_obj, dict):
            missing = {k: v for k, v in key_obj.items() if k not in obj}
            obj = {**obj, **missing} if missing else obj
        return [Change(UPDATE_AFTER, self.rows.row(obj, "value"), pos)]


class Encoder:
    """Encodes the changes of a sink table as Kafka records. ``encode`` returns
    ``(key, value)`` or None when the change is not written (``-U`` of an upsert sink)."""

    def __init__(self, table: TableDef, registry_url: str | None = None):
        self.table = table
        self.spec, url = parse_format(table, registry_url)
        if self.spec.envelope not in ("upsert", "changelog"):
            raise FormatError(
                f"sink table '{table.name}': format '{self.spec.name}' cannot be written "
                f"(sink formats: {', '.join(SINK_FORMATS)}, Avro ones also with -confluent)"
            )
        if self.spec.envelope == "upsert" and not table.primary_key:
            raise FormatError(f"sink table '{table.name}': format '{self.spec.name}' needs a PRIMARY KEY")
        self.rows = RowCodec(table)
        self.key_serde, self.value_serde = _serdes(table, self.spec, url)
        self.topic = table.options.get("topic", table.name)
        self.upsert = self.spec.envelope == "upsert"

    def encode_key(self, row: tuple, topic: str | None = None) -> bytes | None:
        if not self.table.primary_key:
            return None
        if self.spec.encoding == "json":
            return self.key_serde.encode(self.rows.key_to_json(row))
        return self.key_serde.encode(self.rows.key_to_record(row), topic or self.topic)

    def encode(self, change: Change, topic: str | None = None) -> tuple[bytes | None, bytes | None] | None:
        kind, row = change.kind, change.row
        topic = topic or self.topic
        if self.upsert:
            if kind == UPDATE_BEFORE:
                return None
            key = self.encode_key(row, topic)
            if kind == DELETE:
                return key, None
            return key, self._row_bytes(row, topic)
        key = self.encode_key(row, topic)
        if self.spec.encoding == "json":
            return key, self.value_serde.encode({"op": kind, **self.rows.to_json(row)})
        return key, self.value_serde.encode({"op": KIND_AVRO[kind], "row": self.rows.to_record(row)}, topic)

    def _row_bytes(self, row: tuple, topic: str) -> bytes:
        if self.spec.encoding == "json":
            return self.value_serde.encode(self.rows.to_json(row))
        return self.value_serde.encode(self.rows.to_record(row), topic)


def decoder_for(table: TableDef, registry_url: str | None = None) -> Decoder:
    return Decoder(table, registry_url)


def encoder_for(table: TableDef, registry_url: str | None = None) -> Encoder:
    return Encoder(table, registry_url)
