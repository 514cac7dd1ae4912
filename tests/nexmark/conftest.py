"""Flink 2.3's tables for the Nexmark comparisons of every host (replay, Spark): computed
once per test run, in one oracle subprocess, or read from ``.flink-cache``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import expected_status  # noqa: E402  (sibling modules, not a package)
import harness  # noqa: E402

from tidemark.engine.errors import SqlError  # noqa: E402
from tidemark.engine.pipeline import compile_sql  # noqa: E402


def _plans(sql: str) -> bool:
    try:
        compile_sql(sql)
    except SqlError:
        return False
    return True


@pytest.fixture(scope="session")
def flink() -> dict[str, dict]:
    """Flink's report for every query that plans in either form (the others never get as
    far as a comparison) on ``harness.data(harness.FULL)``: one oracle subprocess for the
    test run, or none when all are cached."""
    data = harness.data(harness.FULL)
    needed = [q for q in harness.QUERY_NAMES if q not in expected_status.NO_ORACLE
              and (_plans(harness.query_sql(q)) or _plans(harness.today_dialect(harness.query_sql(q))))]
    cases = [harness.oracle_case(q, harness.query_sql(q), data) for q in needed]
    try:
        return harness.flink_results(cases)
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)
