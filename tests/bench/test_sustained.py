"""The sustained mode's logic without a JVM: the per-batch cap, both systems' steady-state
clocks (the same rule: leave out the first batch's worth of records and the time to take them
in), the keep-up verdict of the latency phase, and how the suite turns a Flink report into a
steady figure and renders a job that fell behind."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import suite
import sustained
import workloads
from flink_runner import source_rows


def test_the_cap_drains_the_input_in_the_asked_number_of_batches() -> None:
    assert sustained.records_per_trigger(220_000, 5) == 44_000
    assert sustained.records_per_trigger(237_051, 5) == 47_411  # rounded up: never a 6th batch of one record
    assert sustained.records_per_trigger(1_000, 1) is None  # one batch: no cap
    with pytest.raises(ValueError, match="batches must be >= 1"):
        sustained.records_per_trigger(1_000, 0)


def test_the_first_batch_takes_up_to_the_cap_from_each_source_table(tmp_path: Path) -> None:
    assert sustained.first_batch_rows(44_000, [20_000, 200_000]) == 64_000  # W1: products, orders
    wl = workloads.generate("W1", 0.04, 1, tmp_path / "w1")  # 200 products, 2,000 orders
    args = argparse.Namespace(max_records_per_trigger=None, batches=5)
    assert suite.records_per_trigger(wl, args) == 440
    assert suite.warmup_rows(wl, args) == 200 + 440
    assert suite.warmup_rows(wl, argparse.Namespace(max_records_per_trigger=None, batches=1)) is None


def test_tidemark_steady_clock_starts_at_the_first_batch_commit() -> None:
    batches = [  # status events, out of order and with an empty (no-data) batch
        {"ts": 130.0, "rows_in": 40_000},
        {"ts": 100.0, "rows_in": 50_000},
        {"ts": 140.0, "rows_in": 0},
        {"ts": 120.0, "rows_in": 50_000},
        {"ts": 110.0, "rows_in": 50_000},
    ]
    st = sustained.tidemark_steady(batches, 190_000)
    assert st is not None
    assert (st.warmup_rows, st.rows, st.seconds) == (50_000, 140_000, 30.0)
    assert st.rows_per_s == pytest.approx(140_000 / 30)
    # one data batch has no steady part
    assert sustained.tidemark_steady([{"ts": 1.0, "rows_in": 10}, {"ts": 2.0, "rows_in": 0}], 10) is None


def test_flink_steady_clock_starts_when_its_sources_had_emitted_the_warmup_share() -> None:
    # 200,000 input records whose sources emit 300,000 rows (Debezium updates are two rows):
    # 50,000 records of warm-up = 75,000 rows emitted, first reached at t = 2.4
    timeline = [(2.0, 40_000), (2.2, 70_000), (2.4, 80_000), (2.6, 120_000), (5.0, 300_000)]
    st = sustained.flink_steady(timeline, 300_000, 200_000, 50_000, end_s=6.4)
    assert st is not None
    assert st.seconds == pytest.approx(4.0)
    assert st.warmup_rows == round(200_000 * 80_000 / 300_000)  # what had passed at that sample
    assert st.rows == 200_000 - st.warmup_rows
    assert st.rows_per_s == pytest.approx(st.rows / 4.0)
    # no sample reached the warm-up before the end, or nothing was sampled: no steady part
    assert sustained.flink_steady([(1.0, 10)], 300_000, 200_000, 50_000, end_s=2.0) is None
    assert sustained.flink_steady([], 300_000, 200_000, 50_000, end_s=2.0) is None
    assert sustained.flink_steady([(1.0, 300_000)], 300_000, 200_000, 50_000, end_s=0.5) is None


def test_the_same_rule_gives_both_systems_the_same_figure_for_the_same_progress() -> None:
    """A job that takes in 50,000 records in its first 10 s and then 25,000/s gets 25,000/s on
    both clocks: the warm-up's time and records are out of both."""
    tm = sustained.tidemark_steady([{"ts": 10.0 + 2.0 * i, "rows_in": 50_000} for i in range(4)], 200_000)
    fl = sustained.flink_steady([(10.0 + 0.2 * i, 50_000 + 5_000 * i) for i in range(31)], 200_000, 200_000,
                                50_000, end_s=16.0)
    assert tm is not None and fl is not None
    assert tm.rows_per_s == pytest.approx(25_000) and fl.rows_per_s == pytest.approx(25_000)


def test_source_rows_sums_the_source_vertices_only() -> None:
    vertices = [
        {"name": "Source: s1[1] -> Calc[2]", "metrics": {"write-records": 1_000}},
        {"name": "Source: s2[3]", "metrics": {"write-records": 20}},
        {"name": "Join -> SinkMaterializer -> Sink: Writer", "metrics": {"write-records": 5_000}},
        {"name": "Source: s3[4]", "metrics": {}},
    ]
    assert source_rows(vertices) == 1_020


def _sawtooth(rate: float, batch_s: float, seconds: float, drain: float) -> list[tuple[float, int]]:
    """Backlog samples every 250 ms of a micro-batch job fed ``rate`` rows/s that commits every
    ``batch_s`` and drains ``drain`` rows/s while it runs."""
    out, backlog, t = [], 0.0, 0.0
    while t <= seconds:
        out.append((t, int(backlog)))
        backlog += rate * 0.25
        if int(t / batch_s) != int((t + 0.25) / batch_s):  # a commit
            backlog = max(0.0, backlog - drain * batch_s)
        t += 0.25
    return out


def test_a_job_that_commits_its_batches_in_time_kept_up_despite_its_sawtooth() -> None:
    v = sustained.keep_up(_sawtooth(10_000, 2.0, 30.0, drain=12_000), 10_000, 9_990)
    assert v.kept_up and v.rate_reached
    assert v.text().startswith("kept up")


def test_a_job_slower_than_its_input_fell_behind_and_says_by_how_much() -> None:
    v = sustained.keep_up(_sawtooth(10_000, 2.0, 30.0, drain=6_000), 10_000, 10_000)
    assert not v.kept_up
    assert v.backlog_end > v.backlog_start + v.allowed_growth
    assert v.text() == f"fell behind (backlog grew from {v.backlog_start:,.0f} to {v.backlog_end:,.0f} rows)"


def test_the_verdict_says_when_the_producer_missed_the_asked_rate() -> None:
    v = sustained.keep_up([(0.0, 0), (1.0, 10), (2.0, 0), (3.0, 10)], 10_000, 7_000)
    assert v.kept_up and not v.rate_reached
    with pytest.raises(ValueError, match="at least 3 backlog samples"):
        sustained.keep_up([(0.0, 0), (1.0, 0)], 10_000, 10_000)


class _SteadyFlink:
    """Stands in for FlinkSession: a finished job whose sources were sampled."""

    startup_s = 3.0
    flink_version = "2.3.0"

    def __init__(self, rows: list[list[Any]]) -> None:
        self.rows = rows
        self.jobs: list[dict[str, Any]] = []

    def run(self, job: dict[str, Any]) -> dict[str, Any]:
        self.jobs.append(job)
        return {"id": job["id"], "ok": True, "throughput_rows_s": 100.0, "seconds": 2.0, "rows": self.rows,
                "source_timeline": [(10.0, 0), (10.5, 500), (11.0, 1_000)], "source_rows_total": 1_000,
                "end_of_input_s": 12.0, "peak_rss_bytes": 2**30, "state_bytes": 1}


def test_run_flink_reports_the_steady_clock_when_given_a_warmup(tmp_path: Path) -> None:
    wl = workloads.generate("W3", 0.01, 1, tmp_path / "in")
    fs = _SteadyFlink([list(r) for r in wl.expected.values()])
    res = suite.run_flink(wl, "ADAPTIVE", tmp_path / "f", fs, warmup_rows=wl.input_rows // 2)
    assert fs.jobs[-1]["sample_sources"] is True
    # half the input was emitted at t = 10.5, the sink held the last output at t = 12.0
    assert res["rows_per_s"] == pytest.approx((wl.input_rows - round(wl.input_rows / 2)) / 1.5)
    assert res["rows_per_s_run"] == 100.0 and "source_timeline" not in res
    # without a warm-up: the whole-run clock, no sampling asked
    res = suite.run_flink(wl, "ADAPTIVE", tmp_path / "f2", fs)
    assert fs.jobs[-1]["sample_sources"] is False and res["rows_per_s"] == 100.0 and res["steady"] is None


def test_a_job_that_fell_behind_is_rendered_without_a_latency() -> None:
    lat = {"rate_rows": 300_000, "asked_rate": 10_000.0, "achieved_rate": 9_800.0, "p50_s": None, "p99_s": None,
           "max_s": None, "verdict": "fell behind (backlog grew from 12,000 to 95,000 rows)",
           "drained_after_s": 41.5, "backlog": 0}
    text = suite.latency_text(lat)
    assert text.startswith("fell behind (backlog grew from 12,000 to 95,000 rows)")
    assert "p50" not in text and "p99" not in text and "9,800 of 10,000 rows/s" in text
    kept = {**lat, "p50_s": 0.8, "p99_s": 1.9, "max_s": 2.2, "verdict": "kept up (backlog 5 rows ...)"}
    assert suite.latency_text(kept).startswith("p50 0.80 s, p99 1.90 s (max 2.20 s), kept up")


def test_sustained_sizes_have_at_least_200000_records(tmp_path: Path) -> None:
    scales = {k: float(v) for k, v in (x.split("=") for x in suite.FULL["scales"].split(","))}
    for name in ("W1", "W2-DEDUPLICATE", "W3", "W4"):
        wl = workloads.generate(name, scales.get(name, suite.FULL["scale"]), 1, tmp_path / name)
        assert wl.input_rows >= 200_000, name
        assert sustained.records_per_trigger(wl.input_rows, suite.FULL["batches"]) * 4 < wl.input_rows  # >= 5 batches


def test_the_docs_section_states_the_steady_rule_and_a_fell_behind_verdict() -> None:
    lat = {"rate_rows": 300_000, "asked_rate": 10_000.0, "achieved_rate": 9_990.0, "p50_s": None, "p99_s": None,
           "max_s": None, "verdict": "fell behind (backlog grew from 12,000 to 95,000 rows)",
           "drained_after_s": 41.5, "backlog": 0, "warmup_s": 10.0}
    results = {"command": "suite.py", "scale": 4.0, "scales": {"W3": 2.1}, "batches": 5, "repeats": 1, "seed": 1,
               "started_at": "t0", "finished_at": "t1", "elapsed_s": 60.0, "load_start": [9.0], "load_end": [9.5],
               "machine": {"cpus": 2, "cpu_model": "x", "mem_bytes": 2**30, "python": "3.11", "java": "17",
                           "pyspark": "4"}, "workloads": {}, "targets": [], "latency": lat}
    text = suite.render(results)
    assert "scale 4, W3 2.1, 1 repeat(s)" in text
    assert "at most input / 5 records per micro-batch" in text and suite.STEADY_TEXT in text
    latency = text[text.index("### Tidemark end-to-end latency"):text.index("### Targets")]
    assert "**fell behind (backlog grew from 12,000 to 95,000 rows)" in latency and "p99" not in latency
    assert "Flink's latency on this shape is not measured" in latency
    one_batch = suite.render({**results, "batches": 1})
    assert suite.STEADY_TEXT not in one_batch and "no per-batch cap" in one_batch


def test_only_can_keep_one_tidemark_variant_of_a_workload(tmp_path: Path) -> None:
    args = argparse.Namespace(scale=0.01, scale_of={}, seed=1, variants={"W4": ["regular"]})
    wl = suite.generate("W4", args, tmp_path)
    assert list(wl.tidemark_variants) == ["regular"]
    assert [p for p in suite.ratio_pairs(wl) if "delta" in p[0] or "delta" in p[1]] == []
    assert list(suite.generate("W1", args, tmp_path).tidemark_variants) == ["default"]  # not named: all kept
    with pytest.raises(SystemExit, match=r"W4 has no Tidemark variant \['fast'\]; it has \['delta', 'regular'\]"):
        suite.generate("W4", argparse.Namespace(scale=0.01, scale_of={}, seed=1, variants={"W4": ["fast"]}), tmp_path)
