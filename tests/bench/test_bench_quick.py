"""Smoke test of the benchmark harness (``make bench-quick``'s command, ``suite.py --quick``):
both systems run every workload variant on tiny inputs, every final table is checked, and
the results and the docs section are written. It asserts what the harness produced, never
how fast anything was (speed lives in the suite's own output)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import workloads
from flink_runner import DEFAULT_FLINK_PYTHON

HERE = Path(__file__).resolve().parent

# In make test on purpose (the issue: a smoke run "used by a test so the harness cannot
# rot"): two JVMs and ~15 tiny jobs, about 3-4 minutes on an idle 2-core machine.
pytestmark = [
    pytest.mark.skipif(not Path(DEFAULT_FLINK_PYTHON).exists(), reason="no .venv-flink (make install-flink)"),
]


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
    assert "The issue's targets" in section
