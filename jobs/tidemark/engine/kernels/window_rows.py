"""What the window Top-N and window join kernels share: the batch loop of a kernel that
keeps a windowed input's rows until their window fires (``WindowRows``), the late rows
dropped, the rows as a typed polars frame.

A row is late when its window had fired before the batch that carries it: its
``window_end - 1`` is at or below the stage's watermark before the batch (the rule of the
window aggregate, ``tidemark.engine.kernels.window``). A record dropped from every window it
falls in counts once in ``late_records_dropped``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl
import pyarrow as pa

from tidemark.engine.arrow_types import arrow_type
from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change
from tidemark.engine.errors import TidemarkError
from tidemark.engine.event_time import epoch_ms, watermark_of
from tidemark.engine.kernels.frame_state import FrameState
from tidemark.engine.stage import BatchContext
from tidemark.engine.types import SqlType

POS = "$pos"
END = "$end_ms"


def on_time(stage_name: str, changes: list[Change], end_index: int, before: int | None, ctx: BatchContext) -> list[Change]:
    """``changes`` without the late rows (module docstring); a retraction is refused: window
    operators take insert-only input, which the planner guarantees."""
    if any(not c.is_add for c in changes):
        raise TidemarkError(f"stage '{stage_name}': a window operator takes inserts only, and got a retraction")
    if before is None or not changes:
        return changes
    open_ = [epoch_ms(c.row[end_index]) - 1 > before for c in changes]
    kept = {c.pos for c, ok in zip(changes, open_) if ok}
    ctx.metrics["late_records_dropped"] += len({c.pos for c, ok in zip(changes, open_) if not ok} - kept)
    return [c for c, ok in zip(changes, open_) if ok]


def row_frame(
    changes: list[Change], names: Sequence[str], types: Sequence[SqlType | None], end_index: int
) -> pl.DataFrame:
    """The rows as columns ``names`` (typed as the planner typed them, inferred where it
    could not), their positions as ``$pos0``... and their window's end in epoch ms."""
    columns: dict[str, pa.Array] = {}
    for i, (name, t) in enumerate(zip(names, types)):
        values = [c.row[i] for c in changes]
        columns[name] = pa.array(values, type=arrow_type(t)) if t is not None else pa.array(values)
    depth = max((len(c.pos) for c in changes), default=0)
    for d in range(depth):
        columns[f"{POS}{d}"] = pa.array([c.pos[d] if d < len(c.pos) else None for c in changes], pa.int64())
    columns[END] = pa.array([epoch_ms(c.row[end_index]) for c in changes], pa.int64())
    return pl.from_arrow(pa.table(columns))


def pos_columns(frame: pl.DataFrame) -> list[str]:
    """The frame's position columns, most significant first."""
    return sorted((c for c in frame.columns if c.startswith(POS)), key=lambda c: int(c[len(POS):]))


def position(values: Sequence[int | None]) -> tuple[int, ...]:
    """A position read back from its columns (a shorter one was padded with NULLs)."""
    return tuple(v for v in values if v is not None)


class WindowRows(FrameState):
    """``process_batch`` of a kernel whose state is the rows of open windows (a polars frame
    with an ``END`` column, or None): ``add`` the batch's rows, then ``emit`` the rows of the
    windows the watermark has passed and forget them. ``stage.sources`` are the tables whose
    watermarks the stage waits for."""

    stage: Any

    def add(
        self, inputs: Sequence[ChangeBatch], state: pl.DataFrame | None, before: int | None, ctx: BatchContext
    ) -> pl.DataFrame | None:
        """The state with the batch's rows that are on time (``before``: the watermark
        before the batch)."""
        raise NotImplementedError

    def emit(self, fired: pl.DataFrame) -> list[Change]:
        """The output of the rows of the fired windows."""
        raise NotImplementedError

    def process_batch(
        self, inputs: Sequence[ChangeBatch], state: pl.DataFrame | None, ctx: BatchContext
    ) -> tuple[pl.DataFrame | None, ChangeBatch]:
        sources = self.stage.sources
        state = self.add(inputs, state, watermark_of(ctx.previous_watermarks, sources), ctx)
        after = watermark_of(ctx.watermarks, sources)
        if state is None or after is None:
            return state, ChangeBatch(changes=[])
        due = pl.col(END) - 1 <= after
        fired, rest = state.filter(due), state.filter(~due)
        return (rest if rest.height else None), ChangeBatch(changes=self.emit(fired) if fired.height else [])
