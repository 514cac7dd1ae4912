"""Planning work is bounded: SQL over a limit of ``tidemark.engine.limits`` is refused with
a SqlError naming the limit, its value and the position, never a RecursionError, a
traceback or minutes of CPU; SQL within the limits plans (timings: tests/bench/bench_planning.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemark.engine import limits
from tidemark.engine.errors import SqlError
from tidemark.engine.pipeline import compile_sql

DDL = """CREATE TABLE s (c0 BIGINT, c1 BOOLEAN) WITH ('topic' = 's', 'format' = 'json');
CREATE TABLE t (c0 BIGINT) WITH ('topic' = 't', 'format' = 'json');
"""  # the query starts on line 3


def wide_sql(n: int) -> str:
    cols = ", ".join(f"c{i} BIGINT" for i in range(n))
    sel = ", ".join(f"c{i} + 1 AS c{i}" for i in range(n))
    return (
        f"CREATE TABLE s ({cols}) WITH ('topic' = 's', 'format' = 'json');\n"
        f"CREATE TABLE t ({cols}) WITH ('topic' = 't', 'format' = 'json');\n"
        f"INSERT INTO t SELECT {sel} FROM s;\n"
    )


def refused(sql: str) -> SqlError:
    with pytest.raises(SqlError) as info:
        compile_sql(sql)
    return info.value


def test_a_select_of_10000_columns_is_refused_naming_the_limit_and_the_first_item_over_it():
    items = ["c0"] * 10_000
    err = refused(DDL + "INSERT INTO t SELECT " + ", ".join(items) + " FROM s;")
    assert "the SELECT has 10000 items: over the limit of 4096 columns per table or SELECT" in str(err)
    # item 4097 starts after "INSERT INTO t SELECT " (21 chars) and 4096 items of "c0, "
    assert (err.line, err.col) == (3, 22 + 4096 * 4)


def test_a_table_of_10000_columns_is_refused_at_its_4097th_column():
    err = refused(wide_sql(10_000))
    assert "the table has 10000 columns: over the limit of 4096 columns per table or SELECT" in str(err)
    assert err.line == 1 and err.col == len("CREATE TABLE s (") + sum(len(f"c{i} BIGINT, ") for i in range(4096)) + 1


def test_2000_columns_are_within_the_limits_and_plan():
    pipeline = compile_sql(wide_sql(2000))
    assert pipeline.sink_node.width == 2000
    assert pipeline.explain()["stages"][1]["detail"]["projections"][1999] == '`c1999` + 1 AS c1999'


def test_a_join_wider_than_the_column_limit_is_refused_at_the_table_that_makes_it_so():
    cols = ", ".join(f"c{i} BIGINT" for i in range(3000))
    sql = (
        f"CREATE TABLE a ({cols}) WITH ('format' = 'json');\nCREATE TABLE b ({cols}) WITH ('format' = 'json');\n"
        "CREATE TABLE t (c0 BIGINT) WITH ('format' = 'json');\n"
        "INSERT INTO t SELECT a.c0 FROM a JOIN b ON a.c0 = b.c0;\n"
    )
    err = refused(sql)
    assert "the join is 6000 columns wide: over the limit of 4096 columns per table or SELECT" in str(err)
    assert (err.line, err.col) == (4, 39)  # the b of JOIN b


@pytest.mark.parametrize(
    ("query", "message", "col"),
    [
        # 33 parentheses: the parser itself could not go this deep
        ("INSERT INTO t SELECT " + "(" * 33 + "c0" + ")" * 33 + " FROM s;",
         "'(' opens nesting level 33: over the limit of 32 levels of nested parentheses and CASE", 22 + 32),
        ("INSERT INTO t SELECT " + "CASE WHEN c1 THEN " * 40 + "c0" + " END" * 40 + " FROM s;",
         "'CASE' opens nesting level 33: over the limit of 32 levels of nested parentheses and CASE", 22 + 32 * 18),
        ("INSERT INTO t SELECT c0 FROM " + "(SELECT c0 FROM " * 40 + "s" + ") x" * 40 + ";",
         "'(' opens nesting level 33", 30 + 32 * 16),
        # 150 terms: a left-deep tree of 149 additions, deeper than Python's compiler can take
        ("INSERT INTO t SELECT " + " + ".join(["c0"] * 150) + " FROM s;",
         "an expression nests 101 levels deep: over the limit of 100 levels of expression nesting", None),
        ("INSERT INTO t SELECT c0 FROM s WHERE " + "NOT " * 105 + "c1;",
         "'NOT' is a prefix operator at nesting level 33: over the limit of 32", 38 + 32 * 4),
    ],
)
def test_nesting_over_a_limit_is_refused_with_its_position(query, message, col):
    err = refused(DDL + query)
    assert message in str(err)
    assert err.line == 3
    if col is not None:
        assert err.col == col


def test_a_recursion_error_while_planning_is_a_sql_error_naming_the_limits(monkeypatch):
    """The safety net under the checks: nesting they cannot see (none is known) still ends
    in the planner's usual error."""
    from tidemark.engine.planner import Planner

    def recurse(self):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(Planner, "plan", recurse)
    err = refused(DDL + "INSERT INTO t SELECT c0 FROM s;")
    assert str(err) == (
        "the SQL nests too deeply to plan (limits: 32 levels of nested parentheses and CASE, "
        "100 levels of expression nesting)"
    )


def test_an_expression_of_more_nodes_than_the_limit_is_refused():
    # a balanced tree stays shallow, so only the size limit applies
    def balanced(n: int) -> str:
        return "c0" if n == 1 else f"({balanced(n // 2)} + {balanced(n - n // 2)})"

    expression = balanced(3000)
    err = refused(DDL + f"INSERT INTO t SELECT {expression} FROM s;")
    assert "an expression has more syntax nodes: over the limit of 5000 syntax nodes per expression" in str(err)
    # positions are on tokens that carry a value: the first c0, after the opening parentheses
    assert (err.line, err.col) == (3, 22 + len(expression) - len(expression.lstrip("(")))


def test_more_statements_than_the_limit_are_refused_at_the_first_one_over_it():
    err = refused(DDL + "SET 'table.exec.state.ttl' = '1 h';\n" * 300 + "INSERT INTO t SELECT c0 FROM s;")
    assert "the script has 303 statements: over the limit of 256 statements per script" in str(err)
    assert err.line == 3 + 256 - 2


def test_more_joined_tables_than_the_limit_are_refused():
    joins = " ".join(f"JOIN s a{i} ON s.c0 = a{i}.c0" for i in range(70))
    err = refused(DDL + f"INSERT INTO t SELECT s.c0 FROM s {joins};")
    assert "the FROM clause joins 71 tables: over the limit of 64 tables per FROM clause" in str(err)


def test_composing_calcs_stops_before_an_expression_grows_over_the_limits():
    """Each level squares the one below; composed into one calc, 30 levels would make an
    expression of 2**30 nodes. Composition stops at the limit and the calcs stack."""
    q = "s"
    for i in range(30):
        q = f"(SELECT c0 * c0 AS c0 FROM {q} x{i})"
    pipeline = compile_sql(DDL + f"INSERT INTO t SELECT c0 FROM {q} y;")
    calcs = [n for n in pipeline.nodes if n.kind == "calc"]
    assert len(calcs) > 1
    for n in calcs:
        for e in n.stage.projections:
            assert limits.within(*limits.measure(e))


def test_every_limit_has_a_name_a_positive_value_and_a_meaning():
    assert {lim.name for lim in limits.ALL} == {
        "columns per table or SELECT", "syntax nodes per expression", "levels of expression nesting",
        "levels of nested parentheses and CASE", "statements per script", "tables per FROM clause",
    }  # fmt: skip
    assert all(lim.value > 0 and lim.meaning for lim in limits.ALL)


def test_every_limit_is_documented_with_its_value():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "sql.md").read_text(encoding="utf-8")
    missing = [lim.name for lim in limits.ALL if f"| {lim.name} | {lim.value} |" not in doc]
    assert not missing, f"docs/sql.md 'Planner limits' does not list: {missing}"
