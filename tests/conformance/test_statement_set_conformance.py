"""Statement sets against Flink 2.3's ``StatementSet`` (one Flink job with three sinks, the
oracle's lockstep waiting for every sink): each sink's table equals Flink's after every
batch and at the end, on CDC workloads with retractions and disorder inside batches
(``generate.statement_set_workload``).

``make test`` runs a few seeds; ``make conformance`` (``TIDEMARK_CONFORMANCE=full``) more.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tidemark.engine.pipeline import compile_sql
from tidemark.engine.replay import ReplayHost

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generate  # noqa: E402  (sibling module, not a package)
from replay_support import oracle_results, shuffled_inputs  # noqa: E402
import harness  # noqa: E402  (tests/nexmark, on the path once replay_support is imported)

pytestmark = pytest.mark.conformance

FULL = os.environ.get("TIDEMARK_CONFORMANCE", "").lower() == "full"
SEEDS = range(1, 31) if FULL else range(1, 4)
WORKLOADS = [generate.statement_set_workload(s, strategy) for s in SEEDS for strategy in ("DEDUPLICATE", "NOTHING")]


def run_tidemark(w: generate.Workload) -> dict[str, list[list]]:
    """Each sink's table after every batch, replayed with each batch's records shuffled."""
    pipeline = compile_sql(w.sql)
    host = ReplayHost(pipeline)
    steps: dict[str, list[list]] = {name: [] for name in generate.STATEMENT_SET_SINKS}
    for b in range(w.n_batches()):
        host.run_batch(shuffled_inputs(pipeline, w, b), now_ms=b)
        for name in steps:
            steps[name].append(harness.canon(host.table(name).values()))
    return steps


@pytest.fixture(scope="module")
def flink() -> dict[str, dict]:
    return oracle_results(WORKLOADS)


def test_the_set_plans_one_join_for_two_sinks():
    pipeline = compile_sql(WORKLOADS[0].sql)
    assert [t.table.name for t in pipeline.sinks] == list(generate.STATEMENT_SET_SINKS)
    assert len([n for n in pipeline.nodes if n.kind == "join"]) == 1
    assert len([n for n in pipeline.nodes if n.kind == "source"]) == 2


@pytest.mark.parametrize("w", WORKLOADS, ids=lambda w: w.name)
def test_every_sink_equals_flink_after_every_batch(w: generate.Workload, flink: dict[str, dict]) -> None:
    theirs = flink[w.name]
    assert theirs["ok"], f"Flink failed {w.name}: {theirs['error']}"
    ours = run_tidemark(w)
    for name in generate.STATEMENT_SET_SINKS:
        flink_steps = [harness.canon(t) for t in theirs["sinks"][name]["steps"]]
        assert len(flink_steps) == w.n_batches(), name
        for b, (mine, flinks) in enumerate(zip(ours[name], flink_steps), start=1):
            assert mine == flinks, f"{w.name}: sink {name} differs after batch {b}"
        assert ours[name][-1] == harness.canon(theirs["sinks"][name]["final"]), name
    assert any(any(ours[name]) for name in generate.STATEMENT_SET_SINKS), "every sink always empty: proves nothing"
