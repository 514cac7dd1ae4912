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
pay for a representation they do not read. The columnar work lives in
``tidemark.engine.batch_columns``, imported on first use: a process that never builds
Arrow (the replay host today) does not even load pyarrow and polars, whose objects would
otherwise make every full garbage collection of the per-key path slower.

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
from typing import TYPE_CHECKING, Any

from tidemark.engine.changelog import Change

if TYPE_CHECKING:
    import pyarrow as pa

KIND = "$kind"
WEIGHT = "$weight"
POS_PREFIX = "$pos"


class ChangeBatch:
    """A batch of changes of one node. ``groups`` (optional, only with changes) gives each
    change the id of the group it belongs to when a host already knows it (Spark's encoded
    key), so the driver does not recompute it."""

    __slots__ = ("_changes", "_table", "_schema", "groups")

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
        self._schema = schema
        self.groups = groups

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_changes(
        cls, changes: Sequence[Change], schema: pa.Schema | None = None, groups: Sequence[Any] | None = None
    ) -> ChangeBatch:
        """``schema``: the row columns' names and Arrow types (None: inferred from the
        values when the table is built)."""
        return cls(changes=list(changes), schema=schema, groups=groups)

    @classmethod
    def from_arrow(cls, rows: pa.Table, kinds: pa.Array | Sequence[str], positions: Sequence[pa.Array]) -> ChangeBatch:
        """From decoded records as columns: ``rows`` (the node's typed columns), one kind per
        row and one array per position component (``positions[0]`` the most significant)."""
        from tidemark.engine import batch_columns

        return cls(table=batch_columns.from_arrow(rows, kinds, positions))

    @classmethod
    def from_table(cls, table: pa.Table) -> ChangeBatch:
        """A table already in the batch's layout (module docstring)."""
        for name in (KIND, WEIGHT):
            if name not in table.column_names:
                raise ValueError(f"a change batch table needs a '{name}' column; it has {', '.join(table.column_names)}")
        return cls(table=table)

    # ------------------------------------------------------------------ the two forms

    @property
    def is_columnar(self) -> bool:
        """Whether the batch holds its Arrow table already (a reader that wants columns can
        then skip building them from ``Change`` tuples with types of its own)."""
        return self._table is not None

    def __len__(self) -> int:
        """Changes in the batch: one per unit of weight."""
        if self._changes is not None:
            return len(self._changes)
        from tidemark.engine import batch_columns

        return batch_columns.weight_total(self._table)

    def changes(self) -> list[Change]:
        """The batch as ``Change`` tuples, one per unit of weight, in the table's order."""
        if self._changes is None:
            from tidemark.engine import batch_columns

            self._changes = batch_columns.to_changes(self._table)
        return self._changes

    def table(self) -> pa.Table:
        """The batch as an Arrow table (module docstring's layout)."""
        if self._table is None:
            from tidemark.engine import batch_columns

            self._table = batch_columns.to_table(self._changes, self._schema)
        return self._table

    # ------------------------------------------------------------------ operations

    def sorted(self) -> ChangeBatch:
        """The canonical order (``changelog.order_key``); stable for full ties."""
        from tidemark.engine import batch_columns

        return ChangeBatch(table=batch_columns.sorted_table(self.table()))

    def consolidate(self) -> ChangeBatch:
        """Net weight per distinct row (module docstring), in the canonical order; rows
        netting zero are dropped."""
        from tidemark.engine import batch_columns

        return ChangeBatch(table=batch_columns.consolidated_table(self.table())).sorted()
