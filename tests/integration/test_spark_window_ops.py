"""Window Top-N and window joins on the Spark job equal the replay host on the job's own batches.

Each pipeline (``generate.window_op_workload``: out-of-order bids, and asks for the join) runs
in two parts on one checkpoint: the first half of the records over several micro-batches, the
job stops, then a late bid and the second half. The replay host runs the very batches the job
reported and the sink topic must hold its table: windows fired in the batches replay fires
them, across the restart. A join waits for the lower watermark of its two sources, which the
restarted job knows only from state; the late bid is dropped and counted likewise.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from run_support import PartRunner, replay_reference, sink_table, unique_topics

from tidemark.engine.pipeline import compile_sql

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "conformance"))
from generate import window_op_workload  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("shape", ["topn_tumble", "dedup_last", "join_left"])
def test_window_operator_on_spark_gives_replays_table_across_a_restart(spark, kafka_bootstrap, tmp_path, shape):
    w = window_op_workload(3, shape)
    sql, _ = unique_topics(w.sql, f"wop-{shape}")
    pipeline = compile_sql(sql)
    kind = "window_join" if shape.startswith("join") else "window_rank"
    stage = next(n.name for n in pipeline.nodes if n.kind == kind)
    records = {t: [r for batch in w.inputs[t] for r in batch] for t in w.inputs}
    parts = PartRunner(spark, kafka_bootstrap, pipeline, str(tmp_path / "checkpoint"), f"wop-{shape}")
    first = parts.run({t: r[: len(r) // 2] for t, r in records.items()})
    bids = records["bids"][: len(records["bids"]) // 2]
    earliest = min(bids, key=lambda r: r["row"]["ts"])["row"]
    late = {"kind": "+I", "row": {**earliest, "ts": "2023-11-14 00:00:00.000"}}  # before every window of the data
    second = parts.run({t: ([late] if t == "bids" else []) + r[len(r) // 2:] for t, r in records.items()})
    reports = first.reports + second.reports
    assert len(first.reports) >= 2 and len(second.reports) >= 2, "several micro-batches on each side of the restart"

    expected = replay_reference(kafka_bootstrap, pipeline, reports)
    assert expected.table(), "windows fired"
    assert sink_table(kafka_bootstrap, pipeline, second.sink_writer_id) == expected.table()
    dropped = [r.counters.get(f"{stage}.late_records_dropped", 0) for r in reports]
    assert sum(dropped) == expected.metrics["late_records_dropped"] >= 1
