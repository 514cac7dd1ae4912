"""The Spark job runs UNION ALL and lookup-join pipelines as the replay host does: the
union conformance shapes (two CDC tables through UNION ALL into a materialized sink, and
into an aggregate) and the lookup-join shapes, with every record in rate-limited batches
over 2-partition topics, equal the in-process reference on the job's own batches
(``test_run_replay_equivalence`` has the method)."""

from __future__ import annotations

import pytest
from test_run_replay_equivalence import case, run_all

pytestmark = pytest.mark.integration


def test_spark_job_runs_union_all_as_replay_does(spark, kafka_bootstrap, tmp_path):
    run_all(spark, kafka_bootstrap, tmp_path, [
        case(1, "union_all", "DEDUPLICATE"),
        case(2, "union_agg", "DEDUPLICATE", "changelog-sink"),
        case(3, "union_all", "NOTHING"),
    ])


def test_spark_job_runs_lookup_joins_as_replay_does(spark, kafka_bootstrap, tmp_path):
    """The dimension has a primary key, so the job looks it up in the (embedded) index
    service as of each batch's start offsets, where replay keeps it in memory; rate-limited
    batches mix dimension and stream records, so this is where the two could differ."""
    run_all(spark, kafka_bootstrap, tmp_path, [
        case(1, "lookup_join", "DEDUPLICATE"),
        case(2, "lookup_left_join", "NOTHING", "changelog-sink"),
    ])
