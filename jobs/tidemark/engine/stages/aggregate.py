"""Group aggregate with retraction: SUM, COUNT, COUNT(*), MIN, MAX, AVG, LAST_VALUE.

Why retractable accumulators: the input is a changelog, so every value that was added may
later be retracted (``-U``/``-D``), and the result must then be exactly as if it had never
been added. Each function therefore keeps what Flink's ``*WithRetract`` aggregate functions
keep: a running sum and count for SUM/COUNT/AVG, a multiset of values for MIN/MAX (so
retracting the current minimum finds the next one), and for LAST_VALUE every still-active
value with its source positions (so retracting the latest rolls back to the one before).

Per batch and group the changes form a Z-set: exact ``+x``/``-x`` pairs cancel, the rest is
applied at once and the stage emits one net change (``+I`` new group, ``-U``/``+U`` changed
row, ``-D`` when the group's row count reaches 0, nothing when the output row is unchanged).
The output position is the greatest position among the batch's changes for that group.

Refresh (what Flink's record-by-record ``GroupAggFunction`` shows downstream): when the output
row ends the batch with the value it started with, Flink may still have emitted changes for
it during the batch (the group emptied and re-created, a value changed and changed back), and
downstream the row then sits at the later position; a sink ``ON CONFLICT DO DEDUPLICATE``
picks its latest row by that position. So in that case the batch's changes are replayed one
by one on a copy of the old state, in position order with retractions before adds at one
position (ties by the row's repr, so arrival order never matters); if the output changed or
vanished at any step, the stage emits ``-U X`` at the first such step's position and ``+U X``
at the last one's. An add that leaves the output equal at every step (e.g. a SUM-neutral
value with no COUNT) emits nothing, as Flink does with state TTL off. Only groups with more
than one change in the batch and an unchanged output pay for the copy.

Semantics worth knowing:
- SQL nulls are ignored by every function; SUM/MIN/MAX/AVG/LAST_VALUE of only nulls is NULL,
  COUNT(col) of only nulls is 0. COUNT(*) (``COUNT_STAR``) counts rows.
- AVG of integers is an integer, truncated toward zero like Java's long division (Flink's
  AVG on BIGINT/INT). Floats divide as floats, Decimals as Decimals.
- LAST_VALUE orders by source position, not arrival. A retraction of value ``v`` removes the
  *earliest* active instance of ``v`` (Flink's ``LastValueWithRetractAggFunction`` removes the
  first order it recorded); that rule is order- and batching-independent.
- ``distinct=True`` feeds a value to SUM/COUNT/AVG only while its multiplicity is positive
  (MIN/MAX/LAST_VALUE ignore it: DISTINCT cannot change their result).
- A retraction that finds nothing to retract (row count would drop below 0) is counted as
  ``retractions_without_state`` and ignored; it never crashes the pipeline.
"""

from __future__ import annotations

import copy
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from tidemark.engine.changelog import UPDATE_AFTER, UPDATE_BEFORE, Change, canonical_sorted, columns_of, diff_to_changes
from tidemark.engine.driver import PerKeyAdapter
from tidemark.engine.errors import PlanError
from tidemark.engine.stage import BatchContext
from tidemark.engine.types import SqlType

if TYPE_CHECKING:
    import pyarrow as pa

FUNCS = ("SUM", "COUNT", "COUNT_STAR", "MIN", "MAX", "AVG", "LAST_VALUE")


@dataclass(frozen=True)
class AggCall:
    """One aggregate call: ``func`` over input column ``arg`` (``None`` only for COUNT(*))."""

    func: str
    arg: int | None = None
    distinct: bool = False

    def __post_init__(self) -> None:
        if self.func not in FUNCS:
            raise PlanError(f"unsupported aggregate function {self.func!r}; supported: {', '.join(FUNCS)}")
        if self.arg is None and self.func not in ("COUNT", "COUNT_STAR"):
            raise PlanError(f"aggregate {self.func} needs an argument column")

    @property
    def counts_rows(self) -> bool:
        return self.func == "COUNT_STAR" or (self.func == "COUNT" and self.arg is None)


# --- accumulators -------------------------------------------------------------------------
# Small __slots__ classes rather than closures: state must pickle (Spark's state store)
# and stay compact per group.


class SumAcc:
    """SUM and AVG: running total plus the number of non-null values behind it."""

    __slots__ = ("total", "n")

    def __init__(self) -> None:
        self.total: Any = 0
        self.n = 0

    def update(self, v: Any, w: int) -> None:
        self.total += v * w
        self.n += w
        if self.n <= 0:
            # Reset rather than keep e.g. 1e-17 of float drift, or a negative leftover
            # from a retraction of something never added.
            self.total, self.n = 0, 0

    def sum(self) -> Any:
        return self.total if self.n > 0 else None

    def avg(self) -> Any:
        if self.n <= 0:
            return None
        t = self.total
        if isinstance(t, int) and not isinstance(t, bool):
            q = abs(t) // self.n  # Java long division truncates toward zero
            return q if t >= 0 else -q
        if isinstance(t, Decimal):
            return t / Decimal(self.n)
        return t / self.n


class CountAcc:
    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0

    def update(self, v: Any, w: int) -> None:
        self.n = max(self.n + w, 0)


class ExtremeAcc:
    """MIN/MAX over a multiset of values (Flink's Min/MaxWithRetract keep a map value->count).

    The current extreme is cached; only retracting its last copy forces a rescan."""

    __slots__ = ("values", "is_max", "cur", "dirty")

    def __init__(self, is_max: bool) -> None:
        self.values: dict = {}
        self.is_max = is_max
        self.cur: Any = None
        self.dirty = False

    def update(self, v: Any, w: int) -> None:
        n = self.values.get(v, 0) + w
        if n > 0:
            self.values[v] = n
            if not self.dirty and (
                self.cur is None or (v > self.cur if self.is_max else v < self.cur)
            ):
                self.cur = v
        else:
            self.values.pop(v, None)
            if v == self.cur:
                self.dirty = True

    def result(self) -> Any:
        if self.dirty:
            self.cur = (max if self.is_max else min)(self.values) if self.values else None
            self.dirty = False
        return self.cur


class LastValueAcc:
    """LAST_VALUE with retraction: active source positions per value; latest position wins."""

    __slots__ = ("positions", "cur")

    def __init__(self) -> None:
        self.positions: dict[Any, list] = {}
        self.cur: tuple | None = None  # (pos, repr(value), value) of the latest

    def apply(self, adds: dict[Any, list], retracts: Counter) -> None:
        rescan = False
        for v in set(adds) | set(retracts):
            active = sorted(self.positions.get(v, []) + adds.get(v, []))
            k = retracts.get(v, 0)
            if k:
                active = active[k:]  # a retraction removes the earliest instance of v
                rescan = rescan or (self.cur is not None and self.cur[2] == v)
            if active:
                self.positions[v] = active
            else:
                self.positions.pop(v, None)
        if rescan:
            self.cur = max(
                ((p[-1], repr(v), v) for v, p in self.positions.items()), default=None
            )
        else:
            for v, ps in adds.items():
                if v in self.positions:
                    cand = (self.positions[v][-1], repr(v), v)
                    if self.cur is None or cand[:2] > self.cur[:2]:
                        self.cur = cand

    def result(self) -> Any:
        return self.cur[2] if self.cur is not None else None


class GroupState:
    """Row count of the group plus one accumulator per aggregate call."""

    __slots__ = ("rows", "accs", "distinct")

    def __init__(self, aggs: Sequence[AggCall]) -> None:
        self.rows = 0
        self.accs = [_new_acc(a) for a in aggs]
        # value multiplicities for DISTINCT calls, indexed like accs (None when not distinct)
        self.distinct = [Counter() if uses_distinct(a) else None for a in aggs]


def uses_distinct(a: AggCall) -> bool:
    return a.distinct and a.func in ("SUM", "COUNT", "AVG") and not a.counts_rows


def _new_acc(a: AggCall):
    if a.func in ("SUM", "AVG"):
        return SumAcc()
    if a.func in ("COUNT", "COUNT_STAR"):
        return CountAcc()
    if a.func in ("MIN", "MAX"):
        return ExtremeAcc(is_max=a.func == "MAX")
    return LastValueAcc()


class GroupAggregate:
    """Keyed by the group-by columns; output row = group-by values, then one value per call."""

    n_inputs = 1

    def __init__(
        self,
        group_by: tuple[int, ...],
        aggs: list[AggCall],
        name: str = "aggregate",
        input_types: list[SqlType | None] | None = None,
    ):
        self.group_by = tuple(group_by)
        self._key_getter = columns_of(self.group_by)
        self.aggs = list(aggs)
        self.name = name
        # the input columns' SQL types (from the planner): what the batch kernel types its
        # batches and its stored state by (``input_schema``)
        self.input_types = input_types

    @property
    def input_schema(self) -> pa.Schema | None:
        """The input as Arrow columns with positional names; None when a type is unknown
        (Arrow then infers types from the values). Built on use: the per-key path never
        loads pyarrow."""
        types = self.input_types
        if types is None or None in types:
            return None
        import pyarrow as pa

        from tidemark.engine.arrow_types import arrow_type

        try:
            return pa.schema([(f"c{i}", arrow_type(t)) for i, t in enumerate(types)])
        except ValueError:  # a type with no Arrow form
            return None

    def batch_kernel(self) -> Any:
        """The stage under the batch contract (``driver.batch_stage``): the aggregate kernel,
        unless ``TIDEMARK_AGGREGATE_KERNEL=0`` asks for the per-key path (it reads a
        checkpoint written in the per-key format)."""
        if os.environ.get("TIDEMARK_AGGREGATE_KERNEL", "1") == "0":
            return PerKeyAdapter(self)
        from tidemark.engine.kernels.aggregate import AggregateKernel

        return AggregateKernel(self)

    def key_columns(self, input_index: int = 0) -> tuple[int, ...]:
        """The row columns the key is (``tidemark.engine.bucketing``)."""
        return self.group_by

    def output_key_columns(self) -> tuple[int, ...]:
        """Where the key lands in the emitted rows (``tidemark.engine.fusion``): an output
        row starts with the group-by values."""
        return tuple(range(len(self.group_by)))

    def key_of(self, change: Change, input_index: int = 0) -> tuple:
        return self._key_getter(change.row)

    def process_key(
        self, key: tuple, inputs: Sequence[list[Change]], state: GroupState | None, ctx: BatchContext
    ) -> tuple[GroupState | None, list[Change]]:
        changes = inputs[0]
        if not changes:
            return state, []
        net: Counter = Counter()
        for c in changes:
            net[c.row] += c.weight
        pos = max(c.pos for c in changes)
        old = self._output(key, state) if state is not None else None
        # Only a batch of several changes can change the output and change it back, or hold
        # changes that leave the output as it is (a new group's later rows under DISTINCT).
        several = len(changes) > 1
        before = copy.deepcopy(state) if state is not None and several else None
        st = state if state is not None else GroupState(self.aggs)

        delta_rows = sum(net.values())
        if st.rows + delta_rows < 0:
            ctx.metrics["retractions_without_state"] += -(st.rows + delta_rows)
        st.rows = max(st.rows + delta_rows, 0)
        if st.rows == 0:
            return None, diff_to_changes(old, None, pos)

        self._feed(st, net, changes)
        new = self._output(key, st)
        if not several:
            return st, diff_to_changes(old, new, pos)
        # Several changes: Flink emits at each record that changes the output, so what
        # reaches the sink carries the position of the LAST changing record (not the
        # batch's greatest), and an output changed and changed back is re-emitted.
        first, last = self._changing_steps(key, before, old, changes)
        if new == old:
            if last is None:
                return st, []
            return st, [Change(UPDATE_BEFORE, old, first), Change(UPDATE_AFTER, old, last)]
        return st, diff_to_changes(old, new, last if last is not None else pos)

    def _feed(self, st: GroupState, net: Counter, changes: Sequence[Change]) -> None:
        """Feed the (net) input rows to every accumulator; ``st.rows`` is the caller's job."""
        delta_rows = sum(net.values())
        for i, call in enumerate(self.aggs):
            acc = st.accs[i]
            if call.func == "LAST_VALUE":
                self._apply_last_value(acc, call.arg, changes)
            elif call.counts_rows:
                acc.update(None, delta_rows)
            else:
                seen = st.distinct[i]
                for row, w in net.items():
                    v = row[call.arg]
                    if v is None or w == 0:
                        continue
                    if seen is None:
                        acc.update(v, w)
                        continue
                    before = seen[v]
                    after = max(before + w, 0)
                    if after:
                        seen[v] = after
                    else:
                        seen.pop(v, None)
                    if before == 0 and after > 0:
                        acc.update(v, 1)
                    elif before > 0 and after == 0:
                        acc.update(v, -1)

    def _changing_steps(
        self, key: tuple, st: GroupState, old: tuple | None, changes: Sequence[Change]
    ) -> tuple[tuple | None, tuple | None]:
        """Replay ``changes`` one by one on ``st`` (a copy of the old state) as Flink would;
        the positions of the first and last steps that changed the output (None, None when
        none did)."""
        sim: GroupState | None = st
        prev, first, last = old, None, None
        for c in canonical_sorted(changes):
            w = c.weight
            if sim is None:
                if w < 0:
                    continue  # Flink ignores a retraction for a group it has no state for
                sim = GroupState(self.aggs)
            if sim.rows + w < 0:
                continue
            sim.rows += w
            if sim.rows == 0:
                sim = None  # the group emptied: Flink clears its state and emits -D
            else:
                self._feed(sim, Counter({c.row: w}), [c])
            out = self._output(key, sim) if sim is not None else None
            if out != prev:
                prev = out
                first = c.pos if first is None else first
                last = c.pos
        return first, last

    @staticmethod
    def _apply_last_value(acc: LastValueAcc, arg: int, changes: list[Change]) -> None:
        adds: dict[Any, list] = {}
        retracts: Counter = Counter()
        for c in changes:
            v = c.row[arg]
            if v is None:
                continue
            if c.is_add:
                adds.setdefault(v, []).append(c.pos)
            else:
                retracts[v] += 1
        acc.apply(adds, retracts)

    def _output(self, key: tuple, st: GroupState) -> tuple:
        vals = []
        for call, acc in zip(self.aggs, st.accs):
            f = call.func
            if f == "SUM":
                vals.append(acc.sum())
            elif f == "AVG":
                vals.append(acc.avg())
            elif f in ("COUNT", "COUNT_STAR"):
                vals.append(acc.n)
            else:
                vals.append(acc.result())
        return tuple(key) + tuple(vals)
