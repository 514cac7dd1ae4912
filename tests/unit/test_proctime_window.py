"""Processing-time TUMBLE windows (Nexmark q12's form) on the replay host: literal batches
run at chosen ``now_ms``, so the window a row falls in is the one holding its batch's
processing time, a window fires when ``now_ms`` reaches its end, and the end of a bounded
input fires nothing (Flink 2.3's behaviour, tests/conformance/test_proctime_window_oracle.py)."""

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

SOURCE = (
    "CREATE TABLE bid (auction BIGINT, bidder BIGINT, price BIGINT) WITH ('format' = 'json');\n"
    "CREATE TABLE out (bidder BIGINT, bid_count BIGINT, top BIGINT, starttime TIMESTAMP(3), endtime TIMESTAMP(3))\n"
    "  WITH ('format' = 'changelog-json');\n"
    "CREATE VIEW B AS SELECT *, PROCTIME() AS p_time FROM bid;\n"
)
Q12 = SOURCE + (
    "INSERT INTO out SELECT bidder, COUNT(*), MAX(price), window_start, window_end\n"
    "FROM TABLE(TUMBLE(TABLE B, DESCRIPTOR(p_time), INTERVAL '10' SECOND))\n"
    "GROUP BY bidder, window_start, window_end"
)

EPOCH = datetime(1970, 1, 1)
START = datetime(2026, 11, 24, 10, 0, 0)  # a multiple of 10 s


def at(second: float) -> datetime:
    return START + timedelta(seconds=second)


def now(second: float) -> int:
    """The processing time ``second`` seconds after START, in epoch ms."""
    return (at(second) - EPOCH) // timedelta(milliseconds=1)


def bid(seq: int, bidder: int, price: int) -> Change:
    return Change("+I", (seq, bidder, price), (seq,))


def test_rows_go_to_the_window_of_their_batch_and_a_window_fires_when_processing_time_reaches_its_end():
    host = ReplayHost(compile_sql(Q12))
    assert host.run_batch({"bid": [bid(1, 7, 10), bid(2, 8, 5)]}, now_ms=now(1)) == []
    assert host.run_batch({"bid": [bid(3, 7, 30)]}, now_ms=now(9.5)) == []
    # 12 s: a new window; [0 s, 10 s) fires, with only the rows of the batches processed in it
    fired = host.run_batch({"bid": [bid(4, 7, 99)]}, now_ms=now(12))
    assert sorted(c.row for c in fired) == [(7, 2, 30, at(0), at(10)), (8, 1, 5, at(0), at(10))]
    assert {c.kind for c in fired} == {"+I"}
    # no record, only time passing: 19.998 s is before the window's last millisecond, 19.999 s is it
    assert host.run_batch({}, now_ms=now(19.998)) == []
    assert [c.row for c in host.run_batch({}, now_ms=now(19.999))] == [(7, 1, 99, at(10), at(20))]
    assert host.run_batch({}, now_ms=now(40)) == []  # fired once, then forgotten


@pytest.mark.parametrize(("sql", "count"), [
    (SOURCE.replace("price BIGINT)", "price BIGINT, p_time AS PROCTIME())") + (
        "INSERT INTO out SELECT bidder, COUNT(*), MAX(price), window_start, window_end\n"
        "FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(p_time), INTERVAL '10' SECOND)) GROUP BY bidder, window_start, window_end"), 2),
    (SOURCE + (
        "INSERT INTO out WITH C AS (SELECT bidder, price, PROCTIME() AS p_time FROM bid WHERE price > 1)\n"
        "SELECT bidder, COUNT(*), MAX(price), window_start, window_end\n"
        "FROM TABLE(TUMBLE(TABLE C, DESCRIPTOR(p_time), INTERVAL '10' SECOND)) GROUP BY bidder, window_start, window_end"), 1),  # the CTE keeps prices above 1
], ids=["table attribute", "CTE"])
def test_a_tables_proctime_attribute_and_a_ctes_proctime_item_are_processing_time_windows_too(sql, count):
    host = ReplayHost(compile_sql(sql))
    assert host.run_batch({"bid": [bid(1, 7, 10), bid(2, 7, 1)]}, now_ms=now(1)) == []
    assert [c.row for c in host.run_batch({}, now_ms=now(10))] == [(7, count, 10, at(0), at(10))]


def test_the_end_of_a_bounded_input_fires_no_processing_time_window():
    host = ReplayHost(compile_sql(Q12))
    host.run_batch({"bid": [bid(1, 7, 10)]}, now_ms=now(1))
    assert host.finish(now_ms=now(60)) == []  # past the window's end, but the input has ended
    assert host.rows() == []


def test_the_kernel_state_is_typed_and_survives_a_round_trip():
    stages = {n.kind: n.stage for n in compile_sql(Q12).nodes}
    aggregate = stages["window_aggregate"]
    assert state_codec.format_of(aggregate) == "proctime-window-aggregate/1"
    kernel = aggregate.batch_kernel()
    rows = ChangeBatch(changes=stages["window"].process([bid(1, 7, 10), bid(2, 7, 30)]))
    state, out = kernel.process_batch([rows], state_codec.empty_state(aggregate), BatchContext(now_ms=now(3)))
    assert out.changes() == []
    restored = state_codec.decode_state(aggregate, state_codec.encode_state(aggregate, state))
    later = BatchContext(metrics=Counter(), now_ms=now(10))
    state, out = kernel.process_batch([ChangeBatch(changes=[])], restored, later)
    assert [c.row for c in out.changes()] == [(7, at(0), at(10), 2, 30)]
    assert state is None


def test_explain_names_the_processing_time_clock():
    text = compile_sql(Q12).explain_text()
    assert "window: TUMBLE(PROCTIME(), size 10000 ms)   clock: processing time" in text
    assert "emits when the processing time reaches window_end" in text


#: the window operators other than aggregation need event time
AGGREGATION_ONLY = "TUMBLE(...) on processing time is only supported under GROUP BY window_start, window_end"
OVER_B = "TABLE(TUMBLE(TABLE B, DESCRIPTOR(p_time), INTERVAL '10' SECOND))"


@pytest.mark.parametrize(("query", "message", "token"), [
    pytest.param("SELECT bidder, COUNT(*), 0, window_start, window_end\n"
                 "FROM TABLE(HOP(TABLE B, DESCRIPTOR(p_time), INTERVAL '5' SECOND, INTERVAL '10' SECOND))\n"
                 "GROUP BY bidder, window_start, window_end",
                 "HOP windows on processing time are not supported (TUMBLE is)", "HOP(", id="hop"),
    pytest.param("SELECT bidder, 0, 0, p_time, p_time FROM B", "unsupported function PROCTIME()", "PROCTIME()",
                 id="selected"),
    pytest.param(f"SELECT bidder, rn, price, window_start, window_end FROM (SELECT *,\n"
                 f"ROW_NUMBER() OVER (PARTITION BY window_start, window_end ORDER BY price DESC) AS rn FROM {OVER_B})\n"
                 "WHERE rn <= 2", AGGREGATION_ONLY, "TUMBLE(", id="window top-n"),
    pytest.param(f"SELECT X.bidder, 0, 0, X.window_start, X.window_end FROM (SELECT * FROM {OVER_B}) X\n"
                 f"JOIN (SELECT * FROM {OVER_B}) Y ON X.bidder = Y.bidder\n"
                 "AND X.window_start = Y.window_start AND X.window_end = Y.window_end", AGGREGATION_ONLY, "TUMBLE(",
                 id="window join"),
])
def test_other_uses_of_a_processing_time_attribute_are_refused_by_name_and_position(query, message, token):
    sql = SOURCE + "INSERT INTO out " + query
    with pytest.raises(SqlError) as info:
        compile_sql(sql)
    at_token = sql.index(token)
    where = (sql.count("\n", 0, at_token) + 1, at_token - sql.rfind("\n", 0, at_token))
    assert (str(info.value)[:len(message)], info.value.line, info.value.col) == (message, *where)


def test_a_bucket_asks_to_be_woken_when_its_earliest_window_is_due_and_spark_accepts_the_plan():
    from tidemark.spark.watermark import check_supported

    pipeline = compile_sql(Q12)
    check_supported(pipeline)
    stages = {n.kind: n.stage for n in pipeline.nodes}
    kernel = stages["window_aggregate"].batch_kernel()
    state = None
    for t, due in ((3, now(10) - 1), (12, now(20) - 1)):  # at 12 s, [0 s, 10 s) fires and [10 s, 20 s) opens
        rows = ChangeBatch(changes=stages["window"].process([bid(t, 7, 10)]))
        state, _ = kernel.process_batch([rows], state, BatchContext(now_ms=now(t)))
        assert kernel.next_wakeup(state) == due
    assert kernel.next_wakeup(None) is None
