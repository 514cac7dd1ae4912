"""Flink SQL as pasted: backtick identifiers, views, CTEs, comma joins, SELECT DISTINCT and
aggregate FILTER plan onto the existing stages and compute what Flink computes, including
under retractions (each query here is run through the in-process host)."""

from __future__ import annotations

import pytest

from tidemark.engine.changelog import Change
from tidemark.engine.errors import SqlError
from tidemark.engine.pipeline import compile_sql
from tidemark.engine.replay import ReplayHost

DDL = """CREATE TABLE a (k BIGINT, v BIGINT, w BIGINT, s STRING, PRIMARY KEY (k) NOT ENFORCED) WITH ('format' = 'debezium-json');
CREATE TABLE b (k BIGINT, x BIGINT, PRIMARY KEY (k) NOT ENFORCED) WITH ('format' = 'debezium-json');
CREATE TABLE out3 (k BIGINT, v BIGINT, x BIGINT, PRIMARY KEY (k) NOT ENFORCED) WITH ('format' = 'upsert-json');
CREATE TABLE agg3 (v BIGINT, n BIGINT, t BIGINT, PRIMARY KEY (v) NOT ENFORCED) WITH ('format' = 'upsert-json');
CREATE TABLE vw (v BIGINT, w BIGINT, PRIMARY KEY (v, w) NOT ENFORCED) WITH ('format' = 'upsert-json');
"""

A = [
    Change("+I", (1, 10, 5, "x"), (1,)),
    Change("+I", (2, 10, 7, "y"), (2,)),
    Change("+I", (3, 20, 5, "x"), (3,)),
]
B = [Change("+I", (1, 100), (4,)), Change("+I", (2, 200), (5,)), Change("+I", (3, 300), (6,))]


def run(sql: str, *batches: dict[str, list[Change]]) -> dict[tuple, tuple]:
    host = ReplayHost(compile_sql(DDL + sql), clock=lambda: 0)
    for batch in batches:
        host.run_batch(batch)
    return host.table()


def test_backtick_identifiers_name_tables_and_columns():
    sql = "INSERT INTO `out3` SELECT `a`.`k`, `v`, `w` FROM `a` WHERE `s` = 'x'"
    assert run(sql, {"a": A}) == {(1,): (1, 10, 5), (3,): (3, 20, 5)}


def test_a_view_is_planned_where_it_is_read_with_its_column_names():
    sql = (
        "CREATE TEMPORARY VIEW big (id, val, other) AS SELECT k, v, w FROM a WHERE v > 10;\n"
        "INSERT INTO out3 SELECT id, val, other FROM big"
    )
    assert run(sql, {"a": A}) == {(3,): (3, 20, 5)}


def test_ctes_see_earlier_ctes_and_subqueries_in_from():
    sql = (
        "WITH c1 AS (SELECT k, v, w FROM a WHERE s = 'x'), c2 (kk, vv, ww) AS (SELECT * FROM c1)\n"
        "INSERT INTO out3 SELECT kk, vv, t.ww FROM (SELECT kk, vv, ww FROM c2) t"
    )
    assert run(sql, {"a": A}) == {(1,): (1, 10, 5), (3,): (3, 20, 5)}


def test_a_view_cannot_see_the_ctes_of_its_reader():
    sql = "CREATE VIEW v1 AS SELECT k, v, w FROM c;\nINSERT INTO out3 WITH c AS (SELECT k, v, w FROM a) SELECT * FROM v1"
    with pytest.raises(SqlError, match="unknown table 'c'"):
        compile_sql(DDL + sql)


def test_a_sink_read_through_a_view_is_refused():
    sql = "CREATE VIEW v1 AS SELECT k, v, x FROM out3;\nINSERT INTO out3 SELECT * FROM v1"
    with pytest.raises(SqlError, match="both read and written"):
        compile_sql(DDL + sql)


def test_comma_join_is_the_inner_join_with_its_condition_from_where():
    comma = "INSERT INTO out3 SELECT a.k, a.v, b.x FROM a, b WHERE a.k = b.k AND b.x BETWEEN a.v * 10 AND a.v * 10 + 50 AND a.w > 4"
    on = "INSERT INTO out3 SELECT a.k, a.v, b.x FROM a JOIN b ON a.k = b.k AND b.x BETWEEN a.v * 10 AND a.v * 10 + 50 WHERE a.w > 4"
    plan = compile_sql(DDL + comma)
    assert [n.kind for n in plan.nodes].count("join") == 1
    retract = {"b": [Change("-U", (1, 100), (7,)), Change("+U", (1, 999), (7,))]}
    assert run(comma, {"a": A, "b": B}) == run(on, {"a": A, "b": B}) == {(1,): (1, 10, 100)}
    assert run(comma, {"a": A, "b": B}, retract) == run(on, {"a": A, "b": B}, retract) == {}


def test_select_distinct_keeps_a_row_while_any_input_row_gives_it():
    sql = "INSERT INTO vw SELECT DISTINCT v, w FROM a"
    plan = compile_sql(DDL + sql)
    assert "aggregates: (none: SELECT DISTINCT)" in plan.explain_text()
    more = {"a": [Change("+I", (4, 10, 5, "z"), (7,))]}
    assert run(sql, {"a": A}, more) == {(10, 5): (10, 5), (10, 7): (10, 7), (20, 5): (20, 5)}
    gone = {"a": [Change("-D", (1, 10, 5, "x"), (8,))]}
    assert (10, 5) in run(sql, {"a": A}, more, gone)  # k=4 still gives (10, 5)
    gone_too = {"a": [Change("-D", (4, 10, 5, "z"), (9,))]}
    assert (10, 5) not in run(sql, {"a": A}, more, gone, gone_too)


def test_aggregate_filter_counts_only_the_rows_it_admits():
    sql = (
        "INSERT INTO agg3 SELECT v, COUNT(*) FILTER (WHERE s = 'x'), "
        "SUM(w) FILTER (WHERE w > 5) FROM a GROUP BY v"
    )
    assert run(sql, {"a": A}) == {(10,): (10, 1, 7), (20,): (20, 1, None)}
    retract = {"a": [Change("-U", (1, 10, 5, "x"), (7,)), Change("+U", (1, 10, 9, "y"), (7,))]}
    assert run(sql, {"a": A}, retract) == {(10,): (10, 0, 16), (20,): (20, 1, None)}


def test_count_distinct_with_filter():
    sql = "INSERT INTO agg3 SELECT v, COUNT(DISTINCT w) FILTER (WHERE s <> 'y'), COUNT(*) FROM a GROUP BY v HAVING COUNT(*) FILTER (WHERE w = 5) > 0"
    more = {"a": [Change("+I", (4, 10, 5, "z"), (7,)), Change("+I", (5, 10, 6, "z"), (8,))]}
    assert run(sql, {"a": A}, more) == {(10,): (10, 2, 4), (20,): (20, 1, 1)}


def test_a_non_equi_condition_in_a_left_joins_on_pads_instead_of_filtering():
    """In ON of an outer join a non-equi condition decides the partners, it does not filter:
    a left row without a passing partner is padded with NULLs."""
    sql = "INSERT INTO out3 SELECT a.k, a.v, b.x FROM a LEFT JOIN b ON a.k = b.k AND b.x > a.v * 15"
    assert run(sql, {"a": A, "b": B}) == {(1,): (1, 10, None), (2,): (2, 10, 200), (3,): (3, 20, None)}
    moved = {"b": [Change("-U", (3, 300), (7,)), Change("+U", (3, 301), (7,))]}
    assert run(sql, {"a": A, "b": B}, moved)[(3,)] == (3, 20, 301)
