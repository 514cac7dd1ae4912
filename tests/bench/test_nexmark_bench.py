"""The Nexmark queries as suite workloads (``nexmark_bench.py``), without a JVM: which queries
are workloads, the Flink text each system gets, and which tables the suite compares."""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

import nexmark_bench
import pytest
import suite
from compare import compare_tables

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "nexmark"))
import expected_status  # noqa: E402  (tests/nexmark module, not a package)


def test_the_workloads_are_the_queries_that_equal_flink_on_spark() -> None:
    equal = {q for q, status in expected_status.SPARK_STATUS.items() if status == "equal"}
    assert set(nexmark_bench.NAMES) == {f"NX-{q}" for q in equal - nexmark_bench.NOT_COMPARABLE}
    assert "NX-q4" in nexmark_bench.NAMES and "NX-q6" not in nexmark_bench.NAMES
    with pytest.raises(ValueError, match="no Nexmark workload 'NX-q6'"):
        nexmark_bench.generate("NX-q6", 0.02, 1, Path("unused"))


def test_flink_reads_the_same_events_from_files_and_writes_the_measuring_sink(tmp_path: Path) -> None:
    wl = nexmark_bench.generate("NX-q4", 0.04, 1, tmp_path)
    assert wl.params == {"query": "q4", "events": 2_000}
    assert set(wl.tables) == {"auction", "bid"}  # what q4 reads: produced, counted
    lines = {t: p.read_text(encoding="utf-8").count("\n") for t, p in wl.declared.items()}
    assert lines["person"] + lines["auction"] + lines["bid"] == 2_000
    assert wl.input_rows == lines["auction"] + lines["bid"]
    assert (wl.sink, wl.sink_pk) == ("nexmark_q4", ["id"])
    sql = wl.flink_sql(sink_options={"connector": "tidemark-bench", "dir": "/out"})
    for table in ("person", "auction", "bid"):
        assert f"'path' = '{tmp_path / table}.json'" in sql
    assert "'kafka'" not in sql and "'connector' = 'tidemark-bench', 'dir' = '/out')" in sql
    assert "WATERMARK FOR `dateTime`" in sql and sql.rstrip().endswith("GROUP BY Q.category;")


def test_a_keyed_sinks_table_is_compared_with_flinks_a_keyless_ones_is_not(tmp_path: Path) -> None:
    keyed = nexmark_bench.generate("NX-q4", 0.02, 1, tmp_path / "q4")
    keyless = nexmark_bench.generate("NX-q22", 0.02, 1, tmp_path / "q22")
    assert not keyless.sink_pk  # Flink's measuring sink then counts: it keeps a table by the key
    assert "'dir' = '/out', 'materialize' = 'false')" in keyless.flink_sql(
        sink_options={"connector": "tidemark-bench", "dir": "/out"})
    results: dict = {"differences": []}
    for wl in (keyed, keyless):
        runs: list = []
        tables: dict = {}
        for system, row in (("flink", (10, 5)), ("tidemark", (10, 6))):
            res = {"table": {(10,): row} if system == "tidemark" else [list(row)], "peak_rss_bytes": 1,
                   "rows_per_s": 1.0, "state_bytes": 1, "wall_s": 1.0}
            suite.record_run(wl, system, "default", 0, res, runs, tables, results)
        assert [r["equal_to_expected"] for r in runs] == [None, None]  # no table from the generator
        suite.check_against_flink(wl, 0, tables, results)
    assert [(d["workload"], d["a"], d["b"]) for d in results["differences"]] == [
        ("NX-q4", "flink:default", "tidemark:default")]


@pytest.mark.parametrize("name", nexmark_bench.NAMES)
def test_flinks_text_splits_into_its_statements_as_the_runner_splits_it(tmp_path: Path, name: str) -> None:
    wl = nexmark_bench.generate(name, 0.02, 1, tmp_path)
    statements = [s.strip() for s in wl.flink_sql().split(";\n") if s.strip()]  # flink_runner's split
    assert all(s.startswith(("CREATE ", "INSERT ")) for s in statements), name
    assert sum(s.startswith("INSERT ") for s in statements) == 1


def test_flinks_timestamps_equal_tidemarks_at_the_same_instant() -> None:
    flink = [[1000, {"millisecond": 1436918400100, "nanoOfMillisecond": 0}]]
    same = {(1000,): (1000, dt.datetime(2015, 7, 15, 0, 0, 0, 100000))}
    later = {(1000,): (1000, dt.datetime(2015, 7, 15, 0, 0, 0, 101000))}
    assert list(compare_tables(flink, same, [0])) == []
    assert len(list(compare_tables(flink, later, [0]))) == 1
