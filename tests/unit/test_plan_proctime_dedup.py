"""Deduplication by processing time: ``ROW_NUMBER() OVER (PARTITION BY k ORDER BY p)`` where
``p`` is a processing-time attribute ranks by arrival (source position), as Flink 2.3's
``Deduplicate`` does; what the planner builds, what EXPLAIN says, what a replay of several
batches gives, and the forms it refuses, by name and position."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tidemark.engine.changelog import Change
from tidemark.engine.errors import SqlError
from tidemark.engine.pipeline import compile_sql
from tidemark.engine.replay import ReplayHost

DDL = """CREATE TABLE bid (auction BIGINT, price BIGINT, p AS PROCTIME()) WITH ('topic' = 'bid', 'format' = 'json');
CREATE TABLE plain (auction BIGINT, price BIGINT) WITH ('topic' = 'plain', 'format' = 'json');
CREATE TABLE cdc (id BIGINT, auction BIGINT, price BIGINT, p AS PROCTIME(), PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 'cdc', 'format' = 'debezium-json');
CREATE TABLE firsts (auction BIGINT, price BIGINT, PRIMARY KEY (auction) NOT ENFORCED) WITH ('topic' = 'f', 'format' = 'upsert-json');
CREATE TABLE log (auction BIGINT, price BIGINT) WITH ('topic' = 'l', 'format' = 'json');
CREATE TABLE changes (auction BIGINT, price BIGINT) WITH ('topic' = 'c', 'format' = 'debezium-json');
"""  # the query starts on line 7


def dedup(order: str, source: str = "bid") -> str:
    return (f"INSERT INTO firsts SELECT auction, price FROM (SELECT *, ROW_NUMBER() OVER "
            f"(PARTITION BY auction ORDER BY {order}) AS rn FROM {source}) WHERE rn = 1")


def rank_node(sql: str):
    p = compile_sql(DDL + sql)
    return p, next(n for n in p.nodes if n.kind == "rank")


@pytest.mark.parametrize("order, ties, word", [("p", "first", "first"), ("p ASC", "first", "first"), ("p DESC", "last", "last")])
def test_order_by_a_declared_processing_time_attribute_ranks_by_arrival(order, ties, word):
    p, node = rank_node(dedup(order))
    assert node.stage.order == () and node.stage.ties == ties and node.stage.top1
    assert node.key_names(node.upsert_key) == ["auction"]
    assert p.materializer is None
    assert node.detail["deduplicate"] == f"keep the {word} row by processing time (arrival)"
    assert f"deduplicate: keep the {word} row by processing time (arrival)" in p.explain_text()


def test_a_from_subquerys_proctime_item_is_a_processing_time_attribute_too():
    _, node = rank_node(dedup("pt DESC", "(SELECT *, PROCTIME() AS pt FROM plain) b"))
    assert node.stage.order == () and node.stage.ties == "last"
    assert node.detail["order_by"] == ["pt DESC (processing time)"]


def test_keeping_the_first_row_of_an_append_only_input_is_append_only():
    # Flink: Deduplicate(keep=[FirstRow], ..., outputInsertOnly=[true]); a sink without a key takes it
    p = compile_sql(DDL + dedup("p").replace("INSERT INTO firsts", "INSERT INTO log"))
    assert [n.changelog_mode for n in p.nodes if n.kind in ("rank", "calc")] == ["append", "append"]
    _, last = rank_node(dedup("p DESC"))
    assert last.changelog_mode == "retract"


def test_top_n_by_processing_time_keeps_the_first_n_arrivals():
    p, node = rank_node("INSERT INTO changes SELECT auction, price FROM (SELECT *, ROW_NUMBER() OVER "
                        "(PARTITION BY auction ORDER BY p) AS rn FROM bid) WHERE rn <= 2")
    assert node.detail["order"] == "keep the first rows (1..2) by processing time (arrival)"
    host = ReplayHost(p)
    host.run_batch({"bid": [Change("+I", (1, 10), (1,)), Change("+I", (1, 11), (2,)), Change("+I", (1, 12), (3,))]}, now_ms=0)
    assert host.rows() == [(1, 10), (1, 11)]


def test_keep_last_may_select_the_row_number_which_is_1():
    p = compile_sql(DDL + "INSERT INTO changes SELECT auction, rn FROM (SELECT *, ROW_NUMBER() OVER "
                          "(PARTITION BY auction ORDER BY p DESC) AS rn FROM bid) WHERE rn = 1")
    host = ReplayHost(p)
    host.run_batch({"bid": [Change("+I", (1, 10), (1,)), Change("+I", (1, 11), (2,))]}, now_ms=0)
    assert host.rows() == [(1, 1)]


def test_replay_keep_first_over_several_batches_emits_each_partitions_first_row_once():
    host = ReplayHost(compile_sql(DDL + dedup("p")))
    out = host.run_batch({"bid": [Change("+I", (1, 30), (1,)), Change("+I", (2, 5), (2,)), Change("+I", (1, 10), (3,))]}, now_ms=0)
    assert sorted((c.kind, c.row) for c in out) == [("+I", (1, 30)), ("+I", (2, 5))]
    out = host.run_batch({"bid": [Change("+I", (1, 1), (4,)), Change("+I", (3, 7), (5,))]}, now_ms=1)
    assert [(c.kind, c.row) for c in out] == [("+I", (3, 7))]
    assert host.rows() == [(1, 30), (2, 5), (3, 7)]


def test_replay_keep_last_over_several_batches_replaces_with_the_latest_arrival():
    host = ReplayHost(compile_sql(DDL + dedup("p DESC")))
    out = host.run_batch({"bid": [Change("+I", (1, 30), (1,)), Change("+I", (2, 5), (2,)), Change("+I", (1, 10), (3,))]}, now_ms=0)
    assert sorted((c.kind, c.row) for c in out) == [("+I", (1, 10)), ("+I", (2, 5))]
    out = host.run_batch({"bid": [Change("+I", (1, 99), (4,)), Change("+I", (1, 40), (5,))]}, now_ms=1)
    assert [(c.kind, c.row) for c in out] == [("-U", (1, 10)), ("+U", (1, 40))]
    assert host.rows() == [(1, 40), (2, 5)]


def test_over_a_changelog_every_active_row_is_kept_in_arrival_order():
    # what Flink 2.3 runs too: the first row's retraction promotes the next arrival
    p = compile_sql(DDL + dedup("p", "cdc"))
    host = ReplayHost(p)
    host.run_batch({"cdc": [Change("+I", (1, 7, 10), (1,)), Change("+I", (2, 7, 20), (2,))]}, now_ms=0)
    assert host.rows() == [(7, 10)]
    host.run_batch({"cdc": [Change("-D", (1, 7, 10), (3,))]}, now_ms=1)
    assert host.rows() == [(7, 20)]


@pytest.mark.parametrize(
    "order, partition, message, col",
    [
        ("p, price", "auction", "ROW_NUMBER() OVER (ORDER BY p): a processing-time attribute must be the only ORDER BY key", 107),
        ("price, p DESC", "auction", "ROW_NUMBER() OVER (ORDER BY p DESC): a processing-time attribute must be the only ORDER BY key", 114),
        ("p", "p", "ROW_NUMBER() OVER (PARTITION BY p): a processing-time attribute cannot partition a rank", 90),
    ],
)
def test_processing_time_elsewhere_in_the_window_is_refused_by_name_and_place(order, partition, message, col):
    sql = dedup(order).replace("PARTITION BY auction", f"PARTITION BY {partition}")
    with pytest.raises(SqlError) as info:
        compile_sql(DDL + sql)
    assert message in str(info.value)
    assert (info.value.line, info.value.col) == (7, col)


def test_processing_time_over_a_join_is_refused():
    # Flink 2.3 materializes p before the join (PROCTIME_MATERIALIZE) and ranks by its value
    query = ("INSERT INTO firsts SELECT auction, price FROM (SELECT bid.*, ROW_NUMBER() OVER (PARTITION BY bid.auction "
             "ORDER BY p) AS rn FROM bid JOIN plain ON bid.auction = plain.auction) WHERE rn = 1")
    with pytest.raises(SqlError) as info:
        compile_sql(DDL + query)
    assert "ROW_NUMBER() OVER (ORDER BY p) over a join: Flink 2.3 turns the processing-time attribute" in str(info.value)
    assert (info.value.line, info.value.col) == (7, query.index("ORDER BY p") + 10)


@pytest.mark.parametrize(
    "query",
    [
        "INSERT INTO changes SELECT auction, price FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY p DESC) AS rn FROM bid) WHERE rn <= 2",
        "INSERT INTO changes SELECT auction, rn FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY p DESC) AS rn FROM bid) WHERE rn BETWEEN 2 AND 3",
        "INSERT INTO firsts SELECT auction, price FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY p DESC) AS rn FROM cdc) WHERE rn = 1",
    ],
)
def test_descending_processing_time_is_only_a_deduplication_of_an_insert_only_input(query):
    # Flink 2.3 plans a Deduplicate only for rn = 1 over an insert-only input; its Top-N by
    # processing time otherwise keeps the first arrivals even for DESC: refused rather than
    # answered differently (tests/conformance/test_proctime_dedup_conformance.py)
    with pytest.raises(SqlError) as info:
        compile_sql(DDL + query)
    assert "descending processing time is supported only as a deduplication keeping the last row" in str(info.value)
    assert (info.value.line, info.value.col) == (7, query.index("ROW_NUMBER") + 1)


def test_cli_explains_the_gap_query_and_refuses_keep_last_over_a_changelog_in_one_line(tmp_path):
    tidemark = str(Path(sys.executable).parent / "tidemark")
    ok, refused = tmp_path / "ok.sql", tmp_path / "refused.sql"
    ok.write_text(DDL + dedup("p ASC") + ";\n", encoding="utf-8")
    refused.write_text(DDL + dedup("p DESC", "cdc") + ";\n", encoding="utf-8")
    proc = subprocess.run([tidemark, "explain", str(ok)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "deduplicate: keep the first row by processing time (arrival)" in proc.stdout
    proc = subprocess.run([tidemark, "explain", str(refused)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") <= 1 and "descending processing time is supported only" in proc.stderr
    assert "line 7" in proc.stderr
