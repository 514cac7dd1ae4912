"""The event log analyzer (``tests/bench/event_log.py``) on a real micro-batch: W1's second
batch from a sustained suite run (Spark 4, the job's five stages, their tasks and the query's
progress), trimmed to the fields the analyzer reads."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import event_log  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "spark-event-log-w1-batch.jsonl"


def test_each_stage_is_named_by_the_operators_it_runs_and_summed_over_its_tasks() -> None:
    stages, _ = event_log.read(FIXTURE)
    assert stages["operator"].to_list() == [
        "decode pass", "keyed stage", "keyed stage", "keyed stage + sink split", "sink produce"]
    assert stages["tasks"].to_list() == [2, 2, 2, 2, 2]
    assert stages["wall_ms"].to_list() == [576, 358, 265, 301, 75]
    assert stages["run_ms"].to_list() == [1070, 616, 501, 549, 119]
    # the JVM's own CPU in those tasks (nanoseconds in the log)
    assert stages["jvm_cpu_ms"].round(1).to_list() == [72.2, 49.7, 49.3, 45.4, 6.9]
    # the last keyed stage and the sink's split are two Python operators in one stage: both count
    assert stages["python_run_ms"].to_list() == [1049, 443, 283, 273 + 510, 105]
    assert stages["state_commit_ms"].to_list() == [0, 137, 184, 203, 0]
    assert stages["rocksdb_sync_ms"].to_list() == [0, 116, 160, 171, 0]


def test_a_batch_is_its_stages_and_the_driver_time_outside_them() -> None:
    stages, batches = event_log.read(FIXTURE)
    row = event_log.per_batch(stages, batches).row(0, named=True)
    assert (row["query"], row["batch"], row["rows_in"]) == ("tidemark_bench_w1_default_efb2c4", 1, 22_000)
    assert (row["batch_ms"], row["stages_ms"], row["driver_ms"]) == (1877, 1575, 302)
    assert (row["queryPlanning_ms"], row["walCommit_ms"], row["commitOffsets_ms"]) == (48, 28, 39)
    assert (row["stages"], row["run_ms"], row["state_commit_ms"]) == (5, 2855, 524)


def test_shares_are_of_the_batches_wall_time() -> None:
    stages, batches = event_log.read(FIXTURE)
    total = event_log.shares(event_log.per_batch(stages, batches)).row(0, named=True)
    assert total["stages_share"] == pytest.approx(1575 / 1877)
    assert total["driver_share"] == pytest.approx(302 / 1877)
    assert total["state_commit_s"] == pytest.approx(0.524)


@pytest.mark.parametrize(("intervals", "covered"), [
    ([(0, 10), (20, 30)], 20),  # apart
    ([(0, 10), (5, 30)], 30),  # overlapping stages of one batch count once
    ([(0, 30), (5, 10)], 30),  # one inside another
])
def test_time_in_stages_counts_overlapping_stages_once(intervals: list, covered: float) -> None:
    assert event_log._union_ms(intervals) == covered


def test_the_cli_prints_the_tables_and_refuses_what_is_not_an_event_log(tmp_path: Path, capsys) -> None:
    assert event_log.main([str(FIXTURE)]) == 0
    out = capsys.readouterr().out
    assert "| tidemark_bench_w1_default_efb2c4 | 1 " in out and "keyed stage + sink split" in out
    bad = tmp_path / "log.json"
    bad.write_text('{"Event": "SparkListenerLogStart"}\nnot json\n', encoding="utf-8")
    assert event_log.main([str(bad)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"event_log.py: {bad} line 2: not a Spark event log line (Expecting value: line 1 column 1 (char 0))"]
    assert event_log.main([str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.strip() == f"event_log.py: {tmp_path / 'missing'}: no such file or directory"
