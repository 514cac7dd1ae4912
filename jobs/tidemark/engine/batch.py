"""``ChangeBatch``: the one engine type for a batch of changes (DESIGN.md, "The data path").

Columnar form: an Arrow table with the node's row columns, then ``$kind`` (the changelog
kind, string), ``$weight`` (int64: +1/-1 per change, a net weight after ``consolidate``)
and the source position as ``$pos0``, ``$pos1``... (one column per position component,
compared lexicographically; a shorter position is padded with nulls, which sort first, so
``()`` < ``(1,)`` < ``(1, 0)`` as Python compares the tuples). ``$`` cannot start an
unquoted SQL identifier, so these names do not collide with a node's columns.

A batch is built from either form, ``Change`` tuples or Arrow columns, and converts to the
other on first use. The per-key adapter (``tidemark.engine.driver``) reads ``changes()``
of a batch built from changes without ever building Arrow: stages not yet batched must not
pay for a representation they do not read.

Two operations are defined here and nowhere else:

- ``sorted()``: the canonical order, ``tidemark.engine.changelog.order_key`` vectorized
  (position, retractions before adds, then the row's ``repr``). The ``repr`` tiebreak is a
  Python value, so it is computed only for the rows that tie on position and sign.
- ``consolidate()``: weights summed per identity, where the identity is the row's full
  value (the Z-set of ``changelog.zset``); rows whose weight cancels are dropped, wherever
  their changes sit in the batch. A surviving row keeps the position and kind of its
  latest change of the surviving sign (retractions for a net retraction, adds for a net
  add), the rule ``join`` and the replay sink table use: the change that outlives the
  cancelled pairs is the later one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from tidemark.engine.arrow_types import python_values
from tidemark.engine.changelog import ADDS, KINDS, Change, Pos

KIND = "$kind"
WEIGHT = "$weight"
POS_PREFIX = "$pos"
_ADD = "$add"
_TIE = "$tie"


def pos_columns(n: int) -> list[str]:
    return [f"{POS_PREFIX}{i}" for i in range(n)]


class ChangeBatch:
    """A batch of changes of one node. ``groups`` (optional, only with changes) gives each
    change the id of the group it belongs to when a host already knows it (Spark's encoded
    key), so the driver does not recompute it."""

    __slots__ = ("_changes", "_table", "schema", "groups")

    def __init__(
        self,
        changes: list[Change] | None = None,
        table: pa.Table | None = None,
        schema: pa.Schema | None = None,
        groups: Sequence[Any] | None = None,
    ) -> None:
        if (changes is None) == (table is None):
            raise ValueError("a ChangeBatch is built from changes or from a table, exactly one")
        if groups is not None and (changes is None or len(groups) != len(changes)):
            raise ValueError("groups need the changes they belong to, one group per change")
        self._changes = changes
        self._table = table
        #: the row columns' names and Arrow types (None: inferred from the values)
        self.schema = schema if table is None else _row_schema(table)
        self.groups = groups

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_changes(
        cls, changes: Sequence[Change], schema: pa.Schema | None = None, groups: Sequence[Any] | None = None
    ) -> ChangeBatch:
        return cls(changes=list(changes), schema=schema, groups=groups)

    @classmethod
    def from_arrow(cls, rows: pa.Table, kinds: pa.Array | Sequence[str], positions: Sequence[pa.Array]) -> ChangeBatch:
        """From decoded records as columns: ``rows`` (the node's typed columns), one kind per
        row and one array per position component (``positions[0]`` the most significant)."""
        kinds = pa.array(kinds, pa.string()) if not isinstance(kinds, pa.Array) else kinds
        bad = pc.invert(pc.is_in(kinds, pa.array(KINDS)))
        if pc.any(bad).as_py():  # a null kind is not in KINDS either
            where = pc.index(bad, True).as_py()
            raise ValueError(f"change {where}: kind {kinds[where].as_py()!r} is not one of {', '.join(KINDS)}")
        for name in rows.column_names:
            if name.startswith("$"):
                raise ValueError(f"column '{name}': names starting with '$' are reserved for the batch's own columns")
        return cls(table=_assemble(rows.column_names, rows.columns, kinds, positions))

    @classmethod
    def from_table(cls, table: pa.Table) -> ChangeBatch:
        """A table already in the batch's layout (module docstring)."""
        for name in (KIND, WEIGHT):
            if name not in table.column_names:
                raise ValueError(f"a change batch table needs a '{name}' column; it has {', '.join(table.column_names)}")
        return cls(table=table)

    # ------------------------------------------------------------------ the two forms

    def __len__(self) -> int:
        if self._changes is not None:
            return len(self._changes)
        return int(pc.sum(pc.abs(self._table.column(WEIGHT))).as_py() or 0)

    def changes(self) -> list[Change]:
        """The batch as ``Change`` tuples, one per unit of weight, in the table's order."""
        if self._changes is None:
            self._changes = _to_changes(self._table)
        return self._changes

    def table(self) -> pa.Table:
        """The batch as an Arrow table (module docstring's layout)."""
        if self._table is None:
            self._table = _to_table(self._changes, self.schema)
        return self._table

    # ------------------------------------------------------------------ operations

    def sorted(self) -> ChangeBatch:
        """The canonical order (``changelog.order_key``); stable for full ties."""
        table = self.table()
        pos = [c for c in table.column_names if c.startswith(POS_PREFIX)]
        df = pl.from_arrow(table).with_columns((pl.col(WEIGHT) > 0).alias(_ADD))
        tied = df.select(pl.len().over([*pos, _ADD]) > 1).to_series()
        by = [*pos, _ADD]
        if tied.any():
            rows = _rows(table.filter(pa.array(tied.to_arrow())))
            tiebreak = pl.Series(_TIE, [None] * len(df), dtype=pl.String)
            tiebreak = tiebreak.scatter(tied.arg_true(), [repr(r) for r in rows])
            df = df.with_columns(tiebreak)
            by.append(_TIE)
        out = df.sort(by, nulls_last=False, maintain_order=True).drop(by[len(pos):])
        return ChangeBatch(table=_restore(out.to_arrow(), table.schema))

    def consolidate(self) -> ChangeBatch:
        """Net weight per distinct row (module docstring), in the canonical order; rows
        netting zero are dropped."""
        table = self.table()
        pos = [c for c in table.column_names if c.startswith(POS_PREFIX)]
        rows = [c for c in table.column_names if not c.startswith("$")]
        last = pl.struct([*pos, KIND])
        df = pl.from_arrow(table).sort([*pos, KIND], nulls_last=False, maintain_order=True)
        net = (
            df.group_by(rows, maintain_order=True)
            .agg(
                pl.col(WEIGHT).sum(),
                last.filter(pl.col(WEIGHT) > 0).last().alias("$last_add"),
                last.filter(pl.col(WEIGHT) < 0).last().alias("$last_retract"),
            )
            .filter(pl.col(WEIGHT) != 0)
            .select(
                *rows,
                pl.when(pl.col(WEIGHT) > 0).then(pl.col("$last_add")).otherwise(pl.col("$last_retract")).alias("$last"),
                WEIGHT,
            )
            .unnest("$last")
            .select(*rows, KIND, WEIGHT, *pos)
        )
        return ChangeBatch(table=_restore(net.to_arrow(), table.schema)).sorted()


# ---------------------------------------------------------------------- conversions


def _row_schema(table: pa.Table) -> pa.Schema:
    return pa.schema([f for f in table.schema if not f.name.startswith("$")])


def _to_table(changes: list[Change], schema: pa.Schema | None) -> pa.Table:
    width = len(schema) if schema is not None else (len(changes[0].row) if changes else 0)
    for i, c in enumerate(changes):
        if len(c.row) != width:
            raise ValueError(f"change {i}: row {c.row!r} has {len(c.row)} columns, expected {width}")
    names = schema.names if schema is not None else [f"f{i}" for i in range(width)]
    arrays = [
        pa.array([c.row[i] for c in changes], schema.field(i).type if schema is not None else None)
        for i in range(width)
    ]
    kinds = pa.array([c.kind for c in changes], pa.string())
    depth = max((len(c.pos) for c in changes), default=0)
    positions = [_pos_array([c.pos[i] if i < len(c.pos) else None for c in changes]) for i in range(depth)]
    return _assemble(names, arrays, kinds, positions)


def _assemble(names: Sequence[str], arrays: Sequence[Any], kinds: pa.Array, positions: Sequence[pa.Array]) -> pa.Table:
    weights = pc.if_else(pc.is_in(kinds, pa.array(sorted(ADDS))), 1, -1).cast(pa.int64())
    return pa.Table.from_arrays(
        [*arrays, kinds, weights, *positions], names=[*names, KIND, WEIGHT, *pos_columns(len(positions))]
    )


def _pos_array(values: list[Any]) -> pa.Array:
    arr = pa.array(values)
    return arr.cast(pa.int64()) if pa.types.is_null(arr.type) else arr


def _rows(table: pa.Table) -> list[tuple]:
    names = [c for c in table.column_names if not c.startswith("$")]
    columns = [python_values(table.column(n)) for n in names]
    return list(zip(*columns)) if columns else [() for _ in range(table.num_rows)]


def _to_changes(table: pa.Table) -> list[Change]:
    rows = _rows(table)
    kinds = table.column(KIND).to_pylist()
    weights = table.column(WEIGHT).to_pylist()
    pos_cols = [table.column(c).to_pylist() for c in table.column_names if c.startswith(POS_PREFIX)]
    positions = [_pos(p) for p in zip(*pos_cols)] if pos_cols else [()] * len(rows)
    out: list[Change] = []
    for row, kind, w, pos in zip(rows, kinds, weights, positions):
        change = Change(kind, row, pos)
        out.extend([change] * abs(w))
    return out


def _pos(values: tuple) -> Pos:
    """A padded position without its trailing nulls."""
    n = len(values)
    while n and values[n - 1] is None:
        n -= 1
    return tuple(values[:n])


def _restore(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Polars widens or renames some Arrow types (large strings, ...): cast back."""
    return table.select(schema.names).cast(schema)
