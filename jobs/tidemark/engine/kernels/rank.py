"""The rank stage under the batch contract: one polars pass per batch over the touched
partitions (``tidemark.engine.stages.rank`` says what it computes).

State of a bucket: one table of the active rows (all of them for a changelog input, the top
``end`` per partition for an append-only one) with their source positions, stored in rank
order within each partition, so the stored order is the tie order of equal sort keys.

Per batch:
1. the touched partitions' stored rows, each a +1 event in stored order, then the batch's
   changes in the canonical order (``batch_columns.sorted_table``): one sequence;
2. per identical row, the copies that survive. A retraction removes the oldest copy, so the
   survivors are always the last adds of the sequence, as many as the running count ends at,
   where the count never drops below zero (a retraction of nothing is counted in
   ``retractions_without_state`` and ignored). With prefix sums ``S``: the final count is
   ``S_n - min(0, min S)``;
3. the survivors ranked: partition, ORDER BY, then arrival (earlier first; latest first for
   ``ties="last"``);
4. old and new ranks in the range compared, per rank (``output_rank``) or as multisets.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl
import pyarrow.compute as pc

from tidemark.engine.arrow_types import arrow_type
from tidemark.engine.batch import KIND, POS_PREFIX, WEIGHT, ChangeBatch
from tidemark.engine.batch_columns import sorted_table
from tidemark.engine.changelog import DELETE, INSERT, UPDATE_AFTER, UPDATE_BEFORE
from tidemark.engine.kernels.frame_state import FrameState
from tidemark.engine.stage import BatchContext
from tidemark.engine.stages.rank import Rank

_SEQ = "$seq"  # arrival order: stored rows first (in stored order), then the batch's changes
_RANK = "$rank"
_OLD = "$old"
_KEEP = "$keep"
_N = "$n"  # per output identity: new count minus old count
_EMIT_POS = "$emit"


class RankKernel(FrameState):
    """``process_batch`` for a ``Rank`` stage, with typed Arrow state (``state_codec``)."""

    state_kind = "rank"
    state_version = 1

    def __init__(self, stage: Rank) -> None:
        self.stage = stage
        self.name = stage.name
        self.n_inputs = 1
        self.rows = [f"f{i}" for i in range(stage.width)]
        self.part = [self.rows[i] for i in stage.partition]
        self._sort = [self.rows[k.column] for k in stage.order]
        self._desc = [k.descending for k in stage.order]
        self._nulls_last = [not k.nulls_first for k in stage.order]
        self._types = [None if t is None else arrow_type(t) for t in stage.types]

    # ------------------------------------------------------------------ the batch

    def process_batch(
        self, inputs: Sequence[ChangeBatch], state: pl.DataFrame | None, ctx: BatchContext
    ) -> tuple[pl.DataFrame | None, ChangeBatch]:
        if len(inputs[0]) == 0:
            return state, ChangeBatch(changes=[])
        batch = self._batch_frame(inputs[0])
        touched = batch.select(self.part).unique()
        old = self._old_rows(state, touched)
        events = pl.concat([old.with_columns(pl.lit(1, pl.Int64).alias(WEIGHT)), batch], how="diagonal_relaxed")
        events = events.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias(_SEQ))
        survivors, orphans = self._survivors(events)
        if orphans:
            ctx.metrics["retractions_without_state"] += orphans
        new = self._ranked(survivors)
        if self.stage.append_only:
            new = new.filter(pl.col(_RANK) <= self.stage.end)
        out = self._emitted(old, new, batch)
        kept = new.drop(_RANK, _SEQ, _OLD)
        rest = state.join(touched, on=self.part, how="anti", nulls_equal=True) if state is not None else None
        state = kept if rest is None else pl.concat([rest, kept], how="diagonal_relaxed")
        return (state if state.height else None), out

    def _batch_frame(self, batch: ChangeBatch) -> pl.DataFrame:
        """The batch's changes, one row per change, in the canonical order, with the row
        columns named ``f0``... and typed as the planner typed them."""
        table = batch.table()
        if table.num_rows and pc.max(pc.abs(table.column(WEIGHT))).as_py() > 1:  # net weights: one row per change
            table = ChangeBatch.from_changes(batch.changes()).table()
        row_cols = [c for c in table.column_names if not c.startswith("$")]
        table = table.rename_columns([self.rows[row_cols.index(c)] if c in row_cols else c for c in table.column_names])
        for name, t in zip(self.rows, self._types):
            if t is not None and table.schema.field(name).type != t:
                table = table.set_column(table.schema.get_field_index(name), name, table.column(name).cast(t))
        return pl.from_arrow(sorted_table(table)).drop(KIND)

    def _old_rows(self, state: pl.DataFrame | None, touched: pl.DataFrame) -> pl.DataFrame:
        """The touched partitions' stored rows, in stored (rank) order, marked as stored."""
        if state is None:
            return touched.clear()
        old = state.join(touched, on=self.part, how="semi", nulls_equal=True, maintain_order="left")
        return old.with_columns(pl.lit(True).alias(_OLD))

    def _survivors(self, events: pl.DataFrame) -> tuple[pl.DataFrame, int]:
        """The copies alive after the sequence, and how many retractions found nothing."""
        w = pl.col(WEIGHT)
        prefix = w.cum_sum().over(self.rows, order_by=_SEQ)
        low = pl.min_horizontal(prefix.min().over(self.rows), pl.lit(0))
        final = w.sum().over(self.rows) - low
        adds_from_here = (w > 0).cast(pl.Int64).cum_sum(reverse=True).over(self.rows, order_by=_SEQ)
        marked = events.with_columns(
            ((w > 0) & (adds_from_here <= final)).alias(_KEEP),
            (-low).alias("$orphans"),
        )
        orphans = int(marked.group_by(self.rows).agg(pl.col("$orphans").first())["$orphans"].sum())
        survivors = marked.filter(pl.col(_KEEP)).drop(_KEEP, "$orphans", WEIGHT)
        if _OLD not in survivors.columns:
            survivors = survivors.with_columns(pl.lit(False).alias(_OLD))
        survivors = survivors.with_columns(pl.col(_OLD).fill_null(False))
        return survivors, orphans

    def _ranked(self, rows: pl.DataFrame) -> pl.DataFrame:
        """Rows sorted in rank order per partition, with their rank (1-based)."""
        if self.stage.ties == "last":  # the latest arrival first: new rows, latest first, then stored order
            ties = [pl.col(_OLD), pl.when(pl.col(_OLD)).then(pl.col(_SEQ)).otherwise(-pl.col(_SEQ))]
        else:
            ties = [pl.col(_SEQ)]
        ordered = rows.sort(
            [*self.part, *self._sort, *ties],
            descending=[False] * len(self.part) + self._desc + [False] * len(ties),
            nulls_last=[False] * len(self.part) + self._nulls_last + [False] * len(ties),
            maintain_order=True,
        )
        return ordered.with_columns((pl.int_range(pl.len(), dtype=pl.Int64).over(self.part) + 1).alias(_RANK))

    def _emitted(self, old: pl.DataFrame, new: pl.DataFrame, batch: pl.DataFrame) -> ChangeBatch:
        stage = self.stage
        pos = sorted(c for c in batch.columns if c.startswith(POS_PREFIX))
        in_range = pl.col(_RANK).is_between(stage.start, stage.end)
        if old.height:
            old_ranked = old.with_columns((pl.int_range(pl.len(), dtype=pl.Int64).over(self.part) + 1).alias(_RANK))
            before = old_ranked.filter(in_range).select(*self.rows, _RANK)
        else:
            before = new.clear().select(*self.rows, _RANK)
        after = new.filter(in_range).select(*self.rows, _RANK)
        if stage.output_rank:
            changes = self._per_rank(before, after)
        else:
            changes = self._per_row(before, after)
        if changes.height == 0:
            return ChangeBatch(changes=[])
        if pos:  # every change of a partition at the greatest position of its batch changes
            emit_pos = batch.sort(pos, nulls_last=False).group_by(self.part).agg(pl.struct(pos).last().alias(_EMIT_POS))
            changes = changes.join(emit_pos, on=self.part, how="left", nulls_equal=True).unnest(_EMIT_POS)
        rank = pl.col(_RANK) if stage.output_rank else pl.lit(None, pl.Int64)
        rows = changes.select(*self.rows, rank.alias(f"f{len(self.rows)}"))
        table = rows.to_arrow()
        for i, (name, t) in enumerate(zip(self.rows, self._types)):
            if t is not None:
                table = table.set_column(i, name, table.column(name).cast(t))
        return ChangeBatch.from_arrow(
            table, changes[KIND].to_arrow(), [changes[c].to_arrow() for c in pos]
        )

    def _per_rank(self, before: pl.DataFrame, after: pl.DataFrame) -> pl.DataFrame:
        """Per (partition, rank): the old row out and the new one in where they differ."""
        others = [c for c in self.rows if c not in self.part]
        # presence is marked explicitly: a row may hold only NULLs outside the partition
        b = before.rename({c: f"{c}$b" for c in others}).with_columns(pl.lit(True).alias("$b"))
        a = after.rename({c: f"{c}$a" for c in others}).with_columns(pl.lit(True).alias("$a"))
        both = b.join(a, on=[*self.part, _RANK], how="full", coalesce=True, nulls_equal=True)
        same = pl.all_horizontal([pl.col(f"{c}$b").eq_missing(pl.col(f"{c}$a")) for c in others] + [pl.lit(True)])
        changed = both.filter(~(pl.col("$b").is_not_null() & pl.col("$a").is_not_null() & same))
        update = pl.col("$b").is_not_null() & pl.col("$a").is_not_null()
        outs = changed.filter(pl.col("$b").is_not_null()).select(
            *self.part, *[pl.col(f"{c}$b").alias(c) for c in others], _RANK,
            pl.when(update).then(pl.lit(UPDATE_BEFORE)).otherwise(pl.lit(DELETE)).alias(KIND),
        )
        ins = changed.filter(pl.col("$a").is_not_null()).select(
            *self.part, *[pl.col(f"{c}$a").alias(c) for c in others], _RANK,
            pl.when(update).then(pl.lit(UPDATE_AFTER)).otherwise(pl.lit(INSERT)).alias(KIND),
        )
        return pl.concat([outs.select(*self.rows, _RANK, KIND), ins.select(*self.rows, _RANK, KIND)])

    def _per_row(self, before: pl.DataFrame, after: pl.DataFrame) -> pl.DataFrame:
        """The rows that left and entered the range (as multisets of identical rows)."""
        counts = pl.concat(
            [before.select(*self.rows, pl.lit(-1, pl.Int64).alias(_N)), after.select(*self.rows, pl.lit(1, pl.Int64).alias(_N))]
        ).group_by(self.rows, maintain_order=True).agg(pl.col(_N).sum()).filter(pl.col(_N) != 0)
        units = counts.with_columns(pl.col(_N).abs().alias("$abs"), (pl.col(_N) > 0).alias("$add"))
        units = units.select(pl.all().repeat_by("$abs")).explode(pl.all(), empty_as_null=False) if units.height else units
        if self.stage.top1:
            moves = units.with_columns(
                (pl.col("$add").any().over(self.part) & (~pl.col("$add")).any().over(self.part)).alias("$pair")
            )
            kind = (
                pl.when(pl.col("$pair"))
                .then(pl.when(pl.col("$add")).then(pl.lit(UPDATE_AFTER)).otherwise(pl.lit(UPDATE_BEFORE)))
                .otherwise(pl.when(pl.col("$add")).then(pl.lit(INSERT)).otherwise(pl.lit(DELETE)))
            )
        else:
            moves = units
            kind = pl.when(pl.col("$add")).then(pl.lit(INSERT)).otherwise(pl.lit(DELETE))
        return moves.sort("$add", maintain_order=True).select(*self.rows, pl.lit(None, pl.Int64).alias(_RANK), kind.alias(KIND))

