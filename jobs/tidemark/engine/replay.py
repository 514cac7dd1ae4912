"""The in-process host: runs a compiled pipeline one micro-batch at a time.

It is the reference host: the Spark job must produce what this produces. Per batch it
walks the stage DAG in topological order; stateless stages get the whole batch, keyed
stages get each key's changes (one list per input) with that key's state from a dict,
exactly as the stage contract describes. Nothing here depends on the order of changes
inside a batch, except where the stages themselves use source positions.

Each sink table (one per INSERT; several in a statement set, fed by one walk of the
shared DAG) is kept the way a consumer of the sink topic would see it, consolidated
per primary key per batch (DESIGN.md "Consolidating one key's rows in a batch"): exact
``+X``/``-X`` pairs cancel, the rest applies in source-position order with retractions
first; an add sets the row, a retraction removes the row only if it is the row stored
(a retraction of a row the table does not hold is counted as
``sink_retractions_without_row``, never applied to another row).

Processing time: each batch runs at one ``now_ms`` (state TTL, and the timers of stages
with ``wakeup_ms``, see ``tidemark.engine.stage``). ``run_batch(..., now_ms=...)`` sets it;
without one the host's clock gives it -- the wall clock unless the host was built with
another ``clock`` -- so ``tidemark replay`` runs in processing time like the Spark job.
Tests pass ``now_ms`` to drive time exactly. After a keyed stage has processed the keys of
a batch, keys without records whose ``wakeup_ms(state) <= now_ms`` are processed with no
records (a ``full-compaction`` barrier reaching a key that saw no new records).

Event time: the host keeps each source's watermark (``tidemark.engine.event_time``) and
gives every batch the watermarks before and after its records; ``finish()`` ends the input.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change, canonical_sorted
from tidemark.engine.driver import BatchStage, batch_stage
from tidemark.engine.errors import InputError
from tidemark.engine.event_time import Watermarks
from tidemark.engine.pipeline import Pipeline
from tidemark.engine.stage import BatchContext, run_stateless, uses_timers
from tidemark.engine.state_codec import empty_state


def _pk_of(row: tuple, pk: Sequence[int]) -> tuple:
    return tuple(row[i] for i in pk) if pk else row


def apply_to_table(
    table: dict[tuple, tuple], changes: Iterable[Change], pk: Sequence[int], metrics: Counter | None = None
) -> None:
    """Apply one batch of sink changes to a materialized table keyed by ``pk`` (positions;
    empty = the whole row is the key)."""
    by_key: dict[tuple, list[Change]] = {}
    for c in changes:
        by_key.setdefault(_pk_of(c.row, pk), []).append(c)
    for key, cs in by_key.items():
        weight: Counter = Counter()
        for c in cs:
            weight[c.row] += c.weight
        # keep, per row, only the changes its net weight leaves (latest positions first
        # to survive: an add that outlives its retraction is the later one)
        remaining: list[Change] = []
        for row, w in weight.items():
            if w == 0:
                continue
            same = sorted((c for c in cs if c.row == row and (c.weight > 0) == (w > 0)), key=lambda c: c.pos)
            remaining.extend(same[-abs(w):])
        if len(remaining) > 1:
            remaining = canonical_sorted(remaining)
        for c in remaining:
            if c.weight > 0:
                table[key] = c.row
            elif table.get(key) == c.row:
                del table[key]
            elif metrics is not None:
                metrics["sink_retractions_without_row"] += 1


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class ReplayHost:
    """Runs ``pipeline`` batch by batch, each keyed stage's state in one in-memory bucket,
    through the one driver loop (``tidemark.engine.driver``). ``clock`` gives ``now_ms``
    for batches run without one (default: the wall clock)."""

    def __init__(self, pipeline: Pipeline, clock: Callable[[], int] | None = None) -> None:
        self.pipeline = pipeline
        self.clock = clock or wall_clock_ms
        self._stages: dict[int, BatchStage] = {n.id: batch_stage(n.stage) for n in pipeline.nodes if _is_keyed(n.stage)}
        self._buckets: dict[int, Any] = {n.id: empty_state(n.stage) for n in pipeline.nodes if n.id in self._stages}
        self.watermarks = Watermarks(pipeline.watermark_delays)
        self._timed = {n.id: uses_timers(n.stage) for n in pipeline.nodes if n.id in self._stages}
        self.metrics: Counter = Counter()
        self._tables: dict[str, dict[tuple, tuple]] = {t.table.name: {} for t in pipeline.sinks}
        self.batch_id = 0
        #: sink table name -> the changes it received in the last batch
        self.last_changes: dict[str, list[Change]] = {}

    @property
    def state(self) -> dict[int, dict[tuple, Any]]:
        """node id -> key -> that key's state (``(key, state)`` for stages with timers); a
        stage with typed state (``state_codec``) maps to its bucket's state object."""
        return {node_id: getattr(b, "states", b) for node_id, b in self._buckets.items()}

    @property
    def timers(self) -> dict[int, dict[tuple, int]]:
        """node id -> key -> wakeup time, for the stages with timers."""
        return {node_id: b.due for node_id, b in self._buckets.items() if self._timed[node_id]}

    def run_batch(self, inputs: Mapping[str, list[Change]], now_ms: int | None = None) -> list[Change]:
        """Run one micro-batch at processing time ``now_ms`` (default: ``self.clock()``);
        ``inputs`` maps source table name -> its changes in this batch. Returns the changes
        the sink receives (a statement set's first sink; ``last_changes`` has every
        sink's). ConflictError propagates."""
        if now_ms is None:
            now_ms = self.clock()
        sources = self.pipeline.source_nodes
        for name in inputs:
            if name not in sources:
                raise InputError(
                    f"input '{name}'",
                    f"the pipeline reads no table of that name (it reads: {', '.join(sorted(sources)) or 'nothing'})",
                )
        ctx = BatchContext(batch_id=self.batch_id, now_ms=now_ms, metrics=Counter(), end_of_input=self.watermarks.ended,
                           previous_watermarks=self.watermarks.current(), watermarks=self.watermarks.current())
        outputs: dict[int, list[Change]] = {}
        sink_changes: dict[str, list[Change]] = {}
        for node in self.pipeline.nodes:
            if node.kind == "source":
                outputs[node.id] = list(inputs.get(node.table, []))
                ctx.metrics[f"records_in:{node.table}"] += len(outputs[node.id])
            elif node.kind == "sink":
                sink_changes[node.table] = outputs[node.id] = outputs[node.inputs[0]]
            elif node.id in self._stages:
                batches = [ChangeBatch(changes=outputs[i]) for i in node.inputs]
                bucket, out = self._stages[node.id].process_batch(batches, self._buckets[node.id], ctx)
                self._buckets[node.id] = bucket
                outputs[node.id] = out.changes()
            elif hasattr(node.stage, "process_batch"):  # a calc: vectorized over the whole batch
                batch = ChangeBatch.from_changes(outputs[node.inputs[0]], schema=node.stage.input_schema())
                outputs[node.id] = node.stage.process_batch(batch).changes()
            else:
                outputs[node.id] = run_stateless(node.stage, [outputs[i] for i in node.inputs])
            event_time = node.detail.get("event_time")
            if event_time is not None:  # the node that carries a source's event-time column
                table, column = event_time
                self.watermarks.advance(table, (c.row[column] for c in outputs[node.id]))
                ctx.watermarks = self.watermarks.current()
        for target in self.pipeline.sinks:
            changes = sink_changes[target.table.name]
            apply_to_table(self._tables[target.table.name], changes, target.table.pk_indexes, ctx.metrics)
            ctx.metrics["sink_changes"] += len(changes)
        self.metrics.update(ctx.metrics)
        self.batch_id += 1
        self.last_changes = sink_changes
        return sink_changes[self.pipeline.sink.name]

    def finish(self, now_ms: int | None = None) -> list[Change]:
        """End of input: one last batch without records at watermark ``END_OF_INPUT``, as
        Flink ends a bounded source, so every event-time window still open fires
        (processing-time windows do not: ``BatchContext.end_of_input``)."""
        self.watermarks.ended = True
        return self.run_batch({}, now_ms)

    def table(self, sink: str | None = None) -> dict[tuple, tuple]:
        """The materialized sink table ``sink`` (default: the first sink): sink PK tuple ->
        row (whole row when no PK)."""
        return dict(self._tables[sink or self.pipeline.sink.name])

    def rows(self, sink: str | None = None) -> list[tuple]:
        """The sink table's rows sorted by key (None sorts first)."""
        table = self._tables[sink or self.pipeline.sink.name]
        return [table[k] for k in sorted(table, key=_sort_key)]


def _sort_key(key: tuple) -> tuple:
    return tuple((v is not None, v) for v in key)


def _is_keyed(stage: Any) -> bool:
    return stage is not None and (hasattr(stage, "process_key") or hasattr(stage, "batch_kernel"))
