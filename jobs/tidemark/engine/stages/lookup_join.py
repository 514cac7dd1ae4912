"""Lookup join (``JOIN dim FOR SYSTEM_TIME AS OF s.proc_time``): Flink's processing-time
temporal join. Each stream change is joined with the dimension rows current when it is
processed; a later change of the dimension does NOT revise results already emitted.

The micro-batch is the unit of processing time: a stream change sees the dimension as it
was at the start of its batch (every dimension change of earlier batches, none of its own
batch), then the batch's dimension changes are applied. A dimension loaded before the
stream therefore gives Flink's answer exactly.

Keyed by the join key: input 0 is the stream (its key computed from the ON clause's
expressions over the stream row, e.g. ``MOD(b.auction, 10000)``), input 1 the dimension
table's changelog (its key the dimension's join columns). The state of one key is the
dimension's rows for it (row -> count), read and written once per batch. Stream changes
keep their kind and position: a stream retraction is joined with the dimension as it is
now (as Flink does), so it retracts what was emitted only if the dimension has not changed
meanwhile. A LEFT join pads a stream change that finds no row passing the ON clause with
NULLs; a NULL join key matches nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlglot import exp

from tidemark.engine.changelog import Change
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
        self.name = name
        self._compile()

    def _compile(self) -> None:
        self._key_fns = [compile_row_fn(e) for e in self.stream_key]

    # compiled functions are not picklable; the expressions are, so recompile after unpickling
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_key_fns", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._compile()

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

    def describe(self) -> dict[str, Any]:
        return {"table": self.table, "join_type": self.join_type}
