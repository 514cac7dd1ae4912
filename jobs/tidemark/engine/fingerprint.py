"""Which changes of a pipeline keep its checkpoint's state readable.

A checkpoint holds the source offsets (one entry per source table, in plan order) and one
state store per keyed stage (in plan order) whose values are that stage's stored state
(``tidemark.engine.state_codec``). A new plan can take the checkpoint over when it reads
the same topics in the same order and every keyed stage is the same stage: same kind,
same inputs (columns, types, changelog modes), same output columns and types, same
configuration (keys, aggregates, join condition, conflict strategy, merge engine options),
run in the same operator (``fused_with``: two keyed stages on one key share one,
``tidemark.engine.fusion``, whose members' states are kept in the same layout,
``fused_state_layout``) and same state format (``state_format``: a stage's state kind and version, so a checkpoint
written by a version that stored the stage differently is refused before the query starts,
naming both formats; a record from before formats were recorded held pickled state). Everything else is stateless
and may change: filters and projections that leave a keyed stage's inputs as they were,
anything after the last keyed stage, the sink's topic and format, job options.

The fingerprint is what ``tidemark run`` records in the checkpoint (``PLAN_FILE``) and
compares on every start; the control service compares with the same function before it
accepts a changed pipeline.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tidemark.engine import state_codec
from tidemark.engine.checkpoint_path import local_dir
from tidemark.engine.errors import TidemarkError
from tidemark.engine.fusion import FUSED_STATE_LAYOUT, FUSED_STATE_LAYOUTS, fused_pairs
from tidemark.engine.pipeline import Pipeline
from tidemark.engine.planner import Node

PLAN_FILE = "tidemark-plan.json"
FINGERPRINT_VERSION = 1
#: the state format of a stage recorded before formats were recorded: its state was pickled
_UNRECORDED_FORMAT = state_codec.FORMAT_PICKLED
#: explanations for humans; they do not decide what the state holds
_PROSE_DETAIL = frozenset({"reason", "strategy_reason", "purpose"})


class IncompatibleChange(TidemarkError):
    """The new plan cannot read the state its checkpoint holds."""

    exit_status = 2


def _schema(node: Node) -> dict[str, Any]:
    return {"columns": list(node.columns), "types": [str(t) for t in node.types],
            "changelog_mode": node.changelog_mode}


def _stateful_stage(pipeline: Pipeline, node: Node, fused_with: dict[int, int]) -> dict[str, Any]:
    detail = {k: v for k, v in node.detail.items() if k not in _PROSE_DETAIL}
    entry = {
        "stage": f"[{node.id}] {node.kind}",
        "kind": node.kind,
        "inputs": [_schema(pipeline.node(i)) for i in node.inputs],
        "output": _schema(node),
        "config": json.loads(json.dumps(detail, sort_keys=True, default=str)),
        "state_format": state_codec.format_of(node.stage),
    }
    if node.id in fused_with:
        other = pipeline.node(fused_with[node.id])
        entry["fused_with"] = f"[{other.id}] {other.kind}"
        entry["fused_state_layout"] = FUSED_STATE_LAYOUT
    return entry


def _fused_with(pipeline: Pipeline) -> dict[int, int]:
    """Each fused stage's partner (``tidemark.engine.fusion``), both ways."""
    out: dict[int, int] = {}
    for first, (second, _) in fused_pairs(pipeline).items():
        out[first], out[second] = second, first
    return out


def fingerprint(pipeline: Pipeline) -> dict[str, Any]:
    """What decides whether a checkpoint's state can be read by this plan, plus the SQL (for
    the messages and for people reading the checkpoint)."""
    sources = [{"table": n.table, "topic": pipeline.tables[n.table].options.get("topic", n.table)}
               for n in pipeline.nodes if n.kind == "source" and n.table is not None]
    fused_with = _fused_with(pipeline)
    stateful = [_stateful_stage(pipeline, n, fused_with) for n in pipeline.nodes
                if n.stage is not None and hasattr(n.stage, "process_key")]
    return {"version": FINGERPRINT_VERSION, "sql": pipeline.sql, "sources": sources, "stateful": stateful}


def incompatibilities(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Why ``new`` cannot take over ``old``'s state, one reason per line; empty when it can."""
    reasons: list[str] = []
    old_topics = [s["topic"] for s in old.get("sources", [])]
    new_topics = [s["topic"] for s in new["sources"]]
    if old_topics != new_topics:
        reasons.append(f"source topics changed: {old_topics} -> {new_topics} (the checkpoint's offsets are per topic)")
    old_stages, new_stages = old.get("stateful", []), new["stateful"]
    if [s["kind"] for s in old_stages] != [s["kind"] for s in new_stages]:
        reasons.append("stateful stages changed: " + _kinds(old_stages) + " -> " + _kinds(new_stages))
        return reasons
    for before, after in zip(old_stages, new_stages):
        for part in ("inputs", "output", "config"):
            if before[part] != after[part]:
                reasons.append(f"stage {after['stage']}: {part} changed: {_diff(before[part], after[part])}")
        if before.get("fused_with") != after.get("fused_with"):
            reasons.append(f"stage {after['stage']}: the checkpoint ran it in {_operator(before)}, "
                           f"this version runs it in {_operator(after)} (state is kept per operator)")
        elif after.get("fused_with") and (layout := before.get("fused_state_layout", 1)) != after["fused_state_layout"]:
            reasons.append(f"stage {after['stage']}: the checkpoint keeps its operator's state as "
                           f"{_layout(layout)}, this version as {_layout(after['fused_state_layout'])}")
        old_format = before.get("state_format", _UNRECORDED_FORMAT)
        if old_format != after["state_format"]:
            reasons.append(
                f"stage {after['stage']}: the checkpoint holds state in format {old_format}, "
                f"this version stores {after['state_format']}"
            )
    return reasons


def _operator(stage: dict[str, Any]) -> str:
    partner = stage.get("fused_with")
    return f"one operator with {partner}" if partner else "an operator of its own"


def _layout(number: int) -> str:
    return f"{FUSED_STATE_LAYOUTS.get(number, 'an unknown layout')} (layout {number})"


def _kinds(stages: list[dict[str, Any]]) -> str:
    return "[" + ", ".join(s["kind"] for s in stages) + "]"


def _diff(before: Any, after: Any) -> str:
    """The first differing entry of two fingerprint parts, shown as ``key: old -> new``."""
    if isinstance(before, dict) and isinstance(after, dict):
        for key in sorted(set(before) | set(after)):
            if before.get(key) != after.get(key):
                return f"{key}: {_diff(before.get(key), after.get(key))}"
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        for i, (b, a) in enumerate(zip(before, after)):
            if b != a:
                return f"#{i} {_diff(b, a)}"
    return f"{json.dumps(before, default=str)} -> {json.dumps(after, default=str)}"


def check_compatible(old: dict[str, Any] | None, new: dict[str, Any], where: str) -> None:
    """Raise ``IncompatibleChange`` naming ``where`` (the checkpoint, the pipeline) and what
    changed; ``old`` None (nothing recorded yet) is always compatible."""
    if old is None:
        return
    reasons = incompatibilities(old, new)
    if reasons:
        raise IncompatibleChange(
            f"{where}: the new plan cannot read the state of the old one: " + "; ".join(reasons))


def _record_path(checkpoint: str) -> Path | None:
    """The record file of a local checkpoint; None for a remote one (``scheme://``)."""
    directory = local_dir(checkpoint)
    return None if directory is None else directory / PLAN_FILE


def read_record(checkpoint: str) -> dict[str, Any] | None:
    """The fingerprint recorded in ``checkpoint``, or None when it has none."""
    path = _record_path(checkpoint)
    if path is None or not path.exists():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def write_record(checkpoint: str, record: dict[str, Any]) -> None:
    """Record ``record`` in ``checkpoint`` atomically (a crash leaves the old or the new one)."""
    path = _record_path(checkpoint)
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


def take_over(checkpoint: str, pipeline: Pipeline) -> None:
    """Before a run: refuse a plan that cannot read ``checkpoint``'s state, else record it."""
    new = fingerprint(pipeline)
    check_compatible(read_record(checkpoint), new, f"checkpoint {checkpoint}")
    write_record(checkpoint, new)
