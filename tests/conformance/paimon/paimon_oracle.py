"""pypaimon 2.1 as the reference: a primary-key table in a temporary local warehouse with the
same merge options and a ``rowkind.field`` column carrying each record's kind. Each Tidemark
micro-batch is one Paimon commit, written in source-position order (Paimon's system sequence
number is arrival order, Tidemark's is the source position). Reading the table back gives the
merged rows to compare with Tidemark's."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from tidemark.engine.changelog import Change

ROWKIND = "_rowkind"
_ids = itertools.count()


class PaimonTable:
    def __init__(self, warehouse: str, schema: pa.Schema, pk: Sequence[str],
                 options: Mapping[str, str]):
        from pypaimon import CatalogFactory, Schema

        self.schema = pa.schema(list(schema) + [pa.field(ROWKIND, pa.string())])
        self.names = list(schema.names)
        self.pk = list(pk)
        catalog = CatalogFactory.create({"warehouse": warehouse})
        catalog.create_database("db", True)
        name = f"db.t{next(_ids)}"
        opts = {"bucket": "1", "rowkind.field": ROWKIND, **options}
        if opts.get("merge-engine") == "aggregation":
            # the row-kind column is ours, not the case's: never aggregate it
            opts[f"fields.{ROWKIND}.aggregate-function"] = "last_value"
        catalog.create_table(name, Schema.from_pyarrow_schema(self.schema, primary_keys=self.pk,
                                                             options=opts), False)
        self.table = catalog.get_table(name)

    def commit(self, changes: Sequence[Change]) -> None:
        if not changes:
            return
        ordered = sorted(changes, key=lambda c: c.pos)
        rows = [dict(zip(self.names, (_to_arrow(v) for v in c.row)), **{ROWKIND: c.kind})
                for c in ordered]
        builder = self.table.new_batch_write_builder()
        write, commit = builder.new_write(), builder.new_commit()
        try:
            write.write_arrow(pa.Table.from_pylist(rows, schema=self.schema))
            commit.commit(write.prepare_commit())
        finally:
            write.close()
            commit.close()

    def rows(self) -> dict[tuple, tuple]:
        builder = self.table.new_read_builder()
        scan = builder.new_scan()
        # A first-row table's batch scan skips level-0 files (they become visible once a
        # compaction merges them, and pypaimon never compacts): read them merged instead,
        # which is the table a compaction would produce.
        scan.file_scanner.skip_level0 = False
        data = builder.new_read().to_arrow(scan.plan().splits())
        out = {}
        for r in data.to_pylist():
            row = tuple(r[n] for n in self.names)
            out[tuple(r[k] for k in self.pk)] = row
        return out


def _to_arrow(value: Any) -> Any:
    """pyarrow builds MAP columns from lists of (key, value) pairs."""
    return list(value.items()) if isinstance(value, dict) else value


def normalize(value: Any, is_map: bool = False) -> Any:
    """Values as a reader compares them: a MAP as a dict whatever its arrow form (pyarrow
    hands maps over as lists of (key, value) pairs)."""
    if value is None:
        return None
    if is_map:
        return dict(value.items() if isinstance(value, dict) else value)
    if isinstance(value, tuple):
        return list(value)
    return value


def normalize_table(table: Mapping[tuple, tuple], map_columns: set[int]) -> dict[tuple, tuple]:
    return {k: tuple(normalize(v, i in map_columns) for i, v in enumerate(row))
            for k, row in table.items()}
