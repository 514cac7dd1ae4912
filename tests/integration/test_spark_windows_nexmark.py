"""The Nexmark window queries (q5 HOP, q7 TUMBLE then a join, q8 two TUMBLEs joined, q11
SESSION) on the Spark job equal the replay host on the job's own batches, over generated
events whose event time is out of order (within the watermark delay). How they compare with
Flink 2.3 is ``tests/nexmark``'s business; here Spark must give replay's table."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import pytest
from run_support import produce, replay_reference, sink_table, topic_of, unique_topics

from tidemark.engine.pipeline import compile_sql
from tidemark.kafka.admin import ensure_topics
from tidemark.spark.job import run_pipeline

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "nexmark"))
import generator  # noqa: E402
from harness import query_sql  # noqa: E402

pytestmark = pytest.mark.integration

EVENTS = 2500


@pytest.mark.parametrize("query", ["q5", "q7", "q8", "q11"])
def test_nexmark_window_query_on_spark_gives_replays_table(spark, kafka_bootstrap, tmp_path, query):
    sql, _ = unique_topics(query_sql(query), query)
    pipeline = compile_sql(sql)
    events = generator.generate(5, EVENTS, jitter_ms=1500)
    spread = itertools.cycle([0, 1])
    largest = 0
    for name, table in pipeline.sources.items():
        topic = topic_of(table)
        ensure_topics(kafka_bootstrap, {topic: 2})
        rows = [(None, json.dumps(e.row).encode()) for e in events if e.table == name]
        produce(kafka_bootstrap, topic, rows, partition_of=lambda _k: next(spread))
        largest = max(largest, len(rows))
    result = run_pipeline(spark, pipeline, kafka_bootstrap, str(tmp_path / "checkpoint"), name=f"nexmark-{query}",
                          max_records_per_trigger=largest // 4 + 1)
    assert len(result.reports) >= 3, "several micro-batches"
    expected = replay_reference(kafka_bootstrap, pipeline, result.reports).table()
    assert expected, "windows fired"
    assert sink_table(kafka_bootstrap, pipeline, result.sink_writer_id) == expected
