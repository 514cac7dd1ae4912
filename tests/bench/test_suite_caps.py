"""The suite's handling of a Flink run cancelled at its time cap (``--flink-cap``), without a
JVM: the cap's defaults and parsing, the runner's progress figures, a capped run left out of
the table comparison, ratios against it as bounds, and how the docs section shows them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import suite
import workloads
from flink_runner import progress

W3_INPUT = 99_999


def _scale(value: float):
    return lambda _workload: value


def test_w3_legacy_is_capped_by_default_only_at_half_size_or_more() -> None:
    assert suite.parse_caps("", _scale(0.1)) == {}
    assert suite.parse_caps("", _scale(0.5)) == {("W3", "LEGACY"): suite.DEFAULT_W3_LEGACY_CAP_S}
    assert suite.parse_caps("W3:LEGACY=120, W1:default=60", _scale(1.0)) == {
        ("W3", "LEGACY"): 120.0, ("W1", "default"): 60.0}
    assert suite.parse_caps("W3:LEGACY=0", _scale(1.0)) == {}  # 0 lifts the default cap


@pytest.mark.parametrize("text", ["W3=300", "W3:LEGACY", "W3:LEGACY=soon", "W3:LEGACY=-1"])
def test_a_malformed_cap_is_refused_naming_it(text: str) -> None:
    with pytest.raises(ValueError, match="--flink-cap") as e:
        suite.parse_caps(text, _scale(0.1))
    assert repr(text) in str(e.value)


def test_progress_counts_records_into_the_materializer_vertex_over_the_time_to_the_cap() -> None:
    vertices = [
        {"name": "Source: s[1] -> DropUpdateBefore[2]",
         "metrics": {"read-records": 0, "read-records-complete": True}},
        {"name": "SinkMaterializer(pk=[grp]) -> Sink: Writer",
         "metrics": {"read-records": 15_000, "read-records-complete": True}},
    ]
    p = progress(vertices, W3_INPUT, running_ms=1_000_000, capped_at_ms=1_300_000)
    assert p["records_in"] == 15_000 and p["records_in_vertex"].startswith("SinkMaterializer")
    assert p["records_in_exact"] is True
    # the whole input had not passed by the cap: at most input / elapsed over the whole run
    assert p["elapsed_s"] == 300.0 and p["throughput_upper_rows_s"] == round(W3_INPUT / 300, 1)
    assert p["rate_so_far_rows_s"] == 50.0
    # no materializer in the plan: the writer's vertex counts
    p = progress([{"name": "Calc -> Sink: Writer", "metrics": {"read-records": 10}}], 20, 0, 2_000)
    assert p["records_in"] == 10 and p["throughput_upper_rows_s"] == 10.0 and p["records_in_exact"] is False


class _CappingFlink:
    """Stands in for FlinkSession: LEGACY is cancelled at its cap, ADAPTIVE runs to its end."""

    startup_s = 5.0
    flink_version = "2.3.0"

    def __init__(self, wl: Any, adaptive_table: list) -> None:
        self.wl, self.adaptive_table = wl, adaptive_table
        self.jobs: list[dict] = []

    def run(self, job: dict) -> dict:
        self.jobs.append(job)
        if job["options"].get(workloads.FLINK_STRATEGY_OPTION) == "LEGACY":
            assert job["cap_s"] == 300.0
            return {"id": job["id"], "ok": False, "capped": True, "cap_s": 300.0, "error": "capped at 300 s: ...",
                    "input_rows": job["input_rows"], "records_in": 600, "elapsed_s": 300.0,
                    "throughput_upper_rows_s": 2.0, "peak_rss_bytes": 900 * 2**20,
                    "peak_rss_with_driver_bytes": 1000 * 2**20, "state_bytes": 1234}
        return {"id": job["id"], "ok": True, "input_rows": job["input_rows"], "throughput_rows_s": 2_000.0,
                "seconds": 50.0, "peak_rss_bytes": 900 * 2**20, "state_bytes": 4096,
                "state_by_vertex": {"SinkMaterializer -> Writer": 4000}, "rows": self.adaptive_table}


class _Sessions:
    def __init__(self, fs: Any) -> None:
        self.fs = fs

    def for_workload(self, _name: str) -> tuple[Any, Any]:
        return self.fs, None


def _w3_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tidemark_rows_s: float,
                adaptive_table: list | None = None) -> tuple[dict[str, Any], _CappingFlink]:
    wl = workloads.generate("W3", 0.01, 1, tmp_path / "input")
    expected = [list(r) for r in wl.expected.values()]
    fs = _CappingFlink(wl, expected if adaptive_table is None else adaptive_table)

    def fake_tidemark(*_a: Any, **_k: Any) -> dict[str, Any]:
        return {"rows_per_s": tidemark_rows_s, "run_s": 1.0, "startup_s": 10.0, "peak_rss_bytes": 2000 * 2**20,
                "state_bytes": 100, "materializer_state_bytes": 10, "input_rows": wl.input_rows, "table": expected}

    monkeypatch.setattr(suite, "run_tidemark", fake_tidemark)
    args = argparse.Namespace(repeats=1, flink_cap=suite.parse_caps("", _scale(1.0)), max_records_per_trigger=None,
                              batches=1)
    results: dict[str, Any] = {"differences": [], "workloads": {}}
    runs = suite.run_workload(wl, args, "unused:9092", tmp_path / "work", _Sessions(fs), results)
    results["workloads"]["W3"] = {"scale": 1.0, "input_rows": W3_INPUT, "final_rows": 1, "params": wl.params,
                                  "runs": runs, "medians": suite.summarize(runs), "ratios": suite.ratios(wl, runs)}
    results["targets"] = suite.targets(results)
    return results, fs


def test_a_capped_run_is_not_compared_and_bounds_the_ratio_against_it(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    results, fs = _w3_results(tmp_path, monkeypatch, tidemark_rows_s=40.0)
    assert [j["cap_s"] for j in fs.jobs] == [300.0, None]  # LEGACY capped, ADAPTIVE not
    w = results["workloads"]["W3"]
    legacy = next(r for r in w["runs"] if r["variant"] == "LEGACY")
    assert legacy["capped"] and legacy["equal_to_expected"] is None and legacy["table_rows"] is None
    assert legacy["rows_per_s"] == 2.0 and legacy["state_bytes"] is None
    assert all(r["equal_to_expected"] for r in w["runs"] if r["variant"] != "LEGACY")
    assert results["differences"] == []
    # Tidemark / LEGACY: LEGACY's 2 rows/s is an upper bound, so 40/2 = 20 is a lower bound
    vs_legacy = w["ratios"]["tidemark:default / flink:LEGACY"]
    assert vs_legacy["rows_per_s"] == 20.0 and vs_legacy["rows_per_s_bound"] == ">="
    assert vs_legacy["state_bytes"] is None and vs_legacy["peak_rss_bytes"] is None
    vs_adaptive = w["ratios"]["tidemark:default / flink:ADAPTIVE"]
    assert vs_adaptive["rows_per_s"] == 0.02 and vs_adaptive["rows_per_s_bound"] == ""
    met = {t["ratio"]: t for t in results["targets"] if t["workload"] == "W3"}
    assert met["tidemark:default / flink:LEGACY"]["met"] is True  # >= 20x decides >= 10x
    assert met["tidemark:default / flink:ADAPTIVE"]["met"] is False


def test_a_lower_bound_below_the_target_leaves_it_undecided(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results, _ = _w3_results(tmp_path, monkeypatch, tidemark_rows_s=10.0)  # >= 5x
    t = next(t for t in results["targets"] if t["ratio"] == "tidemark:default / flink:LEGACY")
    assert t["value"] == 5.0 and t["bound"] == ">=" and t["met"] is None
    assert suite.target_text(t) == "undecided (a bound only)"


def test_capped_figures_read_as_bounds_in_the_docs_section(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results, _ = _w3_results(tmp_path, monkeypatch, tidemark_rows_s=40.0)
    results.update(command="suite.py --only W3 --scales W3=1.0", scale=0.1, repeats=1, seed=1,
                   started_at="t0", finished_at="t1", elapsed_s=60.0, load_start=[1.0], load_end=[1.0],
                   machine={"cpus": 2, "cpu_model": "x", "mem_bytes": 2**30, "python": "3.11", "java": "17",
                            "pyspark": "4"})
    text = suite.render(results)
    row = next(line for line in text.splitlines() if line.startswith("| flink | LEGACY |"))
    assert "| <= 2 rows/s (capped at 300 s, 600 of 999 records) |" in row
    assert "| >= 20x |" in next(line for line in text.splitlines() if line.startswith("| tidemark:default / flink:LEGACY |"))
    assert "its table is not compared" in text
    assert "| tidemark:default / flink:LEGACY | rows_per_s | >= 10 | >= 20x | met |" in text


def test_a_capped_run_the_suite_did_not_ask_for_fails_loudly(tmp_path: Path) -> None:
    """A timeout is not a cap: without one requested, the suite still refuses the run."""
    wl = workloads.generate("W3", 0.01, 1, tmp_path / "input")
    fs = _CappingFlink(wl, [])
    fs.run = lambda job: {"id": job["id"], "ok": False, "capped": True, "error": "timed out at 1800 s: ..."}
    with pytest.raises(SystemExit, match="timed out at 1800 s"):
        suite.run_flink(wl, "LEGACY", tmp_path / "run", fs)


def test_ratio_bounds_by_which_side_was_capped() -> None:
    assert suite.ratio_bound(False, False) == ""
    assert suite.ratio_bound(False, True) == ">="  # Tidemark / capped Flink
    assert suite.ratio_bound(True, False) == "<="
    assert suite.ratio_bound(True, True) is None
    assert suite.target_met(20.0, ">=", ">=", 10.0) is True
    assert suite.target_met(5.0, ">=", ">=", 10.0) is None
    assert suite.target_met(5.0, "<=", ">=", 10.0) is False
    assert suite.target_met(0.05, "<=", "<=", 0.1) is True
    assert suite.target_met(0.5, "", ">=", 1.0) is False


def test_a_variant_capped_in_some_repeats_only_gives_a_bound_on_the_median() -> None:
    wl = argparse.Namespace(tidemark_variants={"default": ""}, flink_variants={"LEGACY": {}})

    def run(system: str, variant: str, rep: int, rows_s: float, capped: bool = False) -> dict[str, Any]:
        return {"system": system, "variant": variant, "repeat": rep, "rows_per_s": rows_s, "capped": capped,
                "peak_rss_bytes": 1, "state_bytes": 1, "materializer_state_bytes": 1}

    runs = [run("tidemark", "default", 0, 100.0), run("flink", "LEGACY", 0, 10.0, capped=True),
            run("tidemark", "default", 1, 100.0), run("flink", "LEGACY", 1, 20.0)]
    r = suite.ratios(wl, runs)["tidemark:default / flink:LEGACY"]
    assert r["rows_per_s"] == 7.5 and r["rows_per_s_bound"] == ">="
    assert r["state_bytes"] == 1.0  # from the repeat that ran to its end only
