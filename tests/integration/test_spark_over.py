"""OVER aggregation on the Spark job equals the replay host on the job's own batches.

Each pipeline (``generate.over_workload``: a ROWS frame and RANGE UNBOUNDED over out-of-order
bids, a computed column and a filter in front) runs in two parts on one checkpoint: the first
half of the bids over several micro-batches, the job stops, then a late bid and the second
half. The replay host runs the very batches the job reported and the sink topic must hold its
table: rows released in the batches replay releases them, across the restart. The late bid
is dropped and counted only if the restarted job still knows the watermark in state.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from run_support import PartRunner, replay_reference, sink_table, unique_topics

from tidemark.engine.pipeline import compile_sql

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "conformance"))
from generate import over_workload  # noqa: E402

pytestmark = pytest.mark.integration


def _late(records: list[dict]) -> dict:
    """A bid at the earliest event time of ``records``: behind the watermark by the end of
    them (the workload spans far more than the delay)."""
    first = min(records, key=lambda r: r["row"]["ts"])
    return {"kind": "+I", "row": {**first["row"], "item": 1, "price": 99}}


@pytest.mark.parametrize("window", ["rows", "range_unbounded"])
def test_over_aggregate_on_spark_gives_replays_table_across_a_restart(spark, kafka_bootstrap, tmp_path, window):
    w = over_workload(11, window)
    sql, _ = unique_topics(w.sql, f"over-{window}")
    pipeline = compile_sql(sql)
    records = [r for batch in w.inputs["bids"] for r in batch]
    half = len(records) // 2
    parts = PartRunner(spark, kafka_bootstrap, pipeline, str(tmp_path / "checkpoint"), f"over-{window}")
    first = parts.run({"bids": records[:half]})
    second = parts.run({"bids": [_late(records[:half]), *records[half:]]})
    reports = first.reports + second.reports
    assert len(first.reports) >= 2 and len(second.reports) >= 2, "several micro-batches on each side of the restart"
    assert sum(r.rows_in for r in reports) == len(records) + 1

    expected = replay_reference(kafka_bootstrap, pipeline, reports)
    assert expected.metrics["late_records_dropped"] == 1
    assert expected.table(), "rows released"
    assert sink_table(kafka_bootstrap, pipeline, second.sink_writer_id) == expected.table()
    window_stage = next(n.name for n in pipeline.nodes if n.kind == "over_aggregate")
    late = [r.counters.get(f"{window_stage}.late_records_dropped", 0) for r in reports]
    # counted once, in the first batch after the restart: late by the watermark kept in state
    assert late[len(first.reports)] == 1 and sum(late) == 1
