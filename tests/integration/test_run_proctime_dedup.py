"""Deduplication by processing time on Spark equals the replay host: keep the first and the
last row per auction over append-only bids, and keep the first over a Debezium changelog
(``proctime_workloads``), each source read in several rate-limited micro-batches over two
partitions. "First" and "last" are source positions on both hosts, so the sink tables are
equal whatever the micro-batches' processing times. The comparison is
``test_run_replay_equivalence``'s (same batches, same source positions)."""

from __future__ import annotations

import pytest
from test_run_replay_equivalence import Case, run_all

from proctime_workloads import append_workload, changelog_workload  # noqa: E402  (tests/conformance, on the path once test_run_replay_equivalence is imported)

pytestmark = pytest.mark.integration

CASES = [
    Case(w.name, w, w.sql)
    for w in (append_workload(41, "keep_first"), append_workload(42, "keep_last"),
              changelog_workload(43, "keep_first", "debezium-json"))
]


def test_spark_job_equals_replay_on_processing_time_deduplication(spark, kafka_bootstrap, tmp_path):
    run_all(spark, kafka_bootstrap, tmp_path, CASES)
