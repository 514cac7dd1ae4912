"""OVER aggregations on the replay host: literal batches in, rows out as the watermark passes
them; each frame (ROWS n, RANGE interval, UNBOUNDED) against rows worked out by hand; the
kernel's typed state through the state codec; and the forms Flink refuses, by reason and
position."""

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
    "CREATE TABLE bids (item BIGINT, price BIGINT, ts TIMESTAMP(3),\n"
    "  WATERMARK FOR ts AS ts - INTERVAL '2' SECOND) WITH ('format' = 'json');\n"
    "CREATE TABLE out (item BIGINT, price BIGINT, n BIGINT, total BIGINT, av BIGINT, lo BIGINT, hi BIGINT)\n"
    "  WITH ('format' = 'changelog-json');\n"
)
CALLS = "COUNT(*) OVER w, SUM(price) OVER w, AVG(price) OVER w, MIN(price) OVER w, MAX(price) OVER w"


def over(frame: str) -> str:
    window = f"(PARTITION BY item ORDER BY ts {frame})".strip()
    return SOURCE + f"INSERT INTO out SELECT item, price, {CALLS.replace('OVER w', 'OVER ' + window)}\nFROM bids"


START = datetime(2026, 11, 24, 10, 0, 0)


def at(second: float) -> datetime:
    return START + timedelta(seconds=second)


def bid(seq: int, item: int, price: int | None, second: float) -> Change:
    return Change("+I", (item, price, at(second)), (seq,))


#: item 1 at 1 s (10), 3 s (30), 3 s (NULL, arriving later), 6 s (60); item 2 at 2 s (7)
BIDS = [bid(1, 1, 10, 1), bid(2, 1, 30, 3), bid(3, 2, 7, 2), bid(4, 1, None, 3), bid(5, 1, 60, 6)]


def run_all(frame: str) -> list[tuple]:
    host = ReplayHost(compile_sql(over(frame)))
    rows = [c.row for c in host.run_batch({"bids": BIDS}, now_ms=0)]
    rows += [c.row for c in host.finish(now_ms=0)]
    assert host.metrics["late_records_dropped"] == 0
    return rows


@pytest.mark.parametrize(("frame", "expected"), [
    # the row and the one before it, in time order, equal times by arrival
    ("ROWS BETWEEN 1 PRECEDING AND CURRENT ROW",
     [(1, 10, 1, 10, 10, 10, 10), (1, 30, 2, 40, 20, 10, 30), (1, None, 2, 30, 30, 30, 30), (1, 60, 2, 60, 60, 60, 60)]),
    # every row within 2 s before the row's time; rows of one time share a result
    ("RANGE BETWEEN INTERVAL '2' SECOND PRECEDING AND CURRENT ROW",
     [(1, 10, 1, 10, 10, 10, 10), (1, 30, 3, 40, 20, 10, 30), (1, None, 3, 40, 20, 10, 30), (1, 60, 1, 60, 60, 60, 60)]),
    ("ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW",
     [(1, 10, 1, 10, 10, 10, 10), (1, 30, 2, 40, 20, 10, 30), (1, None, 3, 40, 20, 10, 30), (1, 60, 4, 100, 33, 10, 60)]),
    # no frame with ORDER BY: RANGE UNBOUNDED PRECEDING
    ("", [(1, 10, 1, 10, 10, 10, 10), (1, 30, 3, 40, 20, 10, 30), (1, None, 3, 40, 20, 10, 30), (1, 60, 4, 100, 33, 10, 60)]),
])
def test_each_frame_aggregates_the_rows_flink_puts_in_it(frame, expected):
    rows = run_all(frame)
    assert sorted((r for r in rows if r[0] == 1), key=lambda r: (r[2], r[3] or 0)) == sorted(
        expected, key=lambda r: (r[2], r[3] or 0))
    assert [r for r in rows if r[0] == 2] == [(2, 7, 1, 7, 7, 7, 7)]


def test_rows_wait_for_the_watermark_and_late_rows_are_dropped_and_counted():
    host = ReplayHost(compile_sql(over("ROWS BETWEEN 1 PRECEDING AND CURRENT ROW")))
    # watermark 5 s - 2 s = 3 s: the rows at 1 s and 3 s are released, 5 s waits
    out = host.run_batch({"bids": [bid(1, 1, 10, 1), bid(2, 1, 50, 5), bid(3, 1, 30, 3)]}, now_ms=0)
    assert [c.row for c in out] == [(1, 10, 1, 10, 10, 10, 10), (1, 30, 2, 40, 20, 10, 30)]
    assert [c.pos for c in out] == [(1,), (3,)]  # each row at its own position
    # 2.5 s is not after the watermark (3 s): late
    assert host.run_batch({"bids": [bid(4, 1, 99, 2.5)]}, now_ms=0) == []
    assert host.metrics["late_records_dropped"] == 1
    # the frame of the row at 5 s reaches back to 3 s across batches
    assert [c.row for c in host.finish(now_ms=0)] == [(1, 50, 2, 80, 40, 30, 50)]


def test_the_frame_reaches_rows_emitted_in_earlier_batches():
    host = ReplayHost(compile_sql(over("RANGE BETWEEN INTERVAL '3' SECOND PRECEDING AND CURRENT ROW")))
    host.run_batch({"bids": [bid(1, 1, 10, 1), bid(2, 1, 20, 2), bid(3, 1, 60, 6)]}, now_ms=0)  # releases 1 s, 2 s
    out = host.run_batch({"bids": [bid(4, 1, 50, 5), bid(5, 1, 70, 7), bid(6, 1, 1, 20)]}, now_ms=0)
    # 5 s reaches 2 s (emitted in the batch before)..5 s, 6 s reaches 3 s..6 s, 7 s reaches 4 s..7 s
    assert [c.row for c in out] == [(1, 50, 2, 70, 35, 20, 50), (1, 60, 2, 110, 55, 50, 60), (1, 70, 3, 180, 60, 50, 70)]


def test_a_query_without_partition_by_and_with_expressions_around_the_calls():
    sql = SOURCE + (
        "INSERT INTO out SELECT item, price, COUNT(*) OVER w * 10, SUM(price + 1) OVER w, 0, 0, 0 FROM bids\n"
        "WHERE price > 5 WINDOW w AS (ORDER BY ts ROWS BETWEEN 1 PRECEDING AND CURRENT ROW)"
    )
    with pytest.raises(SqlError, match="WINDOW clauses is not supported"):  # a named window
        compile_sql(sql)
    sql = SOURCE + (
        "INSERT INTO out SELECT item, price, COUNT(*) OVER (ORDER BY ts ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) * 10,\n"
        "  SUM(price + 1) OVER (ORDER BY ts ROWS BETWEEN 1 PRECEDING AND CURRENT ROW), 0, 0, 0 FROM bids WHERE price > 5"
    )
    host = ReplayHost(compile_sql(sql))
    out = host.run_batch({"bids": BIDS}, now_ms=0) + host.finish(now_ms=0)
    assert [c.row for c in out] == [
        (1, 10, 10, 11, 0, 0, 0), (2, 7, 20, 19, 0, 0, 0), (1, 30, 20, 39, 0, 0, 0), (1, 60, 20, 92, 0, 0, 0)]


def test_the_kernel_state_is_typed_arrow_and_survives_a_round_trip():
    for frame, left in [("ROWS BETWEEN 1 PRECEDING AND CURRENT ROW", 1),
                        ("RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW", 1)]:
        node = next(n for n in compile_sql(over(frame)).nodes if n.kind == "over_aggregate")
        assert state_codec.format_of(node.stage) == "over-aggregate/1"
        kernel = node.stage.batch_kernel()
        watermark = (at(1) - datetime(1970, 1, 1)) // timedelta(milliseconds=1)
        ctx = BatchContext(metrics=Counter(), watermarks={"bids": watermark})
        state, out = kernel.process_batch([ChangeBatch(changes=BIDS[:2])], state_codec.empty_state(node.stage), ctx)
        assert [c.row for c in out.changes()] == [(1, 10, at(1), 1, 10, 10, 10, 10)]
        assert kernel.state_to_table(state).num_rows == 1 + left  # the row at 3 s waits; what 1 s leaves behind
        restored = state_codec.decode_state(node.stage, state_codec.encode_state(node.stage, state))
        end = BatchContext(metrics=Counter(), previous_watermarks={"bids": watermark}, watermarks={"bids": 2**63 - 1})
        state, out = kernel.process_batch([ChangeBatch(changes=[])], restored, end)
        assert [c.row for c in out.changes()] == [(1, 30, at(3), 2, 40, 20, 10, 30)]


def test_a_retraction_reaching_the_kernel_is_an_error_naming_the_stage():
    node = next(n for n in compile_sql(over("")).nodes if n.kind == "over_aggregate")
    bad = ChangeBatch(changes=[Change("-D", (1, 10, at(1)), (1,))])
    with pytest.raises(Exception, match=r"stage 'over#\d+': an OVER aggregation takes inserts only, and got -D"):
        node.stage.batch_kernel().process_batch([bad], None, BatchContext())


W = "(PARTITION BY item ORDER BY ts ROWS BETWEEN 1 PRECEDING AND CURRENT ROW)"


@pytest.mark.parametrize(("items", "message", "token"), [
    ("COUNT(*) OVER (PARTITION BY item ORDER BY price ROWS BETWEEN 1 PRECEDING AND CURRENT ROW)",
     "OVER windows' ordering in stream mode must be defined on a time attribute: price", "price ROWS"),
    ("COUNT(*) OVER (PARTITION BY item ORDER BY ts DESC ROWS BETWEEN 1 PRECEDING AND CURRENT ROW)",
     "OVER windows' ordering in stream mode must be ascending", "ts DESC"),
    ("COUNT(*) OVER (PARTITION BY item)", "window function COUNT(*) OVER (PARTITION BY item) is not supported: an OVER aggregation needs ORDER BY", "COUNT(*)"),
    ("COUNT(*) OVER (PARTITION BY item ORDER BY ts ROWS BETWEEN 1 PRECEDING AND 1 FOLLOWING)",
     "an OVER frame must end at CURRENT ROW, not 1 FOLLOWING", "1 FOLLOWING"),
    (f"COUNT(*) OVER {W}, SUM(price) OVER (PARTITION BY item ORDER BY ts)",
     "all OVER aggregations of one SELECT must be computed on the same window", "SUM(price) OVER"),
    ("COUNT(DISTINCT price) OVER " + W, "COUNT(DISTINCT ...) in an OVER aggregation is not supported", "COUNT(DISTINCT"),
    ("RANK() OVER (PARTITION BY item ORDER BY ts)", "window function RANK() OVER", "RANK()"),
])
def test_forms_flink_refuses_are_refused_by_reason_and_position(items, message, token):
    sql = SOURCE + f"INSERT INTO out SELECT item, price,\n  {items}\nFROM bids"
    with pytest.raises(SqlError) as info:
        compile_sql(sql)
    assert str(info.value).startswith(message), str(info.value)
    line = next(i for i, text in enumerate(sql.splitlines(), start=1) if token in text)
    assert (info.value.line, info.value.col) == (line, sql.splitlines()[line - 1].index(token) + 1)


def test_an_over_aggregation_of_an_updating_input_is_refused_with_flinks_reason():
    sql = SOURCE + (
        "INSERT INTO out SELECT item, price,\n  COUNT(*) OVER (PARTITION BY item ORDER BY ts), 0, 0, 0, 0\n"
        "FROM (SELECT * FROM (SELECT item, price, ts, ROW_NUMBER() OVER (PARTITION BY item ORDER BY price DESC) AS rn\n"
        "  FROM bids) WHERE rn <= 1)"
    )
    with pytest.raises(SqlError) as info:
        compile_sql(sql)
    assert "an OVER aggregation needs an insert-only input" in str(info.value)
    assert "OverAggregate doesn't support consuming update and delete changes" in str(info.value)
    assert (info.value.line, info.value.col) == (6, 3)


def test_a_time_column_read_through_a_join_is_no_time_attribute_any_more():
    """Flink 2.3 on q6 with its filter moved out: "Non-time attribute sort is not supported
    for bounded OVER window" (its comma join's output has no time attribute)."""
    sql = SOURCE.replace("CREATE TABLE out", "CREATE TABLE items (id BIGINT, name STRING) WITH ('format' = 'json');\n"
                         "CREATE TABLE out") + (
        "INSERT INTO out SELECT item, price,\n  COUNT(*) OVER (PARTITION BY item ORDER BY ts), 0, 0, 0, 0\n"
        "FROM bids, items WHERE bids.item = items.id"
    )
    with pytest.raises(SqlError) as info:
        compile_sql(sql)
    assert str(info.value).startswith("OVER windows' ordering in stream mode must be defined on a time attribute: ts")
    assert (info.value.line, info.value.col) == (7, 45)  # at ts


def test_a_processing_time_order_is_refused_by_name():
    sql = SOURCE.replace("ts TIMESTAMP(3),", "ts TIMESTAMP(3), proc AS PROCTIME(),") + (
        "INSERT INTO out SELECT item, price, COUNT(*) OVER (PARTITION BY item ORDER BY proc), 0, 0, 0, 0 FROM bids")
    with pytest.raises(SqlError, match=r"OVER \.\.\. ORDER BY proc: processing-time OVER aggregations are not supported yet"):
        compile_sql(sql)


def test_an_over_aggregation_of_a_changelog_source_is_refused():
    sql = SOURCE.replace("'format' = 'json'", "'format' = 'debezium-json'", 1).replace(
        "ts TIMESTAMP(3),", "ts TIMESTAMP(3), PRIMARY KEY (item) NOT ENFORCED,") + (
        "INSERT INTO out SELECT item, price, COUNT(*) OVER (PARTITION BY item ORDER BY ts), 0, 0, 0, 0 FROM bids")
    with pytest.raises(SqlError, match="an OVER aggregation needs an insert-only input, and 'source:bids' produces update and delete"):
        compile_sql(sql)
