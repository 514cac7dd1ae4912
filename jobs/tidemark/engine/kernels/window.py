"""The window aggregate under the batch contract: one polars pass per batch over a bucket's
open windows (``tidemark.engine.stages.window_aggregate`` says what it computes).

State is typed: one row per open group (its group columns, then per call the partial
aggregate: a count, or a sum and the count of values behind it, or a min/max), and the
greatest source position of its records, which becomes the position of the window's row.
A batch: drop the late rows, aggregate the rest per group, merge that with the stored
partials (counts and sums add, extremes take the extreme), then emit and forget every group
whose window the watermark has passed, in group order.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import INSERT, Change
from tidemark.engine.errors import TidemarkError
from tidemark.engine.event_time import epoch_ms, from_epoch_ms, watermark_of
from tidemark.engine.kernels.frame_state import FrameState
from tidemark.engine.stage import BatchContext
from tidemark.engine.stages.aggregate import AggCall, SumAcc

_POS = "$pos"
_END = "$end_ms"


def _group(i: int) -> str:
    return f"g{i}"


def _part(i: int, what: str) -> str:
    return f"a{i}_{what}"


class WindowAggregateKernel(FrameState):
    """``process_batch`` and the typed state protocol (``tidemark.engine.state_codec``) for
    one ``WindowAggregate``; the state is a polars frame of open groups, or None."""

    state_kind = "window-aggregate"
    state_version = 1

    def __init__(self, stage) -> None:  # noqa: ANN001  (WindowAggregate; imports it)
        self.stage = stage
        self.name = stage.name
        self.n_inputs = 1
        self._groups = [_group(i) for i in range(len(stage.group_by))]
        self._end = self._groups[stage.group_by.index(stage.window_end_index)]

    # ------------------------------------------------------------------ the batch

    def process_batch(
        self, inputs: Sequence[ChangeBatch], state: pl.DataFrame | None, ctx: BatchContext
    ) -> tuple[pl.DataFrame | None, ChangeBatch]:
        stage = self.stage
        before = watermark_of(ctx.previous_watermarks, stage.sources)
        after = watermark_of(ctx.watermarks, stage.sources)
        return self._advance(inputs[0].changes(), state, before, after, ctx)

    def _advance(
        self, changes: list[Change], state: pl.DataFrame | None, before: int | None, after: int | None,
        ctx: BatchContext,
    ) -> tuple[pl.DataFrame | None, ChangeBatch]:
        """Aggregate ``changes`` (those of windows closed at ``before`` dropped as late) into
        ``state``, then fire every window closed at ``after``."""
        partials = self._partials(changes, before, ctx)
        if partials is not None:
            state = partials if state is None else self._merge(pl.concat([state, partials], how="diagonal_relaxed"))
        if state is None or after is None:
            return state, ChangeBatch(changes=[])
        fired = state.filter(pl.col(_END) - 1 <= after)
        if fired.height == 0:
            return state, ChangeBatch(changes=[])
        rest = state.filter(pl.col(_END) - 1 > after)
        return (rest if rest.height else None), ChangeBatch(changes=self._rows(fired.sort(self._groups, nulls_last=False)))

    def _partials(self, changes: list[Change], before: int | None, ctx: BatchContext) -> pl.DataFrame | None:
        """This batch's records, late ones dropped, aggregated per group (None: nothing)."""
        if not changes:
            return None
        stage = self.stage
        if any(not c.is_add for c in changes):
            raise TidemarkError(f"stage '{stage.name}': a window aggregate takes inserts only, and got a retraction")
        if before is not None:
            end = stage.window_end_index
            open_ = [epoch_ms(c.row[end]) - 1 > before for c in changes]
            kept = {c.pos for c, ok in zip(changes, open_) if ok}
            ctx.metrics["late_records_dropped"] += len({c.pos for c, ok in zip(changes, open_) if not ok} - kept)
            changes = [c for c, ok in zip(changes, open_) if ok]
            if not changes:
                return None
        depth = max(len(c.pos) for c in changes)
        data: dict[str, list] = {g: [c.row[i] for c in changes] for g, i in zip(self._groups, stage.group_by)}
        for i, call in enumerate(stage.calls):
            if call.arg is not None:
                data[f"x{i}"] = [c.row[call.arg] for c in changes]
        for d in range(depth):
            data[f"{_POS}{d}"] = [c.pos[d] if d < len(c.pos) else None for c in changes]
        data[_END] = [epoch_ms(c.row[stage.window_end_index]) for c in changes]
        frame = pl.DataFrame(data, strict=False)
        pos = [f"{_POS}{d}" for d in range(depth)]
        aggs: list[pl.Expr] = [pl.col(_END).first()]
        for i, call in enumerate(stage.calls):
            x = pl.col(f"x{i}")
            if call.func == "COUNT_STAR":
                aggs.append(pl.len().cast(pl.Int64).alias(_part(i, "n")))
            elif call.func == "COUNT":
                aggs.append(x.count().cast(pl.Int64).alias(_part(i, "n")))
            elif call.func in ("SUM", "AVG"):
                aggs += [x.sum().alias(_part(i, "sum")), x.count().cast(pl.Int64).alias(_part(i, "n"))]
            else:
                aggs.append((x.max() if call.func == "MAX" else x.min()).alias(_part(i, "v")))
        aggs += [pl.col(p).last() for p in pos]
        return _by_position(frame, pos).group_by(self._groups).agg(aggs)

    def _merge(self, frame: pl.DataFrame) -> pl.DataFrame:
        """Stored partials and this batch's, one row per group."""
        pos = sorted((c for c in frame.columns if c.startswith(_POS)), key=lambda c: int(c[len(_POS):]))
        aggs: list[pl.Expr] = [pl.col(_END).first()]
        for i, call in enumerate(self.stage.calls):
            if call.func in ("COUNT", "COUNT_STAR"):
                aggs.append(pl.col(_part(i, "n")).sum())
            elif call.func in ("SUM", "AVG"):
                aggs += [pl.col(_part(i, "sum")).sum(), pl.col(_part(i, "n")).sum()]
            else:
                v = pl.col(_part(i, "v"))
                aggs.append(v.max() if call.func == "MAX" else v.min())
        aggs += [pl.col(p).last() for p in pos]
        return _by_position(frame, pos).group_by(self._groups).agg(aggs)

    def _rows(self, fired: pl.DataFrame) -> list[Change]:
        pos = sorted((c for c in fired.columns if c.startswith(_POS)), key=lambda c: int(c[len(_POS):]))
        columns = {c: fired[c].to_list() for c in fired.columns}
        out = []
        for r in range(fired.height):
            values = [columns[g][r] for g in self._groups]
            for i, call in enumerate(self.stage.calls):
                values.append(_result(call, columns, i, r))
            p = tuple(columns[c][r] for c in pos)
            out.append(Change(INSERT, tuple(values), tuple(v for v in p if v is not None)))
        return out


class ProctimeWindowKernel(WindowAggregateKernel):
    """The kernel of a ``ProctimeWindowAggregate`` (``tidemark.engine.stages.proctime_window``):
    the batch's rows go to the tumbling window holding ``ctx.now_ms``, and the clock that
    fires windows is ``now_ms`` instead of a watermark (no record is ever late)."""

    state_kind = "proctime-window-aggregate"

    def process_batch(
        self, inputs: Sequence[ChangeBatch], state: pl.DataFrame | None, ctx: BatchContext
    ) -> tuple[pl.DataFrame | None, ChangeBatch]:
        if ctx.end_of_input:
            return state, ChangeBatch(changes=[])
        stage = self.stage
        start = ctx.now_ms - ctx.now_ms % stage.size_ms
        bounds = {stage.window_start_index: from_epoch_ms(start),
                  stage.window_end_index: from_epoch_ms(start + stage.size_ms)}
        changes = [Change(c.kind, tuple(bounds.get(i, v) for i, v in enumerate(c.row)), c.pos)
                   for c in inputs[0].changes()]
        return self._advance(changes, state, None, ctx.now_ms, ctx)

    def next_wakeup(self, state: pl.DataFrame | None) -> int | None:
        """When the earliest open window of ``state`` fires (a host's timer for the bucket)."""
        return None if state is None else int(state[_END].min()) - 1


def _by_position(frame: pl.DataFrame, pos: list[str]) -> pl.DataFrame:
    """Rows in source-position order, so a group's ``last()`` position is its greatest
    (polars keeps the frame's order inside each group)."""
    return frame.sort(pos, nulls_last=False) if pos else frame


def _result(call: AggCall, columns: dict[str, list], i: int, r: int) -> object:
    if call.func in ("COUNT", "COUNT_STAR"):
        return columns[_part(i, "n")][r]
    if call.func in ("SUM", "AVG"):
        acc = SumAcc()
        acc.total, acc.n = columns[_part(i, "sum")][r], columns[_part(i, "n")][r]
        return acc.sum() if call.func == "SUM" else acc.avg()
    return columns[_part(i, "v")][r]
