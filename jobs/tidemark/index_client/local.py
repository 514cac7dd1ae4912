"""In-process lookups: the delta join's ``lookup`` callable answered by ``TableIndex``
objects in this process (tests, benchmarks, and the index service itself)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tidemark.engine.catalog import TableDef
from tidemark.engine.changelog import Change
from tidemark.index_client.store import IndexSpec, TableIndex


class LookupError_(RuntimeError):
    """A lookup that cannot be answered (unknown table, index not caught up)."""


def table_indexes(table: TableDef) -> list[IndexSpec]:
    """The secondary indexes a table declares with ``'index.<name>.columns' = 'a,b'``."""
    specs = []
    for opt, value in table.options.items():
        if opt.startswith("index.") and opt.endswith(".columns"):
            name = opt[len("index.") : -len(".columns")]
            cols = [c.strip() for c in value.split(",") if c.strip()]
            specs.append(IndexSpec(name, tuple(table.index_of(c) for c in cols)))
    return specs


def index_for(table: TableDef, keep_history: bool = True) -> TableIndex:
    return TableIndex(table.name, len(table.columns), table.pk_indexes, table_indexes(table), keep_history)


class LocalLookup:
    """``lookup(table, index, keys, min_offsets=None, as_of=None)`` over in-process indexes.
    ``feed`` applies a batch of source changes the way the index service applies records:
    one change position = one offset of partition 0, in position order."""

    def __init__(self, tables: Mapping[str, TableIndex]):
        self.tables = dict(tables)
        self.calls = 0

    def feed(self, table: str, changes: Sequence[Change]) -> dict[int, int]:
        """Apply ``changes`` (grouped by position) and return the new end offsets."""
        t = self.tables[table]
        by_pos: dict[tuple, list[Change]] = {}
        for c in changes:
            by_pos.setdefault(c.pos, []).append(c)
        for pos in sorted(by_pos):
            t.apply(by_pos[pos], 0, t.applied.get(0, 0))
        return dict(t.applied) or {0: 0}

    def offsets(self, table: str) -> dict[int, int]:
        return dict(self.tables[table].applied) or {0: 0}

    def __call__(
        self,
        table: str,
        index: str,
        keys: Sequence[tuple],
        min_offsets: Mapping[int, int] | None = None,
        as_of: Mapping[int, int] | None = None,
    ) -> list[list[tuple[tuple, tuple]]]:
        self.calls += 1
        t = self.tables.get(table)
        if t is None:
            raise LookupError_(f"no index for table '{table}'")
        if min_offsets and not t.caught_up(min_offsets):
            raise LookupError_(f"table '{table}': index has applied {t.applied}, behind {dict(min_offsets)}")
        return t.lookup(index, keys, as_of)
