"""The Spark host's watermark without a Spark session: what the decode pass measures and
sends (``tidemark.spark.watermark``) and what a bucket keeps (``tidemark.spark.event_clock``).
The whole path on a real session and broker: ``tests/integration/test_spark_windows.py``."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change
from tidemark.engine.event_time import epoch_ms
from tidemark.engine.pipeline import compile_sql
from tidemark.engine.replay import ReplayHost
from tidemark.spark.event_clock import TICK_INPUT, advance, split_ticks
from tidemark.spark.watermark import WatermarkProbe, observed, probe_of, tick_rows
from tidemark.spark.partitioning import grouping_values

START = datetime(2026, 11, 24, 10, 0, 0)
SQL = (
    "CREATE TABLE bids (item BIGINT, price BIGINT, ts TIMESTAMP(3),\n"
    "  WATERMARK FOR ts AS ts - INTERVAL '2' SECOND) WITH ('format' = 'json');\n"
    "CREATE TABLE out (item BIGINT, ws TIMESTAMP(3), we TIMESTAMP(3), n BIGINT) WITH ('format' = 'changelog-json');\n"
    "INSERT INTO out SELECT item, window_start, window_end, COUNT(*)\n"
    "FROM TABLE(HOP(TABLE bids, DESCRIPTOR(ts), INTERVAL '5' SECOND, INTERVAL '10' SECOND))\n"
    "WHERE price > 10 GROUP BY item, window_start, window_end"
)


def bid(pos: int, item: int, price: int, second: int) -> Change:
    return Change("+I", (item, price, START + timedelta(seconds=second)), (0, 0, 0, pos))


def test_the_decode_pass_measures_the_watermark_before_the_filter_as_replay_does():
    pipeline = compile_sql(SQL)
    source = next(n for n in pipeline.nodes if "event_time" in n.detail)
    stages = [probe_of(pipeline, source), *(n.stage for n in pipeline.nodes if n.kind in ("calc", "window"))]
    batch = [bid(1, 1, 50, 3), bid(2, 2, 5, 30)]  # the latest bid is filtered out
    marks: dict[str, int] = {}
    out = observed(stages, ChangeBatch.from_changes(batch), marks)
    assert {c.row[0] for c in out.changes()} == {1}
    host = ReplayHost(pipeline)
    host.run_batch({"bids": batch}, now_ms=0)
    assert marks == host.watermarks.current() == {"bids": epoch_ms(START) + 28_000}


def test_a_probe_reads_columnar_and_row_batches_alike_and_ignores_null_times():
    probe = WatermarkProbe("bids", 2, 2000)
    rows = [bid(1, 1, 50, 3), bid(2, 1, 50, 9), Change("+I", (1, 50, None), (0, 0, 0, 3))]
    columnar = ChangeBatch.from_table(ChangeBatch.from_changes(rows).table())
    assert columnar.is_columnar
    assert probe.watermark(ChangeBatch.from_changes(rows)) == probe.watermark(columnar) == epoch_ms(START) + 7000
    assert probe.watermark(ChangeBatch.from_changes([])) is None


def test_ticks_go_to_every_bucket_of_an_event_time_stage_only():
    pipeline = compile_sql(SQL)
    window = next(n.stage for n in pipeline.nodes if n.kind == "window_aggregate")
    rows = tick_rows({"bids": 5, "other": 9}, (window, 0), 4)
    assert [(b, i) for b, i, _ in rows] == [(int(v), TICK_INPUT) for v in grouping_values(4)]
    assert [json.loads(t) for *_, t in rows] == [{"bids": 5}] * 4  # only what the stage waits for
    assert tick_rows({"bids": 5}, None, 4) == []
    assert tick_rows({}, (window, 0), 4) == []


def test_a_bucket_keeps_the_greatest_watermark_per_table_and_stores_only_a_move():
    (before, after), stored = advance(None, [b'{"a": 10}', b'{"a": 7, "b": 3}'])
    assert (before, after) == ({}, {"a": 10, "b": 3})
    (before, after), again = advance(stored, [b'{"a": 9}'])  # never moves back
    assert (before, after) == ({"a": 10, "b": 3}, {"a": 10, "b": 3}) and again is None
    (_, after), moved = advance(stored, [b'{"b": 4}'])
    assert after == {"a": 10, "b": 4} and advance(moved, [])[0] == (after, after)


def test_tick_rows_are_split_from_data_rows():
    data, ticks = split_ticks([(0, b"x"), (TICK_INPUT, b"t"), (1, b"y")])
    assert data == [(0, b"x"), (1, b"y")] and ticks == [b"t"]


def test_a_window_aggregate_is_keyed_without_its_window_so_a_records_windows_share_a_bucket():
    pipeline = compile_sql(SQL)
    window = next(n for n in pipeline.nodes if n.kind == "window_aggregate")
    assigned = next(n.stage for n in pipeline.nodes if n.kind == "window").process([bid(1, 7, 50, 3)])
    assert len(assigned) == 2  # HOP: two windows of 10 s every 5 s
    assert {window.stage.key_of(c, 0) for c in assigned} == {(7,)}
