"""The OVER aggregation under the batch contract: one polars pass per batch over the
partitions whose rows the watermark releases (``tidemark.engine.stages.over`` says what it
computes).

State of a bucket: one frame of rows, each with a role: a row waiting for the watermark
(``PENDING``), an emitted row later frames still reach (``HISTORY``, bounded frames), or a
partition's accumulator (``ACC``, unbounded frames: per call the count of values, their sum
and their extreme, the rows it stands for forgotten).

Every row is a partial aggregate (a raw row of one value, an accumulator of many), so each
call is a windowed sum (counts, sums) or extreme (MIN, MAX) of partials: polars'
``rolling_*_by`` over the partition, by the row's index in the partition (ROWS) or its time
(RANGE), the window closed on both ends. An accumulator sorts before every row; an
unbounded frame is a window longer than any.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl
import pyarrow.compute as pc

from tidemark.engine.arrow_types import arrow_type
from tidemark.engine.batch import KIND, POS_PREFIX, WEIGHT, ChangeBatch
from tidemark.engine.changelog import INSERT
from tidemark.engine.errors import TidemarkError
from tidemark.engine.event_time import watermark_of
from tidemark.engine.kernels.frame_state import FrameState
from tidemark.engine.stage import BatchContext
from tidemark.engine.stages.over import OverAggregate

PENDING, HISTORY, ACC = 0, 1, 2
_ROLE = "$role"
_TS = "$ts"  # the row's time, epoch milliseconds
_BY = "$by"  # what the frame is measured in: the index in the partition (ROWS) or the time (RANGE)
_FAR = 2**62  # longer than any frame: UNBOUNDED PRECEDING
_BEFORE_ALL = -(2**61)  # an accumulator's time: before every row's


def _part(i: int, what: str) -> str:
    return f"p{i}_{what}"


class OverKernel(FrameState):
    """``process_batch`` and the typed state protocol (``tidemark.engine.state_codec``) for
    one ``OverAggregate``."""

    state_kind = "over-aggregate"
    state_version = 1

    def __init__(self, stage: OverAggregate) -> None:
        self.stage = stage
        self.name = stage.name
        self.n_inputs = 1
        self.rows = [f"f{i}" for i in range(stage.width)]
        self.part = [self.rows[i] for i in stage.partition]
        self._time = self.rows[stage.time_column]
        self._types = [None if t is None else arrow_type(t) for t in stage.types]
        self._results = [None if t is None else arrow_type(t) for t in stage.result_types]

    # ------------------------------------------------------------------ the batch

    def process_batch(
        self, inputs: Sequence[ChangeBatch], state: pl.DataFrame | None, ctx: BatchContext
    ) -> tuple[pl.DataFrame | None, ChangeBatch]:
        stage = self.stage
        before = watermark_of(ctx.previous_watermarks, stage.sources)
        after = watermark_of(ctx.watermarks, stage.sources)
        arrived = self._arrivals(inputs[0], before, ctx)
        frames = [f for f in (state, arrived) if f is not None and f.height]
        state = pl.concat(frames, how="diagonal_relaxed") if len(frames) > 1 else (frames[0] if frames else None)
        if state is None or after is None:
            return state, ChangeBatch(changes=[])
        due = (pl.col(_ROLE) == PENDING) & (pl.col(_TS) <= after)
        ready = state.filter(due)
        if ready.height == 0:
            return state, ChangeBatch(changes=[])
        rest = state.filter(~due)
        waiting = rest.filter(pl.col(_ROLE) == PENDING)
        kept = rest.filter(pl.col(_ROLE) != PENDING)
        if self.part:
            touched = ready.select(self.part).unique()
            context = kept.join(touched, on=self.part, how="semi", nulls_equal=True)
            untouched = kept.join(touched, on=self.part, how="anti", nulls_equal=True)
        else:  # one partition: the whole input
            context, untouched = kept, kept.clear()
        frame = self._windowed(pl.concat([context, ready], how="diagonal_relaxed"))
        out = self._emitted(frame.filter(pl.col(_ROLE) == PENDING))
        parts = [f for f in (untouched, waiting, self._carried(frame, after)) if f.height]
        state = pl.concat(parts, how="diagonal_relaxed") if parts else None
        return state, out

    def _arrivals(self, batch: ChangeBatch, before: int | None, ctx: BatchContext) -> pl.DataFrame | None:
        """The batch's rows, typed as the planner typed them, with their time; late rows
        (time not after ``before``, or NULL) dropped and counted."""
        if len(batch) == 0:
            return None
        table = batch.table()
        if pc.max(pc.abs(table.column(WEIGHT))).as_py() > 1:  # net weights: one row per change
            table = ChangeBatch.from_changes(batch.changes()).table()
        kinds = set(table.column(KIND).to_pylist())
        if kinds - {INSERT}:
            raise TidemarkError(
                f"stage '{self.name}': an OVER aggregation takes inserts only, and got {', '.join(sorted(kinds - {INSERT}))}"
            )
        row_cols = [c for c in table.column_names if not c.startswith("$")]
        table = table.rename_columns([self.rows[row_cols.index(c)] if c in row_cols else c for c in table.column_names])
        for name, t in zip(self.rows, self._types):
            if t is not None and table.schema.field(name).type != t:
                table = table.set_column(table.schema.get_field_index(name), name, table.column(name).cast(t))
        frame = pl.from_arrow(table).drop(KIND, WEIGHT).with_columns(
            pl.col(self._time).dt.epoch("ms").alias(_TS), pl.lit(PENDING, pl.Int8).alias(_ROLE)
        )
        on_time = pl.col(_TS).is_not_null() & (pl.col(_TS) > before if before is not None else pl.lit(True))
        kept = frame.filter(on_time)
        if kept.height < frame.height:
            ctx.metrics["late_records_dropped"] += frame.height - kept.height
        return kept if kept.height else None

    def _per_partition(self, e: pl.Expr) -> pl.Expr:
        """``e`` over each partition (without PARTITION BY the whole input is one)."""
        return e.over(self.part) if self.part else e

    def _pos(self, frame: pl.DataFrame) -> list[str]:
        return sorted((c for c in frame.columns if c.startswith(POS_PREFIX)), key=lambda c: int(c[len(POS_PREFIX):]))

    def _windowed(self, frame: pl.DataFrame) -> pl.DataFrame:
        """Every row in time order per partition (accumulators first, equal times by
        position) with its partials and each call's result over its frame."""
        frame = frame.with_columns(
            pl.when(pl.col(_ROLE) == ACC).then(pl.lit(_BEFORE_ALL)).otherwise(pl.col(_TS)).alias(_TS)
        ).sort([*self.part, _TS, *self._pos(frame)], nulls_last=False, maintain_order=True)
        frame = frame.with_columns(self._partials(frame))
        frame = frame.with_columns(
            (self._per_partition(pl.int_range(pl.len(), dtype=pl.Int64)) if self.stage.frame.kind == "ROWS" else pl.col(_TS)).alias(_BY)
        )
        preceding = self.stage.frame.preceding
        size = f"{_FAR if preceding is None else preceding}i"

        def over(e: pl.Expr, how: str) -> pl.Expr:
            return self._per_partition(getattr(e, f"rolling_{how}_by")(_BY, size, closed="both"))

        results = []
        for i, call in enumerate(self.stage.calls):
            n = over(pl.col(_part(i, "n")), "sum")
            if call.func in ("COUNT", "COUNT_STAR"):
                value = n
            elif call.func in ("SUM", "AVG"):
                total = over(pl.col(_part(i, "s")), "sum")
                value = pl.when(n > 0).then(total if call.func == "SUM" else _average(total, n, frame[_part(i, "s")].dtype))
            else:
                value = over(pl.col(_part(i, "v")), "max" if call.func == "MAX" else "min")
            results.append(value.alias(f"$r{i}"))
        return frame.with_columns(results)

    def _partials(self, frame: pl.DataFrame) -> list[pl.Expr]:
        """Per call, the partial aggregate of each row: a raw row's own value, or what an
        accumulator holds."""
        is_acc = pl.col(_ROLE) == ACC
        out = []
        for i, call in enumerate(self.stage.calls):
            x = pl.col(self.rows[call.arg]) if call.arg is not None else None
            own_n = pl.lit(1, pl.Int64) if x is None else x.is_not_null().cast(pl.Int64)
            held = {"n": own_n}
            if call.func in ("SUM", "AVG"):
                held["s"] = _summable(x, frame.schema[self.rows[call.arg]])
            elif call.func in ("MIN", "MAX"):
                held["v"] = x
            for what, own in held.items():
                name = _part(i, what)
                stored = pl.col(name) if name in frame.columns else pl.lit(None)
                out.append(pl.when(is_acc).then(stored).otherwise(own).alias(name))
        return out

    def _emitted(self, ready: pl.DataFrame) -> ChangeBatch:
        """The released rows, in time order, each with its results, at its own position."""
        pos = self._pos(ready)
        ready = ready.sort([_TS, *pos], nulls_last=False, maintain_order=True)
        n_calls = len(self.stage.calls)
        table = ready.select(*self.rows, *[pl.col(f"$r{i}").alias(f"f{len(self.rows) + i}") for i in range(n_calls)]).to_arrow()
        for i, t in enumerate([*self._types, *self._results]):
            if t is not None and table.schema.field(i).type != t:
                table = table.set_column(i, table.schema.field(i).name, table.column(i).cast(t))
        return ChangeBatch.from_arrow(table, [INSERT] * ready.height, [ready[c].to_arrow() for c in pos])

    def _carried(self, frame: pl.DataFrame, after: int) -> pl.DataFrame:
        """What the touched partitions keep for the rows still to come (all after ``after``)."""
        preceding = self.stage.frame.preceding
        raw = frame.filter(pl.col(_ROLE) != ACC)
        if preceding is None:
            aggs: list[pl.Expr] = []
            for i, call in enumerate(self.stage.calls):
                aggs.append(pl.col(_part(i, "n")).sum())
                if call.func in ("SUM", "AVG"):
                    aggs.append(pl.col(_part(i, "s")).sum())
                elif call.func in ("MIN", "MAX"):
                    v = pl.col(_part(i, "v"))
                    aggs.append(v.max() if call.func == "MAX" else v.min())
            acc = frame.group_by(self.part).agg(aggs) if self.part else frame.select(aggs)
            return acc.with_columns(pl.lit(_BEFORE_ALL, pl.Int64).alias(_TS), pl.lit(ACC, pl.Int8).alias(_ROLE))
        if self.stage.frame.kind == "ROWS":
            history = raw.filter(pl.col(_BY) > self._per_partition(pl.col(_BY).max()) - preceding)
        else:
            history = raw.filter(pl.col(_TS) > after - preceding)
        keep = [*self.rows, _TS, *self._pos(history)]
        return history.select(keep).with_columns(pl.lit(HISTORY, pl.Int8).alias(_ROLE))


def _summable(x: pl.Expr | None, dtype: pl.DataType) -> pl.Expr:
    """A value as SUM and AVG add it: integers as 64-bit (a running sum outgrows the column's
    own width before the result is cast back), other numbers as they are."""
    assert x is not None
    return x.cast(pl.Int64) if dtype.is_integer() else x


def _average(total: pl.Expr, n: pl.Expr, dtype: pl.DataType) -> pl.Expr:
    """AVG as Flink computes it: integers divide as Java longs (truncated toward zero)."""
    if dtype.is_integer():
        return (total.abs() // n) * total.sign()
    return total / n
