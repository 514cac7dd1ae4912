"""OVER aggregation against Flink 2.3 on random append-only workloads with disorder
(``generate.over_workload``: ROWS and RANGE frames, bounded and UNBOUNDED PRECEDING, with a
computed column and a filter in front).

The oracle's watermark never passes an event before the end of input (see
``flink_oracle.py``), so Flink emits every row at the end; the replay host emits rows as its
watermark passes them, batch by batch, then the rest at ``finish()``. Disorder stays within
the delay, so no record is late and the final tables (multisets: the sink has no key) must
be equal; late records are covered by ``tests/unit/test_over.py``.

``make test`` runs a few seeds; ``make conformance`` (``TIDEMARK_CONFORMANCE=full``) more.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generate  # noqa: E402  (sibling module, not a package)
from replay_support import oracle_results, replay_to_the_end  # noqa: E402
import harness  # noqa: E402  (tests/nexmark, on the path once replay_support is imported)
from test_window_conformance import SEEDS  # noqa: E402  (the same seeds of bids)

pytestmark = pytest.mark.conformance

WORKLOADS = [generate.over_workload(s, f) for s in SEEDS for f in sorted(generate.OVER_FRAMES)]


@pytest.fixture(scope="session")
def flink() -> dict[str, dict]:
    return oracle_results(WORKLOADS)


@pytest.mark.parametrize("w", WORKLOADS, ids=[w.name for w in WORKLOADS])
def test_over_aggregate_matches_flink(w: generate.Workload, flink: dict[str, dict]) -> None:
    report = flink[w.name]
    assert report["ok"], f"Flink failed on {w.name}: {report['error']}"
    assert replay_to_the_end(w).rows == harness.canon(report["final"]), f"{w.name}: final tables differ"


def test_the_workloads_hold_ties_and_release_rows_before_the_end() -> None:
    """Equal event times within an item (where ROWS and RANGE differ) occur, and most
    workloads emit rows as the watermark passes them, not only at the end."""
    tied = 0
    for w in WORKLOADS:
        rows = [(r["row"]["item"], r["row"]["ts"]) for batch in w.inputs["bids"] for r in batch]
        tied += len(rows) != len(set(rows))
    assert tied >= len(WORKLOADS) // 4
    early = [w.name for w in WORKLOADS if sum(replay_to_the_end(w).emitted) > 0]
    assert len(early) >= len(WORKLOADS) // 2, early
