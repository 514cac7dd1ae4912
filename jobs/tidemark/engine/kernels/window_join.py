"""The window join under the batch contract: one polars pass per batch over a bucket's open
windows (``tidemark.engine.stages.window_join`` says what it computes).

State is typed: one frame of both sides' kept rows, ``$side`` 0 or 1, the left side's
columns ``l0``..., the right side's ``r0``... (NULL on the other side's rows), each row's
source position and its window's end in epoch ms. A batch: drop the late rows of either
side, add the rest, then join the rows of every window the watermark has passed (equi keys
in polars, the residual condition per candidate pair on the joined Python row, as the
regular join's kernel does), pad the outer sides and forget those rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from tidemark.engine.arrow_types import python_values
from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import INSERT, Change
from tidemark.engine.kernels.window_rows import WindowRows, on_time, pos_columns, position, row_frame
from tidemark.engine.stage import BatchContext

_SIDE = "$side"
_ID = "$id"


class WindowJoinKernel(WindowRows):
    """``process_batch`` and the typed state protocol (``tidemark.engine.state_codec``) for
    one ``WindowJoin``; the state is a polars frame of kept rows, or None."""

    state_kind = "window-join"
    state_version = 1

    def __init__(self, stage) -> None:  # noqa: ANN001  (WindowJoin; it imports this module)
        self.stage = stage
        self.name = stage.name
        self.n_inputs = 2
        left, right = stage.widths
        self.columns = ([f"l{i}" for i in range(left)], [f"r{i}" for i in range(right)])
        # each side's columns typed and empty: a side's rows get the other's as NULLs
        self._empty = [row_frame([], self.columns[s], stage.types[s], stage.window_end[s]) for s in (0, 1)]

    def add(
        self, inputs: Sequence[ChangeBatch], state: pl.DataFrame | None, before: int | None, ctx: BatchContext
    ) -> pl.DataFrame | None:
        stage = self.stage
        for side in (0, 1):
            changes = on_time(stage.name, inputs[side].changes(), stage.window_end[side], before, ctx)
            if changes:
                frame = row_frame(changes, self.columns[side], stage.types[side], stage.window_end[side])
                frame = pl.concat([self._empty[1 - side], frame], how="diagonal_relaxed")
                frame = frame.with_columns(pl.lit(side, pl.Int8).alias(_SIDE))
                state = frame if state is None else pl.concat([state, frame], how="diagonal_relaxed")
        return state

    def emit(self, fired: pl.DataFrame) -> list[Change]:
        """The fired windows' join result (both sides' rows of one window share their
        bounds, which are among the equi keys)."""
        stage = self.stage
        pos = pos_columns(fired)
        sides = [fired.filter(pl.col(_SIDE) == s).select(*self.columns[s], *pos).with_row_index(_ID) for s in (0, 1)]
        rows = [self._python_rows(sides[s], self.columns[s]) for s in (0, 1)]
        positions = [list(sides[s].select(pos).iter_rows()) for s in (0, 1)]
        lkeys = [self.columns[0][i] for i in stage.left_key]
        rkeys = [self.columns[1][i] for i in stage.right_key]
        right = sides[1].with_columns(pl.col(r).cast(sides[0].schema[lk]) for lk, r in zip(lkeys, rkeys))
        pairs = sides[0].select(_ID, *lkeys).join(
            right.select(pl.col(_ID).alias("$rid"), *rkeys), left_on=lkeys, right_on=rkeys, how="inner"
        )
        matched: list[tuple[int, int]] = []
        for a, b in zip(pairs[_ID].to_list(), pairs["$rid"].to_list()):
            if stage.residual is None or stage.residual(rows[0][a] + rows[1][b]):
                matched.append((a, b))
        out = [Change(INSERT, rows[0][a] + rows[1][b], max(position(positions[0][a]), position(positions[1][b])))
               for a, b in matched]  # fmt: skip
        widths = stage.widths
        for s in (0, 1):
            if stage.join_type not in ("full", ("left", "right")[s]):
                continue
            partnered = {pair[s] for pair in matched}
            pad = (None,) * widths[1 - s]
            for r, row in enumerate(rows[s]):
                if r not in partnered:
                    out.append(Change(INSERT, row + pad if s == 0 else pad + row, position(positions[s][r])))
        return out

    @staticmethod
    def _python_rows(frame: pl.DataFrame, names: list[str]) -> list[tuple]:
        """The frame's rows as the Python tuples rows hold (``arrow_types.python_values``)."""
        table = frame.select(names).to_arrow()
        return list(zip(*(python_values(table.column(n)) for n in names))) if frame.height else []
