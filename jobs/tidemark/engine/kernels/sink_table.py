"""What the sink materializer's columnar strategies share (``kernels.deduplicate``,
``kernels.current_row``): whether a batch and a stored bucket are typed as they need, the
batch's changes in the canonical order, and the stored rows of the PKs a batch touches.

Both work on the stored bucket's table itself rather than on per-PK Python state, so they
run only where Arrow's values are the stage's: planner-typed rows, key columns whose Arrow
equality is Python's (no floating point, nested or pickled keys), no TTL, changes of weight
+-1.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import polars as pl
import pyarrow as pa

from tidemark.engine import state_tables as T
from tidemark.engine.arrow_types import arrow_type
from tidemark.engine.batch import POS_PREFIX, WEIGHT
from tidemark.engine.batch_columns import row_indexes, sorted_table

if TYPE_CHECKING:
    from tidemark.engine.stages.materializer import SinkMaterializer

ARR = "$arr"  # a change's index in the batch as it arrived: orders the PKs
OP = "$op"  # a change's index in the canonical order
ADD = "$add"
SIDX = "$sidx"  # a stored row's place in the stored table


class SinkTableKernel:
    """The typed view of one ``SinkMaterializer`` that a columnar strategy works in."""

    #: the strategies a subclass implements
    strategies: tuple[str, ...] = ()

    def __init__(self, stage: SinkMaterializer) -> None:
        self.stage = stage
        columns = stage.columns or ()
        self.names = [n for n, _ in columns]
        try:
            self.types = [arrow_type(t) if t is not None else None for _, t in columns]
        except ValueError:
            self.types = [None]
        self.row_type = pa.struct(list(zip(self.names, self.types))) if self.enabled else None

    @property
    def enabled(self) -> bool:
        """Whether the stage is one this strategy runs, with rows typed as it needs."""
        return (
            self.stage.strategy in self.strategies and self.stage.ttl_ms is None and bool(self.names)
            and all(t is not None for t in self.types)
        )  # fmt: skip

    def batch_fits(self, table: pa.Table, rows: list[str]) -> bool:
        """Whether ``table``'s rows are the stage's types, its weights +-1 and its key columns
        compared as Python compares them."""
        if not self.enabled or len(rows) != len(self.names):
            return False
        if [table.schema.field(r).type for r in rows] != self.types:
            return False
        weights = table.column(WEIGHT)
        if weights.null_count or not np.all(np.abs(weights.to_numpy(zero_copy_only=False)) == 1):
            return False
        key_types = [self.types[j] for j in (*self.identity_indexes(), *self.stage.pk)]
        return all(T.compares_as_python(t) for t in key_types)

    def stored_fits(self, stored: pa.Table | None, columns: dict[str, pa.DataType]) -> bool:
        """Whether the stored table is ``row`` (typed as the stage's rows) and ``columns``."""
        if stored is None:
            return True
        want = {"row": self.row_type, **columns}
        return stored.column_names == list(want) and all(stored.schema.field(n).type == t for n, t in want.items())

    def identity_indexes(self) -> tuple[int, ...]:
        """The row columns a retraction must match: the PK and the upsert key, or all."""
        upsert_key = self.stage.upsert_key
        return tuple(range(len(self.names))) if upsert_key is None else (*self.stage.pk, *upsert_key)

    def identity(self, rows: list[str]) -> list[str]:
        return list(dict.fromkeys(rows[j] for j in self.identity_indexes()))

    def ops(self, table: pa.Table, rows: list[str]) -> pl.DataFrame:
        """The batch's changes in the canonical order: row columns, ``$op``, ``$arr``,
        ``$add`` and the position columns."""
        arrived = table.append_column(ARR, row_indexes(table.num_rows))
        df = pl.from_arrow(sorted_table(arrived))
        pos = [c for c in df.columns if c.startswith(POS_PREFIX)]
        return df.select(*rows, *pos, ARR, (pl.col(WEIGHT) > 0).alias(ADD)).with_row_index(OP).with_columns(
            pl.col(OP).cast(pl.Int64)
        )

    def stored_rows(self, stored: pa.Table | None, rows: list[str], pks: pl.DataFrame,
                    empty: dict[str, pl.DataType]) -> pl.DataFrame:
        """The stored rows of the PKs in ``pks``: row columns, ``$sidx`` and the table's other
        columns (``empty``: their types, for a bucket that stores nothing yet)."""
        if stored is None or stored.num_rows == 0:
            typed = pl.from_arrow(pa.schema(zip(rows, self.types)).empty_table()).schema
            return pl.DataFrame(schema={**typed, SIDX: pl.Int64, **empty})
        df = pl.from_arrow(stored).with_row_index(SIDX).with_columns(pl.col(SIDX).cast(pl.Int64))
        df = df.unnest("row").rename(dict(zip(self.names, rows)))
        return df.join(pks, on=list(pks.columns), how="semi", nulls_equal=True)

    def merged(self, stored: pa.Table | None, read: pl.Series, written: pa.Table) -> pa.Table | None:
        """The bucket's table: the stored rows not ``read`` as they were, and ``written``,
        sorted by PK as ``SinkMaterializer`` stores them (None: no rows)."""
        parts = [written]
        if stored is not None and stored.num_rows:
            keep = np.ones(stored.num_rows, dtype=bool)
            keep[read.to_numpy()] = False
            parts.insert(0, stored.replace_schema_metadata(None).filter(pa.array(keep)))
        merged = pa.concat_tables(parts).combine_chunks()
        if merged.num_rows == 0:
            return None
        return T.sorted_by_key(merged, self.stage.pk)

    def row_struct(self, frame: pl.DataFrame, rows: list[str]) -> pa.StructArray:
        """``frame``'s row columns as the stored ``row`` column."""
        children = [frame.get_column(c).to_arrow().cast(t) for c, t in zip(rows, self.types)]
        return pa.StructArray.from_arrays(children, names=self.names)
