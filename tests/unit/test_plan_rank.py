"""ROW_NUMBER Top-N and deduplication: what the planner builds (range, whether the row number
is output, upsert keys as Flink 2.3 infers them), what a replay of it gives, and the forms it
refuses, by name and position."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tidemark.engine.changelog import Change
from tidemark.engine.errors import PlanError, SqlError
from tidemark.engine.pipeline import compile_sql
from tidemark.engine.replay import ReplayHost

DDL = """CREATE TABLE ev (id BIGINT, cat STRING, v BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 'ev', 'format' = 'debezium-json');
CREATE TABLE top2 (cat STRING, rn BIGINT, id BIGINT, v BIGINT, PRIMARY KEY (cat, rn) NOT ENFORCED) WITH ('topic' = 't', 'format' = 'upsert-json');
CREATE TABLE firsts (cat STRING, id BIGINT, v BIGINT, PRIMARY KEY (cat) NOT ENFORCED) WITH ('topic' = 'f', 'format' = 'upsert-json');
CREATE TABLE byid (id BIGINT, cat STRING, v BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 'b', 'format' = 'upsert-json');
"""  # the query starts on line 5

RANKED = "(SELECT id, cat, v, ROW_NUMBER() OVER (PARTITION BY cat ORDER BY v DESC) AS rn FROM ev)"


def rank_node(sql: str):
    p = compile_sql(DDL + sql)
    return p, next(n for n in p.nodes if n.kind == "rank")


@pytest.mark.parametrize(
    "where, start, end",
    [("rn <= 2", 1, 2), ("rn < 3", 1, 2), ("2 >= rn", 1, 2), ("rn = 1", 1, 1),
     ("rn BETWEEN 2 AND 4", 2, 4), ("rn > 1 AND rn <= 3", 2, 3), ("rn <= 5 AND rn <= 2", 1, 2)],
)
def test_the_enclosing_where_sets_the_rank_range(where, start, end):
    _, node = rank_node(f"INSERT INTO top2 SELECT cat, rn, id, v FROM {RANKED} WHERE {where} ON CONFLICT DO DEDUPLICATE")
    assert (node.stage.start, node.stage.end) == (start, end)
    assert node.detail["range"] == f"{start}..{end}"


def test_top_n_with_row_number_is_keyed_by_partition_and_rank():
    p, node = rank_node(f"INSERT INTO top2 SELECT cat, rn, id, v FROM {RANKED} WHERE rn <= 2")
    assert node.stage.output_rank
    assert p.sink_node.upsert_key == (0, 1)  # (cat, rn) = the sink PK: no materializer
    assert p.materializer is None


def test_top_1_is_keyed_by_the_partition_key_and_does_not_output_the_row_number():
    p, node = rank_node(f"INSERT INTO firsts SELECT cat, id, v FROM {RANKED} WHERE rn = 1")
    assert not node.stage.output_rank and node.stage.top1
    assert node.key_names(node.upsert_key) == ["cat"]
    assert p.materializer is None


def test_top_n_without_row_number_keeps_only_input_keys_that_contain_the_partition_key():
    # the input key (id) does not contain the partition key (cat): no upsert key, so a sink
    # keyed by id needs ON CONFLICT, as in Flink
    with pytest.raises(PlanError, match=r"the query has no upsert key .* ON CONFLICT DO NOTHING"):
        compile_sql(DDL + f"INSERT INTO byid SELECT id, cat, v FROM {RANKED} WHERE rn <= 2")
    p = compile_sql(DDL + "INSERT INTO byid SELECT id, cat, v FROM (SELECT id, cat, v, ROW_NUMBER() OVER "
                          "(PARTITION BY id ORDER BY v) AS rn FROM ev) WHERE rn <= 2")
    assert p.materializer is None  # partitioned by the key itself: the input key stays


def test_other_conjuncts_filter_after_the_rank():
    p = compile_sql(DDL + f"INSERT INTO top2 SELECT cat, rn, id, v FROM {RANKED} WHERE rn <= 2 AND v > 1")
    host = ReplayHost(p)
    host.run_batch({"ev": [Change("+I", (1, "a", 5), (1,)), Change("+I", (2, "a", 1), (2,)),
                           Change("+I", (3, "a", 0), (3,))]}, now_ms=0)
    # ranks are over every row; the filter then drops (a, 2, 2, 1)
    assert host.rows() == [("a", 1, 1, 5)]


def test_replay_of_a_top_2_over_a_changelog():
    p = compile_sql(DDL + f"INSERT INTO top2 SELECT cat, rn, id, v FROM {RANKED} WHERE rn <= 2")
    host = ReplayHost(p)
    host.run_batch({"ev": [Change("+I", (1, "a", 5), (1,)), Change("+I", (2, "a", 3), (2,)),
                           Change("+I", (3, "a", 1), (3,))]}, now_ms=0)
    assert host.rows() == [("a", 1, 1, 5), ("a", 2, 2, 3)]
    host.run_batch({"ev": [Change("-U", (1, "a", 5), (4,)), Change("+U", (1, "b", 5), (4,))]}, now_ms=1)
    assert host.rows() == [("a", 1, 2, 3), ("a", 2, 3, 1), ("b", 1, 1, 5)]


def test_row_number_anywhere_in_the_select_list_and_through_a_cte():
    p = compile_sql(DDL + "INSERT INTO top2 WITH r AS (SELECT ROW_NUMBER() OVER (PARTITION BY cat ORDER BY v) AS rn, "
                          "cat, id, v FROM ev) SELECT cat, rn, id, v FROM r WHERE rn <= 2")
    host = ReplayHost(p)
    host.run_batch({"ev": [Change("+I", (1, "a", 5), (1,)), Change("+I", (2, "a", 3), (2,))]}, now_ms=0)
    assert host.rows() == [("a", 1, 2, 3), ("a", 2, 1, 5)]


@pytest.mark.parametrize(
    "query, message, col",
    [
        (f"INSERT INTO top2 SELECT cat, rn, id, v FROM {RANKED}",
         "ROW_NUMBER() OVER (PARTITION BY cat ORDER BY v DESC) needs a filter on its result", 65),
        (f"INSERT INTO top2 SELECT cat, rn, id, v FROM {RANKED} WHERE rn <= id",
         "ROW_NUMBER() OVER (PARTITION BY cat ORDER BY v DESC) needs a filter on its result", 65),
        ("INSERT INTO top2 SELECT cat, rn, id, v FROM (SELECT id, cat, v, RANK() OVER (PARTITION BY cat ORDER BY v) AS rn FROM ev) WHERE rn <= 2",
         "window function RANK() OVER (PARTITION BY cat ORDER BY v) is not supported", 65),
        ("INSERT INTO top2 SELECT cat, rn, id, v FROM (SELECT id, cat, v, ROW_NUMBER() OVER (PARTITION BY cat) AS rn FROM ev) WHERE rn <= 2",
         "ROW_NUMBER() OVER needs ORDER BY", 65),
        (f"INSERT INTO top2 SELECT cat, rn, id, v FROM {RANKED} WHERE rn > 3 AND rn < 2",
         "the filter on rn leaves no rank (4..1)", 65),
        ("INSERT INTO firsts SELECT cat, COUNT(*), ROW_NUMBER() OVER (ORDER BY cat) FROM ev GROUP BY cat",
         "ROW_NUMBER() OVER in a SELECT with GROUP BY or aggregates is not supported", 42),
    ],
)
def test_unsupported_rank_forms_name_the_construct_and_where(query, message, col):
    with pytest.raises(SqlError) as info:
        compile_sql(DDL + query)
    assert message in str(info.value)
    assert info.value.line == 5 and info.value.col == col


def test_cli_refuses_an_unbounded_row_number_in_one_line_with_status_2(tmp_path):
    path = tmp_path / "p.sql"
    path.write_text(DDL + f"INSERT INTO top2 SELECT cat, rn, id, v FROM {RANKED};\n", encoding="utf-8")
    proc = subprocess.run([str(Path(sys.executable).parent / "tidemark"), "explain", str(path)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") <= 1 and "needs a filter on its result" in proc.stderr and "line 5" in proc.stderr
