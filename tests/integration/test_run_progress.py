"""A running job's batch reports while it waits for data.

Spark posts an idle progress every ``noDataProgressEventInterval`` while a query waits, and
that progress carries the id of the batch it will run next. The job must report the batch
that then runs with its own figures, not the idle progress's zero records: the control
service's ``rows_in`` and the CLI's totals are sums of these reports.
"""

from __future__ import annotations

import time

import pytest
from run_support import produce, unique_topics

from tidemark.cli.demo import DEMO_SQL, s1_case_records, s2_records
from tidemark.engine.pipeline import compile_sql
from tidemark.kafka.admin import ensure_topics
from tidemark.spark.job import PipelineJob

pytestmark = pytest.mark.integration

IDLE_INTERVAL = "spark.sql.streaming.noDataProgressEventInterval"


def test_a_batch_after_idle_progress_is_reported_with_its_records(spark, kafka_bootstrap, tmp_path):
    sql, topics = unique_topics(DEMO_SQL.format(s1="s1", s2="s2", t1="t1"), "idle")
    pipeline = compile_sql(sql)
    ensure_topics(kafka_bootstrap, {topics["s1"]: 1, topics["s2"]: 1})
    produce(kafka_bootstrap, topics["s2"], [(k, v) for _, _, k, v in s2_records(topics["s2"])])
    before = spark.conf.get(IDLE_INTERVAL)
    spark.conf.set(IDLE_INTERVAL, "100ms")  # read when the query starts
    job = PipelineJob(spark, pipeline, kafka_bootstrap, str(tmp_path / "checkpoint"), name="idle",
                      trigger_interval="100 milliseconds")
    try:
        job.start()
        job.process_all_available()
        deadline = time.monotonic() + 60
        while not any(p["numInputRows"] == 0 and p["batchId"] == 1 for p in job.query.recentProgress):
            assert time.monotonic() < deadline, "Spark posted no idle progress"
            time.sleep(0.1)
        records = [(k, v) for _, _, k, v in s1_case_records(topics["s1"], 1, id_=1)]
        produce(kafka_bootstrap, topics["s1"], records)
        job.process_all_available()
    finally:
        job.close()
        spark.conf.set(IDLE_INTERVAL, before)
    assert [(r.batch_id, r.rows_in) for r in job.reports] == [(0, 2), (1, len(records))]
