"""What the conformance tests of single constructs share: a workload replayed batch by batch
on the replay host (each batch's records shuffled: arrival order inside a batch must not
matter), and Flink 2.3's results for a list of workloads from the cached oracle runner."""

from __future__ import annotations

import random
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from tidemark.engine.changelog import Change
from tidemark.engine.pipeline import Pipeline, compile_sql
from tidemark.engine.records import parse_row
from tidemark.engine.replay import ReplayHost

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "nexmark"))
import generate  # noqa: E402  (sibling module, not a package)
import harness  # noqa: E402  (the oracle runner and row canon the Nexmark suite uses)


def shuffled_inputs(pipeline: Pipeline, w: generate.Workload, b: int) -> dict[str, list[Change]]:
    """Batch ``b``'s records of every source table, parsed, shuffled per workload, table and batch."""
    inputs: dict[str, list[Change]] = {}
    for table, batches in w.inputs.items():
        tdef = pipeline.sources[table]
        recs = batches[b] if b < len(batches) else []
        changes = [Change(r["kind"], parse_row(tdef, r["kind"], r["row"]), (r["seq"],)) for r in recs]
        random.Random(f"shuffle-{w.name}-{table}-{b}").shuffle(changes)
        inputs[table] = changes
    return inputs


@dataclass
class FinalRun:
    """A workload replayed to the end of its input."""

    host: ReplayHost
    #: what each batch emitted (the rows the watermark released before the end)
    outputs: list[list[Change]]
    #: the sink's rows at the end, canonical (a multiset: these sinks have no key)
    rows: list[list]

    @property
    def emitted(self) -> list[int]:
        return [len(out) for out in self.outputs]


def replay_to_the_end(w: generate.Workload) -> FinalRun:
    """``w`` through the replay host, then its end of input (``finish``: the windows and
    rows still waiting for the watermark come out, as in Flink's bounded run). These
    workloads' disorder stays within the watermark delay, so no record may be late."""
    pipeline = compile_sql(w.sql)
    host = ReplayHost(pipeline)
    outputs = [host.run_batch(shuffled_inputs(pipeline, w, b), now_ms=b) for b in range(w.n_batches())]
    rows = Counter(c.row for out in outputs for c in out)
    rows.update(c.row for c in host.finish(now_ms=w.n_batches()))
    assert host.metrics["late_records_dropped"] == 0
    return FinalRun(host, outputs, harness.canon([r for r, n in rows.items() for _ in range(n)]))


def oracle_results(workloads: list[generate.Workload], slots: int = 2) -> dict[str, dict]:
    """Flink 2.3's result per workload name (cached by ``harness.flink_results``); a missing
    oracle fails the test with what to install."""
    try:
        return harness.flink_results([w.spec_case() for w in workloads], slots=slots)
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)
