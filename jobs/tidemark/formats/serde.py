"""Bytes <-> decoded objects (dicts), one class per wire encoding.

The change semantics (Debezium, upsert, changelog, append) live in ``envelopes``; they
work on the dicts these produce, so every envelope works over JSON, plain Avro and
Confluent-framed Avro alike. Any failure to decode bytes is a ``DecodeError`` of kind
``undecodable``.
"""

from __future__ import annotations

import io
import json
import threading
import warnings
from typing import Any

from fastavro import parse_schema, schemaless_reader, schemaless_writer

from tidemark.formats.avro_schema import schema_json
from tidemark.formats.errors import DecodeError, FormatError


class JsonSerde:
    name = "json"

    def decode(self, data: bytes, where: str = "value", topic: str = "") -> Any:
        try:
            return json.loads(data)
        except UnicodeDecodeError as err:
            raise DecodeError(f"{where}: not UTF-8 text ({err.reason} at byte {err.start})", "undecodable") from None
        except json.JSONDecodeError as err:
            raise DecodeError(f"{where}: malformed JSON: {err.msg} (line {err.lineno}, column {err.colno})", "undecodable") from None

    def encode(self, obj: Any, topic: str = "") -> bytes:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


class AvroSerde:
    """Plain Avro binary (no framing): writer and reader share the schema derived from the
    table, as Flink's ``avro`` format does."""

    name = "avro"

    def __init__(self, schema: dict[str, Any]):
        self.schema = parse_schema(schema)

    def decode(self, data: bytes, where: str = "value", topic: str = "") -> Any:
        buf = io.BytesIO(data)
        try:
            obj = schemaless_reader(buf, self.schema, None)
        except Exception as err:  # fastavro raises EOFError, ValueError, IndexError...
            raise DecodeError(f"{where}: undecodable Avro ({type(err).__name__}: {err})", "undecodable") from None
        if buf.tell() != len(data):
            raise DecodeError(
                f"{where}: undecodable Avro ({len(data) - buf.tell()} trailing bytes after the record)",
                "undecodable",
            )
        return obj

    def encode(self, obj: Any, topic: str = "") -> bytes:
        buf = io.BytesIO()
        schemaless_writer(buf, self.schema, obj)
        return buf.getvalue()


def _quiet_registry_import() -> Any:
    """Import confluent-kafka's schema registry package without authlib's "httpx is
    deprecated" notice (authlib installs an "always" filter on import, so the notice
    is silenced after that import, not before)."""
    with warnings.catch_warnings():
        try:
            import authlib.deprecate  # noqa: F401
        except ImportError:
            pass
        warnings.simplefilter("ignore")
        import confluent_kafka.schema_registry as registry
        import confluent_kafka.schema_registry.avro  # noqa: F401
    return registry


_clients: dict[str, Any] = {}
_clients_lock = threading.Lock()


def registry_client(url: str) -> Any:
    """One schema registry client per URL and process (``mock://`` clients keep their
    schemas in the client object, so sharing it is what lets a test read what it wrote)."""
    with _clients_lock:
        client = _clients.get(url)
        if client is None:
            client = _quiet_registry_import().SchemaRegistryClient.new_client({"url": url})
            _clients[url] = client
        return client


class ConfluentAvroSerde:
    """Avro in Confluent's wire format (magic byte, schema id, Avro body) through
    confluent-kafka's schema registry serializers. Writes register the derived schema under
    the topic's ``-key``/``-value`` subject; reads use the writer schema the id names."""

    name = "avro-confluent"

    def __init__(self, url: str, schema: dict[str, Any], is_key: bool = False):
        if not url:
            raise FormatError("a Confluent Avro format needs a schema registry URL ('avro-confluent.url')")
        _quiet_registry_import()
        from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
        from confluent_kafka.serialization import MessageField, SerializationContext
        self._ctx = SerializationContext
        self._field = MessageField.KEY if is_key else MessageField.VALUE
        client = registry_client(url)
        self._ser = AvroSerializer(client, schema_json(schema), conf={"auto.register.schemas": True})
        self._de = AvroDeserializer(client)

    def decode(self, data: bytes, where: str = "value", topic: str = "") -> Any:
        try:
            return self._de(data, self._ctx(topic, self._field))
        except Exception as err:  # SerializationError, SchemaRegistryError, fastavro errors
            raise DecodeError(f"{where}: undecodable Confluent Avro ({err})", "undecodable") from None

    def encode(self, obj: Any, topic: str = "") -> bytes:
        return self._ser(obj, self._ctx(topic, self._field))
