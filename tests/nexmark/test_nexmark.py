"""Nexmark against Flink 2.3: every query plans (``tidemark explain``), runs (``tidemark
replay``'s host) and gives Flink's table on the same generated events.

Each query runs twice on Tidemark: as adapted (``test_query``) and in the dialect its
planner reads (``test_query_today_dialect``: backticks written plain, no WATERMARK).
Flink runs the adapted text once per query; both are compared with it, after every batch
(the oracle's batches are Tidemark's micro-batches) and on the final table; queries whose
results the watermark releases (``WATERMARK_DRIVEN``) on the final table only.

``expected_status.py`` is the progress board: a query recorded "not planned: <message>" is
``xfail(strict=True, raises=SqlError)`` and must fail planning with a message starting with
that text, so a query that starts to plan, or stops somewhere else, fails until the board
is updated.

``make test`` runs a fast slice (few events; Flink only for the queries that plan, in one
oracle subprocess, results cached in ``tests/nexmark/.flink-cache``); ``make conformance``
sets ``TIDEMARK_CONFORMANCE=full``: more events and batches.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tidemark.engine.errors import SqlError
from tidemark.engine.pipeline import compile_sql

sys.path.insert(0, str(Path(__file__).resolve().parent))
import expected_status  # noqa: E402  (sibling modules, not a package)
import harness  # noqa: E402

pytestmark = pytest.mark.conformance

DATA = harness.data(harness.FULL)


def _board(status: dict[str, str]) -> list:
    params = []
    for q in harness.QUERY_NAMES:
        marks = []
        if status[q] != "equal":
            marks.append(pytest.mark.xfail(strict=True, raises=SqlError, reason=status[q]))
        params.append(pytest.param(q, marks=marks, id=q))
    return params


def _compare(request: pytest.FixtureRequest, query: str, sql: str, expected: str) -> None:
    try:
        compile_sql(sql)
    except SqlError as e:
        prefix = expected.removeprefix("not planned: ")
        assert expected != "equal" and str(e).startswith(prefix), (
            f"{query} does not plan: {e}; expected_status.py says {expected!r}")
        raise
    if query in expected_status.NO_ORACLE:
        if query not in expected_status.COMPARED_INSTEAD:
            pytest.fail(f"{query} plans, but Flink gives no reference: {expected_status.NO_ORACLE[query]}")
        table, why = expected_status.COMPARED_INSTEAD[query]
        assert harness.run_tidemark(sql, DATA) == [table] * DATA.n_batches, f"{query}: {why}"
        return
    report = request.getfixturevalue("flink")[query]
    assert report["ok"], f"Flink failed on {query}: {report['error']}"
    ours = harness.run_tidemark(sql, DATA)
    flink_final = harness.canon(report["final"])
    assert ours[-1] == flink_final, f"{query}: final tables differ"
    if query not in expected_status.WATERMARK_DRIVEN:
        flink_steps = [harness.canon(s) for s in report["steps"]]
        assert len(flink_steps) == DATA.n_batches, f"Flink reported {len(flink_steps)} batches"
        for b, (mine, theirs) in enumerate(zip(ours, flink_steps), start=1):
            assert mine == theirs, f"{query}: tables differ after batch {b}"


@pytest.mark.parametrize("query", _board(expected_status.STATUS))
def test_query(request: pytest.FixtureRequest, query: str) -> None:
    _compare(request, query, harness.query_sql(query), expected_status.STATUS[query])


@pytest.mark.parametrize("query", _board(expected_status.TODAY_DIALECT))
def test_query_today_dialect(request: pytest.FixtureRequest, query: str) -> None:
    _compare(request, query, harness.today_dialect(harness.query_sql(query)),
             expected_status.TODAY_DIALECT[query])
