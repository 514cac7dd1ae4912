"""A rank pipeline on Spark equals the replay host: Top-N with the row number, deduplication
(``rn = 1``) and Top-N into a sink keyed otherwise (with a materializer), over random CDC
workloads from the conformance generator, each source read in several rate-limited batches.
The comparison is ``test_run_replay_equivalence``'s (same batches, same source positions)."""

from __future__ import annotations

import pytest
from test_run_replay_equivalence import case, run_all

pytestmark = pytest.mark.integration

CASES = [
    case(6, "topn_rank", "DEDUPLICATE"),
    case(7, "dedup_first", "DEDUPLICATE"),
    case(8, "topn_by_id", "NOTHING"),
]


def test_spark_job_equals_replay_on_rank_workloads(spark, kafka_bootstrap, tmp_path):
    run_all(spark, kafka_bootstrap, tmp_path, CASES)
