"""Columns of a keyed stage's typed state table (``tidemark.engine.state_codec``): rows,
source positions and counters as Arrow arrays, and back as the Python values stages hold.

A row-valued field (a materializer's current row, a merge engine's tombstone...) is one
struct column typed by the stage's row type, null where the field is absent, so a state
record with optional rows needs no "which fields are there" convention. The row type comes
from the planner (``RowType``: the node's column names and SQL types). A column whose type
the planner does not know, and every column of a stage built without a row type (tests,
hand-built stages), is a ``large_binary`` column of each value pickled: Arrow's inferred
types would not give the values back as they were (a list comes back a tuple, a dict loses
its keys). So is a typed column holding a value Arrow would change (``_values_column``).
A position is a ``list<int64>``: positions are tuples of integers of varying length (a
joined row carries the later of its inputs').

Kept apart from the stages so that a process that never stores state (the replay host)
does not import pyarrow for them.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from decimal import Decimal
from itertools import islice
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tidemark.engine.arrow_types import arrow_type, pylist, python_values
from tidemark.engine.types import SqlType

#: a node's columns as the planner types them: (name, SQL type or None when unknown)
RowType = tuple[tuple[str, SqlType | None], ...]

POSITION = pa.list_(pa.int64())
#: a column of pickled values (module docstring); no SQL type maps to it
PICKLED = pa.large_binary()


def rows_column(rows: Sequence[tuple | None], width: int, rtype: RowType | None) -> pa.StructArray:
    """``rows`` (None: the field is absent) as one struct column, a field per row column."""
    names = [n for n, _ in rtype] if rtype is not None else [f"f{i}" for i in range(width)]
    types = [t for _, t in rtype] if rtype is not None else [None] * width
    children = [_values_column([r[i] if r is not None else None for r in rows], t) for i, t in enumerate(types)]
    absent = [r is None for r in rows]
    mask = pa.array(absent, pa.bool_()) if any(absent) else None
    return pa.StructArray.from_arrays(children, names=names, mask=mask)


def rows_of(column: pa.Array | pa.ChunkedArray) -> list[tuple | None]:
    """The inverse of ``rows_column``."""
    arr = _one_chunk(column)
    fields = [_values_of(arr.field(i)) for i in range(arr.type.num_fields)]
    rows: list[tuple | None] = list(zip(*fields))
    if arr.null_count:
        for i, valid in enumerate(arr.is_valid().to_pylist()):
            if not valid:
                rows[i] = None
    return rows


def positions_column(positions: Sequence[tuple | None]) -> pa.ListArray:
    return pa.array([list(p) if p is not None else None for p in positions], POSITION)


def positions_of(column: pa.Array | pa.ChunkedArray) -> list[tuple | None]:
    arr = _one_chunk(column)
    if arr.null_count or arr.flatten().null_count:
        return [tuple(p) if p is not None else None for p in arr.to_pylist()]
    return _tuples(arr)


def _tuples(arr: pa.ListArray) -> list[tuple]:
    """A list column without NULLs as tuples, its integers read through numpy (``pylist``):
    a bucket's state holds a position per row and is read whole every batch."""
    values = pylist(arr.flatten())
    lengths = arr.value_lengths().to_numpy(zero_copy_only=False)
    if len(lengths) and (lengths == lengths[0]).all():  # the usual case: one position depth
        n = int(lengths[0])
        return list(zip(*(values[i::n] for i in range(n)))) if n else [()] * len(lengths)
    it = iter(values)
    return [tuple(islice(it, n)) for n in lengths.tolist()]


def position_lists_column(lists: Sequence[Sequence[tuple] | None]) -> pa.ListArray:
    """Several positions per entry (None: none), e.g. the copies of an identical row."""
    return pa.array([[list(p) for p in ps] if ps is not None else None for ps in lists], pa.list_(POSITION))


def position_lists_of(column: pa.Array | pa.ChunkedArray) -> list[list[tuple] | None]:
    return [[tuple(p) for p in ps] if ps is not None else None for ps in _one_chunk(column).to_pylist()]


def ints_column(values: Sequence[int | None]) -> pa.Array:
    return pa.array(values, pa.int64())


def table(columns: dict[str, pa.Array]) -> pa.Table:
    return pa.Table.from_arrays(list(columns.values()), names=list(columns))


def sorted_by_key(table: pa.Table, key: Sequence[int]) -> pa.Table:
    """``table`` with its rows ordered by the ``row`` column's fields at ``key`` (stable):
    the order compresses best, and any order reads back the same state (a key of a nested
    type, which Arrow cannot sort, leaves the table as it is)."""
    if table.num_rows < 2:
        return table
    row = _one_chunk(table.column("row"))
    keys = pa.table({f"k{i}": row.field(j) for i, j in enumerate(key)})
    if any(pa.types.is_nested(t) for t in keys.schema.types):  # Arrow does not sort these
        return table
    return table.take(pc.sort_indices(keys, sort_keys=[(f"k{i}", "ascending") for i in range(len(key))]))


def rows_with_keys(rows: pa.Array | pa.ChunkedArray, key: Sequence[int], keys: pa.Table) -> pa.Array | None:
    """A mask over the stored ``rows`` (a ``row`` column) of those whose fields at ``key``
    are one of ``keys``' rows (one column per key field, any types that cast to the stored
    ones); None when Arrow's equality might differ from the Python values' that the stage
    keys its state by (floats: ``-0.0`` and NaN; pickled or nested fields), so that a caller
    falls back to reading every row rather than miss one."""
    import polars as pl

    row = _one_chunk(rows)
    stored = [row.field(j) for j in key]
    if row.null_count or not all(compares_as_python(c.type) for c in stored):
        return None
    names = [f"k{i}" for i in range(len(key))]
    try:
        wanted = pa.table([keys.column(i).cast(c.type) for i, c in enumerate(stored)], names=names)
        index = (
            pl.from_arrow(pa.table(stored, names=names))
            .with_row_index("$r")
            .join(pl.from_arrow(wanted).unique(), on=names, how="semi", nulls_equal=True)
            .get_column("$r")
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, pl.exceptions.PolarsError):
        return None
    mask = np.zeros(len(row), dtype=bool)
    mask[index.to_numpy()] = True
    return pa.array(mask)


def compares_as_python(t: pa.DataType) -> bool:
    """Whether Arrow's equality on values of ``t`` is Python's on the values they read back
    as (not for floats: ``-0.0`` and NaN; nor pickled or nested values)."""
    return (
        pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_boolean(t)
        or pa.types.is_date(t) or pa.types.is_timestamp(t) or pa.types.is_decimal(t)
    )  # fmt: skip


def _values_column(values: list[Any], t: SqlType | None) -> pa.Array:
    """The typed column, unless a value would not come back as it is (then pickled): a
    value of another type than the planner's, or a DECIMAL of another scale, which Arrow
    would rescale (``1.5`` back as ``1.50``, which a sink writes differently)."""
    target = _arrow_type_or_none(t)
    if target is not None and (t.name != "DECIMAL" or _has_scale(values, t.params[1])):
        try:
            return pa.array(values, target)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            pass
    return pa.array([pickle.dumps(v, pickle.HIGHEST_PROTOCOL) for v in values], PICKLED)


def _has_scale(values: list[Any], scale: int) -> bool:
    return all(v is None or (isinstance(v, Decimal) and v.as_tuple().exponent == -scale) for v in values)


def _arrow_type_or_none(t: SqlType | None) -> pa.DataType | None:
    if t is None:
        return None
    try:
        return arrow_type(t)
    except ValueError:  # a type with no Arrow form (the type of NULL): pickled
        return None


def _values_of(column: pa.Array) -> list[Any]:
    if column.type == PICKLED:
        # a null is a field under an absent row: Parquet does not keep what Arrow held there
        return [pickle.loads(v) if v is not None else None for v in column.to_pylist()]
    return python_values(column)


def _one_chunk(column: pa.Array | pa.ChunkedArray) -> Any:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
