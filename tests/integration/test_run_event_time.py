"""A table with computed columns and a WATERMARK on the Spark job: the job reads the
physical columns from Kafka, computes the others as the replay host does, and the sink
topic equals the replay host's table on the job's own batches. (A window aggregate is
refused on Spark before the job starts: ``tests/control/test_window_registration.py``.)"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from run_support import encode_source, produce, replay_reference, sink_table, topic_of, unique_topics

from tidemark.engine.pipeline import compile_sql
from tidemark.kafka.admin import ensure_topics
from tidemark.spark.job import run_pipeline

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "conformance"))
from generate import window_workload  # noqa: E402

pytestmark = pytest.mark.integration

SINK_AND_QUERY = """
CREATE TABLE priced (item BIGINT, doubled BIGINT, ts TIMESTAMP(3), PRIMARY KEY (ts, item) NOT ENFORCED)
  WITH ('topic' = 'priced', 'format' = 'upsert-json');
INSERT INTO priced SELECT item, doubled, ts FROM bids WHERE price > 10 ON CONFLICT DO DEDUPLICATE;
"""


def test_computed_columns_and_a_watermark_run_on_spark_as_in_replay(spark, kafka_bootstrap, tmp_path):
    w = window_workload(7, "tumble")
    source_ddl = w.sql.split("\n")[0]
    sql, _ = unique_topics(source_ddl + SINK_AND_QUERY, "evt")
    pipeline = compile_sql(sql)
    table = pipeline.sources["bids"]
    records = [r for batch in w.inputs["bids"] for r in batch]
    ensure_topics(kafka_bootstrap, {topic_of(table): 2})
    produce(kafka_bootstrap, topic_of(table), encode_source(table, records), partitions=2)
    result = run_pipeline(spark, pipeline, kafka_bootstrap, str(tmp_path / "checkpoint"), name="event-time",
                          max_records_per_trigger=math.ceil(len(records) / 3))
    assert result.rows_in == len(records)
    expected = replay_reference(kafka_bootstrap, pipeline, result.reports).table()
    assert expected, "the filter keeps some rows"
    assert sink_table(kafka_bootstrap, pipeline, result.sink_writer_id) == expected
