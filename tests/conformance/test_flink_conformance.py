"""Tidemark's sink materializer against Flink 2.3's ``ON CONFLICT``, on random changelogs.

For every generated workload (``generate.py``) the same SQL and the same input run through
Tidemark in-process (``compile_sql`` + ``ReplayHost``, one micro-batch per input batch, each
batch's records shuffled) and through Flink 2.3 (``flink_oracle.py``, one subprocess for the
whole session). The sink table must be equal after every batch:

- ``DO DEDUPLICATE``: Flink's ``SinkUpsertMaterializer`` applies every record at once, so its
  table after a batch is compared as is;
- ``DO NOTHING`` / ``DO ERROR``: Flink's ``WatermarkCompactingSinkMaterializer`` compacts on
  watermarks; the oracle ends every batch with one watermark (and nothing else advances it),
  so Flink's watermark steps are exactly our batches and the tables are compared step by step.
  With ``DO ERROR`` both must fail, at the same batch, or neither.

Where Flink's own result is demonstrably wrong, the workload is excluded by the name of the
Flink defect (``FLINK_DEFECTS``; see ``docs/conformance.md``), which is only claimed when an
independent check proves Flink wrong on that very workload; the comparison itself is never
loosened.

``make test`` runs a fast slice (a couple of seeds); ``make conformance`` sets
``TIDEMARK_CONFORMANCE=full`` (``TIDEMARK_CONFORMANCE_SEEDS=N`` overrides the seed count).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest

from tidemark.engine.changelog import Change
from tidemark.engine.errors import ConflictError
from tidemark.engine.pipeline import compile_sql
from tidemark.engine.records import parse_row
from tidemark.engine.replay import ReplayHost

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import generate  # noqa: E402  (sibling module, not a package)
import wcsm_replay  # noqa: E402

pytestmark = pytest.mark.conformance

REPO = HERE.parent.parent
FLINK_PYTHON = Path(os.environ.get("TIDEMARK_FLINK_PYTHON", REPO / ".venv-flink" / "bin" / "python"))
FULL = os.environ.get("TIDEMARK_CONFORMANCE", "").lower() == "full"
FAST_SEEDS = [1, 2]


def parse_seeds(text: str) -> list[int]:
    """``TIDEMARK_CONFORMANCE_SEEDS``: ``N`` means seeds 1..N; a list of seeds and ranges
    (``55,73,100-105``) selects those, e.g. to re-run the failures of a full run."""
    text = text.strip()
    if text.isdigit():
        return list(range(1, int(text) + 1))
    seeds: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"TIDEMARK_CONFORMANCE_SEEDS: {part!r} is not a seed or a range a-b")
        seeds.extend(range(int(lo), int(hi or lo) + 1))
    return seeds


FULL_SEEDS = parse_seeds(os.environ.get("TIDEMARK_CONFORMANCE_SEEDS", "150"))


#: ``TIDEMARK_CONFORMANCE_SHAPES=udf_view,union_distinct``: only those shapes' random workloads
SHAPES = [s for s in os.environ.get("TIDEMARK_CONFORMANCE_SHAPES", "").split(",") if s.strip()]


def _workloads() -> list[generate.Workload]:
    seeds = FULL_SEEDS if FULL else FAST_SEEDS
    unknown = sorted(set(SHAPES) - set(generate.SHAPES))
    if unknown:
        raise ValueError(f"TIDEMARK_CONFORMANCE_SHAPES: unknown shape(s) {unknown}; known: {sorted(generate.SHAPES)}")
    workloads = generate.suite(seeds, with_v2=FULL)
    if SHAPES:
        return [w for w in workloads if w.shape in SHAPES]
    return generate.seed_examples() + workloads


WORKLOADS = _workloads()
REPRODUCTIONS = {w.name: w for w in generate.reproductions()}
#: reproductions of differences where Tidemark is wrong (docs/conformance.md "Open differences");
#: reported as xfail while Tidemark differs; passes once the stage is fixed (then the entry
#: moves to ALIGNED, where a difference fails the test)
OPEN_DIFFERENCES: set[str] = set()
#: former open differences, fixed in the stages: Tidemark must keep giving Flink's table
ALIGNED = {
    "dedup-identical-copies-retract-oldest",
    "dedup-reinserted-same-row-keeps-old-position",
    "dedup-rejoined-same-row-keeps-old-position",
    "dedup-identical-copies-retract-newest",
    "nothing-retracted-dropped-copy-keeps-shown-row",
    "nothing-retracted-shown-copy-equal-copy-active",
    "dedup-upsert-insert-delete-in-batch-no-refresh",
    "distinct-upsert-unread-column-update-dropped",
    "upsert-unchanged-projected-row-rearrives-in-rank",
}


# --------------------------------------------------------------------------------------------
# Running both systems
# --------------------------------------------------------------------------------------------

def _canon(rows: Any) -> list[list]:
    """Rows as sorted JSON-shaped lists, so Python and Flink values compare equal."""
    out = [json.loads(json.dumps(list(r), default=str)) for r in rows]
    return sorted(out, key=lambda r: json.dumps(r, sort_keys=True))


@dataclass
class TidemarkRun:
    steps: list[list[list]] = field(default_factory=list)
    conflict: ConflictError | None = None
    failed_batch: int | None = None  # 1-based batch whose processing raised


def run_tidemark(w: generate.Workload) -> TidemarkRun:
    pipeline = compile_sql(w.sql)
    host = ReplayHost(pipeline)
    run = TidemarkRun()
    for b in range(w.n_batches()):
        rng = random.Random(f"shuffle-{w.name}-{b}")
        inputs: dict[str, list[Change]] = {}
        for table, batches in w.inputs.items():
            if table not in pipeline.sources:
                continue
            tdef = pipeline.sources[table]
            recs = batches[b] if b < len(batches) else []
            changes = [Change(r["kind"], parse_row(tdef, r["kind"], r["row"]), (r["seq"],)) for r in recs]
            rng.shuffle(changes)  # arrival order inside a batch must not matter
            inputs[table] = changes
        try:
            host.run_batch(inputs, now_ms=b)
        except ConflictError as e:
            run.conflict, run.failed_batch = e, b + 1
            return run
        run.steps.append(_canon(host.table().values()))
    return run


@pytest.fixture(scope="session")
def flink() -> dict[str, dict]:
    """Flink's result for every workload: one oracle subprocess (one JVM) for the session."""
    if not FLINK_PYTHON.exists():
        pytest.fail(
            f"Flink 2.3 is the conformance oracle but its venv is missing ({FLINK_PYTHON} not "
            "found). Install it with `make install-flink` (or point TIDEMARK_FLINK_PYTHON at a "
            "python that has apache-flink==2.3.0; Java 17 and javac must be on PATH).",
            pytrace=False,
        )
    cases = [w.spec_case() for w in [*WORKLOADS, *REPRODUCTIONS.values()]]
    spec = {"cases": cases, "slots": 4, "case_timeout_s": 180}
    proc = subprocess.run(
        [str(FLINK_PYTHON), str(HERE / "flink_oracle.py")],
        input=json.dumps(spec), capture_output=True, text=True, timeout=6 * 3600,
        # the udf_view shape's function module (conformance_udfs) is imported from this folder
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))},
    )
    if proc.returncode != 0:
        pytest.fail(f"flink_oracle.py exited {proc.returncode}:\n{proc.stderr[-4000:]}", pytrace=False)
    report = json.loads(proc.stdout)
    assert report["flink_version"] == "2.3.0", report["flink_version"]
    return {r["id"]: r for r in report["results"]}


# --------------------------------------------------------------------------------------------
# Flink defects: named, each with a check that proves Flink wrong on the workload at hand
# --------------------------------------------------------------------------------------------

def query_result_rows(w: generate.Workload, upto_batch: int) -> Counter:
    """The rows the INSERT's query produces over the source tables as they stand after
    ``upto_batch`` batches: the multiset every correct sink row must come from. Computed
    without Tidemark's stages: the source tables are replayed to their current rows and the
    query is evaluated from scratch by ``generate.evaluate``."""
    return generate.evaluate(w, upto_batch)


def _sink_key(w: generate.Workload, row: list) -> list:
    pipeline = compile_sql(w.sql)
    return [row[i] for i in pipeline.sink.pk_indexes]


def _nothing_keeps_stale_value(w: generate.Workload, flink: dict) -> tuple[int, str] | None:
    """Proof by provenance (``wcsm_replay``): Flink's algorithm, replayed on the query's
    records tagged with where each row comes from, gives Flink's table after every batch, and
    in some batch keeps a current value that its compaction removed and whose every source has
    been retracted. Value equality with another source's row does not hide it."""
    if w.strategy != "NOTHING":
        return None
    at, proof = wcsm_replay.prove_stale_current_value(w, flink["steps"], _canon)
    return (at, proof) if at is not None else None


#: name -> (what is wrong, check returning ``(first batch after which Flink is provably
#: wrong, the proof)`` or None)
FLINK_DEFECTS: dict[str, tuple[str, Callable[[generate.Workload, dict], tuple[int, str] | None]]] = {
    "wcsm-nothing-stale-current-value": (
        "DO NOTHING: when a watermark step retracts (or updates) the kept row and leaves more "
        "than one candidate row for the key, WatermarkCompactingSinkMaterializer emits nothing "
        "and keeps the retracted row as its current value: the sink shows a retracted row",
        _nothing_keeps_stale_value),
}


# --------------------------------------------------------------------------------------------
# The comparison
# --------------------------------------------------------------------------------------------

def _diff_message(w: generate.Workload, batch: int, ours: Any, theirs: Any) -> str:
    lines = [
        f"workload {w.name} differs from Flink 2.3 after batch {batch}",
        f"  Tidemark: {ours}",
        f"  Flink:    {theirs}",
        "SQL:", w.sql,
        "input (per table, batches up to the difference):",
    ]
    for table, batches in w.inputs.items():
        for i, b in enumerate(batches[:batch]):
            lines.append(f"  {table} batch {i + 1}: " + json.dumps([[r['seq'], r['kind'], r['row']] for r in b]))
    lines.append(f"reproduce: python tests/conformance/generate.py {w.seed} {w.shape} {w.strategy}"
                 + (f"  (Flink options {w.options})" if w.options else ""))
    return "\n".join(lines)


def first_difference(w: generate.Workload, ours: TidemarkRun, theirs: dict) -> tuple[int, str] | None:
    """``(batch, message)`` of the first batch after which the two systems differ (tables, or
    one failing and the other not, or failing at different batches), None when they agree."""
    if ours.conflict is not None:
        k = ours.failed_batch
        for i, (a, b) in enumerate(zip(ours.steps, theirs["steps"])):
            if a != b:
                return i + 1, _diff_message(w, i + 1, a, b)
        if w.strategy != "ERROR":
            return k, f"{w.name}: ConflictError under DO {w.strategy}: {ours.conflict}"
        if theirs["ok"] or len(theirs["steps"]) >= k:
            table = theirs["steps"][k - 1] if len(theirs["steps"]) >= k else theirs["final"]
            return k, _diff_message(w, k, f"ConflictError at batch {k}: {ours.conflict}", f"no failure; table {table}")
        if len(theirs["steps"]) != k - 1:
            return len(theirs["steps"]) + 1, _diff_message(
                w, len(theirs["steps"]) + 1, f"ConflictError at batch {k}",
                f"failed after {len(theirs['steps'])} batches: {theirs['error']}")
        if "Primary key constraint violation" not in (theirs["error"] or ""):
            return k, f"{w.name}: Flink failed at batch {k} with another error: {theirs['error']}"
        return None
    for i, (a, b) in enumerate(zip(ours.steps, theirs["steps"])):
        if a != b:
            return i + 1, _diff_message(w, i + 1, a, b)
    if not theirs["ok"]:
        k = len(theirs["steps"]) + 1
        return k, _diff_message(w, k, f"no failure; table {ours.steps[k - 1] if k <= len(ours.steps) else None}",
                                f"failed: {theirs['error']}")
    if not (len(theirs["steps"]) == len(ours.steps) == w.n_batches()):
        return len(ours.steps), f"{w.name}: {len(ours.steps)} Tidemark steps, {len(theirs['steps'])} Flink steps"
    if theirs["final"] != ours.steps[-1]:
        return len(ours.steps), _diff_message(w, len(ours.steps), ours.steps[-1], f"final table {theirs['final']}")
    return None


@pytest.mark.parametrize("w", WORKLOADS, ids=[w.name for w in WORKLOADS])
def test_sink_table_matches_flink(w: generate.Workload, flink: dict[str, dict]) -> None:
    """The tables must be equal after every batch. A difference is excused only by a named
    Flink defect whose check proves Flink wrong on this workload *at or before* the first
    differing batch (so the tables are equal up to where Flink goes wrong)."""
    theirs = flink[w.name]
    assert theirs["phase"] != "plan", f"Flink rejected the workload's SQL: {theirs['error']}\n{w.sql}"
    ours = run_tidemark(w)
    diff = first_difference(w, ours, theirs)
    if diff is None:
        return
    batch, message = diff
    for name, (why, proves) in FLINK_DEFECTS.items():
        proven = proves(w, theirs)
        if proven is not None and proven[0] <= batch:
            pytest.xfail(f"excluded: Flink defect '{name}' after batch {proven[0]}: {why}. "
                         f"Proof: {proven[1]}")
    pytest.fail(message, pytrace=False)


@pytest.mark.parametrize("w", WORKLOADS, ids=[w.name for w in WORKLOADS])
def test_sink_rows_come_from_the_query(w: generate.Workload) -> None:
    """Independent of Flink: after every batch each row Tidemark's sink holds is a row the
    query currently produces (computed from scratch over the source tables) -- a sink never
    shows a retracted row -- and under DO DEDUPLICATE every key the query produces is there."""
    ours = run_tidemark(w)
    for i, table in enumerate(ours.steps):
        produced = _canon(query_result_rows(w, i + 1).elements())
        produced_set = {json.dumps(r) for r in produced}
        stale = [r for r in table if json.dumps(r) not in produced_set]
        assert not stale, f"{w.name}: after batch {i + 1} the sink shows {stale}, which the query does not produce ({produced})"
        if w.strategy == "DEDUPLICATE":
            assert len(table) == len({json.dumps(_sink_key(w, r)) for r in produced}), (
                f"{w.name}: after batch {i + 1} the sink has {table}, the query produces {produced}")


@pytest.mark.parametrize("name", sorted(set(REPRODUCTIONS) - OPEN_DIFFERENCES - ALIGNED))
def test_flink_defect_reproduction(name: str, flink: dict[str, dict]) -> None:
    """Each documented Flink defect, on its minimal input: Flink gives the wrong table the
    docs show, Tidemark the one the strategy defines, and the defect's check fires."""
    w = REPRODUCTIONS[name]
    assert flink[name]["ok"], flink[name]["error"]
    assert flink[name]["steps"] == w.expect["flink"]
    assert run_tidemark(w).steps == w.expect["truth"]
    why, proves = FLINK_DEFECTS[name]
    proven = proves(w, flink[name])
    assert proven is not None and proven[0] == len(w.expect["flink"]), why


@pytest.mark.parametrize("name", sorted(OPEN_DIFFERENCES))
def test_open_difference_reproduction(name: str, flink: dict[str, dict]) -> None:
    """Where Tidemark differs from Flink (docs/conformance.md "Open differences"): Flink gives
    the documented table, and Tidemark must give the same; xfail while the stage differs."""
    w = REPRODUCTIONS[name]
    assert flink[name]["ok"], flink[name]["error"]
    assert flink[name]["steps"] == w.expect["flink"]
    ours = run_tidemark(w).steps
    if ours != w.expect["flink"]:
        pytest.xfail(f"open difference '{name}' (docs/conformance.md): Tidemark gives {ours}, "
                     f"Flink {w.expect['flink']}")


@pytest.mark.parametrize("name", sorted(ALIGNED))
def test_aligned_reproduction(name: str, flink: dict[str, dict]) -> None:
    """A fixed difference stays fixed: on its minimal input Tidemark gives Flink's table."""
    w = REPRODUCTIONS[name]
    assert flink[name]["ok"], flink[name]["error"]
    assert flink[name]["steps"] == w.expect["flink"]
    assert run_tidemark(w).steps == w.expect["flink"]


def test_workloads_exercise_conflicts_and_failures(flink: dict[str, dict]) -> None:
    """The slice is not vacuous: some sink keys get rows from several upsert keys, some
    DO ERROR workloads fail in Flink, and every workload has several batches."""
    if SHAPES:
        pytest.skip(f"TIDEMARK_CONFORMANCE_SHAPES selects {SHAPES}: a claim about the whole slice")
    failed = [w for w in WORKLOADS if w.strategy == "ERROR" and not flink[w.name]["ok"]]
    assert failed, "no DO ERROR workload conflicted: the generator lost its conflicts"
    assert any(flink[w.name]["ok"] for w in WORKLOADS if w.strategy == "ERROR")
    assert all(w.n_batches() >= 3 for w in WORKLOADS if not w.name.startswith("seed-"))


def test_stale_value_proof_needs_every_source_of_the_kept_row_retracted() -> None:
    """The defect's proof, without Flink, on the reproductions' documented Flink tables: it
    fires when the row Flink keeps came from a retracted source row (even when another source
    row holds an equal value), not when the retraction may have meant a dropped copy, and never
    when the replay of Flink's algorithm does not give Flink's tables."""
    nothing = {n: w for n, w in REPRODUCTIONS.items() if w.strategy == "NOTHING"}
    fires = {n: wcsm_replay.prove_stale_current_value(w, w.expect["flink"], _canon)[0]
             for n, w in nothing.items()}
    assert fires == {"wcsm-nothing-stale-current-value": 2,
                     "nothing-retracted-dropped-copy-keeps-shown-row": None,
                     "nothing-retracted-shown-copy-equal-copy-active": 3,
                     "distinct-upsert-unread-column-update-dropped": None}
    w = nothing["wcsm-nothing-stale-current-value"]
    at, why = wcsm_replay.prove_stale_current_value(w, w.expect["truth"], _canon)
    assert at is None and "differs from Flink after batch 2" in why
