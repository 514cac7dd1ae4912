"""Window aggregation on the Spark job equals the replay host on the job's own batches,
batch by batch.

Each pipeline (TUMBLE, HOP, SESSION over out-of-order bids, a computed column and the
filter ``item <> 3 OR price > 10`` in front) runs in three parts on one checkpoint:

1. the first half of the bids, over several micro-batches; the job stops;
2. a late bid (its windows fired in part 1), then the second half; the job stops;
3. two bids the filter drops, far ahead in event time: they reach no state bucket, yet
   move the watermark past every open window.

The replay host runs the very batches the job reported (same offsets, same positions).
Every batch's sink changes must be replay's: windows fire in the batch replay fires them,
across both restarts, and in part 3 with no record in any bucket. The late bid is dropped
and counted in the first batch after the restart, which only the watermark kept in state
can make late.
"""

from __future__ import annotations

import sys
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from run_support import (
    PartRunner,
    replay_batches,
    sink_changes,
    sink_records,
    unique_topics,
)

from tidemark.engine.pipeline import compile_sql
from tidemark.engine.replay import ReplayHost
from tidemark.kafka.transactional import BATCH_HEADER

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "conformance"))
from generate import window_workload  # noqa: E402

pytestmark = pytest.mark.integration

_TS = "%Y-%m-%d %H:%M:%S.%f"


def _late(records: list[dict]) -> dict:
    """A bid at the earliest event time of ``records``: every window it falls in has fired
    by the end of them (the workload spans far more than a window and the delay)."""
    first = min(records, key=lambda r: r["row"]["ts"])
    return {"kind": "+I", "row": {**first["row"], "item": 1, "price": 99}}


def _closing(records: list[dict]) -> list[dict]:
    """Bids the filter drops (item 3, price 5), a minute after the last event time."""
    last = datetime.strptime(max(r["row"]["ts"] for r in records), _TS)
    ts = (last + timedelta(minutes=1)).strftime(_TS)[:-3]
    return [{"kind": "+I", "row": {"item": 3, "price": 5, "ts": ts}}] * 2


@pytest.mark.parametrize("window", ["tumble", "hop", "session"])
def test_window_aggregate_on_spark_gives_replays_batches_across_restarts(spark, kafka_bootstrap, tmp_path, window):
    w = window_workload(11, window, n_events=80)
    sql, _ = unique_topics(w.sql, f"win-{window}")
    pipeline = compile_sql(sql)
    records = [r for batch in w.inputs["bids"] for r in batch]
    half = len(records) // 2
    parts = PartRunner(spark, kafka_bootstrap, pipeline, str(tmp_path / "checkpoint"), f"win-{window}")
    first = parts.run({"bids": records[:half]})
    second = parts.run({"bids": [_late(records[:half]), *records[half:]]})
    third = parts.run({"bids": _closing(records)})
    reports = first.reports + second.reports + third.reports
    assert len(first.reports) >= 2 and len(second.reports) >= 2, "several micro-batches on each side of a restart"
    assert sum(r.rows_in for r in reports) == len(records) + 3

    host = ReplayHost(pipeline, clock=lambda: 0)
    expected = {r.batch_id: Counter((c.kind, c.row) for c in host.run_batch(b)) for r, b in
                zip(sorted(reports, key=lambda r: r.batch_id), replay_batches(kafka_bootstrap, pipeline, reports))}
    got = {r.batch_id: Counter() for r in reports}
    for rec in sink_records(kafka_bootstrap, pipeline, third.sink_writer_id):
        got[int(rec.header(BATCH_HEADER))].update((c.kind, c.row) for c in sink_changes(pipeline, [rec]))
    assert got == expected
    assert host.metrics["late_records_dropped"] == 1
    assert sum(expected[r.batch_id].total() for r in third.reports) > 0, "part 3 fires windows without a record"

    window_stage = next(n.name for n in pipeline.nodes if n.kind == "window_aggregate")
    late = [r.counters.get(f"{window_stage}.late_records_dropped", 0) for r in reports]
    # counted once, in the first batch after the restart: late by the watermark kept in state
    assert late[len(first.reports)] == 1 and sum(late) == 1
