"""The Flink half of the benchmark: the runner's final sink table on the quick W2 workload
equals what Tidemark's reference host (``ReplayHost``, as ``tidemark replay``) computes from
the same files, and the figures the suite reports are there."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from compare import compare_tables, key_positions
from flink_runner import DEFAULT_FLINK_PYTHON, job_spec, run
from replay_reference import replay_table
from workloads import QUICK_SCALE, generate

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(DEFAULT_FLINK_PYTHON).exists(), reason="no .venv-flink (make install-flink)"),
]


def test_flink_runner_matches_replay_on_quick_w2(tmp_path: Path) -> None:
    wls = {s: generate(f"W2-{s}", QUICK_SCALE, 1, tmp_path / s) for s in ("DEDUPLICATE", "ERROR")}
    jobs = [job_spec(wl, "default", tmp_path / "runs") for wl in wls.values()]
    jobs.append(job_spec(wls["DEDUPLICATE"], "default", tmp_path / "runs", materialize=False))
    jobs.append(job_spec(_w3_ending_in_conflict(tmp_path), "default", tmp_path / "runs"))
    report = run(jobs, timeout_s=900)
    assert report["flink_version"] == "2.3.0" and report["jvm_start_seconds"] > 0
    dedup, error, counting, conflict = report["jobs"]
    # a job that fails is reported as such, with Flink's reason, and no table
    assert not conflict["ok"] and "rows" not in conflict
    assert "Primary key constraint violation" in conflict["error"] and "grp=1" in conflict["error"]
    for res, wl in ((dedup, wls["DEDUPLICATE"]), (error, wls["ERROR"])):
        assert res["ok"], res["error"]
        key = key_positions(wl.sink_columns, wl.sink_pk)
        replayed = replay_table(wl)
        assert len(replayed) == len(wl.expected) > 100
        assert compare_tables(res["rows"], replayed, key) == []
        assert res["input_rows"] == wl.input_rows and res["throughput_rows_s"] > 0
        assert res["peak_rss_bytes"] > 100 * 2**20
        # the final checkpoint holds the join's and the materializer's state
        assert res["state_bytes"] > 0
        assert any("Join" in v and size > 0 for v, size in res["state_by_vertex"].items())
        assert any("Materializer" in v and size > 0 for v, size in res["state_by_vertex"].items())
    # the counting sink runs the same job, keeping no table (how many changes reach the sink
    # varies with the parallel join's interleaving, the final table does not)
    assert counting["ok"] and "rows" not in counting and counting["sink_changes"] >= len(wls["DEDUPLICATE"].expected)
    # the check the suite relies on fires on a real Flink table with one value changed
    wl = wls["DEDUPLICATE"]
    rows = sorted(dedup["rows"])
    rows[0] = [rows[0][0], rows[0][1], rows[0][2] + "!"]
    assert compare_tables(rows, wl.expected, key_positions(wl.sink_columns, wl.sink_pk)) == [
        f"key ({rows[0][0]},): flink {tuple(rows[0])!r} != tidemark {wl.expected[(rows[0][0],)]!r}"]


def _w3_ending_in_conflict(tmp_path: Path):
    """W3 with ON CONFLICT DO ERROR and its last retraction dropped: two rows remain for
    sink key grp=1 at the end of input, which DO ERROR must refuse."""
    wl = generate("W3", QUICK_SCALE / 5, 1, tmp_path / "W3")
    lines = wl.tables["s"].read_text().splitlines()
    path = tmp_path / "W3" / "s_conflict.jsonl"
    path.write_text("\n".join(lines[:-1]) + "\n")
    return dataclasses.replace(wl, name="W3-ERROR", strategy="ERROR", tables={"s": path}, input_rows=len(lines) - 1,
                               select=wl.select.replace("DEDUPLICATE", "ERROR"), flink_variants={"default": {}})
