"""Normalize under the batch contract: one polars pass per batch, no Python per record or key.

``tidemark.engine.stages.normalize`` says what the stage computes: per key, its records in
the canonical order replayed one by one against the last row. Written as position
arithmetic over one sequence per key: the key's stored row (if any) first, then its records
of the batch in the canonical order (``batch_columns.sorted_table``), ``-U`` dropped. For
each element, with ``prev`` the element before it in its key's sequence:

- the row is *absent* before an element when it is the key's first (no stored row) or
  ``prev`` is a delete;
- a delete emits ``-D`` unless the row is absent;
- an upsert is *effective* unless ``prev`` is an upsert (or the stored row) equal to it on
  the compared columns; an effective upsert emits ``+I`` when the row is absent, else
  ``-U``/``+U``. An equal upsert is dropped, so the row stays the one the run's first
  upsert set (its unread columns included);
- the current row before an element (the before-image of its ``-U``/``-D``) is the row of
  the latest effective upsert or stored row before it: a forward fill per key;
- the key's new state is the current row after its last element, none after a delete.

State: the stage's own ``normalize-last-row/1`` table, one ``row`` struct per key, read and
written as a table (``TableBucket``), so a checkpoint is the same whichever path wrote it and
the keys a batch does not touch cost no Python. A bucket the per-key path left as a dict
(the replay host keeps one bucket between batches) is turned back into its table first.
The kernel runs when the batch and the stored rows are typed as the stage's columns;
anything else (a stage without column types, a value stored pickled, a batch of ``Change``
tuples holding DECIMALs, whose scale an Arrow column would change) takes the per-key path,
which reads the bucket as a dict. So does a batch of fewer than ``min_changes`` changes:
there the polars plan's fixed cost is more than the per-key loop
(``tests/bench/bench_normalize_kernel.py``; docs/running.md).

Values compare as Arrow compares them, which matches Python's ``==`` on the planner's types
except for NaN: one NaN equals another here, as in Flink's binary rows, so an upsert of a
row with a NaN identical to the stored one is dropped, where the per-key path would emit it
(two decoded NaNs are different Python objects).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import polars as pl
import pyarrow as pa

from tidemark.engine.batch import KIND, POS_PREFIX, WEIGHT, ChangeBatch
from tidemark.engine.batch_columns import row_schema, sorted_table, typed_table
from tidemark.engine.changelog import DELETE, INSERT, UPDATE_AFTER, UPDATE_BEFORE
from tidemark.engine.driver import Bucket, PerKeyAdapter
from tidemark.engine.kernels.table_bucket import TableBucket
from tidemark.engine.stage import BatchContext

if TYPE_CHECKING:
    from tidemark.engine.stages.normalize import Normalize

#: below this many changes a call costs less per key than the kernel's fixed polars cost
#: (docs/running.md, "The normalize batch kernel": a state bucket on the Spark host gets a
#: few hundred changes per batch at W2's size)
KERNEL_MIN_CHANGES = 1500
_E = "$e"  # the element's index in the sequence (stored rows first, then the sorted batch)
_DEL = "$del"
_STORED = "$stored"
_ABSENT = "$absent"  # no row before this element
_EFFECTIVE = "$eff"
_R = "$r"  # the element's row in the sequence sorted by key
_START = "$start"  # the key's first element
_BEFORE = "$before"  # the row (``_R``) holding the current row before this element
_AFTER = "$after"  # on a key's last element: the row holding the current row after it
_ORDER = "$o"  # a retraction before the add of one update


class NormalizeKernel:
    """``process_batch`` for a ``Normalize`` stage (module docstring)."""

    def __init__(self, stage: Normalize, min_changes: int = 0) -> None:
        """``min_changes``: a smaller batch takes the per-key path (``KERNEL_MIN_CHANGES``)."""
        self.stage = stage
        self.min_changes = min_changes
        self.name = stage.name
        self.n_inputs = 1
        self._per_key = PerKeyAdapter(stage)
        self.schema = row_schema(stage.columns)
        self.rows = [f"c{i}" for i in range(stage.width)]
        self.key = [self.rows[i] for i in stage.pk]
        compared = stage.compared if stage.compared is not None else range(stage.width)
        self.compared = [self.rows[i] for i in compared]

    def process_batch(
        self, inputs: Sequence[ChangeBatch], state: Bucket, ctx: BatchContext
    ) -> tuple[Bucket, ChangeBatch]:
        batch = inputs[0]
        if len(batch) < self.min_changes:
            return self._per_key.process_batch(inputs, state, ctx)
        table = self._typed_batch(batch)
        stored = None if table is None else self._stored(state)
        if stored is None:
            return self._per_key.process_batch(inputs, state, ctx)
        if table.num_rows == 0:
            return state, ChangeBatch(changes=[])
        seq = self._sequence(table, stored.lazy())
        out = self._emitted(seq)
        quiet = seq.filter(pl.col(_START) & ~pl.col(_STORED)).join(
            out.select(self.key).unique(), on=self.key, how="anti", nulls_equal=True
        )
        out, new_state, quiet = pl.collect_all([out, self._new_state(seq, stored.lazy()), quiet.select(pl.len())])
        if quiet.item():  # tombstones for keys never seen (the per-key stage's docstring)
            ctx.metrics["retractions_without_state"] += quiet.item()
        return self._bucket(new_state), ChangeBatch.from_table(self._batch_table(out, table))

    # ------------------------------------------------------------------ inputs

    def _typed_batch(self, batch: ChangeBatch) -> pa.Table | None:
        """The batch as a table typed by the stage's columns, or None (per-key path)."""
        return typed_table(batch, self.schema) if self.schema is not None else None

    def _stored(self, state: Bucket) -> pl.DataFrame | None:
        """The bucket's rows as columns ``c0``...; None when they are not typed as the
        stage's columns. A bucket the per-key path holds as a dict (the replay host keeps
        its bucket between batches) is written as its stored table first."""
        table = state.table if isinstance(state, TableBucket) else None
        if table is None:
            if not state.states:
                return pl.from_arrow(self.schema.empty_table().rename_columns(self.rows))
            table = self.stage.state_to_table(state)
        row = table.column("row")
        if row.type != pa.struct(list(zip(self.schema.names, self.schema.types))):
            return None
        return pl.from_arrow(pa.Table.from_struct_array(row.combine_chunks()).rename_columns(self.rows))

    # ------------------------------------------------------------------ the arithmetic

    def _sequence(self, table: pa.Table, stored: pl.LazyFrame) -> pl.LazyFrame:
        """Per touched key its stored row, then its records in the canonical order, with
        the flags of the module docstring. Sorted by key (a key's elements are neighbours),
        so "the element before" is the row before, within the key's run: no window
        expression per key."""
        pos = [c for c in table.column_names if c.startswith(POS_PREFIX)]
        names = [c for c in table.column_names if not c.startswith("$")]
        records = (
            pl.from_arrow(sorted_table(table))
            .lazy()
            .filter(pl.col(KIND) != UPDATE_BEFORE)
            .rename(dict(zip(names, self.rows)))
            .select(*self.rows, *pos, (pl.col(KIND) == DELETE).alias(_DEL), pl.lit(False).alias(_STORED))
        )
        touched = stored.join(records.select(self.key).unique(), on=self.key, how="semi", nulls_equal=True)
        seq = pl.concat([touched.with_columns(pl.lit(False).alias(_DEL), pl.lit(True).alias(_STORED)), records], how="diagonal")
        seq = seq.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias(_E)).sort(*self.key, _E, nulls_last=False)
        row = pl.int_range(pl.len(), dtype=pl.Int64)
        start = (row == 0) | ~pl.all_horizontal([pl.col(c).eq_missing(pl.col(c).shift(1)) for c in self.key])
        seq = seq.with_columns(row.alias(_R), start.alias(_START))
        absent = pl.col(_START) | pl.col(_DEL).shift(1)
        same = pl.all_horizontal([pl.col(c).eq_missing(pl.col(c).shift(1)) for c in self.compared])
        seq = seq.with_columns(absent.alias(_ABSENT), (pl.col(_STORED) | ~pl.col(_DEL) & (absent | ~same)).alias(_EFFECTIVE))
        holder = pl.when(pl.col(_EFFECTIVE) | pl.col(_DEL)).then(pl.col(_R)).forward_fill()
        last = pl.col(_START).shift(-1).fill_null(True)
        return seq.with_columns(
            pl.when(~pl.col(_START)).then(holder.shift(1)).alias(_BEFORE),
            pl.when(last).then(holder).alias(_AFTER),
        )

    def _emitted(self, seq: pl.LazyFrame) -> pl.LazyFrame:
        """The changes, in the sequence's order: per element its retraction (the current
        row before it, at the element's position), then its add."""
        records = ~pl.col(_STORED)
        retracts = seq.filter(records & ~pl.col(_ABSENT) & (pl.col(_DEL) | pl.col(_EFFECTIVE))).drop(self.rows)
        retracts = retracts.join(seq.select(*self.rows, pl.col(_R).alias(_BEFORE)), on=_BEFORE).with_columns(
            pl.when(pl.col(_DEL)).then(pl.lit(DELETE)).otherwise(pl.lit(UPDATE_BEFORE)).alias(KIND),
            pl.lit(-1, pl.Int64).alias(WEIGHT),
            pl.lit(0).alias(_ORDER),
        )
        adds = seq.filter(records & pl.col(_EFFECTIVE)).with_columns(
            pl.when(pl.col(_ABSENT)).then(pl.lit(INSERT)).otherwise(pl.lit(UPDATE_AFTER)).alias(KIND),
            pl.lit(1, pl.Int64).alias(WEIGHT),
            pl.lit(1).alias(_ORDER),
        )
        columns = adds.collect_schema().names()
        return pl.concat([retracts.select(columns), adds]).sort(_E, _ORDER)

    def _new_state(self, seq: pl.LazyFrame, stored: pl.LazyFrame) -> pl.LazyFrame:
        """Untouched keys' stored rows, then per touched key the current row after its last
        element (none after a delete)."""
        after = seq.select(_AFTER).drop_nulls()
        current = seq.filter(~pl.col(_DEL)).join(after, left_on=_R, right_on=_AFTER).select(self.rows)
        kept = stored.join(seq.filter(pl.col(_START)).select(self.key), on=self.key, how="anti", nulls_equal=True)
        return pl.concat([kept, current])

    # ------------------------------------------------------------------ outputs

    def _bucket(self, rows: pl.DataFrame) -> TableBucket:
        table = rows.to_arrow().rename_columns(list(self.schema.names)).cast(self.schema)
        struct = pa.StructArray.from_arrays([table.column(i).combine_chunks() for i in range(table.num_columns)], fields=list(self.schema))
        return TableBucket(pa.table({"row": struct}), self.stage.states_of_table)

    def _batch_table(self, out: pl.DataFrame, batch: pa.Table) -> pa.Table:
        """``out`` in the batch's layout, typed and named as the input batch."""
        names = [c for c in batch.column_names if not c.startswith("$")]
        pos = [c for c in batch.column_names if c.startswith(POS_PREFIX)]
        table = out.select(*self.rows, KIND, WEIGHT, *pos).to_arrow().rename_columns([*names, KIND, WEIGHT, *pos])
        return table.cast(batch.schema)

