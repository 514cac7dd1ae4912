"""Event time on the Spark host: the watermark per micro-batch, as replay computes it.

The rule is replay's (``tidemark.engine.event_time``): a source's watermark is the greatest
event time it has read, less its declared delay, never moving back; a stage sees the least
of its sources'; within a batch a window aggregate sees the watermarks before the batch's
records (a record is late if its window had fired before them) and after them (the
windows that fire in this batch). Replay and Spark give the same rows in the same batches.

Where the watermark lives: in every state bucket of every event-time stage, beside its
state (``tidemark.spark.event_clock``), and so in the checkpoint with it: a restart finds
it as the last committed batch left it. The alternatives do not give replay's batches:

- Spark's own ``withWatermark`` (and transformWithState's EventTime timers) computes the
  watermark of batch N from batches before N: every window would fire one batch later
  than in replay, and late records would be judged by a watermark one batch old.
- A record the driver keeps (in the checkpoint directory) is known only after a batch's
  tasks have finished, while the keyed stage that needs this batch's watermark runs
  inside the same batch, on the executors.

So the pass that reads a source measures it: at the node that carries the source's
event-time column a ``WatermarkProbe`` takes the watermark of the task's records (before
any filter, as replay does), and the pass sends it as a tick row to every bucket of the
event-time stage it feeds (``tick_rows``; a few bytes, tasks x buckets rows per batch).
Every bucket gets every tick, so all buckets agree; a bucket whose open windows are passed
by the watermark fires them in that batch whether or not the batch brought it a record,
and a bucket with nothing stored and no record only stores the watermark.

A bounded source's end (``tidemark.spark.source``) reaches the buckets the same way: its
last batch's decode pass sends ``END_OF_INPUT`` as the table's watermark.

Refused before the job starts, naming the stage: an event-time stage whose input comes
through another keyed stage (ticks travel only from the passes that read sources), and the
window Top-N and window join, which only replay runs yet.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change
from tidemark.engine.errors import PlanError
from tidemark.engine.event_time import epoch_ms, greatest_ms
from tidemark.spark.event_clock import TICK_INPUT, encode_tick, watermark_sources
from tidemark.spark.partitioning import grouping_values


def check_supported(pipeline: Any) -> None:
    """Refuse what the Spark host cannot run with event time (module docstring)."""
    for node in pipeline.nodes:
        if not watermark_sources(node.stage):
            continue
        keyed = _keyed_upstream(pipeline, node)
        if keyed is not None:
            raise PlanError(
                f"stage [{node.id}] {node.name}: a window aggregate reading the output of the keyed stage "
                f"[{keyed.id}] {keyed.name} does not run on Spark yet (its watermark reaches it only from the "
                "passes that read sources); it runs in `tidemark replay`"
            )


def _keyed_upstream(pipeline: Any, node: Any) -> Any:
    """The first keyed node upstream of ``node`` (None: only sources and stateless stages)."""
    todo = list(node.inputs)
    while todo:
        up = pipeline.node(todo.pop())
        if up.stage is not None and hasattr(up.stage, "key_of"):
            return up
        todo.extend(up.inputs)
    return None


class WatermarkProbe:
    """A stateless stage that passes its batch on unchanged; ``observed`` reads the
    watermark of the batch at the point it stands (the node with the event-time column)."""

    def __init__(self, table: str, column: int, delay_ms: int) -> None:
        self.table = table
        self.column = column
        self.delay_ms = delay_ms
        self.name = f"watermark of {table}"

    def process(self, changes: list[Change]) -> list[Change]:
        return changes

    def process_batch(self, batch: ChangeBatch) -> ChangeBatch:
        return batch

    def watermark(self, batch: ChangeBatch) -> int | None:
        """The batch's greatest event time less the delay (None: no event time in it)."""
        if batch.is_columnar:
            import pyarrow.compute as pc

            table = batch.table()
            best = pc.max(table.column(self.column)).as_py() if table.num_rows else None
            ms = epoch_ms(best) if best is not None else None
        else:
            ms = greatest_ms(c.row[self.column] for c in batch.changes())
        return None if ms is None else ms - self.delay_ms


def probe_of(pipeline: Any, node: Any) -> WatermarkProbe:
    """The probe for ``node``, the node whose ``detail['event_time']`` names its source."""
    table, column = node.detail["event_time"]
    return WatermarkProbe(table, column, pipeline.watermark_delays[table])


def observed(stages: Sequence[Any], batch: ChangeBatch, marks: dict[str, int]) -> ChangeBatch:
    """``batch`` through ``stages`` (``keyed.run_stateless``), each probe's watermark
    raising ``marks`` (table -> watermark ms) on the way."""
    from tidemark.spark.keyed import run_stateless

    start = 0
    for i, stage in enumerate(stages):
        if isinstance(stage, WatermarkProbe):
            batch = run_stateless(stages[start:i], batch)
            ms = stage.watermark(batch)
            if ms is not None and ms > marks.get(stage.table, ms - 1):
                marks[stage.table] = ms
            start = i + 1
    return run_stateless(stages[start:], batch)


def tick_rows(marks: dict[str, int], target: Any, buckets: int) -> list[tuple[int, int, bytes]]:
    """``BLOB_SCHEMA`` tick rows carrying ``marks`` to every bucket of ``target``'s stage
    (each under its grouping value, ``tidemark.spark.partitioning``), if it is an event-time
    stage waiting for one of them (``target``: ``keyed.Target``)."""
    if target is None:
        return []
    wanted = {t: ms for t, ms in marks.items() if t in watermark_sources(target[0])}
    if not wanted:
        return []
    tick = encode_tick(wanted)
    return [(int(b), TICK_INPUT, tick) for b in grouping_values(buckets)]
