"""Format codecs: Kafka record bytes <-> changes, without a broker.

Each test feeds bytes to a decoder (or changes to an encoder) and asserts the exact changes
(or bytes) that come out; every kind of bad record must raise DecodeError with its
category, never any other exception.
"""

from __future__ import annotations

import datetime as dt
import io
import json
from decimal import Decimal

import pytest
from fastavro import parse_schema, schemaless_writer

from tidemark.engine.catalog import Column, TableDef
from tidemark.engine.changelog import Change
from tidemark.engine.types import parse_type
from tidemark.formats import DecodeError, FormatError, decoder_for, encoder_for
from tidemark.formats import avro_schema, dead_letter

ROW = (1, 20, Decimal("3.10"), dt.datetime(2024, 1, 2, 3, 4, 5, 678000), "b1")
KINDS = ("+I", "-U", "+U", "-D")


def table(fmt: str, pk: tuple[str, ...] = ("id",), **options: str) -> TableDef:
    cols = [("id", "BIGINT"), ("level", "INT"), ("amount", "DECIMAL(10, 2)"), ("ts", "TIMESTAMP(3)"), ("attr", "STRING")]
    return TableDef(
        "s1",
        [Column(n, parse_type(t)) for n, t in cols],
        pk,
        {"format": fmt, "topic": "s1", **options},
    )


def js(obj) -> bytes:
    return json.dumps(obj).encode()


ROW_JSON = {"id": 1, "level": 20, "amount": "3.10", "ts": "2024-01-02 03:04:05.678", "attr": "b1"}


# ---------------------------------------------------------------- round trips (sinks)

@pytest.mark.parametrize("fmt", ["changelog-json", "changelog-avro", "changelog-avro-confluent"])
def test_changelog_sink_round_trips_every_kind(fmt):
    url = "mock://formats-changelog" if fmt.endswith("confluent") else None
    enc, dec = encoder_for(table(fmt), url), decoder_for(table(fmt), url)
    for kind in KINDS:
        key, value = enc.encode(Change(kind, ROW))
        assert value is not None
        assert dec.decode(key, value, (7,)) == [Change(kind, ROW, (7,))]


@pytest.mark.parametrize("fmt", ["upsert-json", "upsert-avro", "upsert-avro-confluent"])
def test_upsert_sink_writes_rows_and_tombstones_and_skips_update_before(fmt):
    url = "mock://formats-upsert" if fmt.endswith("confluent") else None
    enc, dec = encoder_for(table(fmt), url), decoder_for(table(fmt), url)
    assert enc.encode(Change("-U", ROW)) is None
    for kind in ("+I", "+U"):
        key, value = enc.encode(Change(kind, ROW))
        assert dec.decode(key, value) == [Change("+U", ROW)]
    key, value = enc.encode(Change("-D", ROW))
    assert value is None
    assert dec.decode(key, None) == [Change("-D", (1, None, None, None, None))]
    # one key per PK, whatever the other columns are: compaction keeps the last value
    assert enc.encode(Change("+I", (1, 99, None, None, None)))[0] == key


def test_upsert_json_sink_bytes_are_flink_compatible():
    key, value = encoder_for(table("upsert-json")).encode(Change("+I", ROW))
    assert json.loads(key) == {"id": 1}
    assert json.loads(value) == {"id": 1, "level": 20, "amount": "3.10", "ts": "2024-01-02 03:04:05.678000", "attr": "b1"}


def test_changelog_json_value_carries_the_kind_beside_the_row():
    _, value = encoder_for(table("changelog-json")).encode(Change("-U", ROW))
    assert json.loads(value)["op"] == "-U"
    assert json.loads(value)["attr"] == "b1"


def test_changelog_sink_without_primary_key_writes_null_keys():
    key, value = encoder_for(table("changelog-json", pk=())).encode(Change("+I", ROW))
    assert key is None and json.loads(value)["id"] == 1


# ---------------------------------------------------------------- Debezium

def test_debezium_json_ops_become_changes():
    dec = decoder_for(table("debezium-json"))
    before = {**ROW_JSON, "attr": "a1"}
    old = ROW[:4] + ("a1",)
    assert dec.decode(None, js({"op": "c", "after": ROW_JSON, "ts_ms": 1})) == [Change("+I", ROW)]
    assert dec.decode(None, js({"op": "r", "after": ROW_JSON})) == [Change("+I", ROW)]
    assert dec.decode(None, js({"op": "u", "before": before, "after": ROW_JSON}), (3,)) == [
        Change("-U", old, (3,)),
        Change("+U", ROW, (3,)),
    ]
    assert dec.decode(None, js({"op": "d", "before": ROW_JSON, "after": None})) == [Change("-D", ROW)]


def test_debezium_json_schema_payload_wrapping_and_tombstones():
    dec = decoder_for(table("debezium-json"))
    wrapped = {"schema": {"type": "struct"}, "payload": {"op": "c", "after": ROW_JSON}}
    assert dec.decode(None, js(wrapped)) == [Change("+I", ROW)]
    assert dec.decode(b'{"id":1}', None) == []  # the tombstone after a delete is no change


def test_debezium_extra_fields_are_ignored_and_missing_non_key_fields_are_null():
    dec = decoder_for(table("debezium-json"))
    after = {"id": 2, "level": 5, "unknown_col": "x"}
    assert dec.decode(None, js({"op": "c", "after": after, "source": {"db": "x"}})) == [
        Change("+I", (2, 5, None, None, None))
    ]
    strict = decoder_for(table("debezium-json", **{"json.fail-on-missing-field": "true"}))
    with pytest.raises(DecodeError) as err:
        strict.decode(None, js({"op": "c", "after": after}))
    assert "amount" in err.value.reason


def test_debezium_avro_plain_and_with_a_registry_writer_schema():
    t = table("debezium-avro")
    schema = parse_schema(avro_schema.debezium_schema(t))
    buf = io.BytesIO()
    after = {"id": 1, "level": 20, "amount": Decimal("3.10"), "ts": dt.datetime(2024, 1, 2, 3, 4, 5, 678000), "attr": "b1"}
    schemaless_writer(buf, schema, {"before": None, "after": after, "op": "c", "ts_ms": 5})
    assert decoder_for(t).decode(None, buf.getvalue()) == [Change("+I", ROW)]

    # Confluent framing: the writer (Debezium) has more fields than Tidemark derives
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from tidemark.formats.serde import registry_client

    url = "mock://formats-debezium"
    writer = avro_schema.debezium_schema(t)
    writer["fields"].append({"name": "source", "type": {"type": "map", "values": "string"}})
    ser = AvroSerializer(registry_client(url), avro_schema.schema_json(writer))
    data = ser(
        {"before": after, "after": {**after, "attr": "b2"}, "op": "u", "ts_ms": 6, "source": {"db": "inv"}},
        SerializationContext("s1", MessageField.VALUE),
    )
    changes = decoder_for(table("debezium-avro-confluent", **{"avro-confluent.url": url})).decode(None, data)
    assert changes == [Change("-U", ROW), Change("+U", ROW[:4] + ("b2",))]


# ---------------------------------------------------------------- upsert / changelog / append in

def test_upsert_json_key_fills_a_value_without_the_key_columns():
    dec = decoder_for(table("upsert-json"))
    value = {k: v for k, v in ROW_JSON.items() if k != "id"}
    assert dec.decode(js({"id": 1}), js(value)) == [Change("+U", ROW)]
    assert dec.decode(b"1", None) == [Change("-D", (1, None, None, None, None))]  # bare scalar key


def test_changelog_json_and_plain_json_in():
    assert decoder_for(table("changelog-json")).decode(None, js({"op": "-D", **ROW_JSON})) == [Change("-D", ROW)]
    assert decoder_for(table("json", pk=())).decode(None, js(ROW_JSON)) == [Change("+I", ROW)]
    assert decoder_for(table("avro", pk=())).decode(None, _avro_row(table("avro", pk=()))) == [Change("+I", ROW)]


def _avro_row(t: TableDef) -> bytes:
    buf = io.BytesIO()
    schemaless_writer(buf, parse_schema(avro_schema.row_schema(t)), dict(zip(t.column_names, ROW)))
    return buf.getvalue()


# ---------------------------------------------------------------- bad records

BAD_RECORDS = [
    # (format, key, value, error kind, text in the reason)
    ("debezium-json", None, b"{not json", "undecodable", "malformed JSON"),
    ("debezium-json", None, b"\xff\xfe\x00", "undecodable", "UTF-8"),
    ("debezium-json", None, js({"op": "c", "after": {"level": 1}}), "missing_pk", "missing primary key column 'id'"),
    ("debezium-json", None, js({"op": "c", "after": {"id": None}}), "missing_pk", "is null"),
    ("debezium-json", None, js({"op": "c", "after": {"id": "abc"}}), "wrong_type", "expected BIGINT, got 'abc'"),
    ("debezium-json", None, js({"op": "c", "after": {"id": 1, "level": 1.5}}), "wrong_type", "column 'level'"),
    ("debezium-json", None, js({"op": "x", "after": ROW_JSON}), "unknown_op", "unknown Debezium op 'x'"),
    ("debezium-json", None, js({"after": ROW_JSON}), "unknown_op", 'without "op"'),
    ("debezium-json", None, js({"op": "u", "after": ROW_JSON}), "bad_envelope", 'without "before"'),
    ("debezium-json", None, js({"op": "c", "after": ROW_JSON, "ts_ms": "x"}), "wrong_type", "ts_ms"),
    ("debezium-json", None, js([1, 2]), "bad_envelope", "expected a Debezium envelope"),
    ("changelog-json", None, js({"op": "+X", **ROW_JSON}), "unknown_op", "unknown op '+X'"),
    ("changelog-json", None, js(ROW_JSON), "unknown_op", 'without "op"'),
    ("changelog-json", None, None, "bad_envelope", "tombstone"),
    ("upsert-json", None, None, "missing_pk", "without a key"),
    ("upsert-json", b"{}", None, "missing_pk", "missing primary key column 'id'"),
    ("upsert-json", b'{"id": 1}', b"[", "undecodable", "malformed JSON"),
    ("upsert-avro", None, b"\x02", "undecodable", "undecodable Avro"),
    ("upsert-avro", None, _avro_row(table("upsert-avro")) + b"\x00", "undecodable", "trailing bytes"),
    ("json", None, js({"id": True}), "wrong_type", "expected BIGINT, got true"),
]


@pytest.mark.parametrize("fmt,key,value,kind,text", BAD_RECORDS)
def test_bad_records_raise_decode_error_with_reason(fmt, key, value, kind, text):
    with pytest.raises(DecodeError) as err:
        decoder_for(table(fmt)).decode(key, value)
    assert err.value.kind == kind
    assert text in err.value.reason


def test_confluent_avro_rejects_bytes_without_the_magic_byte():
    with pytest.raises(DecodeError) as err:
        decoder_for(table("upsert-avro-confluent", **{"avro-confluent.url": "mock://formats-bad"})).decode(
            b"\x00\x00\x00\x00\x01", b"plain bytes"
        )
    assert err.value.kind == "undecodable"


# ---------------------------------------------------------------- declarations

@pytest.mark.parametrize(
    "fmt,pk,text",
    [
        ("csv", ("id",), "not supported on Kafka"),
        ("upsert-avro-confluent", ("id",), "needs a schema registry URL"),
        ("upsert-json", (), "needs a PRIMARY KEY"),
    ],
)
def test_unusable_source_declarations_are_plan_errors(fmt, pk, text):
    with pytest.raises(FormatError) as err:
        decoder_for(table(fmt, pk=pk))
    assert text in str(err.value) and "s1" in str(err.value)


def test_sinks_accept_only_upsert_and_changelog_formats():
    with pytest.raises(FormatError, match="cannot be written"):
        encoder_for(table("debezium-json"))


def test_a_registry_url_option_switches_avro_to_the_confluent_wire_format():
    t = table("changelog-avro", **{"avro-confluent.url": "mock://formats-switch"})
    _, value = encoder_for(t).encode(Change("+I", ROW))
    assert value[0] == 0  # Confluent magic byte, then a 4-byte schema id
    assert decoder_for(t).decode(None, value) == [Change("+I", ROW)]


# ---------------------------------------------------------------- dead letters and schemas

@pytest.mark.parametrize("encoding", ["json", "avro"])
def test_dead_letter_round_trip_keeps_the_original_bytes(encoding):
    letter = dead_letter.DeadLetter(
        pipeline="p", table="s1", format="debezium-json", source_topic="s1", source_partition=2,
        source_offset=41, source_timestamp_ms=123, error_kind="undecodable", reason="malformed JSON",
        key=b"\x00k", value=b"\xff{bad", batch_id=7,
    )
    key, value = dead_letter.encode(letter, encoding)
    assert key == b"s1/2/41"
    assert dead_letter.decode(value, encoding) == letter


def test_proto_schemas_are_found_and_parse():
    assert (avro_schema.proto_dir() / "dead_letter.avsc").is_file()
    names = [f["name"] for f in avro_schema.dead_letter_schema()["fields"]]
    assert {"key", "value", "source_topic", "source_partition", "source_offset", "reason"} <= set(names)
    envelope = avro_schema.changelog_schema(table("changelog-avro"))
    assert envelope["fields"][1]["type"]["fields"][0]["name"] == "id"
