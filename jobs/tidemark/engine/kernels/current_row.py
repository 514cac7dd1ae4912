"""``ON CONFLICT DO NOTHING | DO ERROR`` over a whole batch and a stored bucket: polars over
the batch and the state table, no Python per PK or per change.

The per-key stage (``SinkMaterializer._single_row``, Flink's watermark-compacting
materializer with one batch as one compaction step) first cancels exact ``+X``/``-X`` pairs,
then starts a PK's list from its current row and applies the rest in the canonical order: an
add appends a new identity (the upsert key, or the whole row) or, for one already listed,
replaces its row in place (with an upsert key) or counts one more copy (without); a
retraction removes its identity (or one copy), or finds none and is lost. Then 0 rows left
delete the PK, 1 row is the new current row, and more than 1 is a conflict: ERROR raises,
NOTHING keeps the list's first row.

The same, per identity, as arithmetic over the batch: the current row is an event before the
batch's first change (an add of its identity), and an identity's count after each event is
the running count held at zero (without an upsert key; with one, 1 after an add and 0 after
a retraction). A retraction at count 0 is lost. An identity's place in the list is the event
that last took its count from 0 to 1, so the current row, never removed, stays first. Per PK:
the total count of the identities left, the first of them, and what the stage keeps of the
current row's dropped copies (``CurrentRow.dropped``: the first row is still the current one
only if no event removed or replaced it).

Runs where ``kernels.sink_table`` says the batch and the stored table fit; otherwise
``CurrentRowKernel.run`` returns None and the caller takes the per-PK path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl
import pyarrow as pa

from tidemark.engine.batch import KIND, POS_PREFIX, WEIGHT, ChangeBatch
from tidemark.engine.batch_columns import rows_of
from tidemark.engine.errors import ConflictError
from tidemark.engine.kernels.sink_table import ADD, ARR, OP, SIDX, SinkTableKernel

if TYPE_CHECKING:
    from tidemark.engine.stage import BatchContext

_GID = "$gid"  # an identity of a touched PK, as one integer
_START = "$start"
_C = "$c"  # the identity's count after the event
_INIT = "$init"  # the event is the PK's current row, before the batch
_BORN = "$born"  # the event took the identity's count from 0 to 1


class CurrentRowKernel(SinkTableKernel):
    """The batch form of one NOTHING or ERROR ``SinkMaterializer`` (module docstring)."""

    strategies = ("NOTHING", "ERROR")

    def run(self, table: pa.Table, stored: pa.Table | None, ctx: BatchContext) -> tuple[pa.Table | None, ChangeBatch] | None:
        """(the bucket's new stored table, None when empty; the output) for the batch ``table``
        against the bucket's ``stored`` table (None: empty), or None when they need the
        per-PK path. Raises ``ConflictError`` for DO ERROR as the per-PK path does."""
        rows = [c for c in table.column_names if not c.startswith("$")]
        if not self.batch_fits(table, rows) or not (
            self.stored_fits(stored, {}) or self.stored_fits(stored, {"dropped": pa.int64()})
        ):
            return None
        pk = [rows[j] for j in self.stage.pk]
        keys = self.identity(rows)
        pos = [c for c in table.column_names if c.startswith(POS_PREFIX)]
        ops = self.ops(table, rows)
        current = self.stored_rows(stored, rows, ops.select(pk).unique(), {"dropped": pl.Int64})
        if "dropped" not in current.columns:
            current = current.with_columns(pl.lit(0, pl.Int64).alias("dropped"))
        touched = ops.group_by(pk, maintain_order=True).agg(
            pl.col(ARR).min().alias("$first"), *(pl.col(p).last() for p in pos)  # ops are in ``OP`` order
        )
        walk = self._walk(ops.filter(survives_pair_cancelling(ops, rows)), current, rows, pk, keys)
        lost = int(walk.select(pl.col("$lost").sum()).item() or 0)
        if lost:
            ctx.metrics["retractions_without_state"] += lost
        per_pk = self._per_pk(walk, current, rows, pk)
        decided = touched.join(per_pk, on=pk, how="left", nulls_equal=True).join(
            current.select(*pk, *(pl.col(c).alias(f"$old.{c}") for c in rows if c not in pk), "dropped", SIDX),
            on=pk, how="left", nulls_equal=True,
        ).sort("$first")
        decided = self._decide(decided, rows, pk, ctx)
        return self._state(stored, current, decided, rows), self._output(decided, rows, pk, pos, table.schema)

    # ------------------------------------------------------------------ per identity

    def _walk(self, ops: pl.DataFrame, current: pl.DataFrame, rows: list[str], pk: list[str],
              keys: list[str]) -> pl.DataFrame:
        """One row per identity of a touched PK: its count at the end (``$c``), the moment it
        last went from 0 to 1 (``$born``: -1 for the current row), whether it is still the
        current row, unreplaced (``$unchanged``), its row, its lost retractions and (on the
        current row's identity) the retractions of it (``$retracted``)."""
        init = current.select(*rows, pl.lit(-1, pl.Int64).alias(OP), pl.lit(True).alias(ADD), pl.lit(True).alias(_INIT))
        events = pl.concat([init, ops.select(*rows, OP, ADD, pl.lit(False).alias(_INIT))])
        ids = events.select(keys).unique(maintain_order=True).with_row_index(_GID)
        events = events.join(ids, on=keys, how="left", nulls_equal=True).sort(_GID, OP)
        add = pl.col(ADD)
        start = (pl.col(_GID) != pl.col(_GID).shift(1)).fill_null(True)
        events = events.with_columns(start.alias(_START))
        if self.stage.upsert_key is None:
            w = pl.when(add).then(pl.lit(1, pl.Int64)).otherwise(pl.lit(-1, pl.Int64))
            total = w.cum_sum()
            running = total - pl.when(pl.col(_START)).then(total - w).forward_fill()
            step = pl.lit(2**32, pl.Int64)
            offset = pl.col(_START).cast(pl.Int64).cum_sum() * step
            low = pl.min_horizontal(pl.lit(0, pl.Int64), (running - offset).cum_min() + offset)
            events = events.with_columns((running - low).alias(_C), low.alias("$low"))
            before = pl.when(pl.col(_START)).then(pl.lit(0, pl.Int64)).otherwise(pl.col(_C).shift(1))
            lost_at = (~add) & (before == 0)
        else:
            events = events.with_columns(pl.when(add).then(pl.lit(1, pl.Int64)).otherwise(pl.lit(0, pl.Int64)).alias(_C))
            before = pl.when(pl.col(_START)).then(pl.lit(0, pl.Int64)).otherwise(pl.col(_C).shift(1))
            lost_at = (~add) & (before == 0)
        events = events.with_columns(lost_at.alias("$lost_at"), (add & (before == 0)).alias(_BORN))
        return events.group_by(_GID, maintain_order=True).agg(
            *(pl.col(c).last() for c in rows),  # with an upsert key, the last add's row: a replacement
            pl.col(_C).last(),
            pl.col(OP).filter(pl.col(_BORN)).last().alias("$born"),
            (pl.col(_INIT).first() & (pl.col(OP).filter(pl.col(_BORN)).last() == -1)).alias("$current"),
            pl.col(_INIT).first().alias("$was_current"),
            pl.col(OP).last().alias("$last_op"),
            pl.col("$lost_at").sum().alias("$lost"),
            (~add).sum().alias("$retracted"),
        )

    def _per_pk(self, walk: pl.DataFrame, current: pl.DataFrame, rows: list[str], pk: list[str]) -> pl.DataFrame:
        """Per touched PK: the total count left, the first row of the list with its count and
        whether it is the current row unreplaced, the second active row (for DO ERROR's
        message), whether the current row's identity is still listed and how many
        retractions named it."""
        alive = walk.filter(pl.col(_C) > 0).sort(*pk, "$born")
        unreplaced = pl.col("$current") & ((self.stage.upsert_key is None) | (pl.col("$last_op") == -1))
        first = alive.group_by(pk, maintain_order=True).agg(
            pl.col(_C).sum().alias("$total"),
            *(pl.col(c).first().alias(f"$new.{c}") for c in rows if c not in pk),
            pl.col(_C).first().alias("$count"),
            unreplaced.first().alias("$unreplaced"),
            *(pl.col(c).slice(1, 1).first().alias(f"$second.{c}") for c in rows if c not in pk),
            pl.col("$was_current").any().alias("$current_alive"),
        )
        retracted = walk.filter(pl.col("$was_current")).select(*pk, pl.col("$retracted"))
        return first.join(retracted, on=pk, how="full", coalesce=True, nulls_equal=True)

    # ------------------------------------------------------------------ per PK

    def _decide(self, decided: pl.DataFrame, rows: list[str], pk: list[str], ctx: BatchContext) -> pl.DataFrame:
        """Each touched PK's new row (``$new.*``; none: ``$keep`` false) and dropped count,
        and whether the sink's row changes; DO ERROR raises at the first conflicting PK."""
        total = pl.col("$total").fill_null(0)
        had = pl.col(SIDX).is_not_null()
        if self.stage.strategy == "ERROR":
            conflicts = decided.filter(total > 1)
            if conflicts.height:
                raise self._conflict(conflicts.head(1), rows, pk)
        dropped = pl.col("dropped").fill_null(0)
        retracted = pl.col("$retracted").fill_null(0)
        # NOTHING: every retraction of the shown row may have meant a dropped copy: still active
        stale = (total > 1) & had & ~pl.col("$current_alive").fill_null(False) & (retracted > 0) & (retracted <= dropped)
        if self.stage.strategy == "NOTHING":
            n = decided.select(
                pl.when(total > 1).then(total - 1).otherwise(0).sum() + stale.cast(pl.Int64).sum()
            ).item()
            if n:
                ctx.metrics["conflicts_dropped"] += int(n)
        keep_copies = pl.when(pl.col("$unreplaced").fill_null(False)).then(dropped).otherwise(0)
        own = (pl.col("$count") - 1) if self.stage.upsert_key is None else pl.lit(0, pl.Int64)
        others = [c for c in rows if c not in pk]
        return decided.with_columns(
            stale.alias("$stale"),
            (total > 0).alias("$keep"),
            pl.when(stale).then(dropped - retracted).otherwise(keep_copies + own).alias("$dropped"),
        ).with_columns(
            *(pl.when(pl.col("$stale")).then(pl.col(f"$old.{c}")).otherwise(pl.col(f"$new.{c}")).alias(f"$new.{c}")
              for c in others),
        )  # fmt: skip

    def _conflict(self, first: pl.DataFrame, rows: list[str], pk: list[str]) -> ConflictError:
        """The per-PK path's error for the PK of ``first``: its first two active rows."""

        def row(prefix: str) -> tuple:
            values = first.select(*(pl.col(c) if c in pk else pl.col(f"{prefix}{c}").alias(c) for c in rows))
            return rows_of(values.to_arrow().cast(pa.schema(zip(rows, self.types))))[0]

        a = row("$new.")
        b = a if first.get_column("$count").item() > 1 else row("$second.")
        key = rows_of(first.select(pk).to_arrow().cast(pa.schema([(c, self.types[rows.index(c)]) for c in pk])))[0]
        return ConflictError(self.stage.table, dict(zip(self.stage.pk_names, key)), f"active rows {a!r} and {b!r}")

    # ------------------------------------------------------------------ results

    def _output(self, decided: pl.DataFrame, rows: list[str], pk: list[str], pos: list[str],
                schema: pa.Schema) -> ChangeBatch:
        """Per touched PK, the diff between the row it showed and the one it shows now, at the
        greatest position of its changes; PKs in the order of their first change."""
        others = [c for c in rows if c not in pk]
        had = pl.col(SIDX).is_not_null()
        has = pl.col("$keep")
        same = had & has & pl.all_horizontal(
            [pl.col(f"$old.{c}").eq_missing(pl.col(f"$new.{c}")) for c in others] or [pl.lit(True)]
        )
        row = lambda prefix: [pl.col(c) if c in pk else pl.col(f"{prefix}{c}").alias(c) for c in rows]  # noqa: E731
        retract = decided.filter(had & ~same).select(
            "$first", pl.lit(0).alias("$part"), *row("$old."),
            pl.when(has).then(pl.lit("-U")).otherwise(pl.lit("-D")).alias(KIND), pl.lit(-1, pl.Int64).alias(WEIGHT), *pos,
        )  # fmt: skip
        insert = decided.filter(has & ~same).select(
            "$first", pl.lit(1).alias("$part"), *row("$new."),
            pl.when(had).then(pl.lit("+U")).otherwise(pl.lit("+I")).alias(KIND), pl.lit(1, pl.Int64).alias(WEIGHT), *pos,
        )  # fmt: skip
        out = pl.concat([retract, insert]).sort("$first", "$part")
        names = [*rows, KIND, WEIGHT, *pos]
        return ChangeBatch.from_table(out.select(names).to_arrow().cast(pa.schema([schema.field(n) for n in names])))

    def _state(self, stored: pa.Table | None, current: pl.DataFrame, decided: pl.DataFrame,
               rows: list[str]) -> pa.Table | None:
        """The bucket's table: the untouched PKs' rows as stored, each touched PK's new row
        and dropped copies; ``dropped`` only when a row has some, as ``SinkMaterializer``
        stores it."""
        kept = decided.filter(pl.col("$keep")).select(
            *(pl.col(c) if c in [rows[j] for j in self.stage.pk] else pl.col(f"$new.{c}").alias(c) for c in rows),
            pl.col("$dropped").cast(pl.Int64).alias("dropped"),
        )
        written = pa.table({"row": self.row_struct(kept, rows), "dropped": kept.get_column("dropped").to_arrow()})
        parts_stored = stored
        if stored is not None and "dropped" not in stored.column_names:
            parts_stored = stored.append_column("dropped", pa.array([0] * stored.num_rows, pa.int64()))
        merged = self.merged(parts_stored, current.get_column(SIDX), written)
        if merged is None:
            return None
        if not merged.column("dropped").to_numpy().any():
            merged = merged.drop_columns(["dropped"])
        return merged


def survives_pair_cancelling(frame: pl.DataFrame, rows: list[str]) -> pl.Series:
    """Over a batch in the canonical order (``frame``, with ``$add``): per distinct row,
    ``k = min(adds, retractions)`` pairs cancel; the adds after the first ``k`` and the
    retractions before the last ``k`` survive (``materializer.consolidate``). A row's place
    among its copies of the same sign is a window over each group, far costlier than the
    counts: it is taken only for the rows that have pairs, usually a few."""
    add = pl.col(ADD)
    n_ret = (~add).sum().over(rows)
    counts = frame.select(pl.min_horizontal(add.sum().over(rows), n_ret).alias("$k"), n_ret.alias("$n_ret"))
    keep = pl.repeat(True, frame.height, dtype=pl.Boolean, eager=True).alias("$keep")
    paired = (counts["$k"] > 0).arg_true()
    if paired.len() == 0:
        return keep
    k, n_ret = pl.col("$k"), pl.col("$n_ret")
    rank = pl.int_range(pl.len()).over([*rows, ADD])  # the group's rows are all in ``paired``, in order
    kept = frame[paired].hstack(counts[paired]).select(pl.when(add).then(rank >= k).otherwise(rank < n_ret - k))
    return keep.scatter(paired, kept.to_series())
