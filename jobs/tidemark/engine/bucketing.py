"""Which state bucket a change belongs to, computed over whole columns.

A host that keeps a keyed stage's state in N buckets (the Spark host, ``tidemark.spark.keyed``)
sends every change to bucket ``hash(key) mod N``. Two rules make that correct:

- equal SQL keys land in one bucket whatever Arrow types carry them: a join's two sides may
  hold its key as INT and BIGINT, DECIMAL(10, 2) and DOUBLE, TIMESTAMP(3) and TIMESTAMP(6).
  Each key column is first brought to one form per family of types (every number a float64,
  every timestamp, date and time an integer count of microseconds or days as a float64,
  text and bytes as they are), then hashed. Bringing numbers to float64 can make two
  different keys share a bucket (integers beyond 2**53), which costs nothing: a bucket holds
  many keys, and the stage still tells them apart;
- the hash is stable across processes, runs and library upgrades, since a restarted query
  must find a key in the bucket its checkpoint put it in: pandas' ``hash_pandas_object``
  (a fixed-key SipHash for text, a fixed mix for numbers), the hash dask partitions by.

The bucket is computed for a whole table at once from the key's columns when the stage says
which columns its key is (``key_columns``). A stage whose key is computed (``key_of`` does
more than pick columns) gets the same function over the key tuples ``key_of`` returns, built
into columns first, so both routes agree on every key.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from tidemark.engine.changelog import Change

#: what a NULL key value hashes to, in every column family
_NULL_HASH = np.uint64(0x9E3779B97F4A7C15)
#: the multiplier that folds one key column's hash into the key's
_MIX = np.uint64(1_000_003)


def key_columns(stage: Any, input_index: int) -> tuple[int, ...] | None:
    """The row columns ``stage``'s key is made of on input ``input_index``, in key order, or
    None when its key is computed (only ``key_of`` knows it)."""
    fn = getattr(stage, "key_columns", None)
    return None if fn is None else fn(input_index)


def buckets_of_table(table: pa.Table, columns: Sequence[int], buckets: int) -> np.ndarray:
    """The bucket of every row of ``table`` whose key is the row columns ``columns``."""
    return _buckets([_canonical(table.column(i)) for i in columns], table.num_rows, buckets)


def buckets_of_keys(keys: Sequence[tuple], buckets: int) -> np.ndarray:
    """The bucket of every key tuple (what ``key_of`` returns): the same bucket the key's
    columns give (``buckets_of_table``)."""
    if not keys:
        return np.zeros(0, dtype=np.int64)
    width = len(keys[0])
    return _buckets([_canonical(_column([k[j] for k in keys])) for j in range(width)], len(keys), buckets)


def bucket_of_key(key: tuple, buckets: int) -> int:
    """The bucket of one key, for tests and tools that look a key's state up."""
    return int(buckets_of_keys([key], buckets)[0])


def buckets_of_rows(rows: Sequence[tuple], stage: Any, input_index: int, buckets: int) -> np.ndarray:
    """The bucket of every row through ``key_of``, for a stage whose key is computed."""
    return buckets_of_keys([stage.key_of(Change("+I", row), input_index) for row in rows], buckets)


def _buckets(columns: list[tuple[np.ndarray, np.ndarray]], rows: int, buckets: int) -> np.ndarray:
    """``columns``: each key column's values and null mask. A NULL hashes alike in every
    family, so a column typed by its values (all NULL: Arrow's null type) agrees with the
    typed one."""
    if not columns or buckets == 1:
        return np.zeros(rows, dtype=np.int64)
    combined = np.zeros(rows, dtype=np.uint64)
    for values, nulls in columns:
        hashed = np.where(nulls, _NULL_HASH, pd.util.hash_array(values, categorize=False))
        combined = combined * _MIX + hashed  # wraps modulo 2**64
    return (combined % np.uint64(buckets)).astype(np.int64)


def _column(values: list[Any]) -> pa.Array:
    """Key values as one Arrow column; a position mixing number types (1 and 2.5, or a
    Decimal) goes through float as its typed column would."""
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        pass
    if all(v is None or isinstance(v, int | float | Decimal) for v in values):
        return pa.array([None if v is None else float(v) for v in values], pa.float64())
    return pa.array([None if v is None else repr(v) for v in values], pa.string())


def _canonical(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """One key column in its family's form (module docstring) as numpy for the hash, and
    its null mask."""
    nulls = column.is_null().to_numpy(zero_copy_only=False)
    return _family(column), nulls


def _family(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    t = column.type
    if pa.types.is_dictionary(t):
        return _family(pc.cast(column, t.value_type))
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return _objects(pc.cast(column, pa.string()))
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return _objects(pc.cast(column, pa.binary()))
    if pa.types.is_timestamp(t):
        return _floats(pc.cast(column, pa.timestamp("us", t.tz), safe=False).cast(pa.int64()))
    if pa.types.is_date(t):
        return _floats(pc.cast(column, pa.date32()).cast(pa.int32()))
    if pa.types.is_time(t):
        return _floats(pc.cast(column, pa.time64("us"), safe=False).cast(pa.int64()))
    if pa.types.is_duration(t):
        return _floats(pc.cast(column, pa.duration("us"), safe=False).cast(pa.int64()))
    if pa.types.is_boolean(t) or pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        return _floats(column)
    if pa.types.is_null(t):
        return np.zeros(len(column))
    return np.array([repr(_plain(v)) for v in column.to_pylist()], dtype=object)


def _floats(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    values = pc.cast(column, pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False)
    return np.where(np.isnan(values), np.nan, values + 0.0)  # one NaN, and -0.0 as 0.0


def _objects(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    empty = "" if pa.types.is_string(column.type) else b""
    return np.asarray(column.fill_null(empty).to_numpy(zero_copy_only=False), dtype=object)


def _plain(value: Any) -> Any:
    """A nested value (list, struct) with its numbers as floats, so equal values print
    alike whatever their types."""
    if isinstance(value, bool | int | Decimal):
        return float(value)
    if isinstance(value, float):
        return value + 0.0
    if isinstance(value, list | tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _plain(v)) for k, v in value.items())
    return value
