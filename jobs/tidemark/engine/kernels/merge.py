"""The merge engine sink (``tidemark.engine.stages.merge``) under the batch contract, for the
engines whose fold is a choice per column of one record or an aggregate over a key's
records: ``deduplicate`` (the last record in merge order, with or without ``sequence.field``),
``first-row`` (the first add), ``partial-update`` (per column, the last non-null value;
per sequence group, the last update of its greatest sequence) and ``aggregation`` with the
functions of ``FUNCTIONS``, with any changelog producer. One polars pass per batch; the
other engines, and the cases below, take the per-key path.

Per key, the per-key stage cancels exact ``+X``/``-X`` pairs, orders what is left together with
the stored item by (sequence, position, retractions before adds), the stored item ahead of a
record of its own sequence and position, and folds. The stored item is the key's row or, with
``sequence.field``, the record that deleted it (its tombstone). That order is rank arithmetic:

- Cancelling: per distinct row, ``n = min(adds, retractions)``; the ``n`` adds and the ``n``
  retractions of smallest (position, kind) go. A sort by (position, kind) and a running count
  per (row, sign) pick them.
- The merge rank: a dense rank of (sequence fields, position) over the batch's records and the
  stored items together, the sequence fields nulls first, ascending or descending as
  ``sequence.field.sort-order`` says (without a sequence field, the position's rank).
- ``deduplicate``: the last of the key's remaining records, by (merge rank, sign), unless the
  stored item's merge rank is greater (the stored item then folds last and stays). An add
  leaves its row; a retraction leaves none, and with ``sequence.field`` it is the key's new
  tombstone.
- ``first-row``: the stored row if there is one, else the first remaining add.
- ``partial-update``: the key's items (records and stored item) after its last ``-D`` by
  (merge rank, sign); per value column, the last non-null value of their adds. With no add
  after it, a ``-D`` that is the last item is the tombstone, and a ``-U`` after it (ignored
  under ``partial-update.remove-record-on-delete``) leaves a row of nulls if the key had an add
  anywhere in the fold. A retraction without ``ignore-delete`` or that option is an error the
  per-key path reports, and a tie of two items decides columns, so both take that path. A
  sequence group's columns (its sequence fields and members) are those of the last item of
  the greatest group sequence that is not all null, the members null if it is a retraction
  (``_group_winner``); a member with one of the functions whose fold does not depend on the
  order of its items (``_ORDERLESS``) folds every item that names the group's sequence, and a
  ``last_value`` member is the value of the last add that moved the sequence or null after a
  later retraction. Groups with other functions, and calls with a ``-D`` under
  ``partial-update.remove-record-on-sequence-group``, take the per-key path.
- ``aggregation``: the key's items (stored row or tombstone, and records) in merge order,
  under ``aggregation.remove-record-on-delete`` those after its last ``-D`` (a ``-D`` that
  is the last item deletes the row); per value column its function over them
  (``_aggregated_keys``), retractions folded by ``sum``, ``count``, ``last_value`` and
  ``last_non_null_value`` and dropped under ``ignore-retract``; a sequence field takes the
  last add's value; ``product`` multiplies the non-null values of the adds and ``listagg``
  joins their non-blank ones. ``listagg`` with ``distinct`` keeps the first non-blank value
  whole and appends, in merge order, each later token (a value split on the delimiter) that
  is not blank and occurs nowhere earlier among the key's tokens: the per-key fold's "tokens
  not yet present", since a token it skips is one it has seen and every token it appends it
  has seen from then on (``_distinct_listagg``; a delimiter of one character, for which
  splitting the joined string gives back the tokens joined; a longer one can make tokens across a
  join and takes the per-key path). A retraction of another function (an error the per-key path
  reports; for ``product`` a division whose truncation depends on the order of the items),
  a tie of two items of a key and a sum, count or product that may overflow its integer type
  (for a DECIMAL sum, its type or the 28 digits of the per-key fold's Python arithmetic) take
  the per-key path.
- The key's position: the greatest of the stored one and its remaining records'.
- Emitted, at the key's position, from the row before (``old``) and after (``new``): ``none``
  an upsert (``+I``, ``+U`` or ``-D``) when they differ; ``lookup`` ``+I``, ``-D`` or a
  ``-U``/``+U`` pair (none for an unchanged row with ``changelog-producer.row-deduplicate``,
  and never for ``first-row``); ``input`` the records as received, in the canonical order.
  A key whose records all cancel emits nothing but its ``input`` records.
- ``full-compaction``: ``lookup``'s changes, from the row emitted at the key's last barrier
  to the row after, for the keys whose barrier is now (``_compacted``): the keys with records
  left after cancelling, pending since this call's time unless they were already, and the
  stored keys pending since an earlier interval, records or not. A key deleted before its
  barrier is stored without a row or tombstone until then: not an item of the next fold,
  only its position counts. A call with no records (a barrier alone) takes the per-key path.

The per-key path breaks a tie of two records of one sequence, position and sign by the rows'
``repr``. Where such a tie may decide the fold (the last record of ``deduplicate``, the first
add of ``first-row``, any tie of a ``partial-update`` key), and where a ``first-row`` key gets
a retraction (an error the per-key path reports), the batch takes the per-key path. So do
batches whose columns are not the stage's typed columns of types whose Arrow equality is
Python's (``state_tables.compares_as_python``: no floats, no nested values), changes of
weight other than one, stored positions of another length than the batch's, and batches of
fewer than ``min_changes`` changes.

State: the stage's ``merge-engine/1`` table, read and written as a table (``TableBucket``), so
either path reads what the other wrote, and untouched keys cost no Python (their rows are kept
as stored, the touched keys' new rows after them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from tidemark.engine.batch import KIND, POS_PREFIX, WEIGHT, ChangeBatch
from tidemark.engine.batch_columns import position_ranks, positions_as_lists, row_schema, sorted_table, typed_table
from tidemark.engine.changelog import DELETE, INSERT, UPDATE_AFTER, UPDATE_BEFORE
from tidemark.engine.driver import Bucket, PerKeyAdapter
from tidemark.engine.kernels.table_bucket import TableBucket
from tidemark.engine.stage import BatchContext
from tidemark.engine.stages.merge.aggregators import INT_RANGES, FieldAgg, IgnoreRetract
from tidemark.engine.stages.merge.producers import next_barrier_ms
from tidemark.engine.state_tables import POSITION, compares_as_python

if TYPE_CHECKING:
    from tidemark.engine.stages.merge.stage import MergeEngineStage

#: below this many changes a call costs less per key than the kernel's fixed polars cost
#: (``tests/bench/bench_merge_kernel.py``)
KERNEL_MIN_CHANGES = 1500
ENGINES = ("deduplicate", "first-row", "partial-update", "aggregation")
#: ``aggregation`` functions the kernel folds (``_folded_column``); ``sum``, ``count`` and
#: ``product`` on integer columns, and ``sum`` on DECIMAL ones, whose overflow (or Python's
#: rounding of a long decimal) the kernel can bound before it folds;
#: ``listagg`` with ``distinct`` only with a delimiter of one character
FUNCTIONS = frozenset({"sum", "count", "product", "max", "min", "last_value", "last_non_null_value", "first_value",
                       "first_non_null_value", "bool_and", "bool_or", "listagg"})
#: a blank ``listagg`` value (``str.strip`` leaves nothing): Python's whitespace is Unicode's
#: and the four separators U+001C-U+001F
_BLANK = r"^[\s\x1c-\x1f]*$"
PRODUCERS = ("none", "input", "lookup", "full-compaction")
_I, _ADD, _PR, _N = "$i", "$add", "$pr", "$n"  # input order, sign, position rank, rank in (row, sign)
_OLD, _NEW = "$old", "$new"  # prefixes of the row before and after, per key
_HAS_OLD, _HAS_NEW, _OPR, _NPR = "$has_old", "$has_new", "$opr", "$npr"
_TOP, _FIRST, _S = "$top", "$first", "$s"  # the kept record's merge rank, the key's first change, stored row
_MR, _OMR = "$mr", "$omr"  # merge ranks of a record and of the stored item (null: none stored)
_HAS_TOMB = "$has_tomb"  # the key's new item is a tombstone
#: ``full-compaction``: the row emitted at the last barrier after this call (its columns,
#: whether there is one), since when changes are pending, whether the barrier is now, and
#: whether the key has records left after cancelling
_EM, _HAS_EM, _DIRTY, _DUE, _APPLIED = "$em", "$has_em", "$dirty", "$due", "$applied"
_HAS_ITEM, _GPR = "$has_item", "$gpr"  # a stored row or tombstone; a stored key's position rank without either
#: a float sum of absolute values below this share of a type's bound is certainly in range
#: (float64 rounding of a sum of up to 2**20 terms stays below 2**-33 of it)
_SAFE = 1 - 2**-30
_BOUNDED = ("sum", "count", "product")
#: functions whose fold of a key's items does not depend on their order: in a sequence group
#: an older record reaches them too (``agg_reversed``), so every item that names the group's
#: sequence folds, wherever the running sequence stood
_ORDERLESS = ("sum", "product", "max", "min", "bool_and", "bool_or")
#: the functions a sequence group member may have on the kernel: the orderless ones, and
#: ``last_value``, whose fold is the last record that moved the group's sequence (or the last
#: retraction) (``_group_winner``)
_GROUP_FUNCTIONS = (*_ORDERLESS, "last_value")


def supports(stage: MergeEngineStage) -> bool:
    """Whether the kernel computes what ``stage`` does (module docstring)."""
    cfg = stage.cfg
    schema = schema_of(stage)
    if schema is None or cfg.groups and cfg.engine != "partial-update":
        return False
    members = {i for g in cfg.groups for i in g.members}  # a sequence group: _GROUP_FUNCTIONS only
    return cfg.engine in ENGINES and cfg.producer in PRODUCERS and all(
        _folds(a, schema.field(i).type) and (not cfg.groups or i in members and _inner(a).name in _GROUP_FUNCTIONS)
        for i, a in cfg.aggs.items()
    )


def _folds(agg: FieldAgg, arrow_type: pa.DataType) -> bool:
    """Whether the kernel folds ``agg`` over a column of ``arrow_type`` (``FUNCTIONS``; a
    sum, count or product needs its bounds, a ``distinct`` ``listagg`` a delimiter of one
    character)."""
    folded = _Agg.of(agg, arrow_type)
    if folded.function == "listagg":
        return not folded.distinct or len(folded.delimiter) == 1
    return folded.function in FUNCTIONS and (folded.function not in _BOUNDED or folded.bounds is not None)


def _inner(agg: FieldAgg) -> FieldAgg:
    """The function ``fields.<f>.ignore-retract`` wraps."""
    return agg.inner if isinstance(agg, IgnoreRetract) else agg


class _Agg(NamedTuple):
    """An ``aggregation`` column's function as the kernel folds it."""

    function: str
    #: ``sum``, ``count`` and ``product``: the range of the column's integer type; a ``sum``
    #: of DECIMAL(p, s), the range in which the per-key fold's Python ``Decimal`` arithmetic
    #: (28 significant digits) is exact and the type holds the result (``_decimal_bounds``)
    bounds: tuple[int, int] | None
    #: a retraction folds (``sum``, ``count``, ``last_value``, ``last_non_null_value``)
    retracts: bool
    #: a retraction takes the per-key path (an error there, or ``product``'s division, whose
    #: truncation depends on the order of the items), unless ``ignore-retract`` drops it
    refuses_retractions: bool
    #: ``listagg``'s delimiter
    delimiter: str = ","
    #: ``listagg``: only tokens not yet present are appended
    distinct: bool = False
    #: a ``sum`` over a DECIMAL column: folded as decimals, not as integers
    decimal: bool = False

    @classmethod
    def of(cls, agg: FieldAgg, arrow_type: pa.DataType) -> _Agg:
        inner, ignored = _inner(agg), isinstance(agg, IgnoreRetract)
        decimal = inner.name == "sum" and pa.types.is_decimal(arrow_type)
        bounds = INT_RANGES.get(inner.type_name or "") if inner.name in _BOUNDED else None
        if decimal:
            bounds = _decimal_bounds(arrow_type)
        retracts = inner.retractable and inner.name != "product"
        return cls(inner.name, bounds, retracts and not ignored, not retracts and not ignored,
                   getattr(inner, "delimiter", ","), getattr(inner, "distinct", False), decimal)


def _decimal_bounds(arrow_type: pa.Decimal128Type) -> tuple[int, int]:
    """The magnitudes a DECIMAL(p, s) sum stays below for the per-key fold's result to be the
    exact sum the kernel computes: fewer than ``p - s`` integer digits (the type holds it),
    and at most 28 significant digits in all (Python's default ``Decimal`` context, which
    would round a longer sum)."""
    digits = min(arrow_type.precision, 28) - arrow_type.scale
    return -(10**digits), 10**digits


class MergeKernel:
    """``process_batch`` for a ``MergeEngineStage`` that ``supports`` accepts."""

    def __init__(self, stage: MergeEngineStage, min_changes: int = 0) -> None:
        """``min_changes``: a smaller batch takes the per-key path (``KERNEL_MIN_CHANGES``)."""
        self.stage = stage
        self.name = stage.name
        self.n_inputs = 1
        self.min_changes = min_changes
        self._per_key = PerKeyAdapter(stage)
        self.schema = schema_of(stage)
        self.rows = [f"c{i}" for i in range(stage.width)]
        self.key = [self.rows[i] for i in stage.pk]
        self.first_row = stage.cfg.engine == "first-row"
        self.partial = stage.cfg.engine == "partial-update"
        self.sequence = [self.rows[i] for i in stage.cfg.sequence_fields]
        self.descending = not stage.cfg.sequence_ascending
        #: ``partial-update``'s sequence groups: (sequence columns, member columns)
        self.groups = [([self.rows[i] for i in g.seq_fields], [self.rows[i] for i in g.members]) for g in stage.cfg.groups]
        self.aggregation = stage.cfg.engine == "aggregation"
        types = self.schema.types if self.schema is not None else [pa.null()] * stage.width
        #: ``aggregation``'s value columns, and ``partial-update``'s sequence group members,
        #: with their function
        self.aggs = ({self.rows[i]: _Agg.of(a, types[i]) for i, a in stage.cfg.aggs.items()}
                     if self.aggregation or self.groups else {})

    def process_batch(
        self, inputs: Sequence[ChangeBatch], state: Bucket, ctx: BatchContext
    ) -> tuple[Bucket, ChangeBatch]:
        batch = inputs[0]
        table = typed_table(batch, self.schema) if len(batch) >= self.min_changes else None
        stored = self._stored(state) if table is not None else None
        done = self._run(table, stored, ctx) if stored is not None else None
        if done is None:
            return self._per_key.process_batch(inputs, state, ctx)
        new_state, out, metrics = done
        for name, n in metrics.items():
            ctx.metrics[name] += n
        return new_state, ChangeBatch.from_table(out)

    def next_wakeup(self, state: Bucket) -> int | None:
        """The bucket's timer (``full-compaction`` only): the barrier of its earliest key with
        changes pending, read from the stored table while nothing has read it per key."""
        if not self.stage.full:
            return None
        table = state.table if isinstance(state, TableBucket) else None
        if table is None:
            return state.next_wakeup()
        dirty = pc.min(table.column("dirty_since_ms")).as_py()
        return None if dirty is None else next_barrier_ms(dirty, self.stage.cfg.compaction_interval_ms)

    # ------------------------------------------------------------------ inputs

    def _stored(self, state: Bucket) -> pa.Table | None:
        """The bucket's stored table, typed as the stage's columns, or None (per-key path). A
        bucket the per-key path holds as a dict is written as its table first."""
        table = state.table if isinstance(state, TableBucket) else None
        if table is None:
            table = self.stage.state_to_table(state)
        row, tombstone = table.column("row"), table.column("tombstone")
        if row.type != pa.struct(list(self.schema)) or tombstone.type != row.type:
            return None
        if self.stage.full and table.column("emitted").type != row.type:
            return None
        return table

    # ------------------------------------------------------------------ the arithmetic

    def _run(self, table: pa.Table, stored: pa.Table, ctx: BatchContext) -> tuple[TableBucket, pa.Table, dict] | None:
        """(new state, emitted batch table, metrics), or None when the batch must take the
        per-key path (module docstring)."""
        cfg = self.stage.cfg
        names = [c for c in table.column_names if not c.startswith("$")]
        pos = [c for c in table.column_names if c.startswith(POS_PREFIX)]
        if not pos:
            return None
        batch = pl.from_arrow(table).rename(dict(zip(names, self.rows))).with_columns(
            pl.int_range(pl.len(), dtype=pl.Int64).alias(_I)
        )
        if batch.height and not (batch[WEIGHT].abs() == 1).all():
            return None
        metrics: dict[str, int] = {}
        if cfg.ignore_delete:
            kept = batch.filter(pl.col(WEIGHT) > 0)
            if kept.height < batch.height:
                metrics["merge_deletes_ignored"] = batch.height - kept.height
            batch = kept
        full = self.stage.full
        if not batch.height:
            if full:  # only barriers: the per-key path
                return None
            # every key keeps its row; an ``input`` producer has nothing to pass on
            return TableBucket(stored, self.stage.states_of_table), table.slice(0, 0), metrics
        items = self._items(stored)
        touched = items.join(batch.select(self.key).unique(), on=self.key, how="semi", nulls_equal=True)
        # ``full-compaction``: a key deleted since its last barrier is stored without an item
        # (no row, no tombstone: not part of the fold, only its position counts); and the keys
        # whose barrier is now, records or not
        old, ghosts = touched.filter(pl.col(_HAS_ITEM)), touched.filter(~pl.col(_HAS_ITEM))
        interval = self.stage.cfg.compaction_interval_ms
        due = items.filter(_barrier_due(pl.col(_DIRTY), ctx.now_ms, interval)) if full else items.clear()
        stored_pos = pl.concat([old.get_column("pos"), ghosts.get_column("pos"), due.get_column("pos")])
        ranks = self._ranks(batch.select(pos), stored_pos)
        if ranks is None:
            return None
        batch_ranks, stored_ranks, positions = ranks
        old_ranks = stored_ranks[: old.height]
        ghosts = ghosts.with_columns(stored_ranks[old.height : old.height + ghosts.height].alias(_GPR))
        due = due.with_columns(stored_ranks[old.height + ghosts.height :].alias(_NPR))
        batch = batch.with_columns(batch_ranks.alias(_PR), (pl.col(WEIGHT) > 0).alias(_ADD))
        effective = self._cancelled(batch)
        if batch.height > effective.height:
            metrics["merge_pairs_cancelled"] = (batch.height - effective.height) // 2
        effective, old = self._merge_ranked(effective, old.drop("pos").with_columns(old_ranks.alias(_OPR)))
        if self.partial:
            keys = self._partial_keys(effective, old)
        elif self.aggregation:
            keys = self._aggregated_keys(effective, old)
        else:
            folded = self._folded(effective)
            keys = self._keys(folded, old) if folded is not None else None
        if keys is None:
            return None
        first = batch.group_by(self.key).agg(pl.col(_I).min().alias(_FIRST))
        keys = keys.join(first, on=self.key, nulls_equal=True).sort(_FIRST)
        if ghosts.height:  # their stored entry is replaced, and their position counts
            ghosts = ghosts.select(*self.key, pl.col(_S).alias("$gs"), _GPR)
            keys = keys.join(ghosts, on=self.key, how="left", nulls_equal=True).with_columns(
                pl.coalesce(_S, "$gs").alias(_S), pl.max_horizontal(_NPR, pl.col(_GPR).fill_null(-1)).alias(_NPR),
            ).drop("$gs", _GPR)
        if full:
            keys = self._compacted(keys, due, stored, ctx.now_ms)
        emitted = self._emitted(keys, batch, table, positions, pos)
        return self._new_state(stored, keys, positions), emitted, metrics

    def _items(self, stored: pa.Table) -> pl.DataFrame:
        """The stored items: columns ``c0``... (the row, else the tombstone), ``$has_old`` (a
        row), ``pos``, the item's index in the stored table and, for ``full-compaction``, since
        when it has changes pending (``$dirty``)."""
        row = stored.column("row").combine_chunks()
        item = pl.from_arrow(pa.Table.from_struct_array(row).rename_columns(self.rows))
        is_row = pl.from_arrow(row.is_valid())
        if row.null_count:
            tombstones = pa.Table.from_struct_array(stored.column("tombstone").combine_chunks()).rename_columns(self.rows)
            item = item.with_columns(
                pl.when(is_row).then(item[c]).otherwise(pl.from_arrow(tombstones.column(c))).alias(c) for c in self.rows
            )
        has_item = is_row | pl.from_arrow(stored.column("tombstone").is_valid())
        if not has_item.all():  # a key without an item has its key columns in ``key`` only
            keys = pa.Table.from_struct_array(stored.column("key").combine_chunks())
            item = item.with_columns(
                pl.from_arrow(keys.column(j)).cast(item.schema[c]).alias(c) for j, c in enumerate(self.key)
            )
        item = item.with_columns(
            is_row.alias(_HAS_OLD), pl.from_arrow(stored.column("pos")).alias("pos"), has_item.alias(_HAS_ITEM)
        )
        if self.stage.full:
            item = item.with_columns(pl.from_arrow(stored.column("dirty_since_ms")).cast(pl.Int64).alias(_DIRTY))
        return item.with_row_index(_S)

    def _ranks(self, batch_pos: pl.DataFrame, stored_pos: pl.Series) -> tuple[pl.Series, pl.Series, pl.DataFrame] | None:
        """Position ranks of the batch's and the stored rows, and the distinct positions in
        rank order (columns named as the batch's); None when a stored position is longer than
        the batch's."""
        if len(stored_pos) and stored_pos.list.len().max() > batch_pos.width:
            return None
        frame = batch_pos
        if len(stored_pos):
            stored = pl.DataFrame([stored_pos.list.get(i, null_on_oob=True).alias(c) for i, c in enumerate(frame.columns)])
            frame = pl.concat([frame, stored.cast(frame.schema)])
        ranks, positions = position_ranks(frame)
        return ranks[: batch_pos.height], ranks[batch_pos.height :], positions

    def _cancelled(self, batch: pl.DataFrame) -> pl.DataFrame:
        """The batch without its exact ``+X``/``-X`` pairs: per distinct row, the ``n`` adds
        and ``n`` retractions of smallest (position, kind) go."""
        if batch.get_column(_ADD).all() or not batch.get_column(_ADD).any():  # one sign: no pairs
            return batch
        ranked = batch.sort(_PR, KIND, maintain_order=True).with_columns(
            pl.int_range(pl.len(), dtype=pl.Int64).over(*self.rows, _ADD).alias(_N),
            pl.min_horizontal(pl.col(_ADD).sum().over(self.rows), (~pl.col(_ADD)).sum().over(self.rows)).alias("$pairs"),
        )
        return ranked.filter(pl.col(_N) >= pl.col("$pairs")).drop(_N, "$pairs")

    def _merge_ranked(self, records: pl.DataFrame, old: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
        """``records`` and the stored items ``old`` with their merge ranks (``$mr``, ``$omr``:
        module docstring)."""
        if not self.sequence:
            return records.with_columns(pl.col(_PR).alias(_MR)), old.with_columns(pl.col(_OPR).alias(_OMR))
        both = pl.concat([
            records.select(*self.sequence, pl.col(_PR).alias("$p")),
            old.select(*self.sequence, pl.col(_OPR).alias("$p")),
        ])
        ranks = _dense_rank(both, [*self.sequence, "$p"], [self.descending] * len(self.sequence) + [False])
        return records.with_columns(ranks[: records.height].alias(_MR)), old.with_columns(ranks[records.height :].alias(_OMR))

    def _folded(self, effective: pl.DataFrame) -> pl.DataFrame | None:
        """Per key with remaining records: the record the engine keeps (``deduplicate``: the
        last by (merge rank, sign); ``first-row``: the first add), as ``$new`` columns with
        its sign and merge rank, and the greatest position rank; None when a tie decides it
        or a ``first-row`` key has a retraction."""
        if self.first_row:
            if not effective.get_column(_ADD).all():
                return None
            order = pl.col(_PR)
            pick = effective.filter(order == order.min().over(self.key))
        else:
            order = pl.col(_MR) * 2 + pl.col(_ADD).cast(pl.Int64)
            pick = effective.filter(order == order.max().over(self.key))
        if pick.select(pl.len().over(self.key).max()).item(0, 0) not in (None, 1):
            return None
        latest = effective.group_by(self.key).agg(pl.col(_PR).max().alias(_NPR))
        pick = pick.select(*self.key, *(pl.col(c).alias(_NEW + c) for c in self.rows), pl.col(_MR).alias(_TOP), pl.col(_ADD).alias(_HAS_NEW))
        return latest.join(pick, on=self.key, nulls_equal=True)

    def _keys(self, folded: pl.DataFrame, old: pl.DataFrame) -> pl.DataFrame:
        """Per key with remaining records: the row before (``$old`` columns, ``$has_old``) and
        the item after (``$new`` columns: the row, with ``$has_new``, else the tombstone), and
        the key's new position rank ``$npr``."""
        old = old.select(*self.key, *(pl.col(c).alias(_OLD + c) for c in self.rows), _OPR, _OMR, _S, _HAS_OLD)
        keys = folded.join(old, on=self.key, how="left", nulls_equal=True).with_columns(pl.col(_HAS_OLD).fill_null(False))
        if self.first_row:
            keep_old = pl.col(_HAS_OLD)
        else:
            keep_old = (pl.col(_TOP) < pl.col(_OMR)).fill_null(False)  # the stored item folds last
        keys = keys.with_columns(
            *(pl.when(keep_old).then(pl.col(_OLD + c)).otherwise(pl.col(_NEW + c)).alias(_NEW + c) for c in self.rows),
            pl.when(keep_old).then(pl.col(_HAS_OLD)).otherwise(pl.col(_HAS_NEW)).alias(_HAS_NEW),
            pl.max_horizontal(_NPR, pl.col(_OPR).fill_null(-1)).alias(_NPR),
        )
        return keys.with_columns((~pl.col(_HAS_NEW) & self.stage.keep_tombstones).alias(_HAS_TOMB))

    def _partial_keys(self, effective: pl.DataFrame, old: pl.DataFrame) -> pl.DataFrame | None:
        """``partial-update``, per key with remaining records: the columns ``_keys`` gives,
        from the key's items (its records and its stored row or tombstone) in merge order. After the last ``-D`` (a stored tombstone is one), each
        value column is the last non-null value of the adds (the stored row is an add); with
        no add after it, a ``-D`` that is the last item is the key's tombstone, and a ``-U``
        after it leaves a row of nulls if the key ever had an add. None when a retraction
        meets neither ``ignore-delete`` nor ``partial-update.remove-record-on-delete`` (the
        per-key path reports it) or when two items of a key tie in merge order. Sequence
        groups take their columns from ``_group_winner``; a retraction changes nothing else,
        and a key with no add has no row (None for a stored tombstone and for a ``-D`` under
        ``partial-update.remove-record-on-sequence-group``)."""
        cfg = self.stage.cfg
        if not (cfg.remove_record_on_delete or self.groups) and not effective.get_column(_ADD).all():
            return None
        old = old.join(effective.select(self.key).unique(), on=self.key, how="semi", nulls_equal=True)
        deletes = pl.col(KIND) == DELETE
        if self.groups and (not old.get_column(_HAS_OLD).all()
                            or cfg.remove_record_on_sequence_group and effective.select(deletes.any()).item()):
            return None
        items = pl.concat([
            effective.select(*self.rows, (pl.col(_MR) * 3 + pl.col(_ADD).cast(pl.Int64) + 1).alias("$o"),
                             pl.col(_ADD).alias("$add"), (deletes & cfg.remove_record_on_delete).alias("$del")),
            old.select(*self.rows, (pl.col(_OMR) * 3).alias("$o"), pl.col(_HAS_OLD).alias("$add"),
                       (~pl.col(_HAS_OLD)).alias("$del")),
        ])
        if items.select(pl.len().over(*self.key, "$o").max()).item(0, 0) not in (None, 1):
            return None
        items = items.with_columns(pl.col("$o").filter(pl.col("$del")).max().over(self.key).alias("$d"))
        after = pl.col("$d").is_null() | (pl.col("$o") > pl.col("$d"))
        per_key = items.group_by(self.key).agg(
            pl.col("$add").any().alias("$met"),
            (after & pl.col("$add")).any().alias("$add_after"),
            (after & ~pl.col("$add")).any().alias("$u_after"),
            pl.col("$d").first().is_not_null().alias("$has_d"),
        )
        values = [c for i, c in enumerate(self.rows) if i not in self.stage.pk]
        grouped = {c for seq, members in self.groups for c in (*seq, *members)}
        last = items.filter(after & pl.col("$add")).sort("$o").group_by(self.key).agg(
            pl.col(c).drop_nulls().last() for c in values if c not in grouped
        )
        for seq, members in self.groups:
            winner = self._group_winner(items, seq, members)
            if winner is None:
                return None
            last = last.join(winner, on=self.key, how="left", nulls_equal=True)
        deleted = items.filter(pl.col("$o") == pl.col("$d")).select(*self.key, *(pl.col(c).alias("$d_" + c) for c in values))
        keys = per_key.join(last, on=self.key, how="left", nulls_equal=True).join(
            deleted, on=self.key, how="left", nulls_equal=True
        )
        has_new = pl.col("$add_after") | (pl.col("$has_d") & pl.col("$u_after") & pl.col("$met"))
        has_tomb = pl.col("$has_d") & ~pl.col("$add_after") & ~pl.col("$u_after") & self.stage.keep_tombstones
        keys = keys.select(
            *self.key,
            *(pl.col(c).alias(_NEW + c) if c in self.key else
              pl.when(has_tomb).then(pl.col("$d_" + c)).otherwise(pl.col(c)).alias(_NEW + c) for c in self.rows),
            has_new.alias(_HAS_NEW), has_tomb.alias(_HAS_TOMB),
        )
        return self._with_old(keys, effective, old)

    def _group_winner(self, items: pl.DataFrame, seq: list[str], members: list[str]) -> pl.DataFrame | None:
        """One sequence group's columns per key: those of the last item in merge order among
        the items whose group sequence is the greatest, its members null if it is a
        retraction. An item updates the group (a retraction nulls its members) when its
        sequence is not all null and not smaller than the row's, so the last update is the
        last item of the greatest sequence; a key whose items never name one keeps its (null)
        group columns. A member with an orderless function (``_ORDERLESS``) folds every item
        that names the group's sequence, older ones too (``agg_reversed``, the same fold for
        these functions), its retractions as ``aggregation`` folds them
        (``_folded_column``); None (per-key path) for a retraction of a function that takes
        none and for a sum or product that may leave its type. A ``last_value`` member: an
        add whose sequence is not smaller than every earlier one of the key's (the running
        sequence: a newer item sets it, an older one leaves it) sets the value, an older add
        leaves it (``agg_reversed`` keeps the later value), and every retraction nulls it
        unless ``ignore-retract`` drops it; so it is the value at the last of those events,
        null if that is a retraction or there is none."""
        said = items.filter(pl.any_horizontal(pl.col(c).is_not_null() for c in seq))
        said = said.with_columns(_dense_rank(said, seq, [False] * len(seq)).alias("$g"))
        top = said.filter(pl.col("$g") == pl.col("$g").max().over(self.key))
        top = top.filter(pl.col("$o") == pl.col("$o").max().over(self.key))
        folded = {c: self.aggs[c] for c in members if c in self.aggs and self.aggs[c].function in _ORDERLESS}
        last = {c: self.aggs[c] for c in members if c in self.aggs and self.aggs[c].function == "last_value"}
        top = top.select(*self.key, *seq, *(pl.when(pl.col("$add")).then(pl.col(c)).alias(c)
                                            for c in members if c not in folded and c not in last))
        if last:
            prior = pl.col("$g").cum_max().shift(1).over(self.key)
            events = said.sort("$o").with_columns((prior.is_null() | (pl.col("$g") >= prior)).alias("$newer"))
            add = pl.col("$add")
            values = events.group_by(self.key).agg(
                pl.when(add).then(pl.col(c)).filter(add & pl.col("$newer") | ~add & a.retracts).last().alias(c)
                for c, a in last.items()
            )
            top = top.join(values, on=self.key, how="left", nulls_equal=True)
        if not folded:
            return top
        if any(a.refuses_retractions for a in folded.values()) and not said.get_column("$add").all():
            return None
        said = said.with_columns(_counted(pl.col(c), a).alias(c) for c, a in folded.items() if a.function == "sum")
        bounded = {c: a for c, a in folded.items() if a.bounds is not None}
        if bounded and _may_overflow(said, self.key, bounded):
            return None
        add = pl.col("$add")
        values = said.group_by(self.key).agg(
            _folded_column(pl.col(c), add, a).cast(items.schema[c]).alias(c) for c, a in folded.items()
        )
        return top.join(values, on=self.key, how="left", nulls_equal=True)

    def _aggregated_keys(self, effective: pl.DataFrame, old: pl.DataFrame) -> pl.DataFrame | None:
        """``aggregation``, per key with remaining records: the columns ``_keys`` gives. The
        key's items are its records and its stored row (an add) or tombstone (a ``-D``) in
        merge order; under ``aggregation.remove-record-on-delete`` only the items after its
        last ``-D`` fold, and a ``-D`` that is the last item deletes the row (with
        ``sequence.field`` it is the key's tombstone). Each value column folds with its
        function (``_folded_column``) over its items: the adds, and for ``sum``, ``count``,
        ``last_value`` and ``last_non_null_value`` the retractions too unless
        ``fields.<f>.ignore-retract`` drops them. A sequence field takes the last add's value.
        None (per-key path) for a retraction of a function that takes none (an error there;
        ``product``'s divides), two items of a key that tie in merge order, and a sum, count or
        product that may overflow its integer type at any step (the per-key path reports it)."""
        old = old.join(effective.select(self.key).unique(), on=self.key, how="semi", nulls_equal=True)
        remove = self.stage.cfg.aggregation_remove_record_on_delete
        deletes = (pl.col(KIND) == DELETE) & remove
        retracts = (~pl.col(_ADD) & ~deletes).any()
        if effective.select(retracts).item() and any(a.refuses_retractions for a in self.aggs.values()):
            return None
        items = pl.concat([
            effective.select(*self.rows, (pl.col(_MR) * 3 + pl.col(_ADD).cast(pl.Int64) + 1).alias("$o"),
                             pl.col(_ADD).alias("$add"), deletes.alias("$del"), pl.lit(False).alias("$state")),
            old.select(*self.rows, (pl.col(_OMR) * 3).alias("$o"), pl.col(_HAS_OLD).alias("$add"),
                       (~pl.col(_HAS_OLD)).alias("$del"), pl.lit(True).alias("$state")),
        ]).sort("$o")
        if items.select(pl.len().over(*self.key, "$o").max()).item(0, 0) not in (None, 1):
            return None
        schema = items.schema
        added = [c for c, a in self.aggs.items() if a.function in ("sum", "count")]
        items = items.with_columns(_counted(pl.col(c), self.aggs[c]).alias(c) for c in added)
        bounded = [c for c, a in self.aggs.items() if a.bounds is not None]
        if bounded and _may_overflow(items, self.key, {c: self.aggs[c] for c in bounded}):
            return None
        items = items.with_columns(pl.col("$o").filter(pl.col("$del")).max().over(self.key).alias("$d"))
        after = pl.col("$d").is_null() | (pl.col("$o") > pl.col("$d"))
        add = pl.col("$add")
        distinct = [c for c, a in self.aggs.items() if a.function == "listagg" and a.distinct]
        folding = items.filter(after)
        folded = folding.group_by(self.key, maintain_order=True).agg(
            *(_folded_column(pl.col(c), add, self.aggs[c]) if c in self.aggs else pl.col(c).filter(add).last()
              for c in self.rows if c not in self.key and c not in distinct)
        )
        for c in distinct:
            joined = _distinct_listagg(folding.filter(add), self.key, c, self.aggs[c].delimiter)
            folded = folded.join(joined, on=self.key, how="left", nulls_equal=True)
        values = [c for c in self.rows if c not in self.key]
        deleted = items.filter(pl.col("$o") == pl.col("$d")).select(*self.key, *(pl.col(c).alias("$d_" + c) for c in values))
        keys = items.group_by(self.key).agg(after.any().alias(_HAS_NEW)).join(
            folded, on=self.key, how="left", nulls_equal=True
        ).join(deleted, on=self.key, how="left", nulls_equal=True)
        has_tomb = ~pl.col(_HAS_NEW) & self.stage.keep_tombstones
        keys = keys.select(
            *self.key,
            *(pl.col(c).alias(_NEW + c) if c in self.key else
              pl.when(has_tomb).then(pl.col("$d_" + c)).otherwise(pl.col(c)).cast(schema[c]).alias(_NEW + c)
              for c in self.rows),
            _HAS_NEW, has_tomb.alias(_HAS_TOMB),
        )
        return self._with_old(keys, effective, old)

    def _with_old(self, keys: pl.DataFrame, effective: pl.DataFrame, old: pl.DataFrame) -> pl.DataFrame:
        """``keys`` (per key: the key, ``$new`` columns, ``$has_new``, ``$has_tomb``) with
        the stored row's ``$old`` columns, ``$has_old``, ``$s`` and the new position rank."""
        latest = effective.group_by(self.key).agg(pl.col(_PR).max().alias(_NPR))
        old = old.select(*self.key, *(pl.col(c).alias(_OLD + c) for c in self.rows), _OPR, _S, _HAS_OLD)
        keys = keys.join(latest, on=self.key, nulls_equal=True).join(old, on=self.key, how="left", nulls_equal=True)
        return keys.with_columns(
            pl.col(_HAS_OLD).fill_null(False), pl.max_horizontal(_NPR, pl.col(_OPR).fill_null(-1)).alias(_NPR)
        )

    def _compacted(self, keys: pl.DataFrame, due: pl.DataFrame, stored: pa.Table, now_ms: int) -> pl.DataFrame:
        """``full-compaction``: the keys with records (``keys``) and, after them, the stored
        keys without any whose barrier is now (``due``, with their position rank as ``$npr``),
        with what ``_emitted`` and ``_new_state`` need: the row emitted at the last barrier as
        the row before (``$old`` columns, ``$has_old``); whether the barrier is now (``$due``:
        changes pending since a batch in an earlier interval); after this call, the emitted
        row (``$em`` columns, ``$has_em``: the new row at a barrier) and since when changes
        are pending (``$dirty``: this call's time for a key that had none, none after a
        barrier)."""
        common = [*self.key, *(_NEW + c for c in self.rows), _HAS_NEW, _HAS_TOMB, _NPR, _S]
        woken = due.join(keys.select(self.key), on=self.key, how="anti", nulls_equal=True).select(
            *self.key, *(pl.col(c).alias(_NEW + c) for c in self.rows), pl.col(_HAS_OLD).alias(_HAS_NEW),
            (pl.col(_HAS_ITEM) & ~pl.col(_HAS_OLD)).alias(_HAS_TOMB), _NPR, _S, pl.lit(False).alias(_APPLIED),
        )
        called = pl.concat([
            keys.select(*common, pl.lit(True).alias(_APPLIED)).with_columns(pl.col(_NPR).cast(pl.Int64)),
            woken.with_columns(pl.col(_NPR).cast(pl.Int64)),
        ], how="vertical_relaxed")
        emitted = stored.column("emitted").combine_chunks()
        before = pl.from_arrow(pa.Table.from_struct_array(emitted).rename_columns([_OLD + c for c in self.rows]))
        before = before.with_columns(
            pl.from_arrow(emitted.is_valid()).alias(_HAS_OLD),
            pl.from_arrow(stored.column("dirty_since_ms")).cast(pl.Int64).alias(_DIRTY),
        ).with_row_index(_S)
        called = called.join(before, on=_S, how="left", maintain_order="left").with_columns(
            pl.col(_HAS_OLD).fill_null(False),
            pl.when(pl.col(_APPLIED) & pl.col(_DIRTY).is_null()).then(pl.lit(now_ms, pl.Int64))
            .otherwise(pl.col(_DIRTY)).alias(_DIRTY),
        )
        interval = self.stage.cfg.compaction_interval_ms
        called = called.with_columns(_barrier_due(pl.col(_DIRTY), now_ms, interval).alias(_DUE))
        at_barrier = pl.col(_DUE)
        return called.with_columns(
            *(pl.when(at_barrier).then(pl.when(_HAS_NEW).then(pl.col(_NEW + c))).otherwise(pl.col(_OLD + c)).alias(_EM + c)
              for c in self.rows),
            pl.when(at_barrier).then(pl.col(_HAS_NEW)).otherwise(pl.col(_HAS_OLD)).alias(_HAS_EM),
            pl.when(at_barrier).then(None).otherwise(pl.col(_DIRTY)).alias(_DIRTY),
        )

    def _emitted(self, keys: pl.DataFrame, batch: pl.DataFrame, table: pa.Table, positions: pl.DataFrame, pos: list[str]) -> pa.Table:
        """The changes the producer emits, in the batch's layout and types (``full-compaction``:
        ``lookup``'s, against the row emitted at the last barrier, for the keys at a barrier)."""
        names = [c for c in table.column_names if not c.startswith("$")]
        if self.stage.full:
            keys = keys.filter(pl.col(_DUE))
        if self.stage.producer == "input":
            records = batch.sort(_I).select(*self.rows, KIND, WEIGHT, *pos).rename(dict(zip(self.rows, names)))
            return sorted_table(records.to_arrow()).cast(table.schema)
        has_old, has_new = pl.col(_HAS_OLD), pl.col(_HAS_NEW)
        same = has_old & has_new & pl.all_horizontal([pl.col(_OLD + c).eq_missing(pl.col(_NEW + c)) for c in self.rows])
        if self.stage.producer == "none":
            parts = [
                (has_old & ~has_new, _OLD, DELETE, -1),
                (has_new & ~has_old, _NEW, INSERT, 1),
                (has_old & has_new & ~same, _NEW, UPDATE_AFTER, 1),
            ]
        else:
            differ = ~same if self.stage.dedupe else pl.lit(True)
            parts = [
                (has_old & ~has_new, _OLD, DELETE, -1),
                (has_new & ~has_old, _NEW, INSERT, 1),
                (has_old & has_new & differ, _OLD, UPDATE_BEFORE, -1),
                (has_old & has_new & differ, _NEW, UPDATE_AFTER, 1),
            ]
        at = positions.with_row_index(_NPR).with_columns(pl.col(_NPR).cast(pl.Int64))
        keys = keys.lazy().with_row_index("$k").join(at.lazy(), on=_NPR, how="left")
        out = pl.concat([
            keys.filter(when).select(
                "$k", pl.lit(order).alias("$o"), *(pl.col(prefix + c).alias(n) for c, n in zip(self.rows, names)),
                pl.lit(kind).alias(KIND), pl.lit(weight, pl.Int64).alias(WEIGHT), *positions.columns,
            )
            for order, (when, prefix, kind, weight) in enumerate(parts)
        ]).sort("$k", "$o").drop("$k", "$o").collect()
        return out.to_arrow().select(table.column_names).cast(table.schema)

    # ------------------------------------------------------------------ outputs

    def _new_state(self, stored: pa.Table, keys: pl.DataFrame, positions: pl.DataFrame) -> TableBucket:
        """The stored items of untouched keys, then per touched key its new row or, with
        ``sequence.field``, its tombstone (neither: the key is forgotten), in the stage's
        ``merge-engine/1`` layout."""
        kept = np.ones(stored.num_rows, dtype=bool)
        kept[keys.get_column(_S).drop_nulls().to_numpy()] = False
        kept_table = stored.filter(pa.array(kept))
        kept_keys = pl.col(_HAS_NEW) | pl.col(_HAS_TOMB)
        if self.stage.full:  # a key without a row stays while it has an emitted row or changes pending
            kept_keys = kept_keys | pl.col(_HAS_EM) | pl.col(_DIRTY).is_not_null()
        new = keys.filter(kept_keys)
        new_rows = new.select(*(pl.col(_NEW + c).alias(n) for c, n in zip(self.rows, self.schema.names))).to_arrow().cast(self.schema)
        items = [c.combine_chunks() for c in new_rows.columns]
        is_row = new.get_column(_HAS_NEW).to_arrow()
        key_fields = [self.schema.field(i) for i in self.stage.pk]
        at = positions.select(pl.all().gather(new.get_column(_NPR)))
        fresh = pa.table({
            "key": pa.StructArray.from_arrays([new_rows.column(f.name).combine_chunks() for f in key_fields], fields=key_fields),
            "row": pa.StructArray.from_arrays(items, fields=list(self.schema), mask=pc.invert(is_row)),
            "pos": positions_as_lists(at).to_arrow().cast(POSITION) if new.height else pa.array([], POSITION),
            "tombstone": pa.StructArray.from_arrays(
                items, fields=list(self.schema), mask=pc.invert(new.get_column(_HAS_TOMB).to_arrow())
            ),
        })
        if self.stage.full:
            emitted = new.select(*(pl.col(_EM + c).alias(n) for c, n in zip(self.rows, self.schema.names)))
            emitted = emitted.to_arrow().cast(self.schema)
            mask = pc.invert(new.get_column(_HAS_EM).to_arrow())
            fresh = fresh.append_column(
                "emitted", pa.StructArray.from_arrays([c.combine_chunks() for c in emitted.columns], fields=list(self.schema), mask=mask)
            ).append_column("dirty_since_ms", new.get_column(_DIRTY).cast(pl.Int64).to_arrow())
        table = pa.concat_tables([kept_table, fresh.cast(stored.schema)]) if kept_table.num_rows else fresh.cast(stored.schema)
        return TableBucket(table, self.stage.states_of_table)


def _barrier_due(dirty: pl.Expr, now_ms: int, interval_ms: int) -> pl.Expr:
    """``producers.barrier_due`` over a column of ``dirty_since_ms`` (false where null)."""
    if interval_ms <= 0:
        return dirty.is_not_null()
    return (dirty // interval_ms < now_ms // interval_ms).fill_null(False)


def _dense_rank(frame: pl.DataFrame, order: list[str], descending: list[bool]) -> pl.Series:
    """Each row's dense rank by ``order`` (nulls first, each column ascending or not)."""
    ordered = frame.select(order).with_row_index("$j").sort(order, descending=descending, nulls_last=False)
    runs = ordered.select(pl.struct(order).rle_id().cast(pl.Int64)).to_series()
    return pl.zeros(frame.height, pl.Int64, eager=True).scatter(ordered["$j"], runs)


def _may_overflow(items: pl.DataFrame, key: list[str], aggs: dict[str, _Agg]) -> bool:
    """Whether a ``sum``, ``count`` or ``product`` of some key may leave its integer type at
    any step of its fold, whatever the order: a float bound on the sum of the absolute values
    of what it adds, or of the ``log2`` of its non-zero factors (a partial product of
    integers is never larger than the product of all non-zero factors)."""
    def magnitude(c: str, agg: _Agg) -> pl.Expr:
        if agg.function == "product":
            return pl.col(c).cast(pl.Float64).abs().filter(pl.col(c) != 0).log(2).sum()
        return pl.col(c).cast(pl.Float64).abs().sum()

    largest = items.group_by(key).agg(magnitude(c, a).alias(c) for c, a in aggs.items()).select(list(aggs)).max()
    for c, agg in aggs.items():
        limit = _SAFE * agg.bounds[1]
        if largest[c][0] is not None and largest[c][0] > (math.log2(limit) - 2**-20 if agg.function == "product" else limit):
            return True
    return False


def _counted(col: pl.Expr, agg: _Agg) -> pl.Expr:
    """What each item adds to a ``sum`` or ``count`` column: the value, or one per non-null
    value (a stored count is a count), negated for a retraction; null for a null value and
    for a retraction ``ignore-retract`` drops."""
    add, state = pl.col("$add"), pl.col("$state")
    one = col.is_not_null().cast(pl.Int64).replace(0, None)
    if agg.function == "sum":
        part = col if agg.decimal else col.cast(pl.Int64)
    else:
        part = pl.when(state).then(col.cast(pl.Int64)).otherwise(one)
    return pl.when(add).then(part).when(pl.lit(agg.retracts)).then(-part)


def _folded_column(col: pl.Expr, add: pl.Expr, agg: _Agg) -> pl.Expr:
    """One ``aggregation`` value column over a key's items in merge order (``sum``'s and
    ``count``'s items already hold what each adds, ``_counted``). ``last_value`` and
    ``last_non_null_value`` take retractions: the last item (of a non-null value) decides,
    and a retraction there leaves null. The other functions fold the adds only."""
    function = agg.function
    if function in ("sum", "count"):
        return pl.when(col.count() > 0).then(col.sum())
    if agg.retracts and function == "last_value":
        return pl.when(add.last()).then(col.last())
    if agg.retracts and function == "last_non_null_value":
        return pl.when(add.filter(col.is_not_null()).last()).then(col.drop_nulls().last())
    col = col.filter(add)
    some = col.count() > 0
    if function == "product":
        return pl.when(some).then(col.cast(pl.Int64).drop_nulls().product())
    if function == "listagg":  # the non-blank values joined (a blank one never enters the fold)
        values = col.filter(col.is_not_null() & ~col.str.contains(_BLANK))
        return pl.when(values.count() > 0).then(values.str.join(agg.delimiter))
    if function == "bool_and":
        return pl.when(some).then(col.all())
    if function == "bool_or":
        return pl.when(some).then(col.any())
    return {
        "max": col.max(), "min": col.min(), "first_value": col.first(), "last_value": col.last(),
        "first_non_null_value": col.drop_nulls().first(), "last_non_null_value": col.drop_nulls().last(),
    }[function]


def _distinct_listagg(adds: pl.DataFrame, key: list[str], column: str, delimiter: str) -> pl.DataFrame:
    """``listagg`` with ``distinct`` per key over ``adds`` (the key's folded adds in merge
    order): ``key`` and ``column`` for the keys with a non-blank value. The per-key fold keeps
    its first non-blank value whole, then appends each token of a later value that is not
    blank and not in the set of tokens seen so far, and every token of a later value is in
    that set afterwards (appended or already there). So a later token is appended exactly
    when it is not blank and its occurrence is the first of that token among the key's
    tokens (the first value's included) in (value, token) order: a minimum over a row
    index, not a loop."""
    values = adds.filter(pl.col(column).is_not_null() & ~pl.col(column).str.contains(_BLANK)).select(
        *key, column, pl.int_range(pl.len()).over(key).alias("$r")
    )
    first = values.filter(pl.col("$r") == 0).select(*key, pl.col(column).alias("$first"))
    tokens = values.select(*key, "$r", pl.col(column).str.split(delimiter).alias("$t"))
    tokens = tokens.explode("$t", empty_as_null=True).with_row_index("$x")
    appended = tokens.filter(
        (pl.col("$r") > 0) & ~pl.col("$t").str.contains(_BLANK) & (pl.col("$x") == pl.col("$x").min().over(*key, "$t"))
    ).group_by(key, maintain_order=True).agg(pl.col("$t").str.join(delimiter).alias("$more"))
    return first.join(appended, on=key, how="left", nulls_equal=True).select(
        *key, pl.concat_str("$first", "$more", separator=delimiter, ignore_nulls=True).alias(column)
    )


def schema_of(stage: MergeEngineStage) -> pa.Schema | None:
    """The stage's rows as Arrow columns whose equality is Python's; None otherwise."""
    schema = row_schema(stage.columns)
    return schema if schema is not None and all(compares_as_python(t) for t in schema.types) else None
