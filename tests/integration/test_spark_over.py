"""OVER aggregation on the Spark job equals the replay host on the job's own batches.

Each pipeline (``generate.over_workload``: a ROWS frame and RANGE UNBOUNDED over out-of-order
bids, a computed column and a filter in front) runs in two parts on one checkpoint: the first
half of the bids over several micro-batches, the job stops, then a late bid and the second
half. The replay host runs the very batches the job reported and the sink topic must hold its
table: rows released in the batches replay releases them, across the restart. The late bid
is dropped and counted only if the restarted job still knows the watermark in state.
"""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import pytest
from run_support import encode_source, produce, replay_reference, sink_table, topic_of, unique_topics

from tidemark.engine.pipeline import compile_sql
from tidemark.kafka.admin import ensure_topics
from tidemark.spark.job import run_pipeline

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
    table = pipeline.sources["bids"]
    topic = topic_of(table)
    records = [r for batch in w.inputs["bids"] for r in batch]
    half = len(records) // 2
    ensure_topics(kafka_bootstrap, {topic: 2})
    spread = itertools.cycle([0, 1])  # both partitions: two tasks send ticks in each batch

    def run(part: list[dict]):  # noqa: ANN202
        produce(kafka_bootstrap, topic, encode_source(table, part), partition_of=lambda _k: next(spread))
        return run_pipeline(spark, pipeline, kafka_bootstrap, str(tmp_path / "checkpoint"), name=f"over-{window}",
                            max_records_per_trigger=math.ceil(len(part) / 3))

    first = run(records[:half])
    second = run([_late(records[:half]), *records[half:]])
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
