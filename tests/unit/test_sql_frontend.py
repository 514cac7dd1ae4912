"""The SQL front end: Flink-style DDL, SET, INSERT ... ON CONFLICT, and errors with positions."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from tidemark.engine.catalog import Column, TableDef
from tidemark.engine.errors import PlanError, SqlError
from tidemark.engine.sql import parse_script
from tidemark.engine.types import BIGINT, SqlType, assignable, coerce_value, make_type, parse_type, to_json_value

S1 = "CREATE TABLE s1 (id BIGINT, level BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 's1', 'format' = 'debezium-json');\n"
INS = "INSERT INTO s1 SELECT id, level FROM s1"


def test_create_table_columns_pk_and_options():
    script = parse_script(S1 + INS)
    t = script.tables["s1"]
    assert t.column_names == ["id", "level"]
    assert t.types == [BIGINT, BIGINT]
    assert t.primary_key == ("id",)
    assert t.pk_indexes == (0,)
    assert t.options == {"topic": "s1", "format": "debezium-json"}
    assert t.changelog_mode == "retract"


def test_types_and_inline_primary_key():
    sql = (
        "CREATE TABLE e (name VARCHAR(255) PRIMARY KEY NOT ENFORCED, n INTEGER NOT NULL, s SMALLINT, t TINYINT,\n"
        " price DECIMAL(10, 2), f FLOAT, d DOUBLE, b BOOLEAN, day DATE, ts TIMESTAMP(3), txt STRING, c CHAR(3))\n"
        " WITH ('format' = 'upsert-json');\n" + INS.replace("s1", "e", 1)
    )
    t = parse_script(S1 + sql).tables["e"]
    assert [str(c.type) for c in t.columns] == [
        "VARCHAR(255)", "INT", "SMALLINT", "TINYINT", "DECIMAL(10, 2)", "FLOAT", "DOUBLE", "BOOLEAN", "DATE",
        "TIMESTAMP(3)", "STRING", "CHAR(3)",
    ]  # fmt: skip
    assert t.primary_key == ("name",)
    assert t.changelog_mode == "upsert"


def test_set_options_are_kept():
    script = parse_script(
        "SET 'table.optimizer.delta-join.strategy' = 'FORCE';\n"
        "SET 'table.exec.sink.upserts.compaction-mode' = 'CHECKPOINT';\n" + S1 + INS
    )
    assert script.options == {
        "table.optimizer.delta-join.strategy": "FORCE",
        "table.exec.sink.upserts.compaction-mode": "CHECKPOINT",
    }


@pytest.mark.parametrize("action", ["NOTHING", "ERROR", "DEDUPLICATE"])
def test_on_conflict_actions_parse(action):
    script = parse_script(S1 + INS + f" ON CONFLICT DO {action}")
    assert script.insert.on_conflict == action
    assert script.insert.table == "s1"


def test_insert_without_on_conflict_and_with_column_list():
    script = parse_script(S1 + "INSERT INTO s1 (level, id) SELECT level, id FROM s1")
    assert script.insert.on_conflict is None
    assert script.insert.columns == ["level", "id"]


@pytest.mark.parametrize(
    "sql, message, line, col",
    [
        (S1 + INS + " ON CONFLICT DO UPDATE SET level = 1", "ON CONFLICT DO UPDATE is not supported; use ON CONFLICT DO NOTHING, ON CONFLICT DO ERROR or ON CONFLICT DO DEDUPLICATE", 2, None),
        (S1 + INS + " ON CONFLICT (id) DO NOTHING", "a conflict target (ON CONFLICT (cols)) is not supported", 2, None),
        ("CREATE TABLE x (a BIGINT, PRIMARY KEY (b) NOT ENFORCED);\n" + INS, "table 'x': primary key column 'b' is not a column of the table", 1, None),
        ("CREATE TABLE x (a BIGINT, m VARBINARY);\n" + INS, "unsupported column type VARBINARY", 1, 27),
        ("CREATE TABLE x (a BIGINT, a STRING);\n" + INS, "table 'x': column 'a' is declared twice", 1, None),
        (S1 + S1 + INS, "table 's1' is declared twice", 2, None),
        (S1 + "DROP TABLE s1;\n" + INS, "unsupported statement DROP", 2, None),
        (S1 + "CREATE MATERIALIZED VIEW v AS SELECT id FROM s1;\n" + INS, "CREATE VIEW ... MATERIALIZED is not supported", 2, None),
        (S1 + INS + ";\n" + INS, "only one INSERT INTO statement per pipeline is supported", 3, None),
        (S1, "the pipeline has no INSERT INTO statement", None, None),
        (S1 + "INSERT INTO s1 VALUES (1, 2)", "INSERT ... VALUES is not supported", 2, None),
        (S1 + "INSERT INTO s1 SELECT id, level\n\n  FROM s1 WHERE )", "syntax error", 4, None),
        (S1 + "CREATE TABLE y (a BIGINT) WITH (format = 'json');\n" + INS, "table 'y'", 2, None),
        (S1 + "CREATE TABLE y (a DECIMAL(40, 2));\n" + INS, "invalid DECIMAL(40, 2)", 2, None),
    ],
)
def test_bad_statements_name_construct_and_position(sql, message, line, col):
    with pytest.raises(SqlError) as info:
        parse_script(sql)
    err = info.value
    assert message in str(err)
    if line is not None:
        assert err.line == line
        assert f"(line {line}, column " in str(err)
    if col is not None:
        assert err.col == col


def test_syntax_error_points_at_the_offending_token():
    with pytest.raises(SqlError) as info:
        parse_script(S1 + "INSERT INTO s1 SELECT id, level\nFROM s1 WHERE ((")
    assert info.value.line == 3
    assert str(info.value).startswith("syntax error")


# ----------------------------------------------------------------------------- types


@pytest.mark.parametrize(
    "type_text, value, expected",
    [
        ("BIGINT", 5, 5),
        ("BIGINT", 5.0, 5),
        ("INT", -(2**31), -(2**31)),
        ("DOUBLE", 3, 3.0),
        ("DECIMAL(10, 2)", 1.005, Decimal("1.01")),
        ("DECIMAL(10, 2)", "12.3", Decimal("12.30")),
        ("STRING", "x", "x"),
        ("VARCHAR(3)", "abc", "abc"),
        ("BOOLEAN", False, False),
        ("DATE", "2024-02-29", dt.date(2024, 2, 29)),
        ("DATE", 1, dt.date(1970, 1, 2)),
        ("TIMESTAMP(3)", 1700000000123, dt.datetime(2023, 11, 14, 22, 13, 20, 123000)),
        ("TIMESTAMP(3)", "2024-01-01 10:00:00.123456", dt.datetime(2024, 1, 1, 10, 0, 0, 123000)),
        ("TIMESTAMP", "2024-01-01T10:00:00+01:00", dt.datetime(2024, 1, 1, 9, 0, 0)),
        ("BIGINT", None, None),
    ],
)
def test_coerce_value_accepts(type_text, value, expected):
    assert coerce_value(parse_type(type_text), value) == expected


@pytest.mark.parametrize(
    "type_text, value, message",
    [
        ("BIGINT", "abc", "expected BIGINT, got 'abc'"),
        ("BIGINT", True, "expected BIGINT, got true"),
        ("BIGINT", 3.5, "expected BIGINT, got 3.5"),
        ("BIGINT", "3", "expected BIGINT, got '3'"),
        ("TINYINT", 300, "expected TINYINT, got 300 (out of range)"),
        ("INT", 2**31, "out of range"),
        ("DOUBLE", "1.5", "expected DOUBLE, got '1.5'"),
        ("DOUBLE", False, "expected DOUBLE, got false"),
        ("STRING", 5, "expected STRING, got 5"),
        ("BOOLEAN", 1, "expected BOOLEAN, got 1"),
        ("DECIMAL(5, 2)", 1234.5, "too many digits"),
        ("DECIMAL(5, 2)", "x", "expected DECIMAL(5, 2), got 'x'"),
        ("DATE", "2024-13-01", "expected DATE"),
        ("TIMESTAMP", "yesterday", "expected TIMESTAMP(6), got 'yesterday'"),
        ("TIMESTAMP", [1], "expected TIMESTAMP(6)"),
    ],
)
def test_coerce_value_rejects(type_text, value, message):
    with pytest.raises(ValueError) as info:
        coerce_value(parse_type(type_text), value)
    assert message in str(info.value)


def test_type_aliases_defaults_and_json_output():
    assert make_type("INTEGER") == SqlType("INT")
    assert make_type("DECIMAL") == SqlType("DECIMAL", (10, 0))
    assert make_type("TIMESTAMP") == SqlType("TIMESTAMP", (6,))
    assert make_type("VARCHAR") == SqlType("STRING")
    with pytest.raises(ValueError, match="unsupported column type GEOMETRY"):
        make_type("GEOMETRY")
    assert to_json_value(parse_type("DECIMAL(5,2)"), Decimal("1.50")) == "1.50"
    assert to_json_value(parse_type("TIMESTAMP"), dt.datetime(2024, 1, 1, 1, 2, 3)) == "2024-01-01 01:02:03"
    assert to_json_value(parse_type("DATE"), dt.date(2024, 1, 1)) == "2024-01-01"


def test_assignable_follows_implicit_widening():
    assert assignable(make_type("INT"), make_type("BIGINT"))
    assert not assignable(make_type("BIGINT"), make_type("INT"))
    assert assignable(make_type("BIGINT"), make_type("DOUBLE"))
    assert assignable(make_type("INT"), make_type("DECIMAL", (10, 2)))
    assert not assignable(make_type("DOUBLE"), make_type("DECIMAL", (10, 2)))
    assert assignable(make_type("VARCHAR", (3,)), make_type("STRING"))
    assert not assignable(make_type("STRING"), make_type("BIGINT"))


# ----------------------------------------------------------------------------- catalog


def test_changelog_modes_from_format():
    def table(fmt):
        return TableDef("t", [Column("a", BIGINT)], (), {"format": fmt} if fmt else {})

    assert table("json").changelog_mode == "append"
    assert table(None).changelog_mode == "append"
    assert table("debezium-json").changelog_mode == "retract"
    assert table("changelog-json").changelog_mode == "retract"
    assert table("upsert-json").changelog_mode == "upsert"
    assert table("upsert-avro").changelog_mode == "upsert"
    with pytest.raises(PlanError, match="table 't': unknown format 'parquet'"):
        _ = table("parquet").changelog_mode


def test_index_of_is_case_insensitive_and_names_the_table():
    t = TableDef("t", [Column("Id", BIGINT)], ("Id",), {})
    assert t.index_of("id") == 0
    with pytest.raises(KeyError, match="table 't' has no column 'x'"):
        t.index_of("x")
