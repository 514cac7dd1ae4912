"""Window Top-N under the batch contract: one polars pass per batch over a bucket's open
windows (``tidemark.engine.stages.window_rank`` says what it computes).

State is typed: one row per kept input row (its columns ``f0``..., its source position and
its window's end in epoch ms), at most ``end`` per partition. A batch: drop the late rows,
add the rest, keep the first ``end`` of each partition in rank order, then rank the rows of
every window the watermark has passed, emit those in the range and forget them.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from tidemark.engine.arrow_types import python_values
from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import INSERT, Change
from tidemark.engine.kernels.window_rows import WindowRows, on_time, pos_columns, position, row_frame
from tidemark.engine.stage import BatchContext

_RANK = "$rank"


class WindowRankKernel(WindowRows):
    """``process_batch`` and the typed state protocol (``tidemark.engine.state_codec``) for
    one ``WindowRank``; the state is a polars frame of kept rows, or None."""

    state_kind = "window-rank"
    state_version = 1

    def __init__(self, stage) -> None:  # noqa: ANN001  (WindowRank; it imports this module)
        self.stage = stage
        self.name = stage.name
        self.n_inputs = 1
        self.rows = [f"f{i}" for i in range(stage.width)]
        self.part = [self.rows[i] for i in stage.partition]

    def add(
        self, inputs: Sequence[ChangeBatch], state: pl.DataFrame | None, before: int | None, ctx: BatchContext
    ) -> pl.DataFrame | None:
        stage = self.stage
        changes = on_time(stage.name, inputs[0].changes(), stage.window_end_index, before, ctx)
        if not changes:
            return state
        frame = row_frame(changes, self.rows, stage.types, stage.window_end_index)
        state = frame if state is None else pl.concat([state, frame], how="diagonal_relaxed")
        return self._ranked(state).filter(pl.col(_RANK) <= stage.end).drop(_RANK)

    def emit(self, fired: pl.DataFrame) -> list[Change]:
        return self._rows(self._ranked(fired).filter(pl.col(_RANK) >= self.stage.start))

    def _ranked(self, frame: pl.DataFrame) -> pl.DataFrame:
        """Rows in rank order per partition (module docstring of the stage), with their rank."""
        order = self.stage.order
        pos = pos_columns(frame)
        latest_first = self.stage.ties == "last"
        by = [*self.part, *(self.rows[k.column] for k in order), *pos]
        descending = [False] * len(self.part) + [k.descending for k in order] + [latest_first] * len(pos)
        nulls_last = [False] * len(self.part) + [not k.nulls_first for k in order] + [latest_first] * len(pos)
        ordered = frame.sort(by, descending=descending, nulls_last=nulls_last, maintain_order=True)
        return ordered.with_columns((pl.int_range(pl.len(), dtype=pl.Int64).over(self.part) + 1).alias(_RANK))

    def _rows(self, ranked: pl.DataFrame) -> list[Change]:
        table = ranked.to_arrow()
        values = [python_values(table.column(name)) for name in self.rows]
        positions = [table.column(c).to_pylist() for c in pos_columns(ranked)]
        ranks = table.column(_RANK).to_pylist() if self.stage.output_rank else [None] * ranked.height
        return [
            Change(INSERT, (*(v[r] for v in values), ranks[r]), position([p[r] for p in positions]))
            for r in range(ranked.height)
        ]
