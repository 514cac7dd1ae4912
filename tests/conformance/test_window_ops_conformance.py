"""Window Top-N and window join against Flink 2.3 on random append-only workloads with
disorder (``generate.window_op_workload``: Top-N over TUMBLE, HOP and CUMULATE, with and
without the row number, over a window aggregate, window deduplication; inner, left, right
and full window joins with and without a residual condition).

As for the window aggregates (``test_window_conformance.py``), the oracle fires every window
at the end of input and the replay host as its watermark passes; no record is late, so the
final tables must be equal. Flink is asked whether it plans the same operators too: its
``EXPLAIN`` (``flink_explain.py``) must name as many ``WindowRank`` / ``WindowDeduplicate``,
``WindowJoin`` and window aggregates as Tidemark plans window Top-Ns, window joins and window
aggregates (``test_flink_plans_the_same_window_operators``). Over a changelog both refuse
a window Top-N and a window join (``test_over_a_changelog_both_refuse_...``).

``make test`` runs a few seeds; ``make conformance`` (``TIDEMARK_CONFORMANCE=full``) more.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tidemark.engine.changelog import Change
from tidemark.engine.errors import SqlError
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
#: shapes over window aggregates: Flink plans a window Top-N or window join there, Tidemark
#: the regular rank or join (``tidemark.engine.planner.window_ops`` says why); same final table
OVER_AGGREGATES = {"topn_of_window_aggregate", "join_of_window_aggregates", "join_of_cascaded_aggregate"}


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
        if w.shape not in OVER_AGGREGATES:
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


CHANGELOG_WORKLOADS = [generate.window_op_changelog_workload(s) for s in ("topn_tumble", "dedup_last", "join_left")]


@pytest.fixture(scope="session")
def flink_on_changelogs() -> dict[str, dict]:
    try:
        return harness.flink_results([w.spec_case() for w in CHANGELOG_WORKLOADS])
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)


@pytest.mark.parametrize("w", CHANGELOG_WORKLOADS, ids=[w.shape for w in CHANGELOG_WORKLOADS])
def test_over_a_changelog_both_refuse_window_top_n_and_window_join(
    w: generate.Workload, flink_on_changelogs: dict[str, dict]
) -> None:
    report = flink_on_changelogs[w.name]
    assert not report["ok"] and "doesn't support consuming update and delete changes" in report["error"], report
    with pytest.raises(SqlError, match=r"needs insert-only inputs, and 'normalize:bids' is a retract changelog"):
        compile_sql(w.sql)


#: Flink's physical operators -> the Tidemark node kinds that plan the same work
_FLINK_OPERATORS = {"WindowRank": "window_rank", "WindowDeduplicate": "window_rank", "WindowJoin": "window_join",
                    "GlobalWindowAggregate": "window_aggregate", "WindowAggregate": "window_aggregate"}
_PLANS = [generate.window_op_workload(1, shape) for shape in sorted(generate.WINDOW_OP_QUERIES)]


@pytest.fixture(scope="session")
def flink_plans() -> dict[str, str]:
    """Flink's EXPLAIN per workload of seed 1 (the SQL is the same for every seed), cached
    beside the oracle's results under the hash of the SQL."""
    cache = harness.CACHE / f"explain-{hashlib.sha256(json.dumps([w.sql for w in _PLANS]).encode()).hexdigest()[:20]}.json"
    if cache.exists():
        return json.loads(cache.read_text(encoding="utf-8"))
    if not harness.FLINK_PYTHON.exists():
        pytest.fail(f"Flink 2.3's python is missing ({harness.FLINK_PYTHON}); run `make install-flink`", pytrace=False)
    spec = json.dumps({"cases": [{"id": w.name, "sql": w.sql} for w in _PLANS]})
    proc = subprocess.run([str(harness.FLINK_PYTHON), str(HERE / "flink_explain.py")], input=spec,
                          capture_output=True, text=True, timeout=900, cwd=HERE)
    assert proc.returncode == 0, proc.stderr[-4000:]
    plans = json.loads(proc.stdout)["plans"]
    cache.parent.mkdir(exist_ok=True)
    cache.write_text(json.dumps(plans), encoding="utf-8")
    return plans


@pytest.mark.parametrize("w", _PLANS, ids=[w.shape for w in _PLANS])
def test_flink_plans_the_same_window_operators(w: generate.Workload, flink_plans: dict[str, str]) -> None:
    text = flink_plans[w.name]
    assert not text.startswith("error"), text
    physical = text.split("== Optimized Physical Plan ==")[1].split("== Optimized Execution Plan ==")[0]
    theirs = Counter(_FLINK_OPERATORS[op] for op in re.findall(r"(\w+)\(", physical) if op in _FLINK_OPERATORS)
    ours = Counter(n.kind for n in compile_sql(w.sql).nodes if n.kind in _FLINK_OPERATORS.values())
    if w.shape in OVER_AGGREGATES:  # Flink's window Top-N or window join is the regular one here
        assert theirs["window_rank"] + theirs["window_join"] == 1, dict(theirs)
        assert ours["window_rank"] + ours["window_join"] == 0, dict(ours)
        return
    assert ours == theirs, f"{w.shape}: Tidemark plans {dict(ours)}, Flink {dict(theirs)}"
