"""Deduplication and Top-N by processing time (``ROW_NUMBER() OVER (PARTITION BY auction ORDER
BY p)`` with ``p AS PROCTIME()``) against Flink 2.3: the sink table equals Flink's after every
batch. The oracle releases each batch's records in source-position order, so its arrival
order is Tidemark's; Flink's processing-time Deduplicate and Top-N then give one answer.

Inputs: random append-only bids (keep the first row, keep the last row, the first three with
their row number) and random changelogs of bids keyed by ``id`` (Debezium with before-images,
upsert without), where Flink 2.3 ranks every active row by arrival too; both are shuffled
inside each batch here, which must not matter (arrival is the source position). Keeping the
last row over a changelog is refused: Flink 2.3 keeps the first arrival there, and the last
test shows it.

``make test`` runs a few seeds; ``make conformance`` (``TIDEMARK_CONFORMANCE=full``) more.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tidemark.engine.errors import SqlError
from tidemark.engine.pipeline import compile_sql
from tidemark.engine.replay import ReplayHost

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generate  # noqa: E402  (sibling module, not a package)
from proctime_workloads import QUERIES, append_workload, changelog_workload  # noqa: E402
from replay_support import oracle_results, shuffled_inputs  # noqa: E402
import harness  # noqa: E402  (tests/nexmark, on the path once replay_support is imported)

pytestmark = pytest.mark.conformance

FULL = os.environ.get("TIDEMARK_CONFORMANCE", "").lower() == "full"
SEEDS = range(1, 31) if FULL else range(1, 4)
FORMATS = ("debezium-json", "upsert-json")
APPEND = [append_workload(s, shape) for s in SEEDS for shape in QUERIES]
CHANGELOG = [changelog_workload(s, "keep_first", fmt) for s in SEEDS for fmt in FORMATS]
#: what Tidemark refuses: Flink's keep-last over a changelog (the same inputs as CHANGELOG's)
LAST_ON_CHANGELOG = {(s, fmt): changelog_workload(s, "keep_last", fmt) for s in SEEDS for fmt in FORMATS}


@pytest.fixture(scope="module")
def flink() -> dict[str, dict]:
    return oracle_results(APPEND + CHANGELOG + list(LAST_ON_CHANGELOG.values()))


def steps_of(w: generate.Workload) -> list[list]:
    """The sink table after every batch, replayed with each batch's records shuffled."""
    pipeline = compile_sql(w.sql)
    host = ReplayHost(pipeline)
    steps = []
    for b in range(w.n_batches()):
        host.run_batch(shuffled_inputs(pipeline, w, b), now_ms=b)
        steps.append(harness.canon(host.table().values()))
    return steps


@pytest.mark.parametrize("w", APPEND + CHANGELOG, ids=lambda w: w.name)
def test_the_sink_equals_flinks_after_every_batch(w: generate.Workload, flink: dict[str, dict]) -> None:
    theirs = flink[w.name]
    assert theirs["ok"], f"Flink failed {w.name}: {theirs['error']}"
    flink_steps = [harness.canon(t) for t in theirs["steps"]]
    assert len(flink_steps) == w.n_batches()
    ours = steps_of(w)
    for b, (mine, flinks) in enumerate(zip(ours, flink_steps), start=1):
        assert mine == flinks, f"{w.name}: the sink differs after batch {b}"
    assert ours[-1] == harness.canon(theirs["final"])


def test_the_workloads_rank_more_than_one_row_per_partition() -> None:
    """Keeping the first and the last row must differ somewhere, or the suite proves nothing."""
    firsts = {w.seed: steps_of(w)[-1] for w in APPEND if w.shape == "keep_first"}
    lasts = {w.seed: steps_of(w)[-1] for w in APPEND if w.shape == "keep_last"}
    assert all(firsts[s] != lasts[s] for s in firsts)


@pytest.mark.parametrize("seed, fmt", LAST_ON_CHANGELOG, ids=[w.name for w in LAST_ON_CHANGELOG.values()])
def test_over_a_changelog_flinks_keep_last_keeps_the_first_arrival_so_it_is_refused(
    seed: int, fmt: str, flink: dict[str, dict]
) -> None:
    """Flink 2.3 plans no Deduplicate over a changelog but a Top-N, whose processing-time
    order keeps the first active arrival even for DESC: its table after every batch is the
    keep-first one of the same input. Tidemark refuses the query rather than answer that."""
    w = LAST_ON_CHANGELOG[seed, fmt]
    theirs = flink[w.name]
    assert theirs["ok"], f"Flink failed {w.name}: {theirs['error']}"
    assert [harness.canon(t) for t in theirs["steps"]] == steps_of(changelog_workload(seed, "keep_first", fmt))
    with pytest.raises(SqlError, match=r"descending processing time is supported only as a deduplication .* insert-only input"):
        compile_sql(w.sql)
