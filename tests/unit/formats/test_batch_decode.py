"""The batch decoder against the per-record decoder: same changes, same dead letters (reason
included), for random mixes of good and bad records of every JSON format."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemark.engine.catalog import Column, TableDef
from tidemark.engine.types import parse_type
from tidemark.formats.batch_decode import BatchDecoder, batch_decoder_for
from tidemark.formats.codecs import Decoder
from tidemark.formats.errors import DecodeError

COLUMNS = [
    ("id", "BIGINT"), ("n", "INT"), ("t", "TINYINT"), ("x", "DOUBLE"), ("s", "STRING"), ("b", "BOOLEAN"),
    ("amount", "DECIMAL(10, 2)"), ("d", "DATE"), ("ts", "TIMESTAMP(3)"),
]
FORMATS = ("json", "debezium-json", "changelog-json", "upsert-json")


def table(fmt: str, **options: str) -> TableDef:
    return TableDef("t", [Column(n, parse_type(t)) for n, t in COLUMNS], ("id",), {"format": fmt, "topic": "t", **options})


def per_record(decoder: Decoder, keys, values):
    changes, dead = [], []
    for i, (k, v) in enumerate(zip(keys, values)):
        try:
            changes.extend(c._replace(pos=(i,)) for c in decoder.decode(k, v, (i,), "t"))
        except DecodeError as err:
            dead.append((i, err.kind, err.reason))
    return changes, dead


def batched(decoder: BatchDecoder, keys, values):
    """The decoder's output for the records as lists of bytes, checked equal to its output
    for the same records as Arrow binary columns (how the Spark source hands them over)."""
    results = []
    for k, v in ((keys, values), (pa.array(keys, pa.binary()), pa.array(values, pa.binary()))):
        out = decoder.decode(k, v, "t")
        results.append((out.changes([(i,) for i in range(len(values))]), [(i, e.kind, e.reason) for i, e in out.dead]))
    assert results[0] == results[1]
    return results[0]


def assert_same(fmt: str, keys, values, **options: str) -> None:
    t = table(fmt, **options)
    try:
        expected = per_record(Decoder(t), keys, values)
    except Exception as err:  # not a DecodeError (e.g. a DATE out of range): the batch fails alike
        with pytest.raises(type(err)):
            batched(BatchDecoder(t), keys, values)
        return
    got = batched(BatchDecoder(t), keys, values)
    assert got[1] == expected[1]
    assert got[0] == expected[0]
    # same Python types too (1 == 1.0 == True would hide a wrong one)
    assert [tuple(map(type, c.row)) for c in got[0]] == [tuple(map(type, c.row)) for c in expected[0]]


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**64), 2**64), st.floats(allow_nan=False, width=64),
    st.text(max_size=6), st.sampled_from(["12.5", "-0.001", "2024-01-02", "2024-01-02 03:04:05.123456",
                                          "2024-01-02T03:04:05+02:00", "abc", "1e3", " 7 ", "NaN", "99999999999",
                                          "2024-02-30", "2024-02-30 00:00:00", "123.456", "0000-01-01", "2024-01-02 24:00:00",
                                          "00012.5", ".5", "2024-01-02T03:04"]),
    st.sampled_from([0, -0.0, 1.5, 2**53, 3.0, 19000, 1700000000000]),
)
good_values = {
    "id": st.integers(-5, 5), "n": st.integers(-(2**31), 2**31 - 1), "t": st.integers(-128, 127),
    "x": st.floats(allow_nan=False, allow_infinity=False), "s": st.text(max_size=5), "b": st.booleans(),
    "amount": st.one_of(st.decimals(-(10**7), 10**7, places=2).map(str), st.floats(-1e6, 1e6).map(lambda f: round(f, 2))),
    "d": st.one_of(st.dates().map(str), st.integers(-719_162, 2_932_896)),
    "ts": st.one_of(st.datetimes().map(lambda d: d.isoformat(sep=" ")),
                    st.datetimes().map(lambda d: d.isoformat()), st.integers(-62_135_596_800_000, 253_402_300_799_999)),
}
field_names = st.sampled_from([n for n, _ in COLUMNS] + ["ID", "Amount", "other"])


@st.composite
def row_obj(draw, good: bool):
    obj = {}
    for name, _ in COLUMNS:
        if draw(st.integers(0, 9)) == 0 and not good:
            continue
        obj[name] = draw(good_values[name]) if good or draw(st.booleans()) else draw(scalars)
    if not good and draw(st.booleans()):
        obj[draw(field_names)] = draw(scalars)
    return obj


@st.composite
def record(draw, fmt: str):
    good = draw(st.integers(0, 3)) > 0
    row = draw(row_obj(good))
    if fmt == "debezium-json":
        op = draw(st.sampled_from(["c", "r", "u", "d"] + ([] if good else ["x", None])))
        obj = {"op": op, "before": draw(row_obj(good)) if op in ("u", "d") or not good else None,
               "after": row if op != "d" else None, "source": {"db": "x", "DB": 1}, "ts_ms": 17}
        if not good and draw(st.booleans()):
            obj = draw(st.sampled_from([{"schema": {}, "payload": obj}, {**obj, "ts_ms": 1.5}, {**obj, "after": 3}]))
    elif fmt == "changelog-json":
        obj = {"op": draw(st.sampled_from(["+I", "-U", "+U", "-D"] + ([] if good else ["x"]))), **row}
    else:
        obj = row
    text = json.dumps(obj, ensure_ascii=draw(st.booleans()), separators=draw(st.sampled_from([(",", ":"), (", ", ": ")])))
    value = text.encode()
    if not good:
        value = draw(st.sampled_from([value, value, value[:-1], b"", b"null", b"[1]", value + b" {}", b"\xff" + value,
                                      value.replace(b"{", b"{\n", 1), b'{"id":1,"id":2}', b"  " + value]))
    key = None
    if fmt == "upsert-json":
        ident = row.get("id")
        key = draw(st.sampled_from([json.dumps({"id": ident}).encode(), json.dumps({"id": ident}, separators=(",", ":")).encode(),
                                    json.dumps(ident).encode(), None] + ([] if good else [b"{bad", json.dumps({"id": 3, "s": "k"}).encode()])))
        if not good and draw(st.integers(0, 4)) == 0:
            value = None
    if fmt == "debezium-json" and not good and draw(st.integers(0, 5)) == 0:
        value = None
    return key, value


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_batch_decoder_matches_per_record(fmt, data):
    records = data.draw(st.lists(record(fmt), max_size=30))
    assert_same(fmt, [k for k, _ in records], [v for _, v in records])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fail_on_missing_field_matches_per_record(data):
    records = data.draw(st.lists(record("json"), max_size=20))
    assert_same("json", [k for k, _ in records], [v for _, v in records], **{"json.fail-on-missing-field": "true"})


def test_common_path_is_columnar(monkeypatch):
    """Good records never reach the per-record decoder."""
    t = table("debezium-json")
    decoder = BatchDecoder(t)
    monkeypatch.setattr(decoder.record_decoder, "decode", lambda *a: pytest.fail("per-record decode of a good record"))
    values = [json.dumps({"op": "u", "before": {"id": i, "amount": "1.5", "ts": 1700000000000},
                          "after": {"id": i, "amount": "2.5", "ts": 1700000000001}}).encode() for i in range(100)]
    out = decoder.decode([None] * 100, values, "t")
    assert out.rows.num_rows == 200 and out.dead == []
    assert out.kinds.to_pylist()[:2] == ["-U", "+U"]


@pytest.mark.parametrize("fmt", ["json", "upsert-json"])
def test_keys_naming_a_column_in_another_case_decode_as_the_per_record_decoder_does(fmt):
    values = [b'{"id": 1, "ID": 2}', b'{"ID": 3}', b'{"id": 4, "Amount": "1.5"}', b'{"id": 5, "amount": "1", "AMOUNT": null}',
              b'{"\\u0069d": 6}', b'{"id": 7, "s": "\\u0041"}']
    assert_same(fmt, [None] * len(values), values)


def test_a_mixed_case_column_name_is_screened_in_every_record():
    """With a column name that is not lowercase, a record without uppercase letters can
    still name it in another case: every record is counted, not only the suspect ones."""
    t = TableDef("t", [Column("id", parse_type("BIGINT")), Column("userName", parse_type("STRING"))], ("id",), {"format": "json"})
    values = [b'{"id": 1, "userName": "a"}', b'{"id": 2, "username": "b"}', b'{"id": 3, "USERNAME": "c"}', b'{"id": 4}']
    expected = per_record(Decoder(t), [None] * 4, values)
    assert batched(BatchDecoder(t), [None] * 4, values) == expected
    assert [c.row for c in expected[0]][0] == (1, "a")


def test_one_bad_record_loses_no_good_one():
    t = table("json")
    values = [json.dumps({"id": i, "n": i}).encode() for i in range(1000)]
    values[517] = b'{"id": 517, "n": "seventeen"}'
    out = BatchDecoder(t).decode([None] * 1000, values, "t")
    assert [i for i, _ in out.dead] == [517]
    assert "column 'n': expected INT, got 'seventeen'" in out.dead[0][1].reason
    assert out.record.to_pylist() == [i for i in range(1000) if i != 517]


def test_tables_without_a_columnar_form_get_none():
    composite = TableDef("c", [Column("id", parse_type("BIGINT")), Column("a", parse_type("ARRAY<INT>"))], ("id",), {"format": "json"})
    avro = TableDef("v", [Column("id", parse_type("BIGINT"))], ("id",), {"format": "avro"})
    assert batch_decoder_for(composite) is None and batch_decoder_for(avro) is None
    assert batch_decoder_for(table("json")) is not None


def test_a_decimal_zero_loses_its_sign():
    """Arrow's decimal (like Flink's) has no negative zero; the per-record decoder keeps it."""
    values = [b'{"id": 1, "amount": "-0.00"}', b'{"id": 2, "amount": "-0.001"}', b'{"id": 3, "amount": -0.0}']
    rows = BatchDecoder(table("json")).decode([None] * 3, values, "t").row_tuples()
    assert [str(r[6]) for r in rows] == ["0.00", "0.00", "0.00"]
    assert str(Decoder(table("json")).decode(None, values[0])[0].row[6]) == "-0.00"


def test_python_values_are_what_arrow_gives():
    import datetime as dt
    from decimal import Decimal

    import pyarrow as pa

    from tidemark.formats.batch_decode import python_values

    columns = [
        pa.array([dt.datetime(1, 1, 1), None, dt.datetime(9999, 12, 31, 23, 59, 59, 999999)], pa.timestamp("us")),
        pa.array([dt.date(1, 1, 1), None, dt.date(2024, 2, 29)], pa.date32()),
        pa.array([Decimal("-1.50"), None, Decimal("12345678.99")], pa.decimal128(10, 2)),
        pa.array([1, -(2**63), 2**63 - 1], pa.int64()), pa.array([1, None, 3], pa.int32()),
        pa.array([0.1, -0.0, float("inf")]), pa.array([True, False, True]), pa.array(["a", None, "é"]),
    ]
    for col in columns:
        got = python_values(col)
        assert got == col.to_pylist()
        assert [type(v) for v in got] == [type(v) for v in col.to_pylist()]
        assert [str(v) for v in got] == [str(v) for v in col.to_pylist()]


@pytest.mark.parametrize(("column", "value"), [("d", 99999999), ("ts", 10**17), ("ts", -(10**17)), ("f", 10**400)])
def test_a_value_python_cannot_hold_is_one_dead_letter(column, value):
    """A DATE in epoch days or a TIMESTAMP in epoch ms beyond Python's datetime range, or an
    integer beyond a float's, fails its record, not the batch (it used to raise OverflowError)."""
    t = TableDef("t", [Column("id", parse_type("BIGINT")), Column("d", parse_type("DATE")),
                       Column("ts", parse_type("TIMESTAMP(3)")), Column("f", parse_type("DOUBLE"))],
                 options={"format": "json"})
    values = [json.dumps({"id": 1}).encode(), f'{{"id": 2, "{column}": {value}}}'.encode(), json.dumps({"id": 3}).encode()]
    with pytest.raises(DecodeError, match="out of range"):
        Decoder(t).decode(None, values[1], topic="t")
    out = BatchDecoder(t).decode([None] * 3, values, "t")
    assert [i for i, _ in out.dead] == [1]
    assert out.record.to_pylist() == [0, 2]
