"""``ON CONFLICT DO DEDUPLICATE`` over a whole batch and a stored bucket: polars over the
batch and the state table, no Python per PK or per change.

The per-key stage (``SinkMaterializer._deduplicate``, Flink's ``SinkUpsertMaterializer``)
applies a PK's changes one by one, in the canonical order, to its list of active rows
(``ActiveRows``): ordered by each row's position, an add links a row, a retraction unlinks
one, and the PK shows the list's last row. The same result, per identity (the upsert key, or
the whole row when there is none), as arithmetic over the batch:

Without an upsert key, an identity's active copies are a queue. Adds append (a batch's adds
come in position order and, checked here, no earlier than the newest stored copy), and a
retraction pops the oldest copy or, finding none, is lost. A queue only ever holds a suffix
of what was appended, so the copies left are the last ``C`` of (stored copies ++ the batch's
adds), where ``C`` is the running count reflected at zero::

    S_j = stored copies + (weights of the identity's changes up to j)
    C_j = S_j - min(0, min_{i <= j} S_i)        lost retractions = -min(0, min_j S_j)

The row's place in the list is (its newest copy's position, the moment it was last linked):
a row is linked when created and relinked when an add raises its newest position, so it was
last linked by the first add after its last empty moment (``C_j = 0``) that has its final
newest position; when no add raised it, it keeps its stored place.

With an upsert key, an add replaces the identity's row and relinks it at the add's position,
and a retraction removes it (lost if absent): the identity's last change decides, and a
retraction is lost when the change before it (or the state, for the first) left nothing.

Per PK, the rows the batch did not touch keep their stored place; the list sorted by (newest
position, link moment) ends in the PK's row, and the output is the difference between the
last row before and after (``changelog.diff_to_changes``) at the greatest position of the
PK's changes. PKs come out in the order of their first change in the batch, as the per-key
adapter orders them.

This path runs only where its arithmetic is the stage's exactly (``DeduplicateKernel.run``
returns None otherwise and the caller takes the per-PK path): where ``kernels.sink_table``
says the batch and the stored table are typed as a columnar strategy needs, and where no add
is earlier than the newest stored copy of its row (an out-of-order add would land inside a
queue).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl
import pyarrow as pa

from tidemark.engine import state_tables as T
from tidemark.engine.batch import KIND, POS_PREFIX, WEIGHT, ChangeBatch
from tidemark.engine.batch_columns import position_ranks, positions_as_lists
from tidemark.engine.kernels.sink_table import ADD as _ADD
from tidemark.engine.kernels.sink_table import ARR as _ARR
from tidemark.engine.kernels.sink_table import OP as _I
from tidemark.engine.kernels.sink_table import SIDX as _SIDX
from tidemark.engine.kernels.sink_table import SinkTableKernel

if TYPE_CHECKING:
    from tidemark.engine.stage import BatchContext

_PR = "$pr"  # a position's rank among the call's positions
_PL = "$pl"  # a position as a list
_SEQ = "$seq"  # the moment a row was last linked: stored rows by their place, then the batch's
_C0, _PR0 = "$c0", "$pr0"  # stored copies and newest position's rank
_COPIES = "$copies"
_GID = "$gid"  # an identity the batch touches, as one integer
_PL0 = "$pl0"  # a stored row's newest position as a list
_START = "$start"  # the first change of its identity (changes sorted by identity)


class DeduplicateKernel(SinkTableKernel):
    """The batch form of one DEDUPLICATE ``SinkMaterializer`` (module docstring)."""

    strategies = ("DEDUPLICATE",)

    def run(self, table: pa.Table, stored: pa.Table | None, ctx: BatchContext) -> tuple[pa.Table | None, ChangeBatch] | None:
        """(the bucket's new stored table, None when empty; the output) for the batch ``table``
        against the bucket's ``stored`` table (None: empty), or None when the batch or the state
        needs the per-PK path."""
        rows = [c for c in table.column_names if not c.startswith("$")]
        if not self._fits(table, rows, stored):
            return None
        keys = self.identity(rows)
        pk = [rows[j] for j in self.stage.pk]
        ops = self.ops(table, rows)
        nodes = self._stored_nodes(stored, rows, ops.select(pk).unique())
        depth = max([_depth(ops), _list_depth(nodes, "pos")])
        eager_ops, eager_nodes = _ranked(ops, nodes, depth)
        # from here on lazy plans, collected three times (the identities, ``_queues``, the
        # results): each eager polars call has a fixed cost, paid some thirty times otherwise.
        # One integer per identity the batch touches (null on a stored row it does not touch):
        ids = eager_ops.select(keys).unique(maintain_order=True).with_row_index(_GID).lazy()
        ops = eager_ops.lazy().join(ids, on=keys, how="left", nulls_equal=True, maintain_order="left")
        nodes = eager_nodes.lazy().join(ids, on=keys, how="left", nulls_equal=True, maintain_order="left")
        # both plans below start from these two joins: computed once, not once per collect
        ops, nodes = (frame.lazy() for frame in pl.collect_all([ops, nodes]))
        touched = nodes.filter(pl.col(_GID).is_not_null())
        n_stored = stored.num_rows if stored is not None else 0
        if self.stage.upsert_key is None:
            # an add older than its row's newest stored copy would land inside its queue
            older = ops.join(touched.select(_GID, _PR0), on=_GID).filter(pl.col(_ADD) & (pl.col(_PR) < pl.col(_PR0)))
            live, lost = self._queues(ops, touched, rows, n_stored)
        else:
            older = ops.head(0)
            live, lost = self._replacements(ops, touched, rows, n_stored)
        untouched = nodes.filter(pl.col(_GID).is_null())
        final = pl.concat(
            [untouched.select(*rows, pl.col(_PR0).alias(_PR), _PL, _COPIES, pl.col(_SIDX).alias(_SEQ)),
             live.select(*rows, _PR, _PL, _COPIES, pl.col(_SEQ).cast(pl.Int64))],
        ).sort([*pk, _PR, _SEQ], nulls_last=False, maintain_order=True)  # fmt: skip
        out = self._output(ops, nodes, final, rows, pk, table.schema)
        n_older, n_lost, final, out, read = pl.collect_all(
            [older.select(pl.len()), lost, final, out, nodes.select(_SIDX)]
        )
        if n_older.item():
            return None  # per PK
        if n_lost.item():
            ctx.metrics["retractions_without_state"] += int(n_lost.item())
        names = [*rows, KIND, WEIGHT, *(n for n in table.schema.names if n.startswith(POS_PREFIX))]
        output = ChangeBatch.from_table(out.to_arrow().cast(pa.schema([table.schema.field(n) for n in names])))
        return self._state(stored, read, final, rows), output

    # ------------------------------------------------------------------ inputs

    def _fits(self, table: pa.Table, rows: list[str], stored: pa.Table | None) -> bool:
        return self.batch_fits(table, rows) and self.stored_fits(stored, {"pos": T.POSITION, "copies": pa.list_(T.POSITION)})

    def _stored_nodes(self, stored: pa.Table | None, rows: list[str], pks: pl.DataFrame) -> pl.DataFrame:
        """The stored rows of the PKs in ``pks`` (``$sidx``: their place in the stored table,
        which keeps each PK's rows in list order), with ``pos`` and ``$copies`` (the copies'
        positions, oldest first; null for one copy)."""
        nodes = self.stored_rows(stored, rows, pks, {"pos": pl.List(pl.Int64), "copies": pl.List(pl.List(pl.Int64))})
        return nodes.rename({"copies": _COPIES})

    # ------------------------------------------------------------------ per identity

    def _queues(self, ops: pl.LazyFrame, touched: pl.LazyFrame, rows: list[str], n_stored: int) -> tuple[pl.LazyFrame, pl.LazyFrame]:
        """No upsert key: each touched identity's final row, if it keeps a copy (module
        docstring), and the lost retractions (a frame of one value). ``touched``: the stored
        rows of the touched identities."""
        # the list columns stay out of the walk's join and sort (gathering lists costs far
        # more than gathering integers): joined back per identity after the group-by
        stored = touched.select(_GID, _PR0, _SIDX, pl.col(_COPIES).list.len().fill_null(1).alias(_C0))
        stored_lists = touched.select(
            _GID, pl.col(_PL).alias(_PL0), pl.coalesce(pl.col(_COPIES), pl.col(_PL).repeat_by(1)).alias("$stored_copies")
        )
        add = pl.col(_ADD)
        walk = ops.drop(_PL).join(stored, on=_GID, how="left").sort(_GID, _I)
        walk = walk.with_columns(pl.col(_C0).fill_null(0), _segment_start())
        walk = walk.with_columns(_running_count(pl.when(add).then(pl.lit(1, pl.Int64)).otherwise(pl.lit(-1, pl.Int64))).alias("$s"))
        walk = walk.with_columns(pl.min_horizontal(pl.lit(0), _segment_cum_min(pl.col("$s"))).alias("$low"))
        walk = walk.with_columns((pl.col("$s") - pl.col("$low")).alias("$c"))
        # the last empty moment: a change that left no copy, or before the batch when the state held none
        empty_at = pl.when(pl.col("$c") == 0).then(pl.col(_I)).max().over(_GID)
        walk = walk.with_columns(
            pl.when(pl.col(_C0) == 0).then(pl.coalesce(empty_at, pl.lit(-1, pl.Int64))).otherwise(empty_at).alias("$z"),
            pl.when(add).then(pl.col(_PR)).max().over(_GID).alias("$p_last"),  # adds come in position order
        )
        linked = add & (pl.col("$z").is_null() | (pl.col(_I) > pl.col("$z"))) & (pl.col(_PR) == pl.col("$p_last"))
        raised = pl.col("$z").is_not_null() | (pl.col("$p_last") > pl.col(_PR0))
        # the walk is in ``_I`` order and its adds in position order, so an identity's first or
        # last change of a kind is the least or greatest of a masked column (a plain
        # aggregation; a filter inside the groups runs several times slower)
        walk = walk.with_columns(
            pl.when(linked & raised).then(pl.col(_I)).alias("$linked"),
            pl.when(add).then(pl.col(_PR)).alias("$pr_new"),
            pl.when(add).then(pl.col(_I)).alias("$i_new"),
        )
        per_id = walk.group_by(_GID, maintain_order=True).agg(
            *(pl.col(c).first() for c in rows),
            pl.col("$c").last(),
            (-pl.col("$low").min()).alias("$lost"),
            pl.col("$linked").min(), pl.col("$pr_new").max(), pl.col("$i_new").max(),
            pl.col(_SIDX).first(), pl.col(_PR0).first(),
        )  # fmt: skip
        lost = per_id.select(pl.col("$lost").sum())
        live = (
            per_id.filter(pl.col("$c") > 0)
            .join(stored_lists, on=_GID, how="left", maintain_order="left")
            .join(ops.select(pl.col(_I).alias("$i_new"), pl.col(_PL).alias("$pl_new")), on="$i_new", how="left",
                  maintain_order="left")
            .select(
                *rows, _GID, "$c", "$stored_copies",
                pl.coalesce("$pr_new", _PR0).alias(_PR),
                pl.coalesce("$pl_new", _PL0).alias(_PL),  # the newest copy: the last add, else the stored newest
                pl.lit(None).cast(pl.List(pl.List(pl.Int64))).alias(_COPIES),
                pl.coalesce(pl.col("$linked") + n_stored, _SIDX).alias(_SEQ),
            )
        )  # fmt: skip
        live, lost = pl.collect_all([live, lost])
        return self._with_copies(live, ops).lazy(), lost.lazy()

    @staticmethod
    def _with_copies(live: pl.DataFrame, ops: pl.LazyFrame) -> pl.DataFrame:
        """Identities left with several identical copies: the last ``$c`` of (stored copies ++
        the batch's adds, which ``ops`` holds in order); rare, so computed only when there are
        some."""
        several = live.filter(pl.col("$c") > 1)
        if several.height == 0:
            return live
        adds = ops.filter(pl.col(_ADD)).join(several.lazy().select(_GID), on=_GID, how="semi").group_by(_GID).agg(
            pl.col(_PL).alias("$adds")
        ).collect()
        none = pl.lit([], pl.List(pl.List(pl.Int64)))
        copies = several.join(adds, on=_GID, how="left").select(
            _GID,
            pl.concat_list(pl.col("$stored_copies").fill_null(none), pl.col("$adds").fill_null(none))
            .list.tail(pl.col("$c")).alias("$all"),
        )  # fmt: skip
        return live.join(copies, on=_GID, how="left", maintain_order="left").with_columns(
            pl.coalesce("$all", _COPIES).alias(_COPIES)
        )

    def _replacements(self, ops: pl.LazyFrame, touched: pl.LazyFrame, rows: list[str], n_stored: int) -> tuple[pl.LazyFrame, pl.LazyFrame]:
        """With an upsert key: each touched identity's final row (its last change, if an add),
        and the lost retractions (module docstring)."""
        add = pl.col(_ADD)
        walk = ops.join(touched.select(_GID, _SIDX), on=_GID, how="left", maintain_order="left")
        before = pl.col(_ADD).shift(1).over(_GID)
        present = pl.when(before.is_null()).then(pl.col(_SIDX).is_not_null()).otherwise(before)
        lost = walk.select((~add & ~present).sum())
        last = walk.group_by(_GID, maintain_order=True).agg(pl.col(c).last() for c in [*rows, _ADD, _PR, _PL, _I])
        live = last.filter(add).select(
            *rows, _PR, _PL, pl.lit(None).cast(pl.List(pl.List(pl.Int64))).alias(_COPIES), (pl.col(_I) + n_stored).alias(_SEQ)
        )
        return live, lost

    # ------------------------------------------------------------------ results

    def _output(self, ops: pl.LazyFrame, nodes: pl.LazyFrame, final: pl.LazyFrame, rows: list[str], pk: list[str],
                schema: pa.Schema) -> pl.LazyFrame:
        """Per touched PK, the diff between its last row before and after, at the greatest
        position of its changes; PKs in the order of their first change."""
        pos = [n for n in schema.names if n.startswith(POS_PREFIX)]
        old_names = {c: f"$old{j}" for j, c in enumerate(rows)}
        new_names = {c: f"$new{j}" for j, c in enumerate(rows)}
        touched = ops.group_by(pk, maintain_order=True).agg(
            pl.col(_ARR).min().alias("$first"), *(pl.col(p).last() for p in pos)  # ops are in ``_I`` order
        )
        old = nodes.sort(_SIDX).group_by(pk).agg(*(pl.col(c).last().alias(old_names[c]) for c in rows), pl.lit(True).alias("$had"))
        new = final.group_by(pk).agg(*(pl.col(c).last().alias(new_names[c]) for c in rows), pl.lit(True).alias("$has"))
        both = touched.join(old, on=pk, how="left", nulls_equal=True).join(new, on=pk, how="left", nulls_equal=True)
        had, has = pl.col("$had").fill_null(False), pl.col("$has").fill_null(False)
        same = had & has & pl.all_horizontal(pl.col(old_names[c]).eq_missing(pl.col(new_names[c])) for c in rows)
        retract = both.filter(had & ~same).select(
            "$first", pl.lit(0).alias("$part"), *(pl.col(old_names[c]).alias(c) for c in rows),
            pl.when(has).then(pl.lit("-U")).otherwise(pl.lit("-D")).alias(KIND), pl.lit(-1, pl.Int64).alias(WEIGHT), *pos,
        )  # fmt: skip
        insert = both.filter(has & ~same).select(
            "$first", pl.lit(1).alias("$part"), *(pl.col(new_names[c]).alias(c) for c in rows),
            pl.when(had).then(pl.lit("+U")).otherwise(pl.lit("+I")).alias(KIND), pl.lit(1, pl.Int64).alias(WEIGHT), *pos,
        )  # fmt: skip
        return pl.concat([retract, insert]).sort("$first", "$part").select(*rows, KIND, WEIGHT, *pos)

    def _state(self, stored: pa.Table | None, read: pl.DataFrame, final: pl.DataFrame, rows: list[str]) -> pa.Table | None:
        """The bucket's table: the untouched PKs' rows as stored, the touched PKs' rows (``final``,
        in list order; ``read``: the stored rows they replace), sorted by PK as
        ``SinkMaterializer`` stores them."""
        written = pa.table({
            "row": self.row_struct(final, rows),
            "pos": final.get_column(_PL).to_arrow().cast(T.POSITION),
            "copies": final.get_column(_COPIES).to_arrow().cast(pa.list_(T.POSITION)),
        })  # fmt: skip
        return self.merged(stored, read.get_column(_SIDX), written)


def _segment_start() -> pl.Expr:
    """Over changes sorted by identity: whether a change is its identity's first."""
    return (pl.col(_GID) != pl.col(_GID).shift(1)).fill_null(True).alias(_START)


def _running_count(weights: pl.Expr) -> pl.Expr:
    """``S_j``: the stored copies plus the identity's weights up to each change, as one scan
    over the whole sorted batch rather than a window per identity."""
    total = weights.cum_sum()
    before = pl.when(pl.col(_START)).then(total - weights).forward_fill()
    return pl.col(_C0) + total - before


def _segment_cum_min(values: pl.Expr) -> pl.Expr:
    """The running minimum within each identity, as one scan: each identity's values are
    lowered by an offset that grows with its place, so a running minimum never carries
    across an identity's start; the offset is then added back. ``values`` stay far below
    the offset step (they count one batch's changes)."""
    step = pl.lit(2**32, pl.Int64)
    offset = pl.col(_START).cast(pl.Int64).cum_sum() * step
    return (values - offset).cum_min() + offset


def _depth(ops: pl.DataFrame) -> int:
    return sum(c.startswith(POS_PREFIX) for c in ops.columns)


def _list_depth(nodes: pl.DataFrame, column: str) -> int:
    if nodes.height == 0:
        return 0
    return int(nodes.select(pl.col(column).list.len().max()).item() or 0)


def _ranked(ops: pl.DataFrame, nodes: pl.DataFrame, depth: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``$pr`` on the changes and ``$pr0`` on the stored rows: ranks that compare as their
    positions do (field by field, a shorter position first), and ``$pl``, each position as a
    list."""
    cols = [f"{POS_PREFIX}{i}" for i in range(max(depth, 1))]
    ops = ops.with_columns(pl.lit(None, pl.Int64).alias(c) for c in cols if c not in ops.columns)
    padded_ops = ops.select(pl.col(c).cast(pl.Int64) for c in cols)
    padded_nodes = nodes.select(pl.col("pos").list.get(i, null_on_oob=True).alias(c) for i, c in enumerate(cols))
    ranks, _ = position_ranks(pl.concat([padded_ops, padded_nodes]))
    as_list = positions_as_lists(padded_ops)
    ops = ops.with_columns(ranks.slice(0, ops.height).alias(_PR), as_list.alias(_PL))
    nodes = nodes.with_columns(ranks.slice(ops.height, nodes.height).alias(_PR0), pl.col("pos").alias(_PL))
    return ops, nodes
