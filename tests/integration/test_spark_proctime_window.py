"""A processing-time TUMBLE window aggregation (Nexmark q12's shape) on the Spark job: bids
go to the window of the batch that processes them, and each window fires from its state
bucket's processing-time timer once the clock passes its end, in a batch that brings no
record. Which bids share a window depends on the wall clock, so the test checks what does
not: every bid is counted once, in a 10-second window holding the time it was processed,
and every row is a final insert."""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime, timedelta

import pytest
from run_support import encode_source, produce, sink_changes, sink_records, unique_topics

from tidemark.engine.pipeline import compile_sql
from tidemark.kafka.admin import ensure_topics
from tidemark.spark.job import PipelineJob

pytestmark = pytest.mark.integration

SQL = """
CREATE TABLE bid (auction BIGINT, bidder BIGINT, price BIGINT) WITH ('topic' = 'bid', 'format' = 'json');
CREATE TABLE q12 (bidder BIGINT, bid_count BIGINT, starttime TIMESTAMP(3), endtime TIMESTAMP(3))
  WITH ('topic' = 'q12', 'format' = 'changelog-json');
CREATE VIEW B AS SELECT *, PROCTIME() AS p_time FROM bid;
INSERT INTO q12 SELECT bidder, COUNT(*), window_start, window_end
FROM TABLE(TUMBLE(TABLE B, DESCRIPTOR(p_time), INTERVAL '10' SECOND))
GROUP BY bidder, window_start, window_end;
"""
EPOCH = datetime(1970, 1, 1)


def test_processing_time_windows_fire_on_spark_from_their_timers(spark, kafka_bootstrap, tmp_path):
    sql, topics = unique_topics(SQL, "proctime")
    pipeline = compile_sql(sql)
    bids = [{"kind": "+I", "row": {"auction": i, "bidder": i % 3, "price": i}} for i in range(12)]
    ensure_topics(kafka_bootstrap, {topics["bid"]: 1})
    produce(kafka_bootstrap, topics["bid"], encode_source(pipeline.sources["bid"], bids))
    job = PipelineJob(spark, pipeline, kafka_bootstrap, str(tmp_path / "checkpoint"), name=f"proctime-{topics['bid'][-8:]}",
                      max_records_per_trigger=4, trigger_interval="200 milliseconds")
    started_ms = time.time_ns() // 1_000_000
    deadline = time.monotonic() + 240
    try:
        job.start()
        while sum(r.rows_in for r in job.reports) < len(bids):
            assert time.monotonic() < deadline, "the bids were not all processed"
            time.sleep(0.2)
            job.poll()
        processed_ms = time.time_ns() // 1_000_000
        due = time.monotonic() + (10_000 - processed_ms % 10_000) / 1000 + 3  # the last window's end, and a margin
        while time.monotonic() < due:
            time.sleep(0.2)
            job.poll()
    finally:
        job.close()
    result = job.result()
    assert [r for r in result.reports if r.rows_out and not r.rows_in], "a window fired in a batch without records"
    changes = sink_changes(pipeline, sink_records(kafka_bootstrap, pipeline, result.sink_writer_id))
    assert {c.kind for c in changes} == {"+I"}
    counted: Counter = Counter()
    for c in changes:
        bidder, n, start, end = c.row
        counted[bidder] += n
        start_ms = (start - EPOCH) // timedelta(milliseconds=1)
        assert end - start == timedelta(seconds=10) and start_ms % 10_000 == 0
        assert started_ms - 10_000 < start_ms <= processed_ms  # the window of a batch the job ran
    assert counted == Counter(b["row"]["bidder"] for b in bids)
