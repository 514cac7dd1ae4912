"""A bounded source (``'scan.bounded.mode' = 'latest-offset'``) without a Spark session or a
broker: the offsets the Kafka source plans (``tidemark.spark.source``), the end row its last
batch reads, the watermark a bucket keeps from it (``tidemark.spark.event_clock``), and the
option itself (planning, replay). The whole path on a real session and broker:
``tests/integration/test_spark_bounded.py``."""

from __future__ import annotations


import pyarrow as pa
import pytest
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType, TimestampType

from tidemark.engine.errors import PlanError
from tidemark.engine.event_time import END_OF_INPUT
from tidemark.engine.pipeline import compile_sql
from tidemark.engine.replay import ReplayHost
from tidemark.spark.event_clock import advance, encode_tick
from tidemark.spark.source import (
    ENDED_KEY,
    STOP_KEY,
    KafkaRange,
    KafkaSourceError,
    KafkaStreamReader,
    SourceEnd,
    at_stop,
    bounded_offset,
    open_bounded_sources,
    startup_options,
    topic_offsets,
    stop_of,
    without_end_rows,
)

RAW = StructType([
    StructField("topic", StringType()), StructField("partition", IntegerType()), StructField("offset", LongType()),
    StructField("timestamp", TimestampType()), StructField("key", BinaryType()), StructField("value", BinaryType()),
])
STOP = {"t": {"0": 10, "1": 4}}


def reader(**options: str) -> KafkaStreamReader:
    return KafkaStreamReader(RAW, {"topics": "t", "bootstrap.servers": "localhost:1", **options})


def test_a_bounded_offset_carries_its_stop_and_ends_only_after_every_partition_reached_it():
    first = bounded_offset({"t": {"0": 0, "1": 0}}, {"t": {"0": 6, "1": 4}}, STOP)
    assert stop_of(first) == STOP and ENDED_KEY not in first
    assert first[STOP_KEY] == [["t", 0, 10], ["t", 1, 4]]  # a list: readers of {topic: {p: offset}} pass it by
    # partition 1 is at its stop, partition 0 not yet: the batch that reads 0 to its stop does not end it
    second = bounded_offset(first, {"t": {"0": 10, "1": 4}}, STOP)
    assert ENDED_KEY not in second
    # the next batch reads nothing and ends the source: replay's finish
    third = bounded_offset(second, {"t": {"0": 10, "1": 4}}, STOP)
    assert third[ENDED_KEY] is True and third["t"] == second["t"]
    assert bounded_offset(third, topic_offsets(third), STOP)[ENDED_KEY] is True  # and stays ended


def test_an_empty_source_ends_at_once():
    assert bounded_offset({"t": {"0": 0}}, {"t": {"0": 0}}, {"t": {"0": 0}})[ENDED_KEY] is True


def test_nothing_past_the_stop_is_planned_nor_a_partition_created_after_it():
    end = {"t": {"0": 50, "1": 3, "2": 7}}
    assert at_stop(end, STOP, {"t": {"0": 2, "1": 1}}) == {"t": {"0": 10, "1": 3, "2": 0}}


def test_the_batch_that_ends_the_source_reads_one_end_row_per_topic_and_nothing_else():
    r = reader(endingOffsets="latest")
    start = bounded_offset({"t": {"0": 8, "1": 4}}, {"t": {"0": 10, "1": 4}}, STOP)
    end = bounded_offset(start, topic_offsets(start), STOP)
    parts = r.partitions(start, end)
    assert [type(p) for p in parts] == [SourceEnd] and parts[0].topics == ["t"]
    assert r.partitions(end, end) == []  # a restart after the end never ends the source twice
    mid = r.partitions({"t": {"0": 8, "1": 4}}, start)
    assert [(p.partition, p.start, p.end) for p in mid if isinstance(p, KafkaRange)] == [(0, 8, 10)] and len(mid) == 1
    (batch,) = list(r.read(parts[0]))
    records = pa.RecordBatch.from_pylist(
        [{"topic": "t", "partition": 0, "offset": 9, "timestamp": None, "key": None, "value": b"{}"}],
        schema=batch.schema,
    )
    kept, ended = without_end_rows(pa.concat_batches([records, batch]))
    assert ended and kept.to_pylist() == records.to_pylist()
    assert without_end_rows(records) == (records, False)


def test_the_reader_takes_latest_as_its_only_ending_offsets():
    assert reader(endingOffsets="latest").bounded and not reader().bounded
    with pytest.raises(KafkaSourceError, match="endingOffsets must be 'latest' .*got 'earliest'"):
        reader(endingOffsets="earliest")


def test_a_query_is_open_while_a_bounded_source_has_not_ended():
    unbounded = {"t": {"0": 5}}
    running = {"t": {"0": 5}, STOP_KEY: [["t", 0, 9]]}
    ended = {"t": {"0": 9}, STOP_KEY: [["t", 0, 9]], ENDED_KEY: True}
    assert open_bounded_sources([unbounded, running, ended, None]) == 1
    assert open_bounded_sources([unbounded, ended]) == 0


def test_a_bucket_keeps_the_end_of_input_once_its_tick_came():
    (before, after), stored = advance(encode_tick({"t": 5_000, "u": 7_000}), [encode_tick({"t": END_OF_INPUT})])
    assert before == {"t": 5_000, "u": 7_000} and after == {"t": END_OF_INPUT, "u": 7_000}
    # a later tick (a batch replayed after a restart) never takes it back
    (before, after), changed = advance(stored, [encode_tick({"t": 6_000})])
    assert before == after == {"t": END_OF_INPUT, "u": 7_000} and changed is None


SQL = (
    "CREATE TABLE bids (item BIGINT, ts TIMESTAMP(3), WATERMARK FOR ts AS ts)\n"
    "  WITH ('format' = 'json', {bounded});\n"
    "CREATE TABLE out (item BIGINT, ws TIMESTAMP(3), n BIGINT) WITH ('format' = 'changelog-json');\n"
    "INSERT INTO out SELECT item, window_start, COUNT(*)\n"
    "FROM TABLE(TUMBLE(TABLE bids, DESCRIPTOR(ts), INTERVAL '10' SECOND)) GROUP BY item, window_start, window_end"
)


def sql(mode: str) -> str:
    return SQL.format(bounded=f"'scan.bounded.mode' = '{mode}'")


def test_the_option_reaches_the_spark_reader_and_unbounded_is_the_default():
    assert startup_options(compile_sql(sql("latest-offset")).sources["bids"])["endingOffsets"] == "latest"
    assert "endingOffsets" not in startup_options(compile_sql(sql("unbounded")).sources["bids"])


@pytest.mark.parametrize("mode", ["group-offsets", "timestamp", "specific-offsets"])
def test_flink_bounded_modes_tidemark_does_not_implement_are_refused_by_name(mode):
    with pytest.raises(PlanError) as info:
        compile_sql(sql(mode))
    assert str(info.value).startswith(
        f"table 'bids': option 'scan.bounded.mode': '{mode}' is not supported: a source ends only at the "
        "offsets latest when the pipeline started (modes: unbounded, latest-offset)"
    )


def test_an_unknown_bounded_mode_names_the_one_meant():
    with pytest.raises(PlanError, match=r"unknown value 'latest-offsets' \(did you mean 'latest-offset'\?\) "
                                        r"\(expected one of unbounded, latest-offset\)"):
        compile_sql(sql("latest-offsets"))


def test_the_bounded_mode_is_read_by_a_source_and_refused_on_the_sink():
    text = SQL.format(bounded="'scan.startup.mode' = 'earliest-offset'").replace(
        "'changelog-json')", "'changelog-json', 'scan.bounded.mode' = 'latest-offset')")
    with pytest.raises(PlanError, match="option\\(s\\) 'scan.bounded.mode' are read by a source, and table 'out' is the sink"):
        compile_sql(text)


def test_replay_ends_its_input_anyway_and_the_option_changes_nothing():
    from datetime import datetime, timedelta

    from tidemark.engine.changelog import Change

    start = datetime(2026, 11, 24, 10, 0, 0)
    rows = [Change("+I", (i % 2, start + timedelta(seconds=3 * i)), (0, 0, 0, i)) for i in range(9)]
    tables = []
    for mode in ("latest-offset", "unbounded"):
        host = ReplayHost(compile_sql(sql(mode)))
        host.run_batch({"bids": rows}, now_ms=0)
        host.finish(now_ms=0)
        tables.append(host.rows())
    assert tables[0] == tables[1] and len(tables[0]) == 6  # items 0/1 in windows 0, 10 and 20 s
