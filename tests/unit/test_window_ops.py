"""Window Top-N and window join on the replay host: literal batches in, rows out, the
watermark moving between batches (output insert-only, once, when the watermark passes the
window; late rows dropped; state gone once the window fires); their typed state through the
state codec; what the planner turns into them and what it refuses, by name and position."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta

import pytest

from tidemark.engine import state_codec
from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change
from tidemark.engine.errors import SqlError
from tidemark.engine.pipeline import compile_sql
from tidemark.engine.replay import ReplayHost
from tidemark.engine.stage import BatchContext
from tidemark.spark.event_clock import watermark_sources
from tidemark.spark.watermark import check_supported

START = datetime(2026, 11, 24, 10, 0, 0)


def at(second: float) -> datetime:
    return START + timedelta(seconds=second)


def table(name: str) -> str:
    return (f"CREATE TABLE {name} (k BIGINT, v BIGINT, ts TIMESTAMP(3),\n"
            f"  WATERMARK FOR ts AS ts - INTERVAL '2' SECOND) WITH ('format' = 'json');\n")


def row(seq: int, k: int | None, v: int | None, second: float) -> Change:
    return Change("+I", (k, v, at(second)), (seq,))


def tumble(t: str) -> str:
    return f"TABLE(TUMBLE(TABLE {t}, DESCRIPTOR(ts), INTERVAL '10' SECOND))"


TOP2 = table("bids") + (
    "CREATE TABLE out (ws TIMESTAMP(3), k BIGINT, v BIGINT, rn BIGINT) WITH ('format' = 'changelog-json');\n"
    "INSERT INTO out SELECT window_start, k, v, rn FROM (\n"
    "  SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end ORDER BY v DESC) AS rn\n"
    f"  FROM {tumble('bids')}) WHERE rn <= 2"
)


def join_sql(kind: str = "", on: str = "") -> str:
    return table("l") + table("r") + (
        "CREATE TABLE out (lk BIGINT, lv BIGINT, rk BIGINT, rv BIGINT, ws TIMESTAMP(3)) WITH ('format' = 'changelog-json');\n"
        "INSERT INTO out SELECT L.k, L.v, R.k, R.v, COALESCE(L.window_start, R.window_start)\n"
        f"FROM (SELECT * FROM {tumble('l')}) L {kind} JOIN (SELECT * FROM {tumble('r')}) R\n"
        f"ON L.k = R.k AND L.window_start = R.window_start AND L.window_end = R.window_end{on}"
    )


def stage_node(pipeline, kind: str):  # noqa: ANN001, ANN201
    return next(n for n in pipeline.nodes if n.kind == kind)


# ------------------------------------------------------------------ window Top-N


def test_window_top_n_emits_the_top_rows_once_when_the_watermark_passes_and_forgets_the_window():
    pipeline = compile_sql(TOP2)
    rank = stage_node(pipeline, "window_rank")
    host = ReplayHost(pipeline)
    assert host.run_batch({"bids": [row(1, 1, 10, 1), row(2, 2, 30, 2), row(3, 3, 20, 3), row(4, 4, 5, 4)]}, now_ms=0) == []
    assert host.state[rank.id].height == 2, "only the rows that can still be in the top 2 are kept"
    # 12.5 s - 2 s = watermark 10.5 s: [0 s, 10 s) fires, as inserts with their row numbers
    fired = host.run_batch({"bids": [row(5, 5, 1, 12.5)]}, now_ms=0)
    assert [(c.kind, c.row, c.pos) for c in fired] == [("+I", (at(0), 2, 30, 1), (2,)), ("+I", (at(0), 3, 20, 2), (3,))]
    assert host.state[rank.id].height == 1, "the fired window's rows are gone; [10 s, 20 s) is open"
    # 7 s is in the fired window: late, dropped and counted, never emitted
    assert host.run_batch({"bids": [row(6, 6, 99, 7)]}, now_ms=0) == []
    assert host.metrics["late_records_dropped"] == 1
    assert [c.row for c in host.finish(now_ms=0)] == [(at(10), 5, 1, 1)]
    assert host.state[rank.id] is None


def test_window_top_n_without_the_row_number_outputs_null_for_it_and_ties_go_to_the_first_arrival():
    sql = TOP2.replace("SELECT window_start, k, v, rn FROM", "SELECT window_start, k, v, CAST(NULL AS BIGINT) FROM")
    pipeline = compile_sql(sql)
    assert stage_node(pipeline, "window_rank").stage.output_rank is False
    host = ReplayHost(pipeline)
    host.run_batch({"bids": [row(3, 3, 10, 3), row(1, 1, 10, 1), row(2, 2, 10, 2)]}, now_ms=0)
    assert sorted(c.row for c in host.finish(now_ms=0)) == [(at(0), 1, 10, None), (at(0), 2, 10, None)]


def test_window_deduplication_by_event_time_descending_keeps_the_last_row_and_an_equal_time_replaces():
    sql = TOP2.replace("ORDER BY v DESC", "ORDER BY ts DESC").replace("rn <= 2", "rn = 1")
    pipeline = compile_sql(sql)
    rank = stage_node(pipeline, "window_rank")
    assert rank.stage.ties == "last" and "deduplicate" in rank.detail
    host = ReplayHost(pipeline)
    host.run_batch({"bids": [row(1, 1, 0, 4), row(2, 2, 0, 5), row(3, 3, 0, 5), row(4, 4, 0, 2)]}, now_ms=0)
    assert [c.row for c in host.finish(now_ms=0)] == [(at(0), 3, 0, 1)]


def test_a_rank_over_a_window_aggregate_or_not_partitioned_by_both_bounds_is_no_window_top_n():
    """Over a window aggregate it stays a regular rank (with retractions: planner.window_ops
    says why); a window table function read by a rank not partitioned by both bounds is
    refused, as a window table function read directly is."""
    over_aggregate = table("bids") + (
        "CREATE TABLE out (ws TIMESTAMP(3), k BIGINT) WITH ('format' = 'changelog-json');\n"
        "INSERT INTO out SELECT ws, k FROM (\n"
        "  SELECT *, ROW_NUMBER() OVER (PARTITION BY ws ORDER BY n DESC) AS rn FROM (\n"
        "    SELECT window_start AS ws, window_end AS we, k, COUNT(*) AS n\n"
        f"    FROM {tumble('bids')} GROUP BY window_start, window_end, k)) WHERE rn = 1"
    )
    pipeline = compile_sql(over_aggregate)
    assert [n.kind for n in pipeline.nodes if "rank" in n.kind] == ["rank"]
    assert stage_node(pipeline, "rank").changelog_mode == "retract"
    by_both_bounds = compile_sql(over_aggregate.replace("PARTITION BY ws", "PARTITION BY ws, we"))
    assert [n.kind for n in by_both_bounds.nodes if "rank" in n.kind] == ["rank"], "over a window aggregate"
    sql = TOP2.replace("PARTITION BY window_start, window_end", "PARTITION BY window_start")
    with pytest.raises(SqlError, match=r"TUMBLE\(\.\.\.\) is only supported under GROUP BY window_start, window_end \(a window aggregate\), ROW_NUMBER"):
        compile_sql(sql)


# ------------------------------------------------------------------ window join


def test_window_join_emits_the_window_once_both_watermarks_pass_it_and_keeps_nothing_after():
    pipeline = compile_sql(join_sql())
    node = stage_node(pipeline, "window_join")
    assert node.changelog_mode == "append" and node.stage.join_type == "inner"
    host = ReplayHost(pipeline)
    assert host.run_batch({"l": [row(1, 1, 10, 1), row(2, None, 20, 2)], "r": [row(1, 1, 15, 3), row(2, None, 25, 4)]}, now_ms=0) == []
    # l's watermark passes 10 s, r's does not: the join waits for the least of them
    assert host.run_batch({"l": [row(3, 1, 11, 15)]}, now_ms=0) == []
    assert host.run_batch({"r": [row(3, 1, 16, 13)]}, now_ms=0) == [Change("+I", (1, 10, 1, 15, at(0)), (1,))]
    assert host.state[node.id].height == 2, "only the open window [10 s, 20 s) is kept"
    # the NULL keys never matched; r's 9 s row is late now
    assert host.run_batch({"r": [row(4, 1, 99, 9)]}, now_ms=0) == []
    assert host.metrics["late_records_dropped"] == 1
    assert host.finish(now_ms=0) == [Change("+I", (1, 11, 1, 16, at(10)), (3,))]
    assert host.state[node.id] is None


@pytest.mark.parametrize(("kind", "expected"), [
    ("LEFT", [(1, 10, 1, 15), (2, 20, None, None), (3, 30, None, None)]),
    ("RIGHT", [(1, 10, 1, 15), (None, None, 1, 5), (None, None, 4, 40)]),
    ("FULL", [(1, 10, 1, 15), (2, 20, None, None), (3, 30, None, None), (None, None, 1, 5), (None, None, 4, 40)]),
])
def test_outer_window_joins_pad_the_rows_no_partner_passed_the_residual_for(kind, expected):
    host = ReplayHost(compile_sql(join_sql(kind, on=" AND L.v < R.v")))
    host.run_batch({"l": [row(1, 1, 10, 1), row(2, 2, 20, 2), row(3, 3, 30, 3)],
                    "r": [row(1, 1, 15, 1), row(2, 1, 5, 2), row(3, 4, 40, 3)]}, now_ms=0)
    out = host.finish(now_ms=0)
    assert {c.kind for c in out} == {"+I"}
    assert sorted((c.row[:4] for c in out), key=repr) == sorted(expected, key=repr)


def q8_like(on: str = "P.k = A.k AND P.s = A.s AND P.e = A.e", right_size: int = 10) -> str:
    right = f"TABLE(TUMBLE(TABLE r, DESCRIPTOR(ts), INTERVAL '{right_size}' SECOND))"
    return table("l") + table("r") + (
        "CREATE TABLE out (k BIGINT, ws TIMESTAMP(3)) WITH ('format' = 'changelog-json');\n"
        "INSERT INTO out SELECT P.k, P.s FROM (\n"
        f"  SELECT k, window_start AS s, window_end AS e FROM {tumble('l')} GROUP BY k, window_start, window_end) P\n"
        f"JOIN (SELECT k, window_start AS s, window_end AS e FROM {right} GROUP BY k, window_start, window_end) A\n"
        f"ON {on}"
    )


def test_the_window_kernels_state_is_typed_arrow_and_survives_a_round_trip():
    pipeline = compile_sql(join_sql("LEFT"))
    node = stage_node(pipeline, "window_join")
    assert state_codec.format_of(node.stage) == "window-join/1"
    kernel = node.stage.batch_kernel()
    windows = [n.stage for n in pipeline.nodes if n.kind == "window"]
    left = ChangeBatch(changes=windows[0].process([row(1, 1, 10, 1), row(2, 2, 20, 2)]))
    right = ChangeBatch(changes=windows[1].process([row(1, 1, 15, 3)]))
    ctx = BatchContext(metrics=Counter(), watermarks={"l": 1_000, "r": 1_000})
    state, out = kernel.process_batch([left, right], state_codec.empty_state(node.stage), ctx)
    assert out.changes() == []
    restored = state_codec.decode_state(node.stage, state_codec.encode_state(node.stage, state))
    end = BatchContext(metrics=Counter(), watermarks={"l": 2**63 - 1, "r": 2**63 - 1})
    state, out = kernel.process_batch([ChangeBatch(changes=[]), ChangeBatch(changes=[])], restored, end)
    assert sorted((c.row[0], c.row[1], c.row[6]) for c in out.changes()) == [(1, 10, 1), (2, 20, None)]
    assert state is None and state_codec.encode_state(node.stage, state) is None
    assert state_codec.format_of(stage_node(compile_sql(TOP2), "window_rank").stage) == "window-rank/1"


@pytest.mark.parametrize("sql", [q8_like("P.k = A.k AND P.s = A.s"), q8_like(right_size=5), q8_like()],
                         ids=["one-bound", "two-windows", "nexmark-q8"])
def test_a_join_of_window_aggregates_stays_a_regular_join_which_spark_runs(sql):
    """Flink 2.3 plans a window join for Nexmark q8's shape (both bounds, one window), a
    regular join for the other two; here all three stay regular (planner.window_ops)."""
    pipeline = compile_sql(sql)
    kinds = [n.kind for n in pipeline.nodes]
    assert "join" in kinds and "window_join" not in kinds
    check_supported(pipeline)  # the Spark host runs it


@pytest.mark.parametrize(("sql", "message", "token"), [
    (join_sql().replace(" AND L.window_end = R.window_end", ""),
     r"TUMBLE\(\.\.\.\) is only supported under GROUP BY window_start, window_end", "FROM (SELECT"),
    (join_sql().replace("CREATE TABLE l (k BIGINT", "CREATE TABLE l (k BIGINT PRIMARY KEY NOT ENFORCED")
     .replace("WITH ('format' = 'json');\nCREATE TABLE r", "WITH ('format' = 'upsert-json');\nCREATE TABLE r"),
     "a window join needs insert-only inputs, and 'normalize:l' is a retract changelog", "L.k = R.k"),
    (TOP2.replace("(k BIGINT,", "(k BIGINT PRIMARY KEY NOT ENFORCED,").replace("'json'", "'upsert-json'", 1),
     "a window Top-N needs insert-only inputs, and 'normalize:bids' is a retract changelog", "ROW_NUMBER()"),
])
def test_window_operator_refusals_name_the_construct_and_its_position(sql, message, token):
    with pytest.raises(SqlError, match=message) as e:
        compile_sql(sql)
    line = next(i for i, text in enumerate(sql.splitlines(), start=1) if token in text)
    assert f"line {line}," in str(e.value)


def test_window_top_n_and_window_join_are_event_time_stages_to_the_spark_host():
    for sql, kind in ((TOP2, "window_rank"), (join_sql(), "window_join")):
        pipeline = compile_sql(sql)
        node = stage_node(pipeline, kind)
        check_supported(pipeline)  # runs on Spark (tests/integration/test_spark_window_ops.py)
        assert watermark_sources(node.stage) == node.stage.sources and node.stage.sources
