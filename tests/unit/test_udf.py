"""Python UDFs: ``CREATE FUNCTION name AS 'module.function' LANGUAGE PYTHON``, called once
per batch on whole columns, and the errors for a function that cannot be used."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from tidemark.engine.changelog import Change
from tidemark.engine.errors import InputError, SqlError
from tidemark.engine.pipeline import compile_sql
from tidemark.engine.replay import ReplayHost

DDL = """CREATE TABLE a (k BIGINT, s STRING, amount DECIMAL(10, 2), PRIMARY KEY (k) NOT ENFORCED) WITH ('format' = 'debezium-json');
CREATE TABLE o (k BIGINT, n BIGINT, taxed DECIMAL(10, 2), PRIMARY KEY (k) NOT ENFORCED) WITH ('format' = 'upsert-json');
"""
ROWS = [(1, "a,b,a", Decimal("10.00")), (2, None, None), (3, "xyz", Decimal("1.25")), (4, ",,", Decimal("0.10"))]


@pytest.fixture(autouse=True)
def _importable(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))


def _run(sql: str) -> ReplayHost:
    host = ReplayHost(compile_sql(sql), clock=lambda: 0)
    host.run_batch({"a": [Change("+I", r, (n,)) for n, r in enumerate(ROWS)]})
    return host


@pytest.mark.parametrize("create", ["CREATE FUNCTION", "CREATE TEMPORARY FUNCTION", "CREATE TEMPORARY SYSTEM FUNCTION"])
def test_a_udf_runs_once_per_batch_on_whole_columns(create):
    import udf_examples

    udf_examples.CALLS.clear()
    host = _run(
        f"{create} count_char AS 'udf_examples.count_char' LANGUAGE PYTHON;\n"
        "CREATE FUNCTION with_tax AS 'udf_examples.with_tax' LANGUAGE PYTHON;\n" + DDL
        + "INSERT INTO o SELECT k, count_char(s, 'a'), with_tax(amount) FROM a WHERE count_char(s, ',') > 0 OR s IS NULL"
    )
    assert host.rows() == [(1, 2, Decimal("12.00")), (2, None, None), (4, 0, Decimal("0.12"))]
    assert udf_examples.CALLS == [4, 3]  # the filter on all 4 rows, then the projection on the 3 kept


@pytest.mark.parametrize(
    "create, call, message",
    [
        ("CREATE FUNCTION f AS 'no_such_module.f' LANGUAGE PYTHON", "f(s)", "cannot import module 'no_such_module'"),
        ("CREATE FUNCTION f AS 'udf_examples.nope' LANGUAGE PYTHON", "f(s)", "module 'udf_examples' has no function 'nope'"),
        ("CREATE FUNCTION f AS 'udf_examples.undeclared' LANGUAGE PYTHON", "f(s)", "declares no result type"),
        ("CREATE FUNCTION f AS 'com.example.CountChar'", "f(s)", "only LANGUAGE PYTHON functions are supported"),
        ("CREATE FUNCTION f AS 'udf_examples.count_char' LANGUAGE PYTHON", "f(s)", r"f\(\): 'udf_examples.count_char' cannot be called with 1 argument"),
        ("CREATE FUNCTION f AS 'udf_examples.count_char' LANGUAGE PYTHON", "g(s, 'a')", r"unsupported function G\(\)"),
    ],
)
def test_a_function_that_cannot_be_used_is_refused_at_planning(create, call, message):
    sql = f"{create};\n{DDL}INSERT INTO o\nSELECT k, {call}, amount FROM a"
    with pytest.raises(SqlError, match=message) as info:
        compile_sql(sql)
    assert info.value.line is not None


def test_a_udf_raising_on_a_batch_is_an_input_error_naming_it():
    sql = "CREATE FUNCTION fails AS 'udf_examples.fails' LANGUAGE PYTHON;\n" + DDL.replace("n BIGINT", "n STRING")
    with pytest.raises(InputError, match=r"function fails \('udf_examples.fails'\) failed on a batch: RuntimeError: no service"):
        _run(sql + "INSERT INTO o SELECT k, fails(s), amount FROM a")


def _calc_of(sql: str):
    from tidemark.engine.stages.calc import Calc

    return next(n.stage for n in compile_sql(sql).nodes if isinstance(n.stage, Calc))


def test_the_row_path_hands_a_null_argument_to_a_udf_with_its_column_type():
    """A calc after a keyed stage may run row by row; a NULL argument must still arrive as
    its column's type (STRING, DECIMAL), as on the vectorized path, not as Arrow's null type."""
    from tidemark.engine.batch import ChangeBatch

    sql = (
        "CREATE FUNCTION count_char AS 'udf_examples.count_char' LANGUAGE PYTHON;\n"
        "CREATE FUNCTION with_tax AS 'udf_examples.with_tax' LANGUAGE PYTHON;\n" + DDL
        + "INSERT INTO o SELECT k, count_char(s, 'a'), with_tax(amount) FROM a"
    )
    calc = _calc_of(sql)
    changes = [Change("+I", r, (n,)) for n, r in enumerate(ROWS)]
    expected = [(1, 2, Decimal("12.00")), (2, None, None), (3, 0, Decimal("1.50")), (4, 0, Decimal("0.12"))]
    assert [c.row for c in calc.process(changes)] == expected
    assert [c.row for c in calc.process_batch(ChangeBatch.from_changes(changes, calc.input_schema())).changes()] == expected
