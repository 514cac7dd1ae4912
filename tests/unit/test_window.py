"""Event time and window aggregation on the replay host: literal batches in, rows out, the
watermark moving between batches; the kernel's typed state through the state codec; and the
window forms that are refused, by name and position."""

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
from tidemark.engine.stages.window_tvf import WindowSpec

SOURCE = (
    "CREATE TABLE bids (item BIGINT, price BIGINT, ts TIMESTAMP(3),\n"
    "  WATERMARK FOR ts AS ts - INTERVAL '2' SECOND) WITH ('format' = 'json');\n"
    "CREATE TABLE out (item BIGINT, ws TIMESTAMP(3), we TIMESTAMP(3), n BIGINT, top BIGINT, total BIGINT)\n"
    "  WITH ('format' = 'changelog-json');\n"
)
TUMBLE = SOURCE + (
    "INSERT INTO out SELECT item, window_start, window_end, COUNT(*), MAX(price), SUM(price)\n"
    "FROM TABLE(TUMBLE(TABLE bids, DESCRIPTOR(ts), INTERVAL '10' SECOND))\n"
    "GROUP BY item, window_start, window_end"
)


START = datetime(2026, 11, 24, 10, 0, 0)


def at(second: float) -> datetime:
    return START + timedelta(seconds=second)


def ms(second: float) -> int:
    return (at(second) - datetime(1970, 1, 1)) // timedelta(milliseconds=1)


def bid(seq: int, item: int, price: int, second: float) -> Change:
    return Change("+I", (item, price, at(second)), (seq,))


def test_window_bounds_are_flinks_for_tumble_hop_and_cumulate():
    assert WindowSpec("TUMBLE", 10_000, 10_000).windows(12_345) == [(10_000, 20_000)]
    assert WindowSpec("HOP", 10_000, 2_000).windows(12_345) == [(s, s + 10_000) for s in range(4_000, 14_000, 2_000)]
    assert WindowSpec("CUMULATE", 10_000, 2_000).windows(12_345) == [(10_000, e) for e in (14_000, 16_000, 18_000, 20_000)]
    assert WindowSpec("TUMBLE", 10_000, 10_000).windows(-1) == [(-10_000, 0)]


def test_a_window_fires_once_when_the_watermark_passes_its_end_and_late_records_are_dropped_and_counted():
    host = ReplayHost(compile_sql(TUMBLE))
    assert host.run_batch({"bids": [bid(1, 1, 10, 1), bid(2, 1, 30, 9.5), bid(3, 2, 5, 4)]}, now_ms=0) == []
    # 12.5 s - 2 s delay = watermark 10.5 s: [0 s, 10 s) fires; its rows are inserts, final
    fired = host.run_batch({"bids": [bid(4, 1, 20, 12.5)]}, now_ms=0)
    assert sorted(c.row for c in fired) == [(1, at(0), at(10), 2, 30, 40), (2, at(0), at(10), 1, 5, 5)]
    assert {c.kind for c in fired} == {"+I"}
    # 7 s is behind the watermark and its window has fired: dropped, counted; 11 s is not late
    assert host.run_batch({"bids": [bid(5, 1, 99, 7), bid(6, 1, 1, 11)]}, now_ms=0) == []
    assert host.metrics["late_records_dropped"] == 1
    end = host.finish(now_ms=0)
    assert [c.row for c in end] == [(1, at(10), at(20), 2, 20, 21)]


def test_the_watermark_is_the_greatest_event_time_less_the_delay_and_never_moves_back():
    host = ReplayHost(compile_sql(TUMBLE))
    host.run_batch({"bids": [bid(1, 1, 10, 5), bid(2, 1, 10, 3)]}, now_ms=0)
    assert host.watermarks.current() == {"bids": ms(5) - 2000}
    host.run_batch({"bids": [bid(3, 1, 10, 1)]}, now_ms=0)
    assert host.watermarks.current() == {"bids": ms(5) - 2000}


def test_hop_counts_a_record_in_every_window_that_holds_it():
    sql = SOURCE + (
        "INSERT INTO out SELECT item, window_start, window_end, COUNT(*), MIN(price), SUM(price)\n"
        "FROM TABLE(HOP(TABLE bids, DESCRIPTOR(ts), INTERVAL '5' SECOND, INTERVAL '10' SECOND))\n"
        "GROUP BY item, window_start, window_end"
    )
    host = ReplayHost(compile_sql(sql))
    # watermark 10 s: [0 s, 10 s) fires at once, the two windows holding 12 s at the end
    first = host.run_batch({"bids": [bid(1, 1, 10, 7), bid(2, 1, 4, 12)]}, now_ms=0)
    assert [c.row for c in first] == [(1, at(0), at(10), 1, 10, 10)]
    rows = sorted(c.row for c in first + host.finish(now_ms=0))
    assert rows == [
        (1, at(0), at(10), 1, 10, 10),
        (1, at(5), at(15), 2, 4, 14),
        (1, at(10), at(20), 1, 4, 4),
    ]


def test_the_kernel_state_is_typed_arrow_and_survives_a_round_trip():
    pipeline = compile_sql(TUMBLE)
    node = next(n for n in pipeline.nodes if n.kind == "window_aggregate")
    assert state_codec.format_of(node.stage) == "window-aggregate/1"
    kernel = node.stage.batch_kernel()
    window = next(n for n in pipeline.nodes if n.kind == "window").stage
    rows = ChangeBatch(changes=window.process([bid(1, 1, 10, 1), bid(2, 1, 30, 3)]))
    ctx = BatchContext(metrics=Counter(), watermarks={"bids": 1_000})
    state, out = kernel.process_batch([rows], state_codec.empty_state(node.stage), ctx)
    assert out.changes() == []
    stored = state_codec.encode_state(node.stage, state)
    restored = state_codec.decode_state(node.stage, stored)
    end = BatchContext(metrics=Counter(), previous_watermarks={"bids": 1_000}, watermarks={"bids": 2**63 - 1})
    state, out = kernel.process_batch([ChangeBatch(changes=[])], restored, end)
    assert [c.row[-3:] for c in out.changes()] == [(2, 30, 40)]
    assert state is None and state_codec.encode_state(node.stage, state) is None


@pytest.mark.parametrize(("query", "message", "token"), [
    ("SELECT item, 0, 0, COUNT(*), 0, 0 FROM bids GROUP BY item, SESSION(price, INTERVAL '5' SECOND)",
     "SESSION: the time column 'price' must be a TIMESTAMP", "SESSION("),
    ("SELECT item, 0, 0, COUNT(*), 0, 0 FROM bids GROUP BY item, TUMBLE(ts, INTERVAL '5' SECOND)",
     "GROUP BY TUMBLE(...) (a legacy group window) is not supported", "TUMBLE("),
    ("SELECT item, window_start, window_end, price, price, price\n"
     "FROM TABLE(TUMBLE(TABLE bids, DESCRIPTOR(ts), INTERVAL '10' SECOND))",
     "TUMBLE(...) is only supported under GROUP BY window_start, window_end", "TUMBLE("),
    ("SELECT item, window_start, window_end, COUNT(*), 0, 0\n"
     "FROM TABLE(TUMBLE(TABLE bids, DESCRIPTOR(price), INTERVAL '10' SECOND)) GROUP BY item, window_start, window_end",
     "TUMBLE: the time column 'price' must be a TIMESTAMP", "DESCRIPTOR(price)"),
    ("SELECT item, window_start, window_end, COUNT(DISTINCT price), 0, 0\n"
     "FROM TABLE(TUMBLE(TABLE bids, DESCRIPTOR(ts), INTERVAL '10' SECOND)) GROUP BY item, window_start, window_end",
     "COUNT(DISTINCT) in a window aggregate is not supported yet", "item, window_start, window_end, COUNT(DISTINCT"),
    ("SELECT item, window_start, window_end, COUNT(*), 0, 0\n"
     "FROM TABLE(SESSION(TABLE bids, DESCRIPTOR(ts), INTERVAL '10' SECOND)) GROUP BY item, window_start, window_end",
     "SESSION windows are not supported yet", "SESSION("),
    ("SELECT item, window_start, window_end, COUNT(*), 0, 0\n"
     "FROM TABLE(HOP(TABLE bids, DESCRIPTOR(ts), INTERVAL '3' SECOND, INTERVAL '10' SECOND)) GROUP BY item, window_start, window_end",
     "HOP: the window size must be a positive multiple of the slide", "HOP("),
])
def test_unsupported_window_forms_are_refused_by_name_and_position(query, message, token):
    sql = SOURCE + "INSERT INTO out " + query
    with pytest.raises(SqlError) as info:
        compile_sql(sql)
    assert str(info.value).startswith(message)
    line = next(i for i, text in enumerate(sql.splitlines(), start=1) if token in text)
    assert (info.value.line, info.value.col) == (line, sql.splitlines()[line - 1].index(token) + 1)


def test_a_window_aggregate_over_an_updating_input_is_refused():
    sql = SOURCE.replace("'format' = 'json'", "'format' = 'debezium-json'", 1).replace(
        "ts TIMESTAMP(3),", "ts TIMESTAMP(3), PRIMARY KEY (item) NOT ENFORCED,") + (
        "INSERT INTO out SELECT item, window_start, window_end, COUNT(*), 0, 0\n"
        "FROM TABLE(TUMBLE(TABLE bids, DESCRIPTOR(ts), INTERVAL '10' SECOND)) GROUP BY item, window_start, window_end"
    )
    with pytest.raises(SqlError, match="a window aggregate needs an insert-only input"):
        compile_sql(sql)


def test_computed_columns_are_columns_of_the_table_and_can_carry_the_watermark():
    sql = (
        "CREATE TABLE bids (item BIGINT, price BIGINT, t TIMESTAMP(3), ts AS t + INTERVAL '1' SECOND,\n"
        "  doubled AS price * 2, WATERMARK FOR ts AS ts) WITH ('format' = 'json');\n"
        "CREATE TABLE out (item BIGINT, p BIGINT) WITH ('format' = 'changelog-json');\n"
        "INSERT INTO out SELECT item, doubled FROM bids"
    )
    pipeline = compile_sql(sql)
    assert [c.name for c in pipeline.sources["bids"].columns] == ["item", "price", "t"]  # what records carry
    host = ReplayHost(pipeline)
    out = host.run_batch({"bids": [Change("+I", (1, 21, at(3)), (1,))]}, now_ms=0)
    assert [c.row for c in out] == [(1, 42)]
    assert host.watermarks.current() == {"bids": ms(4)}  # AS ts: no delay, on the computed column


def test_the_spark_host_refuses_only_a_window_aggregate_behind_a_keyed_stage_before_the_job_starts():
    from tidemark.engine.errors import PlanError
    from tidemark.spark.watermark import check_supported

    joined = SOURCE.replace("CREATE TABLE out", "CREATE TABLE items (item BIGINT) WITH ('format' = 'json');\nCREATE TABLE out") + (
        "CREATE VIEW sold AS SELECT b.* FROM bids b JOIN items i ON b.item = i.item;\n"
        "INSERT INTO out SELECT item, window_start, window_end, COUNT(*), MAX(price), SUM(price)\n"
        "FROM TABLE(TUMBLE(TABLE sold, DESCRIPTOR(ts), INTERVAL '10' SECOND)) GROUP BY item, window_start, window_end"
    )
    with pytest.raises(PlanError, match=r"stage \[\d+\] aggregate#\d+: a window aggregate reading the output of "
                                        r"the keyed stage \[\d+\] join#\d+ does not run on Spark yet"):
        check_supported(compile_sql(joined))
    check_supported(compile_sql(TUMBLE))
    check_supported(compile_sql(SOURCE + "INSERT INTO out SELECT item, ts, ts, price, price, price FROM bids"))


SESSIONS = SOURCE + (
    "INSERT INTO out SELECT item, SESSION_START(ts, INTERVAL '3' SECOND), SESSION_END(ts, INTERVAL '3' SECOND),\n"
    "  COUNT(*), MAX(price), SUM(price) FROM bids GROUP BY item, SESSION(ts, INTERVAL '3' SECOND)"
)


def test_session_windows_merge_per_key_and_fire_when_the_watermark_passes_the_last_record_plus_the_gap():
    host = ReplayHost(compile_sql(SESSIONS))
    # item 1: 1 s and 5 s are apart by more than the gap, 3 s joins them into one session
    assert host.run_batch({"bids": [bid(1, 1, 10, 1), bid(2, 1, 20, 5), bid(3, 2, 7, 2)]}, now_ms=0) == []
    assert host.run_batch({"bids": [bid(4, 1, 30, 3)]}, now_ms=0) == []
    # watermark 10 s: item 1's session ends at 8 s, item 2's at 5 s
    fired = host.run_batch({"bids": [bid(5, 1, 1, 12)]}, now_ms=0)
    assert sorted(c.row for c in fired) == [(1, at(1), at(8), 3, 30, 60), (2, at(2), at(5), 1, 7, 7)]
    # 4 s would have merged into item 1's fired session: late, dropped
    assert host.run_batch({"bids": [bid(6, 1, 99, 4)]}, now_ms=0) == []
    assert host.metrics["late_records_dropped"] == 1
    assert [c.row for c in host.finish(now_ms=0)] == [(1, at(12), at(15), 1, 1, 1)]


def test_session_state_is_typed_arrow_and_survives_a_round_trip():
    node = next(n for n in compile_sql(SESSIONS).nodes if n.kind == "window_aggregate")
    assert state_codec.format_of(node.stage) == "session-aggregate/1"
    state = {(1,): [{"start": 1000, "end": 4000, "acc": [2, 30, (40, 2)], "pos": (7,)}]}
    restored = state_codec.decode_state(node.stage, state_codec.encode_state(node.stage, state))
    assert restored == state
