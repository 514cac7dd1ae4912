"""``make bench-quick`` (``suite.py --quick``): the smoke run of the benchmark harness, and the
``--overlap`` method it uses to take about a minute.

The smoke test runs both systems on every workload variant on tiny inputs, checks every final
table and the results and docs section written. It asserts what the harness produced, never
how fast anything was (speed lives in the suite's own output). The ``--overlap`` tests need no
JVM: stand-in sessions show that both systems' sides and Tidemark's runs really run at the
same time, and that every table is still compared."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import suite
import workloads
from flink_runner import DEFAULT_FLINK_PYTHON

HERE = Path(__file__).resolve().parent


# In make test on purpose (the issue: a smoke run "used by a test so the harness cannot
# rot"): two JVMs and 16 tiny jobs, side by side (--overlap), about a minute on an idle
# 2-core machine (2-4 minutes when others share it).
@pytest.mark.skipif(not Path(DEFAULT_FLINK_PYTHON).exists(), reason="no .venv-flink (make install-flink)")
def test_quick_suite_runs_every_workload_with_equal_tables(tmp_path: Path) -> None:
    out, results_json = tmp_path / "benchmarks.md", tmp_path / "results.json"
    out.write_text("# Benchmarks\n\n## Hand-written section\n\nkept as it is.\n", encoding="utf-8")
    env = dict(os.environ, PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable))
    proc = subprocess.run(
        [sys.executable, str(HERE / "suite.py"), "--quick", "--out", str(out), "--json", str(results_json),
         "--workdir", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(results_json.read_text(encoding="utf-8"))
    assert results["ok"] and results["differences"] == []
    assert set(results["workloads"]) == set(workloads.NAMES)
    for name, w in results["workloads"].items():
        wl = workloads.generate(name, w["scale"], results["seed"], tmp_path / "regen" / name)
        wanted = {f"flink:{v}" for v in wl.flink_variants} | {f"tidemark:{v}" for v in wl.tidemark_variants}
        assert set(w["medians"]) == wanted, name
        for run in w["runs"]:
            assert run["equal_to_expected"] and run["table_rows"] == len(wl.expected), (name, run["system"])
            assert run["input_rows"] == wl.input_rows and run["rows_per_s"] > 0
            assert run["peak_rss_bytes"] > 50 * 2**20  # a JVM at least
    assert {t["workload"] for t in results["targets"] if t["met"] is not None} == {
        "W1", "W2-DEDUPLICATE", "W2-NOTHING", "W2-ERROR", "W3", "W4"}
    text = out.read_text(encoding="utf-8")
    assert text.startswith("# Benchmarks\n\n## Hand-written section\n\nkept as it is.\n")
    section = text[text.index("<!-- suite:begin -->"):text.index("<!-- suite:end -->")]
    assert all(f"### {n}" in section for n in workloads.NAMES)
    assert "### Targets" in section
    assert results["overlap"] and "are not measurements" in section  # a smoke run says what it is not


# ---------------------------------------------------------------------------- --overlap, no JVM


class _Session:
    """Stands in for FlinkSession and TidemarkSession (start-up, context manager)."""

    startup_s = 1.0
    flink_version = "2.3.0"

    def __init__(self, workdir: Path, java_options: str | None = None) -> None:
        self.java_options = java_options
        STARTED.append(self)

    def __enter__(self) -> _Session:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


STARTED: list[_Session] = []


def _overlap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, names: list[str], overlap: int,
             in_flight_together: int, wrong: tuple[str, str, str] | None = None) -> dict[str, Any]:
    """Run ``run_all_overlapped`` with stand-in sessions and runs. The first
    ``in_flight_together`` runs (the first Flink run and the first Tidemark ones) wait for each
    other at a barrier: they return only if they were in flight at the same time. ``wrong``
    = (workload, system, variant) returns a table with one row changed."""
    STARTED.clear()
    monkeypatch.setattr(suite, "FlinkSession", _Session)
    monkeypatch.setattr(suite.tidemark_runner, "TidemarkSession", _Session)
    barrier = threading.Barrier(in_flight_together, timeout=60)
    calls: list[tuple[str, str, str]] = []
    lock = threading.Lock()

    def fake(system: str, wl: Any, variant: str) -> dict[str, Any]:
        with lock:
            calls.append((wl.name, system, variant))
            first = len([c for c in calls if c[1] == system]) <= (1 if system == "flink" else in_flight_together - 1)
        if first:
            barrier.wait()  # raises BrokenBarrierError unless the others arrive too
        table = dict(wl.expected)
        if wrong == (wl.name, system, variant):
            k = next(iter(table))
            table[k] = (*table[k][:-1], "changed")
        return {"rows_per_s": 10.0, "run_s": 1.0, "startup_s": 1.0, "peak_rss_bytes": 2**30, "state_bytes": 1,
                "materializer_state_bytes": 1, "input_rows": wl.input_rows,
                "table": table if system == "tidemark" else [list(r) for r in table.values()]}

    def fake_flink(wl: Any, variant: str, d: Path, fs: Any, cap_s: float | None = None) -> dict[str, Any]:
        return fake("flink", wl, variant)

    def fake_tidemark(wl: Any, variant: str, bootstrap: str, d: Path, args: Any, ts: Any) -> dict[str, Any]:
        return fake("tidemark", wl, variant)

    monkeypatch.setattr(suite, "run_flink", fake_flink)
    monkeypatch.setattr(suite, "run_tidemark", fake_tidemark)
    args = argparse.Namespace(scale=0.01, scale_of={}, seed=1, repeats=1, overlap=overlap, keep=False,
                              flink_cap={})
    results: dict[str, Any] = {"differences": [], "workloads": {}}
    suite.run_all_overlapped(names, args, "unused:9092", tmp_path / "work", results)
    results["calls"] = calls
    return results


def test_overlap_runs_both_sides_and_n_tidemark_runs_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    names = ["W3", "W4"]
    results = _overlap(tmp_path, monkeypatch, names, overlap=2, in_flight_together=3)
    assert sorted(results["calls"]) == sorted([("W3", "flink", "LEGACY"), ("W3", "flink", "ADAPTIVE"),
                                               ("W3", "tidemark", "default"), ("W4", "flink", "default"),
                                               ("W4", "tidemark", "delta"), ("W4", "tidemark", "regular")])
    assert [s.java_options for s in STARTED] == [suite.QUICK_JAVA_OPTIONS] * 2
    assert results["differences"] == []
    for name in names:
        w = results["workloads"][name]
        assert all(r["equal_to_expected"] and r["repeat"] == 0 for r in w["runs"])
        assert {f"{r['system']}:{r['variant']}" for r in w["runs"]} == set(w["medians"])


def test_overlap_still_compares_every_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results = _overlap(tmp_path, monkeypatch, ["W4"], overlap=1, in_flight_together=2,
                       wrong=("W4", "tidemark", "regular"))
    diffs = {(d["a"], d["b"]) for d in results["differences"]}
    assert diffs == {("expected", "tidemark:regular"), ("flink:default", "tidemark:regular")}
    run = next(r for r in results["workloads"]["W4"]["runs"] if r["variant"] == "regular")
    assert run["equal_to_expected"] is False


def test_quick_overlaps_and_the_measured_run_does_not() -> None:
    assert suite.QUICK["overlap"] >= 1 and suite.FULL["overlap"] == 0
