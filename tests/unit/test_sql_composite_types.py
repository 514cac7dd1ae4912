"""ARRAY<T>, MAP<K, V> and ROW<...> column types: DDL, input conversion (hashable values,
because rows are hashed in Z-sets), JSON output that reads back to the same value, INSERT
type checks and casts."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemark.engine.changelog import Change
from tidemark.engine.errors import PlanError, SqlError
from tidemark.engine.pipeline import compile_sql
from tidemark.engine.replay import ReplayHost
from tidemark.engine.sql import parse_script
from tidemark.engine.types import (
    BIGINT,
    STRING,
    array_of,
    assignable,
    coerce_value,
    map_of,
    map_value,
    parse_type,
    row_of,
    to_json_value,
)

INT = parse_type("INT")


# -- DDL ------------------------------------------------------------------------------------


def test_ddl_declares_composite_columns():
    script = parse_script(
        "CREATE TABLE t (a ARRAY<INT>, m MAP<STRING, BIGINT>, r ROW<id BIGINT, name STRING>, "
        "n ARRAY<ROW(id BIGINT, tags ARRAY<STRING>)>, d MAP<INT, DECIMAL(5, 2)>) WITH ('format' = 'json');"
        "CREATE TABLE o (a ARRAY<INT>) WITH ('format' = 'json'); INSERT INTO o SELECT a FROM t;"
    )
    t = script.table("t")
    assert t.types == [
        array_of(INT),
        map_of(STRING, BIGINT),
        row_of([("id", BIGINT), ("name", STRING)]),
        array_of(row_of([("id", BIGINT), ("tags", array_of(STRING))])),
        map_of(INT, parse_type("DECIMAL(5, 2)")),
    ]
    assert [str(x) for x in t.types] == [
        "ARRAY<INT>", "MAP<STRING, BIGINT>", "ROW<id BIGINT, name STRING>",
        "ARRAY<ROW<id BIGINT, tags ARRAY<STRING>>>", "MAP<INT, DECIMAL(5, 2)>",
    ]  # fmt: skip
    for x in t.types:
        assert parse_type(str(x)) == x  # the text form reads back


@pytest.mark.parametrize("ddl,message", [
    ("ARRAY", "unsupported column type ARRAY (write e.g. ARRAY<INT>)"),
    ("MAP<ARRAY<INT>, INT>", "MAP key type must be a scalar type, got ARRAY<INT>"),
    ("ROW<a INT, A STRING>", "ROW field 'A' is declared twice"),
    ("ARRAY<WHATEVER>", "unsupported column type"),
])
def test_bad_composite_types_are_sql_errors_with_a_position(ddl, message):
    with pytest.raises(SqlError, match="line 1, column") as err:
        parse_script(f"CREATE TABLE t (k BIGINT, c {ddl}) WITH ('format' = 'json');"
                     "CREATE TABLE o (k BIGINT) WITH ('format' = 'json'); INSERT INTO o SELECT k FROM t;")
    assert message in str(err.value)


# -- values ---------------------------------------------------------------------------------


def test_arrays_are_tuples_with_converted_elements():
    t = parse_type("ARRAY<DECIMAL(4, 1)>")
    assert coerce_value(t, [1, "2.25", None]) == (Decimal("1.0"), Decimal("2.3"), None)
    with pytest.raises(ValueError, match=r"ARRAY<INT> element 1: expected INT, got 'x'"):
        coerce_value(array_of(INT), [1, "x"])
    with pytest.raises(ValueError, match="expected ARRAY<INT>, got 'x'"):
        coerce_value(array_of(INT), "x")


def test_maps_are_key_sorted_pairs_whatever_the_written_order():
    t = parse_type("MAP<INT, STRING>")
    a = coerce_value(t, {"2": "b", "1": "a"})  # JSON object keys are text
    b = coerce_value(t, [[1, "a"], [2, "b"]])  # or [key, value] pairs
    assert a == b == ((1, "a"), (2, "b"))
    assert hash(a) == hash(b)
    assert a == map_value({2: "b", 1: "a"})
    assert coerce_value(t, {}) == ()


@pytest.mark.parametrize("value,message", [
    ({"x": "a"}, "MAP<INT, STRING> key 'x': expected INT, got 'x'"),
    ({"1": "a", "1.0": "b"}, "key '1.0' appears twice"),
    ([[None, "a"]], "a map key cannot be null"),
    ({"1": 5}, "value of key '1': expected STRING, got 5"),
    ("nope", "expected MAP<INT, STRING> (an object, or an array of [key, value] pairs)"),
])
def test_bad_map_values_name_what_is_wrong(value, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        coerce_value(parse_type("MAP<INT, STRING>"), value)


def test_rows_are_tuples_by_field_name_or_position():
    t = parse_type("ROW<id BIGINT, name STRING>")
    assert coerce_value(t, {"name": "x", "id": 1}) == (1, "x")
    assert coerce_value(t, {"id": 1}) == (1, None)  # a missing field is NULL
    assert coerce_value(t, [1, "x"]) == (1, "x")
    with pytest.raises(ValueError, match=r"unknown field 'nme' \(fields: id, name\)"):
        coerce_value(t, {"id": 1, "nme": "x"})
    with pytest.raises(ValueError, match="got 1 values for 2 fields"):
        coerce_value(t, [1])
    with pytest.raises(ValueError, match="field 'id': expected BIGINT, got 'one'"):
        coerce_value(t, {"id": "one"})


def test_json_output_of_composites():
    t = parse_type("MAP<DATE, ARRAY<ROW<p DECIMAL(5, 2), ok BOOLEAN>>>")
    value = coerce_value(t, {"2024-01-02": [{"p": "1.5", "ok": True}, None]})
    assert value == ((dt.date(2024, 1, 2), ((Decimal("1.50"), True), None)),)
    out = to_json_value(t, value)
    assert out == {"2024-01-02": [{"p": "1.50", "ok": True}, None]}
    assert coerce_value(t, json.loads(json.dumps(out))) == value
    assert to_json_value(parse_type("MAP<BOOLEAN, INT>"), ((False, 0), (True, 1))) == {"false": 0, "true": 1}


SCALARS = {
    "BIGINT": st.integers(-(2**63), 2**63 - 1),
    "STRING": st.text(max_size=5),
    "BOOLEAN": st.booleans(),
    "DOUBLE": st.floats(allow_nan=False, allow_infinity=False),
    "DECIMAL(6, 2)": st.decimals(min_value=-9999, max_value=9999, places=2, allow_nan=False),
    "DATE": st.dates(),
}
TYPED = st.one_of(
    *[st.tuples(st.just(f"ARRAY<{n}>"), st.lists(st.one_of(st.none(), s), max_size=4)) for n, s in SCALARS.items()],
    *[st.tuples(st.just(f"MAP<{k}, ARRAY<{v}>>"),
                st.dictionaries(ks, st.lists(vs, max_size=2), max_size=3))
      for k, ks in SCALARS.items() for v, vs in list(SCALARS.items())[:3]],
    *[st.tuples(st.just(f"ROW<a {n}, b ARRAY<STRING>>"),
                st.fixed_dictionaries({"a": s, "b": st.lists(st.text(max_size=3), max_size=2)}))
      for n, s in SCALARS.items()],
)  # fmt: skip


@given(TYPED)
def test_to_json_value_round_trips_through_json(typed):
    text, raw = typed
    t = parse_type(text)
    value = coerce_value(t, raw)
    hash(value)  # usable in a row of a Z-set
    back = coerce_value(t, json.loads(json.dumps(to_json_value(t, value))))
    assert back == value


# -- SQL: INSERT checks and casts -----------------------------------------------------------


def test_composite_assignability_is_element_wise():
    assert assignable(array_of(INT), array_of(BIGINT))
    assert not assignable(array_of(STRING), array_of(INT))
    assert not assignable(array_of(INT), map_of(INT, INT))
    assert assignable(row_of([("a", INT)]), row_of([("x", BIGINT)]))
    assert not assignable(row_of([("a", INT)]), row_of([("a", INT), ("b", INT)]))


def test_insert_checks_and_casts_composite_columns():
    ddl = ("CREATE TABLE s (k BIGINT, a ARRAY<INT>, b ARRAY<STRING>) WITH ('format' = 'json');\n"
           "CREATE TABLE t (k BIGINT, a ARRAY<BIGINT>, m MAP<STRING, INT>, PRIMARY KEY (k) NOT ENFORCED) "
           "WITH ('format' = 'upsert-json');\n")
    with pytest.raises(PlanError, match="column 'a' is ARRAY<BIGINT> but the query gives ARRAY<STRING>"):
        compile_sql(ddl + "INSERT INTO t (k, a) SELECT k, b FROM s ON CONFLICT DO DEDUPLICATE")
    host = ReplayHost(compile_sql(ddl + "INSERT INTO t (k, a) SELECT k, a FROM s ON CONFLICT DO DEDUPLICATE"))
    host.run_batch({"s": [Change("+I", (1, (1, 2), ("x",)), (1,))]}, now_ms=0)
    assert host.table() == {(1,): (1, (1, 2), None)}  # a widened, m is CAST(NULL AS MAP<...>)
