"""A rank pipeline on Spark equals the replay host: Top-N with the row number, deduplication
(``rn = 1``) and Top-N into a sink keyed otherwise (with a materializer), over random CDC
workloads from the conformance generator, each source read in several rate-limited batches.
The comparison is ``test_run_replay_equivalence``'s (same batches, same source positions)."""

from __future__ import annotations

import pytest
from test_run_replay_equivalence import case, run_all

pytestmark = pytest.mark.integration

# The rank stage is a batch kernel with typed state; the Spark host runs such kernels once its
# data path is Arrow IPC blobs through driver.batch_stage (tidemark.engine.batch_ipc).
pytest.importorskip("tidemark.engine.batch_ipc", reason="the Spark host runs batch kernels with the Arrow IPC data path")

CASES = [
    case(6, "topn_rank", "DEDUPLICATE"),
    case(7, "dedup_first", "DEDUPLICATE"),
    case(8, "topn_by_id", "NOTHING"),
]


def test_spark_job_equals_replay_on_rank_workloads(spark, kafka_bootstrap, tmp_path):
    run_all(spark, kafka_bootstrap, tmp_path, CASES)
