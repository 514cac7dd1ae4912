"""Entry point the planner calls for a sink whose table declares a merge engine.

``build_merge_engine(table, columns, pk, options, input_retracts)`` validates the table's
merge options (Paimon's names: ``merge-engine``, ``sequence.field``,
``fields.<f>.aggregate-function``, ``changelog-producer``...) and returns the keyed sink
stage. Any invalid option raises ``PlanError`` naming it, so a pipeline fails at
registration, never mid-stream. ``input_retracts`` says whether the stream reaching the
sink carries ``-U``/``-D``: functions and engines that cannot take retractions are refused
for such a stream. ``types`` (optional, one ``SqlType`` or type name per column) enables the
type checks Paimon's aggregate factories do and integral overflow checks.

The user documentation is ``docs/merge-engines.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tidemark.engine.stages.merge import options as merge_options
from tidemark.engine.types import SqlType
from tidemark.engine.stages.merge.aggregation import AggregationMerge
from tidemark.engine.stages.merge.deduplicate import DeduplicateMerge
from tidemark.engine.stages.merge.first_row import FirstRowMerge
from tidemark.engine.stages.merge.partial_update import PartialUpdateMerge
from tidemark.engine.stages.merge.stage import MergeEngineStage

__all__ = ["MergeEngineStage", "build_merge_engine"]


def build_merge_engine(
    table: str,
    columns: list[str],
    pk: tuple[int, ...],
    options: Mapping[str, str],
    input_retracts: bool,
    types: Sequence[Any] | None = None,
    name: str = "merge_engine",
) -> MergeEngineStage:
    cfg = merge_options.parse(table, columns, pk, options, input_retracts, types)
    # SQL types type the stored state; a column given by a type name only is left to Arrow
    row_type = tuple(zip(columns, (t if isinstance(t, SqlType) else None for t in types))) if types is not None else None
    if cfg.engine == "deduplicate":
        merge_fn: Any = DeduplicateMerge()
    elif cfg.engine == "first-row":
        merge_fn = FirstRowMerge()
    elif cfg.engine == "aggregation":
        merge_fn = AggregationMerge(cfg)
    else:
        merge_fn = PartialUpdateMerge(cfg)
    return MergeEngineStage(cfg, merge_fn, name=name, columns=row_type)
