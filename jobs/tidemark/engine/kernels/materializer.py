"""The sink materializer under the batch contract: one polars pass per batch, then one state
step per touched sink PK.

What is columnar (polars over the batch's Arrow table): grouping by sink PK, the canonical
order (``batch_columns.sorted_table``: position, retractions before adds, the ``repr``
tiebreak only for ties), the greatest position per PK, and, for NOTHING and ERROR, the
cancelling of exact ``+X``/``-X`` pairs (per distinct row the earliest adds cancel the latest
retractions: window ranks over the sorted batch, no Python per record).

What stays per PK, in Python: applying the surviving ops to that PK's state
(``SinkMaterializer.apply``), which is the stage's own code, so the semantics are the
per-key path's by construction. The state is the stage's own per PK (``ActiveRows`` for
DEDUPLICATE, ``CurrentRow`` otherwise) in a ``Bucket`` keyed by the PK tuple, the layout the
stage's typed state protocol stores (``tidemark.engine.state_codec``), so the replay host,
the Spark host and the per-key adapter share one state. When the batch is large enough
(``columnar_min_changes``) and it and the stored bucket are typed as they need
(``kernels.sink_table``), each strategy's record order per PK is arithmetic per identity over
the stored bucket's table itself instead: ``kernels.deduplicate`` (each add and retraction
against the active rows one by one; which identical copy a retraction removes depends on
what came before) and ``kernels.current_row`` (NOTHING and ERROR). Otherwise DEDUPLICATE's
ops are walked per PK, and NOTHING's and ERROR's only what survives the pair cancelling.

Host group ids (``ChangeBatch.groups``, the Spark host) are not used: the PK is the group.
A batch of fewer than ``min_changes`` changes (the stage asks for ``KERNEL_MIN_CHANGES``)
runs through ``PerKeyAdapter``: both paths keep one state layout and give one result, and
for a small batch the polars pass costs more than it saves.
Batches of ``Change`` tuples whose values Arrow cannot type as one column per field (a
column mixing types, an integer beyond 64 bits, a tuple mixing types), which the planner's
typed batches never hold but hand-built changes may, run through ``PerKeyAdapter``.

Values compare as Arrow compares them, which matches Python's ``==`` on the planner's types
(``0.0`` and ``-0.0`` are one PK, ``Decimal("1.10")`` and ``Decimal("1.1")`` one row) except
for NaN: one NaN equals another here, as in Flink's binary rows, while on the per-key path
two decoded NaNs are different Python objects and so different keys.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl
import pyarrow as pa

from tidemark.engine.batch import WEIGHT, ChangeBatch
from tidemark.engine.batch_columns import row_indexes, sorted_table
from tidemark.engine.changelog import Change
from tidemark.engine.driver import Bucket, PerKeyAdapter
from tidemark.engine.kernels.current_row import CurrentRowKernel, survives_pair_cancelling
from tidemark.engine.kernels.deduplicate import DeduplicateKernel
from tidemark.engine.kernels.table_bucket import TableBucket
from tidemark.engine.stage import BatchContext
from tidemark.engine.stages.materializer import SinkMaterializer

#: below this many changes a call costs less per key than the kernel's fixed polars cost
#: (docs/running.md, "The sink materializer's batch kernel": the Spark host calls it once per
#: state bucket, a few hundred changes at W2's batch size)
KERNEL_MIN_CHANGES = 1500
#: below this many changes the columnar strategies (``kernels.deduplicate``,
#: ``kernels.current_row``) cost about what the per-PK step does: their fixed polars cost
#: (docs/benchmarks.md, "The materializer on the stored table")
COLUMNAR_MIN_CHANGES = 4000
_I = "$i"  # a change's index in the batch's change list
_ADD = "$add"
_KEY = "$key"  # the PK's first arrival index: a PK id that also orders PKs as the adapter does
_LAST = "$last"  # the index of the PK's change with the greatest position
_KEEP = "$keep"  # the change is an op to apply (survives the pair cancelling)
_N = "$n"  # ops per PK
# Python values Arrow cannot type as one column (module docstring): nothing has been applied yet
_NOT_TABULAR = (
    pa.ArrowInvalid,
    pa.ArrowTypeError,
    pa.ArrowNotImplementedError,
    OverflowError,
    pl.exceptions.PolarsError,
)


class MaterializerKernel:
    """``process_batch`` for a ``SinkMaterializer`` (module docstring)."""

    def __init__(self, stage: SinkMaterializer, min_changes: int = 0, columnar_min_changes: int = 0) -> None:
        """``min_changes``: a smaller batch takes the per-key path (``KERNEL_MIN_CHANGES``);
        ``columnar_min_changes``: a smaller one does not try the columnar strategies
        (``COLUMNAR_MIN_CHANGES``)."""
        self.stage = stage
        self.min_changes = min_changes
        self.columnar_min_changes = columnar_min_changes
        self.name = stage.name
        self.n_inputs = stage.n_inputs
        self._per_key = PerKeyAdapter(stage)
        self._columnar = DeduplicateKernel(stage) if stage.strategy == "DEDUPLICATE" else CurrentRowKernel(stage)

    def process_batch(
        self, inputs: Sequence[ChangeBatch], state: Bucket, ctx: BatchContext
    ) -> tuple[Bucket, ChangeBatch]:
        batch = inputs[0]
        if self._columnar.enabled and len(batch) >= max(self.min_changes, self.columnar_min_changes, 1):
            done = self._columnar_path(batch, state, ctx)
            if done is not None:
                return done
        changes = batch.changes()
        if not changes:
            return state, ChangeBatch(changes=[])
        if isinstance(state, TableBucket) and state.table is not None:
            keys = self._pk_columns(batch)
            if keys is not None:
                self.stage.read_keys(state, keys)
        if len(changes) < self.min_changes:
            return self._per_key.process_batch(inputs, state, ctx)
        try:
            keys, ops = self._ops_per_key(_unit_table(batch, changes))
        except _NOT_TABULAR:
            return self._per_key.process_batch(inputs, state, ctx)
        first_of, last_of, n_ops = (keys[c].to_list() for c in (_KEY, _LAST, _N))
        op_index, op_add = ops[_I].to_list(), ops[_ADD].to_list()
        stage, states = self.stage, state.states
        pk = stage.pk
        emitted: list[Change] = []
        start = 0
        for first, last, n in zip(first_of, last_of, n_ops):
            key = tuple(changes[first].row[j] for j in pk)
            end = start + n
            key_ops = [(changes[i].pos, a, changes[i].row) for i, a in zip(op_index[start:end], op_add[start:end])]
            start = end
            new_state, out = stage.apply(key, key_ops, states.get(key), changes[last].pos, ctx)
            if new_state is None:
                states.pop(key, None)
            else:
                states[key] = new_state
            emitted.extend(out)
        return state, ChangeBatch(changes=emitted)

    def _columnar_path(
        self, batch: ChangeBatch, state: Bucket, ctx: BatchContext
    ) -> tuple[Bucket, ChangeBatch] | None:
        """The strategy on the stored table itself (``kernels.deduplicate``,
        ``kernels.current_row``), when the bucket is still its stored table (or empty) and the
        batch fits that path; None otherwise."""
        if isinstance(state, TableBucket) and state.table is not None:
            stored = state.table
        elif type(state) is Bucket and not state.states:
            stored = None
        else:
            return None
        try:
            done = self._columnar.run(batch.table(), stored, ctx)
        except _NOT_TABULAR:
            return None
        if done is None:
            return None
        table, out = done
        return (TableBucket(table, self.stage._states_of) if table is not None else Bucket()), out

    def _pk_columns(self, batch: ChangeBatch) -> pa.Table | None:
        """The batch's PK columns, which ``SinkMaterializer.read_keys`` reads the state of (None: values
        Arrow cannot type, so the whole state is read)."""
        try:
            table = batch.table()
        except _NOT_TABULAR:
            return None
        return table.select(list(self.stage.pk))

    def _ops_per_key(self, table: pa.Table) -> tuple[pl.DataFrame, pl.DataFrame]:
        """(one row per touched PK in arrival order of the PKs: the PK's first change, the
        change with its greatest position and how many ops it has; the ops to apply as
        change indexes and signs, grouped by PK in that order, each PK's in the canonical
        order)."""
        df = pl.from_arrow(sorted_table(table)).with_columns((pl.col(WEIGHT) > 0).alias(_ADD))
        rows = [c for c in table.column_names if not c.startswith("$")]
        pk = [rows[j] for j in self.stage.pk]
        keep = pl.lit(True) if self.stage.strategy == "DEDUPLICATE" else pl.lit(survives_pair_cancelling(df, rows))
        df = df.select(pl.col(_I).min().over(pk).alias(_KEY), _I, _ADD, keep.alias(_KEEP))
        keys = df.group_by(_KEY).agg(pl.col(_I).last().alias(_LAST), pl.col(_KEEP).sum().alias(_N)).sort(_KEY)
        return keys, df.filter(pl.col(_KEEP)).sort(_KEY, maintain_order=True)


def _unit_table(batch: ChangeBatch, changes: list[Change]) -> pa.Table:
    """The batch as a table with one row per change (weights +-1) and the change's index."""
    table = batch.table()
    if table.num_rows != len(changes):  # net weights: one row per unit of weight
        table = ChangeBatch.from_changes(changes).table()
    return table.append_column(_I, row_indexes(len(changes)))
