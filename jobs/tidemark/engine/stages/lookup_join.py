"""Lookup join (``JOIN dim FOR SYSTEM_TIME AS OF s.proc_time``): Flink's processing-time
temporal join. Each stream change is joined with the dimension rows current when it is
processed; a later change of the dimension does NOT revise results already emitted.

The micro-batch is the unit of processing time: a stream change sees the dimension as it
was at the start of its batch (every dimension change of earlier batches, none of its own
batch), then the batch's dimension changes are applied. A dimension loaded before the
stream therefore gives Flink's answer exactly.

Where the dimension's rows come from:

- unbound (``tidemark replay``, and Spark without an index service): keyed by the join
  key, input 0 is the stream (its key computed from the ON clause's
expressions over the stream row, e.g. ``MOD(b.auction, 10000)``), input 1 the dimension
table's changelog (its key the dimension's join columns). The state of one key is the
dimension's rows for it (row -> count), read and written once per batch. Stream changes
keep their kind and position: a stream retraction is joined with the dimension as it is
now (as Flink does), so it retracts what was emitted only if the dimension has not changed
meanwhile. A LEFT join pads a stream change that finds no row passing the ON clause with
NULLs; a NULL join key matches nothing.
- ``bind(lookup)``: the rows come from the index service following the dimension's topic
  (the delta join's ``lookup(table, index, keys, min_offsets=..., as_of=...)``), asked once
  per batch for all the batch's keys *as of the batch's start offsets* (``begin_batch``
  gives the fences), which is the same dimension the unbound stage holds. The host keeps
  no state and the dimension input is not read. ``index`` names the dimension's index
  that the join key covers (the primary key or an ``index.<name>.columns`` declaration);
  without one the stage cannot be bound.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlglot import exp

from tidemark.engine.changelog import Change
from tidemark.engine.errors import PlanError
from tidemark.engine.expressions import compile_row_fn
from tidemark.engine.stage import BatchContext

JOIN_TYPES = ("inner", "left")


class LookupJoin:
    n_inputs = 2

    def __init__(
        self,
        join_type: str,
        stream_key: Sequence[exp.Expr],
        dim_key: tuple[int, ...],
        dim_width: int,
        residual: Callable[[tuple], bool] | None = None,
        *,
        table: str,
        index: tuple[str, tuple[int, ...]] | None = None,
        name: str = "lookup_join",
    ) -> None:
        if join_type not in JOIN_TYPES:
            raise ValueError(f"a lookup join is INNER or LEFT, not {join_type.upper()}")
        if len(stream_key) != len(dim_key):
            raise ValueError("a lookup join needs one stream expression per dimension key column")
        self.join_type = join_type
        self.stream_key = list(stream_key)
        self.dim_key = tuple(dim_key)
        self.dim_width = dim_width
        self.residual = residual
        self.table = table
        #: (index name, positions in the join key of its columns, in the index's order)
        self.index = index
        self.name = name
        self._lookup: Any = None
        self._as_of: Mapping[int, int] | None = None
        self._compile()

    def _compile(self) -> None:
        self._key_fns = [compile_row_fn(e) for e in self.stream_key]

    # compiled functions are not picklable, nor is the lookup (an HTTP client): the
    # expressions are, so recompile after unpickling; a shipped stage is bound again there
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_key_fns", None)
        state["_lookup"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._compile()

    def key_columns(self, input_index: int = 0) -> tuple[int, ...] | None:
        """The row columns the key is (``tidemark.engine.bucketing``); the stream side's key
        is computed."""
        return self.dim_key if input_index == 1 else None

    def key_of(self, change: Change, input_index: int) -> tuple:
        if input_index == 0:
            return tuple(f(change.row) for f in self._key_fns)
        return tuple(change.row[i] for i in self.dim_key)

    def process_key(
        self, key: tuple, inputs: Sequence[list[Change]], state: dict[tuple, int] | None, ctx: BatchContext
    ) -> tuple[dict[tuple, int] | None, list[Change]]:
        stream, dim = inputs
        rows = state or {}
        unmatchable = any(v is None for v in key)
        out: list[Change] = []
        for c in stream:
            found = False
            if not unmatchable:
                for row, n in rows.items():
                    joined = c.row + row
                    if self.residual is None or self.residual(joined):
                        out.extend([Change(c.kind, joined, c.pos)] * n)
                        found = True
            if not found and self.join_type == "left":
                out.append(Change(c.kind, c.row + (None,) * self.dim_width, c.pos))
        if stream:
            ctx.metrics[f"lookup_join.{self.table}.lookups"] += len(stream)
        if not dim or unmatchable:
            return (rows or None), out
        after = dict(rows)
        for c in dim:
            n = after.get(c.row, 0) + c.weight
            if n > 0:
                after[c.row] = n
            else:
                after.pop(c.row, None)
        return (after or None), out

    # ------------------------------------------------------------------ bound to an index

    def bind(self, lookup: Any) -> LookupJoin:
        """Look the dimension up through ``lookup`` (module docstring)."""
        if self.index is None:
            raise PlanError(f"lookup join '{self.name}': the join key covers no index of table '{self.table}'")
        self._lookup = lookup
        return self

    def begin_batch(self, batch_id: int, fences: Mapping[str, tuple[Mapping[int, int], Mapping[int, int]]] | None) -> None:
        """The batch's ``{table: (start offsets, end offsets)}``: lookups are as of the start."""
        fence = (fences or {}).get(self.table)
        if fence is None:
            raise RuntimeError(f"lookup join '{self.name}': no offset fence for table '{self.table}'")
        self._as_of = fence[0]

    def process_batch(self, inputs: Sequence[list[Change]], ctx: BatchContext) -> list[Change]:
        """A batch (or one partition of it) through the bound stage: one lookup for all its
        keys, then each stream change joined with its key's rows."""
        stream = inputs[0]
        keys = [self.key_of(c, 0) for c in stream]
        wanted = list(dict.fromkeys(k for k in keys if not any(v is None for v in k)))
        name, positions = self.index or ("", ())
        found: dict[tuple, dict[tuple, int]] = {k: {} for k in wanted}
        if wanted:
            ikeys = list(dict.fromkeys(tuple(k[j] for j in positions) for k in wanted))
            answers = self._lookup(self.table, name, ikeys, min_offsets=self._as_of, as_of=self._as_of)
            for rows in answers:
                for row, _pos in rows:
                    rows_of_key = found.get(tuple(row[i] for i in self.dim_key))
                    if rows_of_key is not None:  # the index may be coarser than the join key
                        rows_of_key[tuple(row)] = rows_of_key.get(tuple(row), 0) + 1
            ctx.metrics[f"lookup_join.{self.table}.lookup_requests"] += 1
        out: list[Change] = []
        by_key: dict[tuple, list[Change]] = {}
        for k, c in zip(keys, stream):
            by_key.setdefault(k, []).append(c)
        for k, cs in by_key.items():
            out.extend(self.process_key(k, [cs, []], found.get(k), ctx)[1])
        return out
