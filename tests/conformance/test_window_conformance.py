"""Window aggregation against Flink 2.3 on random append-only workloads with disorder
(``generate.window_workload``: TUMBLE, HOP, CUMULATE and SESSION, a computed column, a
filter).

The oracle's watermark never passes an event before the end of input (its batches end
with watermark ``i``, see ``flink_oracle.py``), so Flink fires every window at the end; the
replay host fires them as its watermark passes, batch by batch, then the rest at
``finish()``. Disorder stays within the delay, so no record is late and the final tables must
be equal; late records are covered by ``tests/unit/test_window.py``.

``make test`` runs a few seeds; ``make conformance`` (``TIDEMARK_CONFORMANCE=full``) more.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generate  # noqa: E402  (sibling module, not a package)
from replay_support import oracle_results, replay_to_the_end  # noqa: E402
import harness  # noqa: E402  (tests/nexmark, on the path once replay_support is imported)

pytestmark = pytest.mark.conformance

FULL = os.environ.get("TIDEMARK_CONFORMANCE", "").lower() == "full"
SEEDS = range(1, 41) if FULL else range(1, 7)
WORKLOADS = [generate.window_workload(s, w) for s in SEEDS for w in sorted(generate.WINDOW_QUERIES)]


@pytest.fixture(scope="session")
def flink() -> dict[str, dict]:
    return oracle_results(WORKLOADS)


@pytest.mark.parametrize("w", WORKLOADS, ids=[w.name for w in WORKLOADS])
def test_window_aggregate_matches_flink(w: generate.Workload, flink: dict[str, dict]) -> None:
    report = flink[w.name]
    assert report["ok"], f"Flink failed on {w.name}: {report['error']}"
    assert replay_to_the_end(w).rows == harness.canon(report["final"]), f"{w.name}: final tables differ"


def test_windows_fire_before_the_end_when_the_watermark_passes_them() -> None:
    """The suite is not only an end-of-input check: most workloads release windows early."""
    early = [w.name for w in WORKLOADS if sum(replay_to_the_end(w).emitted) > 0]
    assert len(early) >= len(WORKLOADS) // 2, early
