"""Regular equi-join with retraction: inner, left, right and full outer.

Keyed by the join key; the state of one key holds the multiset of left rows and of right
rows that carry it (each with its count, the position of its latest add and how many rows
of the other side it currently matches). Per batch the stage emits the net change of the
join output for that key as a Z-set diff, ``out(L_new, R_new) - out(L_old, R_old)``,
computed incrementally: each changed input row is joined only with the other side's rows of
the same key, so a one-row change costs O(rows on the other side), never a cross product.
Applying the left changes first and then the right ones telescopes to the same total diff
whatever the order, so the output never depends on arrival order.

Outer joins keep, per row, the number of partners that pass the residual predicate: a row
is padded with NULLs exactly while that number is 0 (SQL semantics: a left row with no
partner passing ``ON ... AND residual`` is padded), so un-padding when a first partner
arrives and re-padding when the last one leaves cost no scan. NULL join keys never match:
such rows are never stored, outer sides pass straight through padded.

Positions (what "latest" means downstream): a joined row carries the greater of its two
inputs' positions, where a row changed in this batch contributes the position of that
change (an add's or a retraction's). A padded row carries its present side's position, or
the position of the change that (un)padded it if that is later, so a retraction and the add
it causes sort in the right order at the sink materializer. Kinds come from
``zset_to_changes``: retractions first; ``-U``/``+U`` when the batch both retracts and adds
rows for the key, ``-D``/``+I`` otherwise.

Refresh (what Flink's record-by-record join shows downstream): an input row deleted and
re-inserted in one batch nets to nothing, yet Flink retracted and re-emitted its joined rows,
which downstream then sit at the later position (a sink ``ON CONFLICT DO DEDUPLICATE`` picks
its latest row by position). So an input row whose changes cancel is not dropped when it
was re-added last and is in state: it is applied as a retraction (at its latest retraction's
position) and then an add (at its latest add's position). Likewise one added and then
retracted (add strictly earlier) is applied as both, so a partner padded again re-appears at
the later position. Input rows are applied in position order (retractions before adds at one
position, then side and repr, never arrival order). An output row whose net weight is 0 but
that was first retracted and last re-added is emitted as ``-U X`` (position of its first
retraction) / ``+U X`` (position of its last add).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tidemark.engine.changelog import UPDATE_AFTER, UPDATE_BEFORE, Change, columns_of, order_key, sorted_by_order, zset_to_changes
from tidemark.engine.errors import PlanError
from tidemark.engine.stage import BatchContext

if TYPE_CHECKING:
    import pyarrow as pa

JOIN_TYPES = ("inner", "left", "right", "full")

# per side: row -> [count, pos of latest add, matching rows on the other side]
CNT, POS, MATCHES = 0, 1, 2

#: "1" runs the join as its batch kernel (``tidemark.engine.kernels.join``) when its input
#: schemas are known; otherwise it runs per key. Off by default until the Spark host runs
#: typed-state kernels (its ``_BucketRunner`` hands every bucket to the per-key adapter).
KERNEL_ENV = "TIDEMARK_JOIN_KERNEL"


class Join:
    n_inputs = 2

    def __init__(
        self,
        join_type: str,
        left_key: tuple[int, ...],
        right_key: tuple[int, ...],
        left_width: int,
        right_width: int,
        residual: Callable[[tuple], bool] | None = None,
        name: str = "join",
        input_schemas: tuple[pa.Schema, pa.Schema] | None = None,
    ):
        """``input_schemas``: each side's columns as Arrow types (the planner's), which the
        batch kernel needs; without them the stage runs per key."""
        if join_type not in JOIN_TYPES:
            raise PlanError(f"unsupported join type {join_type!r}; supported: {', '.join(JOIN_TYPES)}")
        if len(left_key) != len(right_key) or not left_key:
            raise PlanError("an equi-join needs the same number (>= 1) of left and right key columns")
        self.join_type = join_type
        self.keys = (tuple(left_key), tuple(right_key))
        self._key_getters = (columns_of(self.keys[0]), columns_of(self.keys[1]))
        self.widths = (left_width, right_width)
        self.residual = residual
        self.outer = (join_type in ("left", "full"), join_type in ("right", "full"))
        self.name = name
        self.input_schemas = input_schemas

    def batch_kernel(self) -> Any:
        """The batch kernel (``tidemark.engine.kernels.join``) when the input schemas are
        known, unless ``TIDEMARK_JOIN_KERNEL=0`` asks for the per-key adapter (it reads a
        checkpoint written in the per-key format)."""
        from tidemark.engine.driver import PerKeyAdapter

        if self.input_schemas is None or os.environ.get(KERNEL_ENV, "1") == "0":
            return PerKeyAdapter(self)
        from tidemark.engine.kernels.join import JoinKernel

        return JoinKernel(self, self.input_schemas)

    def key_columns(self, input_index: int = 0) -> tuple[int, ...]:
        """The row columns the key is (``tidemark.engine.bucketing``)."""
        return self.keys[input_index]

    def key_of(self, change: Change, input_index: int) -> tuple:
        return self._key_getters[input_index](change.row)

    # -- rows ------------------------------------------------------------------------------
    def _joined(self, side: int, row: tuple, other: tuple) -> tuple:
        return row + other if side == 0 else other + row

    def _padded(self, side: int, row: tuple) -> tuple:
        nulls = (None,) * self.widths[1 - side]
        return row + nulls if side == 0 else nulls + row

    def _passes(self, joined: tuple) -> bool:
        return self.residual is None or bool(self.residual(joined))

    # -- processing ------------------------------------------------------------------------
    def process_key(
        self, key: tuple, inputs: Sequence[list[Change]], state: list | None, ctx: BatchContext
    ) -> tuple[list | None, list[Change]]:
        delta: Counter = Counter()
        pos_of: dict = {}
        # per output row: [first emission an add?, last one an add?, pos of first
        # retraction, pos of last add]
        trace: dict = {}

        def emit(row: tuple, w: int, pos: tuple) -> None:
            if w == 0:
                return
            delta[row] += w
            prev = pos_of.get(row)
            pos_of[row] = pos if prev is None or pos > prev else prev
            t = trace.get(row)
            if t is None:
                t = trace[row] = [w > 0, w > 0, None, None]
            t[1] = w > 0
            if w < 0:
                if t[2] is None:
                    t[2] = pos
            else:
                t[3] = pos

        if any(v is None for v in key):
            # NULL never equals anything: nothing to store, outer sides pass through padded.
            for side in (0, 1):
                if self.outer[side]:
                    for row, (w, pos) in _consolidate(inputs[side]).items():
                        emit(self._padded(side, row), w, pos)
            return None, _encode(delta, pos_of, trace)

        st = state if state is not None else [{}, {}]
        for side, row, w, pos in self._steps(inputs, st):
            self._apply(side, row, w, pos, st, emit, ctx)
        new_state = st if (st[0] or st[1]) else None
        return new_state, _encode(delta, pos_of, trace)

    @staticmethod
    def _steps(inputs: Sequence[list[Change]], st: list) -> list[tuple]:
        """The batch's input rows as (side, row, weight, pos) steps in position order. A row
        whose changes cancel becomes a retract+add (re-added last, in state) or add+retract
        (added strictly earlier) pair of steps, so its joined rows move as in Flink."""
        steps: list[tuple] = []
        for side in (0, 1):
            w: Counter = Counter()
            add_pos: dict = {}
            ret_pos: dict = {}
            for c in inputs[side]:
                w[c.row] += c.weight
                best = add_pos if c.is_add else ret_pos
                if c.row not in best or c.pos > best[c.row]:
                    best[c.row] = c.pos
            for row, n in w.items():
                if n > 0:
                    steps.append((side, row, n, add_pos[row]))
                elif n < 0:
                    steps.append((side, row, n, ret_pos[row]))
                elif row in add_pos and row in ret_pos:
                    a, r = add_pos[row], ret_pos[row]
                    if a < r:
                        steps.append((side, row, 1, a))
                        steps.append((side, row, -1, r))
                    elif row in st[side]:
                        steps.append((side, row, -1, r))
                        steps.append((side, row, 1, a))
        # the canonical order with (side, row) as the row: at a tie, side 0 before side 1,
        # then by the row's repr (``repr((side, row))`` is the side's digit, then repr(row))
        return sorted_by_order(steps, _step_position_side, _step_order_key)

    def _apply(self, side: int, row: tuple, w: int, pos: tuple, st: list, emit, ctx) -> None:
        mine, theirs = st[side], st[1 - side]
        entry = mine.get(row)
        old_cnt = entry[CNT] if entry is not None else 0
        if old_cnt + w < 0:
            # Retracting more copies than were ever added: retract what exists, count the rest.
            ctx.metrics["retractions_without_state"] += -(old_cnt + w)
            w = -old_cnt
        if w == 0:
            return
        other_outer = self.outer[1 - side]
        matches = 0
        for other, o in theirs.items():
            joined = self._joined(side, row, other)
            if not self._passes(joined):
                continue
            matches += o[CNT]
            emit(joined, w * o[CNT], max(pos, o[POS]))
            before = o[MATCHES]
            o[MATCHES] = before + w
            if other_outer:
                if before == 0 and o[MATCHES] > 0:  # first partner arrived: un-pad
                    emit(self._padded(1 - side, other), -o[CNT], max(pos, o[POS]))
                elif before > 0 and o[MATCHES] == 0:  # last partner left: pad again
                    emit(self._padded(1 - side, other), o[CNT], max(pos, o[POS]))
        if entry is None:
            entry = mine[row] = [0, pos, matches]
        if self.outer[side] and entry[MATCHES] == 0:
            emit(self._padded(side, row), w, pos)
        entry[CNT] += w
        if w > 0:
            entry[POS] = pos
        if entry[CNT] == 0:
            del mine[row]


def _step_position_side(s: tuple) -> tuple:
    return (s[3], s[2] > 0, s[0])


def _step_order_key(s: tuple) -> tuple:
    return order_key(s[3], s[2] > 0, (s[0], s[1]))


def _consolidate(changes: list[Change]) -> dict[tuple, tuple[int, tuple]]:
    """Net weight per distinct row, with the position of the changes that produced it:
    the latest add for a net add, the latest retraction for a net retraction."""
    w: Counter = Counter()
    add_pos: dict = {}
    ret_pos: dict = {}
    for c in changes:
        w[c.row] += c.weight
        best = add_pos if c.is_add else ret_pos
        if c.row not in best or c.pos > best[c.row]:
            best[c.row] = c.pos
    return {r: (n, add_pos[r] if n > 0 else ret_pos[r]) for r, n in w.items() if n != 0}


def _encode(delta: Counter, pos_of: dict, trace: dict) -> list[Change]:
    out = zset_to_changes({r: n for r, n in delta.items() if n != 0}, pos_of)
    for row, (first_add, last_add, ret, add) in trace.items():
        # net 0, first retracted and re-added last: it was there before and is again,
        # at the later position
        if delta[row] == 0 and not first_add and last_add:
            out.append(Change(UPDATE_BEFORE, row, ret))
            out.append(Change(UPDATE_AFTER, row, add))
    return out
