"""Delta join: an equi-join that keeps no join state. For each change on one side it looks
up the other side's rows for the join key in an index built from that side's source topic
(see ``docs/delta-join.md``), with an LRU cache per side in front of the index.

Two consistency modes, per batch (the micro-batch holds both deltas, ``dA`` and ``dB``):

- ``eventual`` (the seed's): ``dA |x| (B + dB) + (A + dA) |x| dB`` with the other side
  looked up *as it is now* (at least as new as the end of this batch). The term
  ``dA |x| dB`` is counted twice and a lookup may see rows of later batches, so the output
  is an upsert stream: right once every batch has been processed, when applied by key by
  the sink materializer the planner puts after it. INNER joins only, and the planner
  allows deletes (or updates that move rows between join keys) on one input only.
- ``strong``: ``dA |x| B_before + A_after |x| dB`` where ``B_before`` is B as of the start
  of the batch (the index answers "as of" an offset fence) and ``A_after = A_before + dA``.
  That is exactly the regular join's delta. To emit it with the regular join's kinds,
  refreshes (``-U X``/``+U X`` for a row put back within the batch) and positions, every
  join type rebuilds the regular join's state for the key from the two before-images and
  lets ``Join`` compute the change, so the output equals ``stages.join.Join`` change for
  change. A key touched on either side therefore needs both sides' before-images (an
  inner join skips the side that only adds while the other side is unchanged: its rows
  cannot change the output).

Where the rows come from is injected, so the stage has no HTTP or Kafka in it:

- unbound (``tidemark replay``, tests): an *embedded* index per side, fed with the join
  input's own changes: the in-process stand-in for the index service (it holds each
  side's rows, like the index service does; the host's join state stays empty);
- ``bind(lookup)``: ``lookup(table, index, keys, min_offsets=..., as_of=...) -> rows per
  key`` answers from the index service over HTTP (or an in-process ``TableIndex``); the
  rows are source-table rows, so the side's calc chain (projection/filter between source
  and join) is applied here. The host gives the batch's offset fences with
  ``begin_batch``: strong lookups are ``as_of`` the batch's start offsets, eventual ones
  wait for its end offsets.

Caches: one LRU per side, join key -> that side's rows at the end of the last batch this
instance processed. A change on a side updates that side's entry only if cached. Entries
are only valid while one instance sees every batch of its keys, so ``begin_batch`` clears
the caches when batches are not consecutive (a retried batch, a partition that moved to
another worker). The host keeps no state for this stage: ``process_key`` always returns
``None``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tidemark.engine.changelog import INSERT, Change, zset_to_changes
from tidemark.engine.errors import PlanError
from tidemark.engine.stage import BatchContext
from tidemark.engine.stages.delta_cache import SideCache, SideRows
from tidemark.engine.stages.join import CNT, MATCHES, POS, Join, _consolidate

CONSISTENCY = ("eventual", "strong")
SIDE_NAMES = ("left", "right")
Offsets = Mapping[int, int]


class LookupFn(Protocol):
    def __call__(
        self,
        table: str,
        index: str,
        keys: Sequence[tuple],
        min_offsets: Offsets | None = None,
        as_of: Offsets | None = None,
    ) -> list[list[tuple[tuple, tuple]]]: ...


@dataclass
class DeltaSide:
    """How to look one join input up in its source table's index. ``index_key`` gives, in
    the index's column order, the positions in the join key tuple holding the index
    columns; ``calcs`` turn a source row into the join input's row (None = filtered)."""

    table: str
    index: str
    index_columns: tuple[str, ...]
    index_key: tuple[int, ...]
    calcs: list[Any] = field(default_factory=list)

    def to_input_row(self, row: tuple, pos: tuple) -> tuple | None:
        changes = [Change(INSERT, row, pos)]
        for calc in self.calcs:
            changes = calc.process(changes)
            if not changes:
                return None
        return changes[0].row


# --------------------------------------------------------------------------- sources


class EmbeddedSource:
    """The in-process index of one join input: its rows by join key, fed with the
    input's own changes. "start" is the state before the current batch's changes."""

    latest_includes_batch = False

    def __init__(self) -> None:
        self.store: dict[tuple, SideRows] = {}

    def fetch(self, keys: Sequence[tuple], fence: str) -> dict[tuple, SideRows]:
        return {k: self.store.get(k, {}) for k in keys}

    def advance(self, key: tuple, changes: dict) -> None:
        if changes:
            rows = advance_rows(self.store.get(key, {}), changes)
            if rows:
                self.store[key] = rows
            else:
                self.store.pop(key, None)

    def replace(self, key: tuple, rows: SideRows) -> None:
        """The key's rows after the batch, as the regular join's state has them."""
        if rows:
            self.store[key] = rows
        else:
            self.store.pop(key, None)

    def set_fence(self, start: Offsets | None, end: Offsets | None) -> None:
        pass


class IndexSource:
    """One join input looked up through ``lookup`` (index service or ``TableIndex``)."""

    latest_includes_batch = True

    def __init__(self, lookup: LookupFn, side: DeltaSide, key_of: Callable[[tuple], tuple]):
        self.lookup, self.side, self.key_of = lookup, side, key_of
        self.start: Offsets | None = None
        self.end: Offsets | None = None

    def set_fence(self, start: Offsets | None, end: Offsets | None) -> None:
        self.start, self.end = start, end

    def fetch(self, keys: Sequence[tuple], fence: str) -> dict[tuple, SideRows]:
        side = self.side
        out: dict[tuple, SideRows] = {k: {} for k in keys}
        ikeys = list(dict.fromkeys(tuple(k[j] for j in side.index_key) for k in keys))
        if fence == "start":
            if self.start is None:
                raise RuntimeError(f"delta join: no start offsets for '{side.table}' (strong mode needs begin_batch fences)")
            answers = self.lookup(side.table, side.index, ikeys, min_offsets=self.start, as_of=self.start)
        else:
            answers = self.lookup(side.table, side.index, ikeys, min_offsets=self.end, as_of=None)
        for rows in answers:
            for row, pos in rows:
                jrow = side.to_input_row(tuple(row), tuple(pos))
                if jrow is None:
                    continue
                entry = out.get(self.key_of(jrow))
                if entry is None:
                    continue  # the index is coarser than the join key: another join key
                e = entry.get(jrow)
                if e is None:
                    entry[jrow] = [1, tuple(pos)]
                else:
                    e[0] += 1
                    e[1] = max(e[1], tuple(pos))
        return out

    def advance(self, key: tuple, changes: dict) -> None:
        pass  # the index service follows the source topic itself

    def replace(self, key: tuple, rows: SideRows) -> None:
        pass


def advance_rows(rows: SideRows, changes: dict) -> SideRows:
    """``rows + changes`` (consolidated ``row -> (weight, pos)``) as a new dict; a row's
    position becomes that of its latest net add, as in the regular join's state."""
    out = {r: [c, p] for r, (c, p) in rows.items()}
    for r, (w, pos) in changes.items():
        e = out.get(r)
        cnt = (e[0] if e is not None else 0) + w
        if cnt <= 0:
            out.pop(r, None)
        elif e is None:
            out[r] = [cnt, pos]
        else:
            e[0] = cnt
            if w > 0:
                e[1] = pos
    return out


# --------------------------------------------------------------------------- stage


class DeltaJoin:
    n_inputs = 2

    def __init__(
        self,
        join_type: str,
        left_key: tuple[int, ...],
        right_key: tuple[int, ...],
        left_width: int,
        right_width: int,
        residual: Callable[[tuple], bool] | None = None,
        *,
        sides: tuple[DeltaSide | None, DeltaSide | None] = (None, None),
        consistency: str = "eventual",
        cache_enabled: bool = True,
        cache_sizes: tuple[int, int] = (10000, 10000),
        name: str = "delta_join",
    ):
        self.join = Join(join_type, left_key, right_key, left_width, right_width, residual, name=name)
        if consistency not in CONSISTENCY:
            raise PlanError(f"delta join consistency must be one of {', '.join(CONSISTENCY)}, got {consistency!r}")
        if consistency == "eventual" and join_type != "inner":
            raise PlanError(f"an eventually consistent delta join supports INNER joins only, not {join_type.upper()}")
        self.join_type = join_type
        self.residual = residual
        self.sides = sides
        self.consistency = consistency
        self.cache_enabled = cache_enabled
        self.cache_sizes = tuple(cache_sizes)
        self.name = name
        self._lookup: LookupFn | None = None
        self._init_runtime()

    # ------------------------------------------------------------------ runtime objects

    def _init_runtime(self) -> None:
        self.caches = [SideCache(self.cache_sizes[s], self.cache_enabled) for s in (0, 1)]
        if self._lookup is None:
            self.sources: list[Any] = [EmbeddedSource(), EmbeddedSource()]
        else:
            self.sources = [IndexSource(self._lookup, self.sides[s], self._key_fn(s)) for s in (0, 1)]
        self._batch_rows: list[dict[tuple, tuple[SideRows, bool]]] = [{}, {}]
        self._batch: int | None = None
        self._reported_size = [0, 0]

    def __getstate__(self) -> dict[str, Any]:
        # caches, embedded rows and the lookup (an HTTP client) stay in the process that made them
        state = dict(self.__dict__)
        for k in ("caches", "sources", "_batch_rows", "_batch", "_reported_size"):
            state.pop(k, None)
        state["_lookup"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._shipped = True
        self._init_runtime()

    def _key_fn(self, side: int) -> Callable[[tuple], tuple]:
        cols = self.join.keys[side]
        return lambda row: tuple(row[i] for i in cols)

    def bind(self, lookup: LookupFn) -> DeltaJoin:
        """Look both inputs up through ``lookup`` instead of the embedded index."""
        for s in (0, 1):
            if self.sides[s] is None:
                raise PlanError(f"delta join '{self.name}': the {SIDE_NAMES[s]} input has no index description")
        self._lookup = lookup
        self._init_runtime()
        return self

    @property
    def bound(self) -> bool:
        return self._lookup is not None

    def begin_batch(self, batch_id: int, fences: Mapping[str, tuple[Offsets, Offsets]] | None = None) -> None:
        """Start a batch: ``fences[table] = (start offsets, end offsets)`` of the batch.
        Caches survive only from one batch to the next (see the module docstring)."""
        if self._batch is not None and batch_id != self._batch + 1:
            for c in self.caches:
                c.clear()
        self._batch = batch_id
        self._batch_rows = [{}, {}]
        for s in (0, 1):
            side = self.sides[s]
            start, end = (fences or {}).get(side.table, (None, None)) if side is not None else (None, None)
            self.sources[s].set_fence(start, end)

    def _enter(self, ctx: BatchContext) -> None:
        if self._batch != ctx.batch_id:
            # a host that does not call begin_batch (the replay host): batches are consecutive
            self._batch = ctx.batch_id
            self._batch_rows = [{}, {}]

    # ------------------------------------------------------------------ keyed contract

    def key_columns(self, input_index: int = 0) -> tuple[int, ...]:
        """The row columns the key is (``tidemark.engine.bucketing``)."""
        return self.join.key_columns(input_index)

    def key_of(self, change: Change, input_index: int) -> tuple:
        return self.join.key_of(change, input_index)

    def _fence(self, side: int) -> str:
        if self.consistency == "strong" or not self.sources[side].latest_includes_batch:
            return "start"
        return "end"

    def process_key(
        self, key: tuple, inputs: Sequence[list[Change]], state: Any, ctx: BatchContext
    ) -> tuple[Any, list[Change]]:
        if self._lookup is None and getattr(self, "_shipped", False):
            # Shipped to another process (a Spark worker) but never bound to an index: an
            # embedded index there would see only its task's rows. Be the regular join,
            # with its state kept by the host: right, only not stateless.
            ctx.metrics["delta_join.unbound_regular_join_keys"] += 1
            return self.join.process_key(key, inputs, state, ctx)
        self._enter(ctx)
        if any(v is None for v in key):  # NULL never matches: the regular join's pass-through
            return None, self.join.process_key(key, inputs, None, ctx)[1]
        if self.consistency == "strong":
            out = self._strong(key, inputs, ctx)
        else:
            out = self._eventual(key, inputs, ctx)
        for s in (0, 1):
            size = len(self.caches[s])
            ctx.metrics[f"delta_join.{SIDE_NAMES[s]}.cache_size"] += size - self._reported_size[s]
            self._reported_size[s] = size
        return None, out

    def _strong_needs(self, inputs: Sequence[list[Change]]) -> list[bool]:
        """Which sides' before-images ``Join`` needs for a key the batch touches. Outer
        joins: both (padding depends on both sides' rows). Inner joins: side ``s`` when the
        other side changed (its changes join with ``s``'s rows) or when ``s`` retracts (a
        retraction, or a row put back, needs ``s``'s own rows: how many copies exist, and
        whether the row was there); a side that only adds, facing an unchanged other side,
        changes the output the same whatever its own rows are, so it is not looked up."""
        if not (inputs[0] or inputs[1]):
            return [False, False]
        if any(self.join.outer):
            return [True, True]
        return [bool(inputs[1 - s]) or any(not c.is_add for c in inputs[s]) for s in (0, 1)]

    def _strong(self, key: tuple, inputs: Sequence[list[Change]], ctx: BatchContext) -> list[Change]:
        """The regular join's change for ``key``: its per-key state rebuilt from both sides'
        before-images (as of the batch's start), then ``Join.process_key`` on the batch's
        changes, so kinds, refreshes and positions are the regular join's own. The state it
        leaves is the after-images, with the regular join's positions: what the caches and
        the embedded index keep for the next batch. A side not looked up (see
        ``_strong_needs``) only adds; its cached entry, if any, is advanced."""
        need = self._strong_needs(inputs)
        if not (need[0] or need[1]):
            return []
        before = [self._rows(s, key, ctx)[0] if need[s] else {} for s in (0, 1)]
        st = self._join_state(before)
        out = self.join.process_key(key, inputs, st, ctx)[1]
        for s in (0, 1):
            if need[s]:
                after = {r: [e[CNT], e[POS]] for r, e in st[s].items()}
                if self.cache_enabled:
                    self.caches[s].put(key, after)
                self.sources[s].replace(key, after)
            elif inputs[s]:
                adds = _consolidate(inputs[s])
                cached = self.caches[s].peek(key)
                if cached is not None:
                    self.caches[s].put(key, advance_rows(cached, adds))
                self.sources[s].advance(key, adds)
        return out

    def _eventual(self, key: tuple, inputs: Sequence[list[Change]], ctx: BatchContext) -> list[Change]:
        """``dA |x| (B + dB) + (A + dA) |x| dB`` with both sides as they are after the batch
        (looked up at its end, or the embedded index advanced by the batch)."""
        cons = [_consolidate(inputs[0]), _consolidate(inputs[1])]
        need = [bool(cons[1]), bool(cons[0])]  # each changed side needs the other's rows
        after: list[SideRows | None] = [None, None]
        for s in (0, 1):
            cache = self.caches[s]
            if need[s]:
                rows, includes_batch = self._rows(s, key, ctx)
                if includes_batch:  # looked up after the batch: only fix positions
                    after[s] = {r: [c, p] for r, (c, p) in rows.items()}
                    for r, (w, p) in cons[s].items():
                        if w > 0 and r in after[s]:
                            after[s][r][1] = p
                else:
                    after[s] = advance_rows(rows, cons[s]) if cons[s] else rows
                if self.cache_enabled:
                    cache.put(key, after[s])
            elif cons[s] and key in cache:
                # "a change on one side updates that side's cached entry only if present"
                cache.put(key, advance_rows(cache.peek(key), cons[s]))
            self.sources[s].advance(key, cons[s])
        return self._inner(cons, after)

    def _rows(self, s: int, key: tuple, ctx: BatchContext) -> tuple[SideRows, bool]:
        """Side ``s``'s rows for ``key``: (rows, whether they already include this batch)."""
        pre = self._batch_rows[s].pop(key, None)
        if pre is not None:
            return pre
        side = SIDE_NAMES[s]
        if self.cache_enabled:
            hit = self.caches[s].get(key)
            if hit is not None:
                ctx.metrics[f"delta_join.{side}.cache_hits"] += 1
                return hit, False
            ctx.metrics[f"delta_join.{side}.cache_misses"] += 1
        fence = self._fence(s)
        ctx.metrics[f"delta_join.{side}.lookup_requests"] += 1
        ctx.metrics[f"delta_join.{side}.lookup_keys"] += 1
        rows = self.sources[s].fetch([key], fence)[key]
        return rows, fence == "end"

    def _inner(self, cons: list[dict], after: list) -> list[Change]:
        """Eventual: ``dA |x| B_after + A_after |x| dB`` (``dA |x| dB`` twice: the seed's
        duplicate). A joined row carries the greater of its inputs' positions."""
        delta: Counter = Counter()
        pos_of: dict = {}
        residual = self.residual
        for s in (0, 1):
            if not cons[s]:
                continue
            other = after[1 - s]
            for row, (w, pos) in cons[s].items():
                for o, (cnt, opos) in other.items():
                    j = row + o if s == 0 else o + row
                    if residual is None or residual(j):
                        _emit(delta, pos_of, j, w * cnt, max(pos, opos))
        return zset_to_changes({r: n for r, n in delta.items() if n != 0}, pos_of)

    def _join_state(self, before: list) -> list:
        """The regular join's state for one key, rebuilt from the two before-images. The
        per-row partner counts only matter to an outer side (they decide padding), so an
        inner join skips the O(rows x rows) pass that computes them."""
        st: list[dict] = [{}, {}]
        for s in (0, 1):
            for r, (c, p) in (before[s] or {}).items():
                st[s][r] = [c, p, 0]  # Join's [CNT, POS, MATCHES]
        if not any(self.join.outer):
            return st
        residual = self.residual
        for a, ea in st[0].items():
            for b, eb in st[1].items():
                if residual is None or residual(a + b):
                    ea[MATCHES] += eb[CNT]
                    eb[MATCHES] += ea[CNT]
        return st

    # ------------------------------------------------------------------ batched hosting

    def process_batch(self, inputs: Sequence[list[Change]], ctx: BatchContext) -> list[Change]:
        """A whole batch (or one partition of it, split by join key): one lookup request
        per side for every key the caches miss, then ``process_key`` per key. What the
        Spark host calls, so a batch costs two round trips instead of one per key."""
        self._enter(ctx)
        groups: dict[tuple, list[list[Change]]] = {}
        for idx in (0, 1):
            for c in inputs[idx]:
                groups.setdefault(self.key_of(c, idx), [[], []])[idx].append(c)
        self._prefetch(groups, ctx)
        out: list[Change] = []
        for key, lists in groups.items():
            out.extend(self.process_key(key, lists, None, ctx)[1])
        self._batch_rows = [{}, {}]
        return out

    def _prefetch(self, groups: dict[tuple, list[list[Change]]], ctx: BatchContext) -> None:
        strong = self.consistency == "strong"
        for s in (0, 1):
            wanted = []
            for key, lists in groups.items():
                # eventual: the other side of a change; strong: what Join needs
                if any(v is None for v in key) or not (self._strong_needs(lists)[s] if strong else lists[1 - s]):
                    continue
                if self.cache_enabled:
                    hit = self.caches[s].get(key)
                    if hit is not None:
                        ctx.metrics[f"delta_join.{SIDE_NAMES[s]}.cache_hits"] += 1
                        self._batch_rows[s][key] = (hit, False)
                        continue
                    ctx.metrics[f"delta_join.{SIDE_NAMES[s]}.cache_misses"] += 1
                wanted.append(key)
            if not wanted:
                continue
            fence = self._fence(s)
            ctx.metrics[f"delta_join.{SIDE_NAMES[s]}.lookup_requests"] += 1
            ctx.metrics[f"delta_join.{SIDE_NAMES[s]}.lookup_keys"] += len(wanted)
            for key, rows in self.sources[s].fetch(wanted, fence).items():
                self._batch_rows[s][key] = (rows, fence == "end")

    def describe(self) -> dict[str, Any]:
        return {
            "consistency": self.consistency,
            "cache_enabled": self.cache_enabled,
            "cache_sizes": {"left": self.cache_sizes[0], "right": self.cache_sizes[1]},
            "indexes": {
                SIDE_NAMES[s]: f"{side.table}.{side.index}({', '.join(side.index_columns)})"
                for s, side in enumerate(self.sides)
                if side is not None
            },
        }


def _emit(delta: Counter, pos_of: dict, row: tuple, w: int, pos: tuple) -> None:
    delta[row] += w
    prev = pos_of.get(row)
    pos_of[row] = pos if prev is None or pos > prev else prev
