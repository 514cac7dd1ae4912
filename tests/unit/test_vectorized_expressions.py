"""The vectorized calc (``Calc.process_batch``) against the per-row reference
(``Calc.process``, ``compile_row_fn``), one property test per operator or function family,
on random values including NULL, extremes, DECIMAL scales and unicode text.

The two agree when the reference's value, stored in the output column's type, is the
vectorized value: a DECIMAL is compared at the output column's scale (the reference keeps
28 significant digits of a quotient, the column keeps its scale), and a value outside the
output type's range (a BIGINT product past 2^63) is an InputError for the vectorized path,
where the reference hands on a Python int no column can hold.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import pytest
import sqlglot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlglot import exp

from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change
from tidemark.engine.errors import InputError, SqlError
from tidemark.engine.expressions import col_ref
from tidemark.engine.sql import Tidemark
from tidemark.engine.stages.calc import Calc
from tidemark.engine.types import INTEGER_RANGES, SqlType, make_type

#: the input row: name -> type
COLUMNS = {
    "i": make_type("INT"),
    "b": make_type("BIGINT"),
    "d": make_type("DECIMAL", (10, 2)),
    "e": make_type("DECIMAL", (18, 5)),
    "f": make_type("DOUBLE"),
    "s": make_type("STRING"),
    "t": make_type("STRING"),
    "p": make_type("BOOLEAN"),
    "day": make_type("DATE"),
    "ts": make_type("TIMESTAMP", (3,)),
}
NAMES = list(COLUMNS)


def _decimal(p: int, s: int) -> st.SearchStrategy[Decimal]:
    bound = 10 ** (p - s) - 1
    return st.decimals(min_value=-bound, max_value=bound, places=s, allow_nan=False, allow_infinity=False)


TEXT = st.text(alphabet=st.sampled_from(list("ab,c xyzé漢😀-*|_%") + ["ß", "\t", "\n", "0", "9"]), max_size=8)
VALUES = {
    "i": st.one_of(st.integers(-(2**31), 2**31 - 1), st.sampled_from([0, 1, -1, 2, 3, -3, 7, -7])),
    "b": st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(-1000, 1000), st.sampled_from([0, 2**53 + 1])),
    "d": _decimal(10, 2),
    "e": _decimal(18, 5),
    "f": st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=64), st.sampled_from([0.0, -0.0, 2.5, -2.5, 0.1])),
    "s": TEXT,
    "t": st.sampled_from(["", "a", ",", "b,c", "é", "ab"]),
    "p": st.booleans(),
    "day": st.dates(min_value=dt.date(1, 1, 1), max_value=dt.date(9999, 12, 31)),
    "ts": st.datetimes(min_value=dt.datetime(1900, 1, 1), max_value=dt.datetime(2200, 1, 1)).map(
        lambda v: v.replace(microsecond=v.microsecond // 1000 * 1000)
    ),
}
ROWS = st.lists(
    st.tuples(*(st.one_of(st.none(), VALUES[n]) for n in NAMES)),
    min_size=1,
    max_size=25,
)


def _positional(sql: str) -> exp.Expr:
    tree = sqlglot.parse_one(sql, read=Tidemark)
    return tree.transform(lambda n: col_ref(NAMES.index(n.name)) if isinstance(n, exp.Column) and n.name in NAMES else n)


@functools.lru_cache(maxsize=None)
def _calc(projections: tuple[str, ...], predicate: str | None = None) -> Calc:
    from tidemark.engine.expressions import infer_type

    types = list(COLUMNS.values())
    exprs = [_positional(p) for p in projections]
    return Calc(
        exprs,
        _positional(predicate) if predicate else None,
        NAMES,
        [f"o{i}" for i in range(len(exprs))],
        input_types=types,
        output_types=[infer_type(e, types) for e in exprs],
    )


def _stored(value: Any, t: SqlType | None) -> Any:
    """The reference's value as the output column of type ``t`` holds it."""
    if value is None or t is None:
        return value
    if t.name == "DECIMAL":
        return Decimal(value).quantize(Decimal(1).scaleb(-t.params[1]), rounding=ROUND_HALF_UP)
    if t.name in ("DOUBLE", "FLOAT") and not isinstance(value, float):
        return float(value)
    return value


def _fits(value: Any, t: SqlType | None) -> bool:
    if t is None or value is None:
        return True
    if t.name in INTEGER_RANGES and isinstance(value, int):
        lo, hi = INTEGER_RANGES[t.name]
        return lo <= value <= hi
    if t.name == "DECIMAL":
        digits = Decimal(value).quantize(Decimal(1).scaleb(-t.params[1]), rounding=ROUND_HALF_UP).adjusted() + 1
        return digits <= t.params[0] - t.params[1]
    return True


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    return type(a) is type(b) and a == b if a is not None and b is not None else a is b


def check(projections: list[str], rows: list[tuple], predicate: str | None = None) -> None:
    """Both paths on ``rows`` (as a +I, a -U and a +U, kinds and positions kept)."""
    stage = _calc(tuple(projections), predicate)
    changes = [Change(k, r, (n, j)) for n, r in enumerate(rows) for j, k in enumerate(("+I", "-U", "+U"))]
    try:
        expected = stage.process(changes)
    except InputError:
        with pytest.raises(InputError):
            stage.process_batch(ChangeBatch.from_changes(changes, schema=stage.input_schema()))
        return
    types = stage.output_types
    if not all(_fits(v, t) for c in expected for v, t in zip(c.row, types)):
        with pytest.raises(InputError):
            stage.process_batch(ChangeBatch.from_changes(changes, schema=stage.input_schema()))
        return
    got = stage.process_batch(ChangeBatch.from_changes(changes, schema=stage.input_schema())).changes()
    assert [(c.kind, c.pos) for c in got] == [(c.kind, c.pos) for c in expected]
    for g, e in zip(got, expected):
        want = tuple(_stored(v, t) for v, t in zip(e.row, types))
        assert all(_same(x, y) for x, y in zip(g.row, want)), (projections, predicate, e.row, want, g.row)


SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], report_multiple_bugs=False)

ARITHMETIC = [
    "i + b", "b - i", "i * b", "b * b", "i / b", "d / i", "d / e", "e / d", "i % 3", "b % i", "d % e", "-i", "-d", "-f",
    "d + e", "d * e", "d - i", "e * i", "f + i", "f * d", "f / d", "f % i", "d + 0.5", "i * 1.25", "b / 0",
    "(i + 1) * 2", "i - (b * 0)", "d * d * d",
]  # fmt: skip


COMPARISONS = [
    "i = b", "i <> b", "i < d", "d <= e", "f > i", "f >= b", "s = t", "s < t", "p = TRUE", "day < DATE '2000-01-01'",
    "ts >= TIMESTAMP '2000-01-01 00:00:00'", "i IN (1, 2, 3)", "i IN (1, NULL)", "s IN ('a', ',')",
    "i BETWEEN -3 AND b", "d BETWEEN i AND e", "i IS NULL", "s IS NOT NULL", "p IS TRUE", "p IS FALSE",
    "i IS DISTINCT FROM b", "d IS NOT DISTINCT FROM e", "s IS DISTINCT FROM t", "s LIKE 'a%'", "s LIKE '_b%'",
    "s NOT LIKE '%,%'", "p AND i > 0", "p OR i > 0", "NOT p", "NOT (p AND s = t)", "(i > 0 OR p) AND NOT (d < 0)",
]  # fmt: skip


CONDITIONALS = [
    "CASE WHEN i > 0 THEN 'pos' WHEN i < 0 THEN 'neg' ELSE 'zero' END", "CASE i WHEN 7 THEN s WHEN -7 THEN t END",
    "CASE WHEN p THEN d ELSE e END", "CASE WHEN p THEN i END", "COALESCE(s, t, 'none')", "COALESCE(i, b)",
    "COALESCE(d, 0.5)", "NULLIF(i, 7)", "NULLIF(s, '')", "IF(p, s, t)", "IF(i > b, i, b)", "NULLIF(d, e)",
]  # fmt: skip


STRINGS = [
    "UPPER(s)", "LOWER(s)", "CHAR_LENGTH(s)", "SUBSTRING(s, 2)", "SUBSTRING(s, 2, 3)", "SUBSTRING(s, 0, 2)",
    "SUBSTRING(s, -2, 1)", "SUBSTRING(s, i, 2)", "CONCAT(s, t)", "CONCAT(s, '-', t)", "s || t", "CONCAT(s, i)",
    "CONCAT_WS('|', s, t)", "CONCAT_WS('', s, NULL, t)", "REPLACE(s, 'a', 'AA')", "REPLACE(s, '', 'x')",
    "LPAD(s, 4, '*')", "RPAD(s, 3, 'ab')", "LPAD(s, 0, '*')", "LPAD(s, 2, '')", "SPLIT_INDEX(s, ',', 0)",
    "SPLIT_INDEX(s, ',', 1)", "SPLIT_INDEX(s, 'é', 2)", "REGEXP_EXTRACT(s, '(\\w+),(\\w*)', 2)",
    "REGEXP_EXTRACT(s, 'a+')", "REGEXP_EXTRACT(s, '(x)?(a)', 1)", "REGEXP_EXTRACT(s, '(a)', 3)", "TRIM(s)",
    "REVERSE(s)", "LEFT(s, 2)", "RIGHT(s, 2)", "POSITION(t IN s)",
]  # fmt: skip


NUMERIC = [
    "FLOOR(d)", "CEIL(d)", "FLOOR(f)", "CEIL(f)", "FLOOR(i)", "ROUND(d)", "ROUND(d, 1)", "ROUND(e, 3)", "ROUND(i, -1)",
    "ROUND(f)", "ROUND(f, 2)", "SQRT(f)", "SQRT(i)", "SQRT(d)", "ABS(i)", "ABS(d)", "ABS(f)", "MOD(i, 3)", "MOD(d, 2)",
    "MOD(f, 2)", "POWER(f, 2)", "FLOOR(i) + CEIL(i)",
]  # fmt: skip


CASTS = [
    "CAST(i AS BIGINT)", "CAST(b AS INT)", "CAST(d AS INT)", "CAST(e AS DECIMAL(10, 1))", "CAST(i AS DECIMAL(12, 2))",
    "CAST(d AS DOUBLE)", "CAST(i AS DOUBLE)", "CAST(f AS DECIMAL(20, 4))", "CAST(f AS BIGINT)", "CAST(i AS STRING)",
    "CAST(d AS STRING)", "CAST(f AS STRING)", "CAST(p AS STRING)", "CAST(day AS STRING)", "CAST(ts AS STRING)",
    "CAST(ts AS DATE)", "CAST(day AS TIMESTAMP)", "CAST(t AS INT)", "CAST(s AS BOOLEAN)", "CAST(CAST(i AS STRING) AS BIGINT)",
]  # fmt: skip


DATES = [
    "YEAR(day)", "MONTH(ts)", "EXTRACT(DAY FROM day)", "EXTRACT(HOUR FROM ts)", "HOUR(ts)", "DATEDIFF(day, DATE '2000-01-01')",
    "DATEDIFF(ts, TIMESTAMP '2000-01-01 12:00:00')", "DATE_FORMAT(ts, 'yyyy-MM-dd HH:mm:ss.SSS')",
    "DATE_FORMAT(ts, 'yy/MM')",
]  # fmt: skip


FAMILIES = {
    "arithmetic": ARITHMETIC, "comparison and logic": COMPARISONS, "conditionals": CONDITIONALS,
    "strings": STRINGS, "numeric functions": NUMERIC, "casts": CASTS, "dates": DATES,
}  # fmt: skip


@pytest.mark.parametrize("family", sorted(FAMILIES))
@SETTINGS
@given(rows=ROWS, data=st.data())
def test_family_agrees_with_the_reference(family, rows, data):
    check([data.draw(st.sampled_from(FAMILIES[family]), label="expr")], rows)


@SETTINGS
@given(rows=ROWS, expr=st.sampled_from(COMPARISONS))
def test_filter_keeps_only_true(rows, expr):
    check(["i", "s"], rows, predicate=expr)


def test_many_projections_and_a_filter_in_one_batch():
    rows = [(1, 2, Decimal("1.25"), Decimal("0.50000"), 2.5, "a,b", "b", True, dt.date(2024, 1, 2), dt.datetime(2024, 1, 2, 3, 4, 5))]
    rows += [tuple(None for _ in NAMES)]
    check(["i + b", "UPPER(s)", "d * e", "CASE WHEN p THEN 'y' END", "SPLIT_INDEX(s, ',', 1)", "HOUR(ts)"], rows, predicate="i > 0 OR s IS NULL")


def test_a_bad_cast_is_an_input_error_naming_the_row():
    stage = _calc(("CAST(s AS INT)",))
    row = (None, None, None, None, None, "x1", None, None, None, None)
    with pytest.raises(InputError, match="x1"):
        stage.process_batch(ChangeBatch.from_changes([Change("+I", row, (0,))], schema=stage.input_schema()))


def test_an_integer_past_its_type_is_an_input_error():
    stage = _calc(("b * b",))
    row = (None, 2**62, None, None, None, None, None, None, None, None)
    with pytest.raises(InputError, match="stage 'calc'"):
        stage.process_batch(ChangeBatch.from_changes([Change("+I", row, (0,))], schema=stage.input_schema()))


def test_an_expression_without_a_vectorized_form_is_refused_at_planning():
    from tidemark.engine.pipeline import compile_sql

    ddl = (
        "CREATE TABLE a (k BIGINT, arr ARRAY<STRING>, PRIMARY KEY (k) NOT ENFORCED) WITH ('format' = 'debezium-json');\n"
        "CREATE TABLE o (k BIGINT, r STRING, PRIMARY KEY (k) NOT ENFORCED) WITH ('format' = 'upsert-json');\n"
    )
    with pytest.raises(SqlError, match=r"element access on ARRAY and MAP values .* has no vectorized form") as info:
        compile_sql(ddl + "INSERT INTO o\nSELECT k, arr[1] FROM a")
    assert (info.value.line, info.value.col) == (4, 11)
