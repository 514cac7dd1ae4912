"""The merge engine as a keyed sink stage.

Keyed by the sink primary key. State per key, a ``MergeState``:

- ``row`` and ``pos``: the merged row and the greatest source position merged into it.
  Everything an engine needs lives in the merged row itself (as in Paimon, where a
  compacted row is all that is left of a key's history), so state is one row per key.
- ``tombstone``: with ``sequence.field`` only, a deleted key (``row`` None) keeps the record
  that deleted it, so a record with a smaller sequence arriving in a later batch sorts
  before the delete and cannot resurrect the key ("the largest sequence wins, also across
  batches"). Without ``sequence.field`` a delete forgets the key.
- ``emitted`` and ``dirty_since_ms`` (``full-compaction`` only): the row emitted at the last
  barrier and since when changes are pending (None: nothing pending), from which
  ``wakeup_ms`` tells the host when to call the key again.
- ``None`` when there is nothing to keep.

Per batch and key: drop retractions under ``ignore-delete``; cancel exact ``+X``/``-X``
pairs; order the rest together with the state (``ordering``); fold them with the engine;
emit what the changelog producer asks for (``producers``).

Stored state (``tidemark.engine.state_codec``), ``merge-engine/1``: one table row per key,
``key`` (struct of the primary key columns: a key pending a barrier may have no row left),
``row``, ``tombstone`` and ``emitted`` (structs typed by the table's columns, null when
absent), ``pos`` (``list<int64>``) and ``dirty_since_ms`` (int64, null when nothing is
pending). Timers are not stored: they follow from ``dirty_since_ms``. The table is handed
over as it is (``TableBucket``): the batch kernel (``tidemark.engine.kernels.merge``,
``batch_kernel``) works on it, and this stage reads it into ``MergeState``s, and its timers,
only when it runs.
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from tidemark.engine.changelog import ADDS, Change
from tidemark.engine.driver import Bucket, PerKeyAdapter
from tidemark.engine.errors import InputError
from tidemark.engine.stage import BatchContext
from tidemark.engine.stages.merge import producers
from tidemark.engine.stages.merge.aggregators import MergeError
from tidemark.engine.stages.merge.options import MergeConfig
from tidemark.engine.stages.merge.ordering import cancel_pairs, merge_order

if TYPE_CHECKING:
    import pyarrow as pa

    from tidemark.engine.state_tables import RowType


#: ``TIDEMARK_MERGE_KERNEL=0`` runs every merge engine per key (``batch_kernel``)
KERNEL_ENV = "TIDEMARK_MERGE_KERNEL"


class MergeState(NamedTuple):
    """One key's state (module docstring)."""

    row: tuple | None
    pos: tuple
    tombstone: tuple | None = None
    emitted: tuple | None = None
    dirty_since_ms: int | None = None


class MergeEngineStage:
    n_inputs = 1

    state_kind = "merge-engine"
    state_version = 1

    def __init__(self, cfg: MergeConfig, merge_fn: Any, name: str = "merge_engine", columns: RowType | None = None):
        """``columns``: the table's column names and types, which type the stored state
        (None: Arrow infers them from the values)."""
        self.cfg = cfg
        self.columns = tuple(columns) if columns is not None else None
        self.name = name
        self.merge_fn = merge_fn
        self.pk = cfg.pk
        self.width = len(cfg.columns)
        self.fill_key = cfg.engine in ("partial-update", "aggregation")
        self.producer = cfg.producer
        self.full = cfg.producer == "full-compaction"
        # only full-compaction emits at time barriers; other producers never wake a key
        self.uses_timers = self.full
        self.keep_tombstones = bool(cfg.sequence_fields)
        # first-row's changelog is insert-only: an unchanged row is never re-emitted.
        self.dedupe = cfg.row_deduplicate or cfg.engine == "first-row"

    def describe(self) -> dict[str, Any]:
        return self.cfg.describe()

    def key_columns(self, input_index: int = 0) -> tuple[int, ...]:
        """The row columns the key is (``tidemark.engine.bucketing``)."""
        return tuple(self.pk)

    def output_key_columns(self) -> tuple[int, ...]:
        """The table's PK: the stage emits the table's rows, so its key stays where it was."""
        return tuple(self.pk)

    def key_of(self, change: Change, input_index: int = 0) -> tuple:
        return tuple(change.row[i] for i in self.pk)

    def batch_kernel(self) -> Any:
        """The polars kernel (``tidemark.engine.kernels.merge``) where it computes what this
        stage does, unless ``TIDEMARK_MERGE_KERNEL=0`` asks for the per-key path."""
        from tidemark.engine.kernels import merge

        if os.environ.get(KERNEL_ENV, "1") == "0" or not merge.supports(self):
            return PerKeyAdapter(self)
        return merge.MergeKernel(self, min_changes=merge.KERNEL_MIN_CHANGES)

    def wakeup_ms(self, state: Any) -> int | None:
        """When the host must call ``process_key`` for this key even without records
        (``full-compaction`` barriers); ``None`` when nothing is pending."""
        if not self.full or state is None or state.dirty_since_ms is None:
            return None
        return producers.next_barrier_ms(state.dirty_since_ms, self.cfg.compaction_interval_ms)

    def process_key(
        self, key: tuple, inputs: Sequence[list[Change]], state: Any, ctx: BatchContext
    ) -> tuple[Any, list[Change]]:
        old_row, old_pos, old_tomb = (state.row, state.pos, state.tombstone) if state is not None else (None, (), None)
        records = self._accepted(inputs[0], ctx)
        effective = cancel_pairs(records) if len(records) > 1 else records
        if len(effective) < len(records):
            ctx.metrics["merge_pairs_cancelled"] += (len(records) - len(effective)) // 2
        if effective:
            new_row, tomb = self._merge(key, effective, old_row, old_pos, old_tomb)
            pos = max(old_pos, max(c.pos for c in effective))
        else:
            new_row, tomb, pos = old_row, old_tomb, old_pos
        if not self.keep_tombstones:
            tomb = None
        if self.full:
            return self._full_compaction(state, new_row, pos, tomb, bool(effective), ctx)
        new_state = MergeState(new_row, pos, tomb) if new_row is not None or tomb is not None else None
        if self.producer == "none":
            return new_state, producers.upserts(old_row, new_row, pos)
        if self.producer == "input":
            return new_state, producers.input_records(records)
        if not effective:
            return new_state, []
        return new_state, producers.full_diff(old_row, new_row, pos, self.dedupe)

    def _accepted(self, records: list[Change], ctx: BatchContext) -> list[Change]:
        for c in records:
            if len(c.row) != self.width:
                raise InputError(
                    f"table '{self.cfg.table}'",
                    f"row {c.row!r} has {len(c.row)} columns, expected {self.width}",
                )
        if self.cfg.ignore_delete:
            kept = [c for c in records if c.kind in ADDS]
            if len(kept) < len(records):
                ctx.metrics["merge_deletes_ignored"] += len(records) - len(kept)
            return kept
        return records

    def _merge(self, key: tuple, records: list[Change], old_row: tuple | None, old_pos: tuple,
               old_tomb: tuple | None) -> tuple[tuple | None, tuple | None]:
        if old_row is not None:
            items = merge_order(records, old_row, old_pos, self.cfg.sequence_fields,
                                self.cfg.sequence_ascending)
        else:
            items = merge_order(records, old_tomb, old_pos, self.cfg.sequence_fields,
                                self.cfg.sequence_ascending, state_kind="-D")
        try:
            row, tomb = self.merge_fn.merge(items)
        except MergeError as exc:
            pk = ", ".join(f"{self.cfg.columns[i]}={v!r}" for i, v in zip(self.pk, key))
            raise InputError(f"table '{self.cfg.table}'", f"primary key ({pk}): {exc}") from None
        if row is not None and self.fill_key:
            values = list(row)
            for i, v in zip(self.pk, key):
                values[i] = v
            row = tuple(values)
        return row, tomb

    def _full_compaction(self, state: Any, new_row: tuple | None, pos: tuple,
                         tomb: tuple | None, applied: bool,
                         ctx: BatchContext) -> tuple[Any, list[Change]]:
        emitted, dirty = (state.emitted, state.dirty_since_ms) if state is not None else (None, None)
        if applied and dirty is None:
            dirty = ctx.now_ms
        changes: list[Change] = []
        if dirty is not None and producers.barrier_due(
            dirty, ctx.now_ms, self.cfg.compaction_interval_ms
        ):
            changes = producers.full_diff(emitted, new_row, pos, self.dedupe)
            emitted, dirty = new_row, None
        if new_row is None and tomb is None and emitted is None and dirty is None:
            return None, changes
        return MergeState(new_row, pos, tomb, emitted, dirty), changes

    # ------------------------------------------------------------------ typed state

    def empty_state(self) -> Bucket:
        return Bucket()

    def state_to_table(self, bucket: Bucket) -> pa.Table:
        """The bucket's states as the module docstring's table."""
        stored = getattr(bucket, "table", None)  # a TableBucket nothing has read as a dict
        if stored is not None:
            return stored
        from tidemark.engine import state_tables as T

        keys, states = list(bucket.states), list(bucket.states.values())
        key_type = tuple(self.columns[i] for i in self.pk) if self.columns is not None else None
        cols = {
            "key": T.rows_column(keys, len(self.pk), key_type),
            "row": T.rows_column([st.row for st in states], self.width, self.columns),
            "pos": T.positions_column([st.pos for st in states]),
            "tombstone": T.rows_column([st.tombstone for st in states], self.width, self.columns),
        }
        if self.full:
            cols["emitted"] = T.rows_column([st.emitted for st in states], self.width, self.columns)
            cols["dirty_since_ms"] = T.ints_column([st.dirty_since_ms for st in states])
        return T.table(cols)

    def state_from_table(self, table: pa.Table) -> Bucket:
        """The stored table as it is: the batch kernel works on it, and the per-key path
        reads it as a dict (``states_of_table``) and its timers on first use."""
        from tidemark.engine.kernels.table_bucket import TableBucket

        return TableBucket(table, self.states_of_table, timers=self if self.full else None)

    def states_of_table(self, table: pa.Table) -> dict[Hashable, MergeState]:
        """A stored table as the per-key path's state: key -> ``MergeState``."""
        from tidemark.engine import state_tables as T

        n = table.num_rows
        fields = [
            T.rows_of(table.column("row")),
            T.positions_of(table.column("pos")),
            T.rows_of(table.column("tombstone")),
            T.rows_of(table.column("emitted")) if self.full else [None] * n,
            table.column("dirty_since_ms").to_pylist() if self.full else [None] * n,
        ]
        return {key: MergeState(*f) for key, *f in zip(T.rows_of(table.column("key")), *fields)}
