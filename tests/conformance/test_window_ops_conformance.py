"""Window Top-N and window join against Flink 2.3 on random append-only workloads with
disorder (``generate.window_op_workload``: Top-N over TUMBLE, HOP and CUMULATE, with and
without the row number, over a window aggregate, window deduplication; inner, left, right
and full window joins with and without a residual condition).

As for the window aggregates (``test_window_conformance.py``), the oracle fires every window
at the end of input and the replay host as its watermark passes; no record is late, so the
final tables must be equal. Flink is asked whether it plans the same operator too: its
``EXPLAIN`` must name ``WindowRank`` / ``WindowDeduplicate`` / ``WindowJoin`` where Tidemark
plans a window operator (``test_flink_plans_the_same_window_operators``).

``make test`` runs a few seeds; ``make conformance`` (``TIDEMARK_CONFORMANCE=full``) more.
"""

from __future__ import annotations

import os
import random
import sys
from collections import Counter
from pathlib import Path

import pytest

from tidemark.engine.changelog import Change
from tidemark.engine.pipeline import compile_sql
from tidemark.engine.records import parse_row
from tidemark.engine.replay import ReplayHost

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "nexmark"))
import generate  # noqa: E402  (sibling module, not a package)
import harness  # noqa: E402  (the oracle runner and row canon the Nexmark suite uses)

pytestmark = pytest.mark.conformance

FULL = os.environ.get("TIDEMARK_CONFORMANCE", "").lower() == "full"
SEEDS = range(1, 31) if FULL else range(1, 4)
WORKLOADS = [generate.window_op_workload(s, shape) for s in SEEDS for shape in sorted(generate.WINDOW_OP_QUERIES)]


def run_tidemark(w: generate.Workload) -> tuple[list[list], list[int], int]:
    """The sink's rows at the end (a multiset: the sink has no key), how many rows each batch
    emitted, and how many rows the window stages hold after the end."""
    pipeline = compile_sql(w.sql)
    host = ReplayHost(pipeline)
    rows: Counter = Counter()
    emitted = []
    for b in range(w.n_batches()):
        batch = {}
        for table, batches in w.inputs.items():
            tdef = pipeline.sources[table]
            batch[table] = [Change(r["kind"], parse_row(tdef, r["kind"], r["row"]), (r["seq"],)) for r in batches[b]]
            random.Random(f"shuffle-{w.name}-{table}-{b}").shuffle(batch[table])
        out = host.run_batch(batch, now_ms=b)
        assert {c.kind for c in out} <= {"+I"}, "window operators emit inserts only"
        emitted.append(len(out))
        rows.update(c.row for c in out)
    rows.update(c.row for c in host.finish(now_ms=w.n_batches()))
    assert host.metrics["late_records_dropped"] == 0
    kept = sum(0 if s is None else s.height for i, s in host.state.items() if pipeline.nodes[i].kind.startswith("window_"))
    return harness.canon([r for r, n in rows.items() for _ in range(n)]), emitted, kept


@pytest.fixture(scope="session")
def flink() -> dict[str, dict]:
    try:
        return harness.flink_results([w.spec_case() for w in WORKLOADS])
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)


@pytest.mark.parametrize("w", WORKLOADS, ids=[w.name for w in WORKLOADS])
def test_window_operator_matches_flink(w: generate.Workload, flink: dict[str, dict]) -> None:
    report = flink[w.name]
    assert report["ok"], f"Flink failed on {w.name}: {report['error']}"
    ours, _, kept = run_tidemark(w)
    assert ours == harness.canon(report["final"]), f"{w.name}: final tables differ"
    assert kept == 0, "every window has fired at the end of input: no state is left"


def test_windows_fire_before_the_end_when_the_watermark_passes_them() -> None:
    """The suite is not only an end-of-input check: most workloads release rows early."""
    early = [w.name for w in WORKLOADS if sum(run_tidemark(w)[1]) > 0]
    assert len(early) >= len(WORKLOADS) // 2, early
