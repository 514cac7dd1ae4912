"""Calc as an operator harness: feed changes, assert the emitted changes (kinds preserved,
SQL NULL semantics, filter keeps only TRUE), plus its Spark SQL rendering and pickling."""

from __future__ import annotations

import pickle
from decimal import Decimal

import pytest
import sqlglot
from sqlglot import exp

from tidemark.engine.changelog import Change
from tidemark.engine.errors import InputError
from tidemark.engine.expressions import col_ref, infer_type, to_spark_sql
from tidemark.engine.sql import Tidemark
from tidemark.engine.stages.calc import Calc
from tidemark.engine.types import make_type

NAMES = ["a", "b", "s"]


def expr(sql: str) -> exp.Expr:
    """Parse an expression over columns a, b, s and make the references positional."""
    tree = sqlglot.parse_one(sql, read=Tidemark)
    return tree.transform(lambda n: col_ref(NAMES.index(n.name)) if isinstance(n, exp.Column) else n)


def calc(projections: list[str] | None, predicate: str | None = None) -> Calc:
    return Calc(
        [expr(p) for p in projections] if projections is not None else None,
        expr(predicate) if predicate else None,
        NAMES,
    )


def test_projection_preserves_kinds_and_positions():
    stage = calc(["a + b", "UPPER(s)"])
    out = stage.process([Change("+I", (1, 2, "x"), (1,)), Change("-U", (1, 2, "x"), (2,)), Change("+U", (5, 5, "y"), (2,))])
    assert out == [Change("+I", (3, "X"), (1,)), Change("-U", (3, "X"), (2,)), Change("+U", (10, "Y"), (2,))]


def test_filter_keeps_only_true_and_treats_null_as_false():
    stage = calc(None, "a > 1")
    out = stage.process([Change("+I", (2, 0, ""), (1,)), Change("+I", (1, 0, ""), (2,)), Change("-D", (None, 0, ""), (3,))])
    assert out == [Change("+I", (2, 0, ""), (1,))]


def test_filter_retraction_is_filtered_like_its_add():
    stage = calc(["a"], "b IS NOT NULL AND b < 10")
    add, retract = Change("+I", (1, 5, ""), (1,)), Change("-D", (1, 5, ""), (2,))
    assert [c.kind for c in stage.process([add, retract])] == ["+I", "-D"]
    assert stage.process([Change("+I", (1, 50, ""), (1,)), Change("-D", (1, 50, ""), (2,))]) == []


@pytest.mark.parametrize(
    "sql, row, expected",
    [
        ("a + b", (1, None, ""), None),
        ("a / b", (1, 2, ""), 0.5),
        ("a / b", (1, 0, ""), None),
        ("a % b", (-7, 3, ""), -1),
        ("a > 1 OR b > 1", (2, None, ""), True),
        ("a > 1 AND b > 1", (2, None, ""), None),
        ("NOT (a = 1)", (None, 0, ""), None),
        ("CASE WHEN a > 1 THEN 'big' ELSE 'small' END", (2, 0, ""), "big"),
        ("COALESCE(b, a)", (5, None, ""), 5),
        ("s || '!'", (0, 0, "hi"), "hi!"),
        ("a IN (1, 2)", (2, 0, ""), True),
        ("s LIKE 'x%'", (0, 0, "xyz"), True),
        ("CAST(a AS DECIMAL(10, 2))", (1, 0, ""), Decimal("1.00")),
        ("a * 0.5", (3, 0, ""), Decimal("1.5")),
        ("CAST(s AS BIGINT)", (0, 0, "42"), 42),
        ("ROUND(CAST(a AS DOUBLE) / b, 1)", (5, 4, ""), 1.3),
        ("a BETWEEN 1 AND 3", (2, 0, ""), True),
    ],
)
def test_expression_semantics(sql, row, expected):
    out = calc([sql]).process([Change("+I", row, (1,))])
    assert out[0].row == (expected,)


def test_bad_value_names_the_stage_and_row():
    stage = Calc([expr("CAST(s AS BIGINT)")], None, NAMES, ["n"], name="calc#3")
    with pytest.raises(InputError) as info:
        stage.process([Change("+I", (0, 0, "abc"), (1,))])
    assert "stage 'calc#3'" in str(info.value)
    assert "(0, 0, 'abc')" in str(info.value)


def test_to_spark_sql_names_columns_as_asked():
    stage = Calc([expr("a + 1"), expr("s")], expr("b > 2"), NAMES, ["a1", "s"])
    assert stage.to_spark_sql() == {"columns": [("a1", "`a` + 1"), ("s", "`s`")], "filter": "`b` > 2"}
    assert stage.to_spark_sql(["c0", "c1", "c2"])["filter"] == "`c1` > 2"
    assert to_spark_sql(expr("CASE WHEN a IS NULL THEN 0 ELSE a END"), NAMES) == "CASE WHEN `a` IS NULL THEN 0 ELSE `a` END"


def test_calc_survives_pickling():
    stage = calc(["a * 2"], "a > 0")
    clone = pickle.loads(pickle.dumps(stage))
    assert clone.process([Change("+I", (3, 0, ""), (1,)), Change("+I", (-1, 0, ""), (2,))]) == [Change("+I", (6,), (1,))]


def test_infer_type():
    types = [make_type("INT"), make_type("BIGINT"), make_type("STRING")]
    assert infer_type(expr("a + b"), types) == make_type("BIGINT")
    assert infer_type(expr("a / b"), types) == make_type("DOUBLE")
    assert infer_type(expr("a > b"), types) == make_type("BOOLEAN")
    assert infer_type(expr("UPPER(s)"), types) == make_type("STRING")
    assert infer_type(expr("CAST(a AS DECIMAL(5, 1))"), types) == make_type("DECIMAL", (5, 1))
