"""UNION ALL and UNION: the union stage, how the planner builds it (branches, names, type
widening, upsert keys, changelog mode) and what the replay host computes through it."""

from __future__ import annotations

from collections import Counter

import pytest

from tidemark.engine.changelog import Change
from tidemark.engine.errors import SqlError
from tidemark.engine.pipeline import compile_sql
from tidemark.engine.replay import ReplayHost
from tidemark.engine.stages.union import Union

DDL = """
CREATE TABLE a (k BIGINT, v INT, PRIMARY KEY (k) NOT ENFORCED) WITH ('topic' = 'a', 'format' = 'debezium-json');
CREATE TABLE b (k BIGINT, w BIGINT, PRIMARY KEY (k) NOT ENFORCED) WITH ('topic' = 'b', 'format' = 'debezium-json');
CREATE TABLE e1 (k BIGINT, v INT) WITH ('topic' = 'e1', 'format' = 'json');
CREATE TABLE e2 (k BIGINT, v INT) WITH ('topic' = 'e2', 'format' = 'json');
CREATE TABLE t (k BIGINT, v BIGINT) WITH ('topic' = 't', 'format' = 'changelog-json');
CREATE TABLE tk (k BIGINT, v BIGINT, PRIMARY KEY (k) NOT ENFORCED) WITH ('topic' = 'tk', 'format' = 'upsert-json');
"""


def _kind(pipeline, kind):
    return [n for n in pipeline.nodes if n.kind == kind]


def _multiset(host: ReplayHost, batches: list[dict]) -> Counter:
    """The sink as a multiset after the batches (the sink has no key: every change counts)."""
    total: Counter = Counter()
    for i, batch in enumerate(batches):
        for c in host.run_batch(batch, now_ms=i):
            total[c.row] += c.weight
    return +total


def test_the_stage_concatenates_its_inputs_keeping_kinds_and_positions():
    a = [Change("+I", (1,), (1,)), Change("-U", (1,), (3,))]
    b = [Change("+I", (1,), (2,))]
    assert Union(2).process_inputs([a, b]) == a + b
    with pytest.raises(ValueError, match="has 2 inputs, got 1"):
        Union(2).process_inputs([a])
    with pytest.raises(ValueError, match="at least two inputs"):
        Union(1)


def test_three_branches_are_one_union_named_and_typed_as_flink_does():
    p = compile_sql(DDL + "INSERT INTO t SELECT k, v FROM a UNION ALL SELECT k AS kk, w FROM b UNION ALL SELECT k + 1, v FROM a")
    [union] = _kind(p, "union")
    assert len(union.inputs) == 3
    assert union.columns == ["k", "v"]  # the first branch's names
    assert [str(t) for t in union.types] == ["BIGINT", "BIGINT"]  # INT widened to BIGINT
    assert union.upsert_keys == frozenset() and union.changelog_mode == "retract"
    casts = [n for n in p.nodes if n.kind == "calc" and "CAST(" in str(n.stage.to_spark_sql()["columns"])]
    assert len(casts) == 2  # both branches reading a.v (INT) are cast; b.w is BIGINT already
    assert "[%d] union <- [%s]" % (union.id, "], [".join(map(str, union.inputs))) in p.explain_text()


def test_a_union_of_append_only_inputs_is_append_only():
    p = compile_sql(DDL + "INSERT INTO t SELECT k, v FROM e1 UNION ALL SELECT k, v FROM e2")
    [union] = _kind(p, "union")
    assert union.changelog_mode == "append"
    assert union.types == p.node(union.inputs[0]).types  # same types: no cast calc
    assert [p.node(i).kind for i in union.inputs] == ["source", "source"]


def test_no_upsert_key_so_a_keyed_sink_needs_on_conflict():
    with pytest.raises(Exception, match="ON CONFLICT"):
        compile_sql(DDL + "INSERT INTO tk SELECT k, v FROM a UNION ALL SELECT k, w FROM b")
    p = compile_sql(DDL + "INSERT INTO tk SELECT k, v FROM a UNION ALL SELECT k, w FROM b ON CONFLICT DO DEDUPLICATE")
    assert p.materializer is not None


def test_retractions_flow_through_each_branch():
    p = compile_sql(DDL + "INSERT INTO t SELECT k, v FROM a UNION ALL SELECT k, w FROM b WHERE w > 1")
    host = ReplayHost(p)
    batches = [
        {"a": [Change("+I", (1, 5), (1,))], "b": [Change("+I", (2, 7), (2,)), Change("+I", (3, 0), (3,))]},
        {"a": [Change("-U", (1, 5), (4,)), Change("+U", (1, 6), (4,))], "b": [Change("-D", (2, 7), (5,))]},
    ]
    assert _multiset(host, batches) == Counter({(1, 6): 1})


def test_one_table_in_two_branches_gives_each_row_twice():
    p = compile_sql(DDL + "INSERT INTO t SELECT k, v FROM a UNION ALL SELECT k, v FROM a")
    [union] = _kind(p, "union")
    assert union.inputs[0] == union.inputs[1]
    host = ReplayHost(p)
    assert _multiset(host, [{"a": [Change("+I", (1, 5), (1,))]}]) == Counter({(1, 5): 2})


def test_union_without_all_is_union_all_then_distinct():
    p = compile_sql(DDL + "INSERT INTO t SELECT k, v FROM e1 UNION SELECT k, v FROM e2")
    assert [n.kind for n in p.nodes][-3:] == ["union", "aggregate", "sink"]
    assert p.node(p.nodes[-2].id).upsert_keys == frozenset({frozenset({0, 1})})
    host = ReplayHost(p)
    rows = _multiset(host, [{"e1": [Change("+I", (1, 5), (1,))], "e2": [Change("+I", (1, 5), (2,)), Change("+I", (2, 5), (3,))]}])
    assert rows == Counter({(1, 5): 1, (2, 5): 1})


@pytest.mark.parametrize(
    "query",
    [
        "INSERT INTO t WITH u AS (SELECT k, v FROM a UNION ALL SELECT k, w FROM b) SELECT k, v FROM u WHERE v > 1",
        "INSERT INTO t SELECT k, v FROM (SELECT k, v FROM a UNION ALL SELECT k, w FROM b) u WHERE v > 1",
        "INSERT INTO t WITH x AS (SELECT k, v FROM a) SELECT k, v FROM x WHERE v > 1 UNION ALL SELECT k, w FROM b WHERE w > 1",
        "INSERT INTO t SELECT k, v FROM a WHERE v > 1 UNION ALL (SELECT k, w FROM b WHERE w > 1)",
    ],
)
def test_a_union_may_stand_wherever_a_query_may(query):
    host = ReplayHost(compile_sql(DDL + query))
    batch = {"a": [Change("+I", (1, 5), (1,)), Change("+I", (2, 0), (2,))], "b": [Change("+I", (3, 7), (3,))]}
    assert _multiset(host, [batch]) == Counter({(1, 5): 1, (3, 7): 1})


def test_order_by_on_a_union_is_refused_with_its_position():
    with pytest.raises(SqlError, match="ORDER BY on a UNION is not supported") as info:
        compile_sql(DDL + "INSERT INTO t SELECT k, v FROM a UNION ALL SELECT k, w FROM b ORDER BY k")
    assert info.value.line == 8
