"""Sink upsert materializer: resolves ``INSERT ... ON CONFLICT DO DEDUPLICATE | NOTHING | ERROR``.

Needed when the upsert key of the stream reaching the sink differs from the sink's primary
key: several upstream rows (upsert keys) can then claim one sink PK, and their changes may
reach us in any order inside a batch (the disorder cases of the seeds). Keyed by sink PK.

Per batch and PK (DESIGN.md "Consolidating one key's rows in a batch"), never in arrival order:
the batch's changes are taken in source-position order, retractions before adds at one
position (ties broken by the row's repr). With an upsert key an add sets that upsert key's
row and a retraction removes that upsert key's row whatever its other values; with
``upsert_key=None`` rows match by full value (a multiset: identical rows from different
source rows are separate copies). Only the net change of what the sink shows for the PK is
emitted (``+I``, ``-U``/``+U``, ``-D`` or nothing), with the greatest position of the batch.
How exact ``+X``/``-X`` pairs inside one batch are treated differs per strategy, each as the
Flink 2.3 operator it stands for does (below).

Strategies
- DEDUPLICATE: the latest (greatest position) still-active row wins; retracting it rolls
  back to the previous active one (the seed's Football example). The batch's changes are
  applied one by one in position order against the active rows *including those already in
  state*, as Flink's ``SinkUpsertMaterializer`` applies records one by one; there is no
  separate pair-cancelling step. Without an upsert key a retraction of ``X`` removes the
  *oldest* active copy of ``X`` (Flink's ``findFirst`` on its list), so an in-batch
  ``+X``/``-X`` pair only cancels when no older copy of ``X`` is active. Why: at the sink the
  copies are identical, so which one a retraction means cannot be known; cancelling against
  the in-batch copy first (what Tidemark used to do) removed the *newest* copy and diverged
  from Flink (docs/conformance.md, ``dedup-identical-copies-retract-oldest/-newest``).
  A retraction finds the oldest copy whatever its position (in a valid changelog that copy is
  never newer than the retraction).
  State = the active rows of the PK (``ActiveRows``) in a dict keyed by identity (upsert key,
  or full row) whose entries form a doubly-linked list in position order, linked by identity
  rather than by object references so the state stores flat. A full-row entry with several identical
  copies keeps their positions in a deque, oldest first (adds arrive in position order, so
  appending keeps it sorted); the entry sits in the list at its newest copy. Add, retract
  and "latest" are O(1) amortized: a new add almost always has the greatest position and
  appends at the tail (otherwise it walks back from the tail to its place), a retraction
  pops the oldest copy or unlinks the entry. No list scans (Flink's list-based SUM drops to a
  few rows per second on long histories).
  Difference from Flink 2.3: an add for an upsert key that is already active moves that
  row to its (new, later) position; Flink replaces it in place in its list, so retracting
  that row later can leave Flink's sink showing a retracted row.
- NOTHING and ERROR follow Flink 2.3's ``WatermarkCompactingSinkMaterializer`` with one
  batch as one compaction step. State = the current sink row (its identity is derived
  from it) and a count, not a history: ``CurrentRow(row, touched_ms, dropped)``. Per batch: first cancel exact ``+X``/``-X`` pairs wherever they
  sit in the batch (Flink cancels them in its step buffer whichever came first; with several
  adds of one row the earliest cancel), then start from ``[current]`` and apply the rest in
  position order (an add for an identity already listed replaces it in place,
  a new identity is appended; a retraction removes its identity), then:
  * 0 rows left -> the PK is deleted (``-D``);
  * 1 row -> it becomes the sink row;
  * more than 1 row -> ERROR raises ``ConflictError(table, {pk: value})``; with no upsert
    key even two copies of the identical row count as two rows, as in Flink. NOTHING keeps
    the first row of the list: the current row if it is still active, otherwise the
    earliest-positioned surviving add; the others are dropped for good and counted in
    ``conflicts_dropped``.
  Identical copies need no "oldest copy" convention here: the step buffer cancels pairs
  before the current row is consulted, as in Flink; removing the current row for an
  in-batch ``-X`` instead would reorder the list and change the row NOTHING keeps (Flink
  keeps the current row).
  Consequence (same as Flink): dropped rows are not remembered. When the current row is
  later retracted the PK is deleted, even if a dropped row is still active upstream; a later
  retraction of a dropped row finds no state and is only counted.
  Difference from Flink 2.3 (Flink is demonstrably wrong here): when in one batch the
  current row is retracted or replaced *and* other rows remain, Flink keeps showing the old
  current row; Tidemark shows the first surviving row, so the sink and the state never hold
  a retracted row.
  Except when the retraction is ambiguous (no upsert key): the state also counts the
  identical copies of the current row that were dropped (``dropped``, one int). A retraction
  of ``X`` cannot say whether it means the shown copy or a dropped one, so while the copies
  of ``X`` still count at least one (``dropped >= retractions of X``) the current row is
  still an active row and, where Flink keeps it (more than one row left), Tidemark keeps it
  too: Flink's result is right there as far as the sink can know
  (docs/conformance.md, ``wcsm-nothing-stale-current-value``). Where Flink deletes the key
  or shows the only row left, Tidemark does the same (dropped copies are not candidates).
- TTL (``ttl_ms``): a PK's state not written for longer than ``ttl_ms`` (by ``ctx.now_ms``)
  is dropped when next touched and counted in ``state_expired``; like Flink, what the sink
  shows is then unknown, so a following add is emitted as ``+I``.
- Every retraction that finds no row to retract (expired state or never added) is counted
  in ``retractions_without_state`` and otherwise ignored.

Stored state (the typed state protocol of ``tidemark.engine.state_codec``), one table row per
row the state holds, typed by the sink's columns; the PK is the row's own columns, so it is
not stored twice:
- DEDUPLICATE, ``materializer-active-rows/1``: ``row`` (struct), ``pos`` (``list<int64>``),
  ``copies`` (the positions of identical active copies, oldest first; null for one copy),
  the PK's rows in their list order, oldest first;
- NOTHING and ERROR, ``materializer-current-row/1``: ``row``, and ``dropped`` (int64) only
  in a bucket where a PK has dropped copies.
Both add ``touched_ms`` (int64) only when a TTL is set: nothing else reads it. Rows are
stored sorted by PK (stable: a DEDUPLICATE PK's rows keep their order), which is what
makes the compressed columns small: neighbouring keys share their leading bytes.
"""

from __future__ import annotations

import os
from bisect import insort
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from tidemark.engine.changelog import Change, canonical_sorted, columns_of, diff_to_changes, sorted_ops
from tidemark.engine.driver import Bucket, PerKeyAdapter
from tidemark.engine.errors import ConflictError, PlanError
from tidemark.engine.stage import BatchContext

if TYPE_CHECKING:
    import pyarrow as pa

    from tidemark.engine.state_tables import RowType

STRATEGIES = ("DEDUPLICATE", "NOTHING", "ERROR")
#: NOTHING / ERROR: the current row's list entry while no add has replaced it
_CURRENT = object()

@dataclass(slots=True)
class _Node:
    """One active row of a DEDUPLICATE PK, linked to its neighbours in position order by
    identity rather than by object references, so the state stores flat. ``copies`` is None
    for one copy (always, with an upsert key); for several identical active copies of a full
    row, a deque of their positions, oldest first, whose last is ``pos``. Only duplicated
    values pay for a deque."""

    row: tuple
    pos: tuple
    prev: tuple | None = None
    next: tuple | None = None
    copies: deque | None = None


class CurrentRow(NamedTuple):
    """NOTHING / ERROR state of one PK: the row the sink shows, when the state was last
    written (for TTL) and how many identical copies of it were dropped (no upsert key only;
    see the module docstring). Like Flink's, it keeps no position: the next batch's changes
    carry their own, and the output takes the batch's."""

    row: tuple
    touched_ms: int
    dropped: int


class ActiveRows:
    """DEDUPLICATE state: active rows of one PK, O(1) add / retract / latest.

    Identities are tuples, so ``None`` is a safe "no neighbour" marker."""

    __slots__ = ("nodes", "head", "tail", "touched_ms")

    def __init__(self) -> None:
        self.nodes: dict[tuple, _Node] = {}
        self.head: tuple | None = None
        self.tail: tuple | None = None
        self.touched_ms = 0

    def latest(self) -> tuple | None:
        return self.nodes[self.tail].row if self.tail is not None else None

    def add(self, ident: tuple, row: tuple, pos: tuple, replace: bool) -> None:
        """``replace``: the identity is an upsert key, so the new row replaces the old one and
        takes the new position; otherwise the add is one more copy of an identical row."""
        node = self.nodes.get(ident)
        if node is None:
            node = _Node(row, pos)
            self.nodes[ident] = node
        elif replace:
            self._unlink(ident, node)
            node.row, node.pos = row, pos
        else:
            copies = node.copies
            if copies is None:
                copies = node.copies = deque((node.pos,))
            if pos >= copies[-1]:
                copies.append(pos)
            else:  # a copy older than the newest one (disorder across batches): rare
                insort(copies, pos)
            if copies[-1] == node.pos:
                return  # the newest copy did not change: the node stays where it is
            self._unlink(ident, node)
            node.pos = copies[-1]
        self._link_by_pos(ident, node)

    def retract(self, ident: tuple) -> bool:
        """Remove the identity's row; of several identical copies, the oldest (Flink's
        ``findFirst``). The node keeps its place: its newest copy is still active."""
        node = self.nodes.get(ident)
        if node is None:
            return False
        copies = node.copies
        if copies is not None:
            copies.popleft()
            if len(copies) == 1:
                node.copies = None
            return True
        self._unlink(ident, node)
        del self.nodes[ident]
        return True

    def copies(self, ident: tuple) -> list[tuple]:
        """Positions of the identity's active copies, oldest first; for tests and debugging."""
        node = self.nodes.get(ident)
        if node is None:
            return []
        return list(node.copies) if node.copies is not None else [node.pos]

    def _unlink(self, ident: tuple, node: _Node) -> None:
        prev, nxt = node.prev, node.next
        if prev is None:
            self.head = nxt
        else:
            self.nodes[prev].next = nxt
        if nxt is None:
            self.tail = prev
        else:
            self.nodes[nxt].prev = prev
        node.prev = node.next = None

    def _link_by_pos(self, ident: tuple, node: _Node) -> None:
        # Walk back from the tail to the last node not later than this one: 0 steps for the
        # usual newest-add, a few for mild disorder.
        after = self.tail
        pos = node.pos
        while after is not None and self.nodes[after].pos > pos:
            after = self.nodes[after].prev
        if after is None:
            node.prev, node.next = None, self.head
            if self.head is not None:
                self.nodes[self.head].prev = ident
            self.head = ident
            if self.tail is None:
                self.tail = ident
        else:
            a = self.nodes[after]
            node.prev, node.next = after, a.next
            if a.next is None:
                self.tail = ident
            else:
                self.nodes[a.next].prev = ident
            a.next = ident

    def in_order(self) -> Iterator[_Node]:
        """The active rows oldest to latest (O(n))."""
        cur = self.head
        while cur is not None:
            node = self.nodes[cur]
            yield node
            cur = node.next

    def rows_in_order(self) -> list[tuple]:
        """Oldest to latest; for tests and debugging (O(n))."""
        return [node.row for node in self.in_order()]

    def append(self, ident: tuple, row: tuple, pos: tuple, copies: list[tuple] | None) -> None:
        """Add a row after all others, as stored (``in_order``): rebuilding a state."""
        node = _Node(row, pos, self.tail, None, deque(copies) if copies is not None else None)
        if self.tail is None:
            self.head = ident
        else:
            self.nodes[self.tail].next = ident
        self.tail = ident
        self.nodes[ident] = node


_STORED_COLUMNS = ("row", "pos", "copies", "dropped", "touched_ms")


def _concat_stored(unread: pa.Table, written: pa.Table) -> pa.Table | None:
    """The two parts of a bucket's stored table as one, with a ``dropped`` column only if a
    row has dropped copies (as ``SinkMaterializer._table_of`` writes it); None when their
    columns are typed differently."""
    import pyarrow as pa
    import pyarrow.compute as pc

    parts = [unread.replace_schema_metadata(None), written]
    if any("dropped" in p.column_names for p in parts):
        parts = [p if "dropped" in p.column_names else p.append_column("dropped", pa.repeat(pa.scalar(0, pa.int64()), p.num_rows)) for p in parts]
    names = [c for c in _STORED_COLUMNS if c in parts[0].column_names]
    try:
        merged = pa.concat_tables([p.select(names) for p in parts]).combine_chunks()
    except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError):
        return None
    if "dropped" in names and not pc.any(pc.not_equal(merged.column("dropped"), 0)).as_py():
        merged = merged.drop_columns(["dropped"])
    return merged


class SinkMaterializer:
    n_inputs = 1

    def __init__(
        self,
        table: str,
        pk: tuple[int, ...],
        pk_names: tuple[str, ...],
        upsert_key: tuple[int, ...] | None,
        strategy: str,
        ttl_ms: int | None = None,
        name: str = "materializer",
        columns: RowType | None = None,
    ):
        """``columns``: the sink's column names and types, which type the stored state
        (None: Arrow infers them from the values)."""
        if strategy not in STRATEGIES:
            raise PlanError(f"unknown ON CONFLICT strategy {strategy!r}; use DO {', DO '.join(STRATEGIES)}")
        if len(pk) != len(pk_names) or not pk:
            raise PlanError(f"sink '{table}': primary key indexes {pk} do not match names {pk_names}")
        if ttl_ms is not None and ttl_ms <= 0:
            raise PlanError(f"sink '{table}': state TTL must be positive, got {ttl_ms} ms")
        self.table = table
        self.pk = tuple(pk)
        self.pk_names = tuple(pk_names)
        self.upsert_key = tuple(upsert_key) if upsert_key is not None else None
        if self.upsert_key is not None:
            self._uk_getter = columns_of(self.upsert_key)
        self.key_of_row = columns_of(self.pk)  # row -> its sink PK values
        self.strategy = strategy
        self.ttl_ms = ttl_ms
        self.name = name
        self.columns = tuple(columns) if columns is not None else None

    def key_columns(self, input_index: int = 0) -> tuple[int, ...]:
        """The row columns the key is (``tidemark.engine.bucketing``)."""
        return self.pk

    def output_key_columns(self) -> tuple[int, ...]:
        """The sink PK: the stage emits the sink's rows, so its key stays where it was."""
        return self.pk

    def key_of(self, change: Change, input_index: int = 0) -> tuple:
        return self.key_of_row(change.row)

    def identity(self, row: tuple) -> tuple:
        """What a retraction must match: the upsert key's values, or the whole row."""
        return row if self.upsert_key is None else self._uk_getter(row)

    def process_key(
        self, key: tuple, inputs: Sequence[list[Change]], state: Any, ctx: BatchContext
    ) -> tuple[Any, list[Change]]:
        changes = inputs[0]
        if not changes:
            return state, []
        pos = max(c.pos for c in changes)
        ops = in_position_order(changes) if self.strategy == "DEDUPLICATE" else consolidate(changes)
        return self.apply(key, ops, state, pos, ctx)

    def apply(
        self, key: tuple, ops: list[tuple[tuple, bool, tuple]], state: Any, pos: tuple, ctx: BatchContext
    ) -> tuple[Any, list[Change]]:
        """One PK's batch, already in the canonical order (and, for NOTHING and ERROR, with
        exact pairs cancelled: ``consolidate``), against its state; ``pos`` is the batch's
        greatest position for the PK. Shared by ``process_key`` and the batch kernel
        (``tidemark.engine.kernels.materializer``), which orders and cancels a whole batch
        at once."""
        if state is not None and self.ttl_ms is not None and ctx.now_ms - state.touched_ms > self.ttl_ms:
            ctx.metrics["state_expired"] += 1
            state = None
        if self.strategy == "DEDUPLICATE":
            return self._deduplicate(ops, state, pos, ctx)
        return self._single_row(key, ops, state, pos, ctx)

    def batch_kernel(self) -> Any:
        """The stage under the batch contract (``driver.batch_stage``): the materializer
        kernel, unless ``TIDEMARK_MATERIALIZER_KERNEL=0`` asks for the per-key path."""
        if os.environ.get("TIDEMARK_MATERIALIZER_KERNEL", "1") == "0":
            return PerKeyAdapter(self)
        from tidemark.engine.kernels.materializer import COLUMNAR_MIN_CHANGES, KERNEL_MIN_CHANGES, MaterializerKernel

        return MaterializerKernel(self, min_changes=KERNEL_MIN_CHANGES, columnar_min_changes=COLUMNAR_MIN_CHANGES)

    # ------------------------------------------------------------------ typed state

    state_version = 1

    @property
    def state_kind(self) -> str:
        return "materializer-active-rows" if self.strategy == "DEDUPLICATE" else "materializer-current-row"

    def empty_state(self) -> Bucket:
        return Bucket()

    def state_to_table(self, bucket: Bucket) -> pa.Table:
        """One row per active row (module docstring, "Stored state"); the PK is the row's.
        A stored bucket's unread rows (``read_keys``) are written back as they were read."""
        from tidemark.engine import state_tables as T
        from tidemark.engine.kernels.table_bucket import TableBucket

        if not isinstance(bucket, TableBucket) or bucket.unread is None:
            return self._table_of(bucket.states.values())
        if bucket.table is not None:  # nothing read
            return bucket.table
        merged = _concat_stored(bucket.unread, self._table_of(bucket.states.values()))
        if merged is None:  # the parts typed a column differently (a pickled value): read all
            states = self._states_of(bucket.unread)
            states.update(bucket.states)
            return self._table_of(states.values())
        return T.sorted_by_key(merged, self.pk)

    def state_from_table(self, table: pa.Table) -> Bucket:
        from tidemark.engine.kernels.table_bucket import TableBucket

        return TableBucket(table, self._states_of)

    def read_keys(self, bucket: Bucket, keys: pa.Table) -> None:
        """Read into a stored bucket (``TableBucket``) only the PKs in ``keys`` (a column per
        PK column, in the PK's order), the others staying stored. Why: turning every stored
        PK into Python state and back at every batch made the stage's cost grow with its
        state rather than with its batch. A bucket already read, or keys that cannot be
        matched by value (``state_tables.rows_with_keys``), are read whole on first use."""
        from tidemark.engine import state_tables as T
        from tidemark.engine.kernels.table_bucket import TableBucket

        if not isinstance(bucket, TableBucket) or bucket.table is None:
            return
        mask = T.rows_with_keys(bucket.table.column("row"), self.pk, keys)
        if mask is not None:
            bucket.read_rows(mask)

    def _table_of(self, states: Iterable[Any]) -> pa.Table:
        from tidemark.engine import state_tables as T

        cols: dict[str, Any] = {}
        if self.strategy == "DEDUPLICATE":
            nodes = [(st, node) for st in states for node in st.in_order()]
            rows = [n.row for _, n in nodes]
            cols["pos"] = T.positions_column([n.pos for _, n in nodes])
            copies = [list(n.copies) if n.copies is not None else None for _, n in nodes]
            cols["copies"] = T.position_lists_column(copies)
            touched = [st.touched_ms for st, _ in nodes]
        else:
            current = list(states)
            rows = [st.row for st in current]
            dropped = [st.dropped for st in current]
            if any(dropped):  # almost always 0: a bucket without any does not store them
                cols["dropped"] = T.ints_column(dropped)
            touched = [st.touched_ms for st in current]
        if self.ttl_ms is not None:  # without a TTL nothing reads it: not stored
            cols["touched_ms"] = T.ints_column(touched)
        width = len(rows[0]) if rows else len(self.columns or ())
        return T.sorted_by_key(T.table({"row": T.rows_column(rows, width, self.columns), **cols}), self.pk)

    def _states_of(self, table: pa.Table) -> dict[tuple, Any]:
        from tidemark.engine import state_tables as T

        rows = T.rows_of(table.column("row"))
        touched = table.column("touched_ms").to_pylist() if "touched_ms" in table.column_names else [0] * len(rows)
        states: dict[tuple, Any] = {}
        if self.strategy == "DEDUPLICATE":
            pos = T.positions_of(table.column("pos"))
            copies = T.position_lists_of(table.column("copies"))
            for row, p, cp, t in zip(rows, pos, copies, touched):
                key = self.key_of_row(row)
                st = states.get(key)
                if st is None:
                    st = states[key] = ActiveRows()
                    st.touched_ms = t
                st.append(self.identity(row), row, p, cp)
        else:
            dropped = table.column("dropped").to_pylist() if "dropped" in table.column_names else [0] * len(rows)
            for row, t, d in zip(rows, touched, dropped):
                states[self.key_of_row(row)] = CurrentRow(row, t, d)
        return states

    def _deduplicate(self, ops, st: ActiveRows | None, pos: tuple, ctx: BatchContext):
        """One record at a time against the state, as Flink's SinkUpsertMaterializer."""
        replace = self.upsert_key is not None
        old = st.latest() if st is not None else None
        for op_pos, is_add, row in ops:
            ident = self.identity(row)
            if is_add:
                if st is None:
                    st = ActiveRows()
                st.add(ident, row, op_pos, replace)
            elif st is None or not st.retract(ident):
                ctx.metrics["retractions_without_state"] += 1
        if st is None or not st.nodes:
            return None, diff_to_changes(old, None, pos)
        st.touched_ms = ctx.now_ms
        return st, diff_to_changes(old, st.latest(), pos)

    def _single_row(self, key: tuple, ops, state: CurrentRow | None, pos: tuple, ctx: BatchContext):
        """NOTHING / ERROR: one compaction step of Flink's watermark-compacting materializer."""
        replace = self.upsert_key is not None
        old = state.row if state is not None else None
        dropped = state.dropped if state is not None else 0
        old_ident = self.identity(old) if old is not None else None
        old_retracted = 0  # retractions of the current row's identity left after cancelling
        # identity -> [row, count, add position or _CURRENT]; dicts keep insertion order =
        # Flink's list order
        rows: dict[tuple, list] = {}
        if old is not None:
            rows[old_ident] = [old, 1, _CURRENT]
        for op_pos, is_add, row in ops:
            ident = self.identity(row)
            entry = rows.get(ident)
            if is_add:
                if entry is None:
                    rows[ident] = [row, 1, op_pos]
                elif replace:
                    entry[0], entry[2] = row, op_pos
                else:
                    entry[1] += 1
                continue
            if ident == old_ident:
                old_retracted += 1
            if entry is None:
                ctx.metrics["retractions_without_state"] += 1
            elif replace or entry[1] == 1:
                del rows[ident]
            else:
                entry[1] -= 1
        total = sum(e[1] for e in rows.values())
        if total == 0:
            return None, diff_to_changes(old, None, pos)
        first = next(iter(rows.values()))
        if total > 1:
            if self.strategy == "ERROR":
                active = [e[0] for e in rows.values() for _ in range(e[1])]
                raise ConflictError(
                    self.table,
                    dict(zip(self.pk_names, key)),
                    f"active rows {active[0]!r} and {active[1]!r}",
                )
            ctx.metrics["conflicts_dropped"] += total - 1
            if old is not None and old_ident not in rows and 0 < old_retracted <= dropped:
                # every retraction of the shown row may have meant a dropped copy: it is
                # still active as far as the sink can know, and Flink keeps it
                ctx.metrics["conflicts_dropped"] += 1
                return CurrentRow(old, ctx.now_ms, dropped - old_retracted), []
        if first[2] is _CURRENT:
            keep = dropped  # the current row stays: its dropped copies still count
        else:
            keep = 0
        new_state = CurrentRow(first[0], ctx.now_ms, keep + (first[1] - 1 if not replace else 0))
        return new_state, diff_to_changes(old, first[0], pos)


def in_position_order(changes: list[Change]) -> list[tuple[tuple, bool, tuple]]:
    """``(pos, is_add, row)`` by position, retractions before adds at one position (the
    ``-U`` of an update precedes its ``+U``), ties by repr: never arrival order."""
    if len(changes) == 1:
        c = changes[0]
        return [(c.pos, c.is_add, c.row)]
    return [(c.pos, c.is_add, c.row) for c in canonical_sorted(changes)]


def consolidate(changes: list[Change]) -> list[tuple[tuple, bool, tuple]]:
    """NOTHING/ERROR: cancel exact +X/-X pairs wherever they sit, as Flink's compacting
    materializer cancels them inside one compaction step (the earliest adds cancel against
    the latest retractions), then order the rest as ``in_position_order`` does."""
    if len(changes) == 1:
        c = changes[0]
        return [(c.pos, c.is_add, c.row)]
    adds: dict[tuple, list] = {}
    rets: dict[tuple, list] = {}
    for c in changes:
        (adds if c.is_add else rets).setdefault(c.row, []).append(c.pos)
    ops = []
    for row in adds.keys() | rets.keys():
        a = sorted(adds.get(row, ()))
        r = sorted(rets.get(row, ()))
        k = min(len(a), len(r))
        ops.extend((p, True, row) for p in a[k:])
        ops.extend((p, False, row) for p in r[: len(r) - k])
    return sorted_ops(ops)


