"""A source that two stages read is scanned twice in each micro-batch, and Spark's
``numInputRows`` counts its records once per scan: the job's ``rows_in`` must still count
each record once (the benchmark harness checks a run by it, and ``tidemark run`` reports it)."""

from __future__ import annotations

import pytest
from run_support import encode_source, produce, unique_topics

from tidemark.engine.pipeline import compile_sql
from tidemark.spark.job import run_pipeline

pytestmark = pytest.mark.integration

#: Nexmark q7's shape: the bids joined with their own window maxima
SQL = """
CREATE TABLE bid (auction BIGINT, price BIGINT, ts TIMESTAMP(3), WATERMARK FOR ts AS ts - INTERVAL '1' SECOND)
  WITH ('topic' = 'bid', 'format' = 'json');
CREATE TABLE top_bids (auction BIGINT, price BIGINT) WITH ('topic' = 'top_bids', 'format' = 'changelog-json');
INSERT INTO top_bids SELECT B.auction, B.price FROM bid B JOIN (
  SELECT MAX(price) AS maxprice FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(ts), INTERVAL '10' SECOND))
  GROUP BY window_start, window_end) M ON B.price = M.maxprice;
"""


def test_a_source_read_by_two_stages_counts_each_record_once(spark, kafka_bootstrap, tmp_path):
    sql, topics = unique_topics(SQL, "rows-in")
    pipeline = compile_sql(sql)
    bids = [{"kind": "+I", "row": {"auction": i % 3, "price": i, "ts": f"2024-01-01 00:00:{i:02d}"}}
            for i in range(40)]
    produce(kafka_bootstrap, topics["bid"], encode_source(pipeline.sources["bid"], bids))
    result = run_pipeline(spark, pipeline, kafka_bootstrap, str(tmp_path / "ckpt"), name=f"rows-in-{topics['bid'][-8:]}",
                          max_records_per_trigger=15, trigger_interval=None)
    assert [r.rows_in for r in result.reports if r.rows_in] == [15, 15, 10]
