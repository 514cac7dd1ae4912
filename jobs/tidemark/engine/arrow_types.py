"""SQL column types as Arrow types, and Arrow values back as the Python values rows hold.

A ``ChangeBatch`` is typed by the planner's column types, so that a value crosses Arrow and
comes back as the same Python value a row held before (``tidemark.engine.types``): DECIMAL
keeps its scale, TIMESTAMP stays a naive ``datetime``, composite values stay tuples.
FLOAT maps to ``float64`` on purpose: rows hold Python floats, and a ``float32`` column
would round them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from tidemark.engine.types import SqlType

_SCALARS: dict[str, pa.DataType] = {
    "TINYINT": pa.int8(),
    "SMALLINT": pa.int16(),
    "INT": pa.int32(),
    "BIGINT": pa.int64(),
    "FLOAT": pa.float64(),
    "DOUBLE": pa.float64(),
    "STRING": pa.string(),
    "VARCHAR": pa.string(),
    "CHAR": pa.string(),
    "BOOLEAN": pa.bool_(),
    "DATE": pa.date32(),
}


def arrow_type(t: SqlType) -> pa.DataType:
    """The Arrow type of a column of SQL type ``t``. MAP is a list of key/value structs, not
    Arrow's map type: rows hold a map as sorted ``(key, value)`` pairs, and a list keeps
    that order and form."""
    if t.name in _SCALARS:
        return _SCALARS[t.name]
    if t.name == "DECIMAL":
        return pa.decimal128(*t.params)
    if t.name == "TIMESTAMP":
        return pa.timestamp("us")  # a Python datetime holds microseconds at most
    if t.name == "ARRAY":
        return pa.list_(arrow_type(t.element))
    if t.name == "MAP":
        return pa.list_(pa.struct([("key", arrow_type(t.params[0])), ("value", arrow_type(t.params[1]))]))
    if t.name == "ROW":
        return pa.struct([(name, arrow_type(ft)) for name, ft in t.params])
    raise ValueError(f"no Arrow type for SQL type {t}")


def _is_variable_width(t: pa.DataType) -> bool:
    """Text or bytes: numpy's object conversion gives each value, None for a NULL."""
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t))


def pylist(column: pa.Array | pa.ChunkedArray) -> list[Any]:
    """``column.to_pylist()``, through numpy where that gives the same values: numbers and
    booleans without NULLs, text and bytes. pyarrow builds each Python object on its own
    path, much slower than numpy's ``tolist``, and the per-key stages read every value of
    every batch this way (as does the JSON encoder, every record it writes)."""
    t = column.type
    if _is_variable_width(t) or (
        column.null_count == 0 and (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t))
    ):
        return column.to_numpy(zero_copy_only=False).tolist()
    return column.to_pylist()


def python_values(column: pa.Array | pa.ChunkedArray) -> list[Any]:
    """A column's values as rows hold them: ``to_pylist``, with lists and structs turned
    into tuples (rows are hashed and compared whole, so composite values are tuples)."""
    values = pylist(column)
    convert = _converter(column.type)
    return values if convert is None else [None if v is None else convert(v) for v in values]


def _converter(t: pa.DataType) -> Callable[[Any], Any] | None:
    """How to turn one ``to_pylist`` value of type ``t`` into a row value; None: as is."""
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        inner = _converter(t.value_type)
        if inner is None:
            return tuple
        return lambda v: tuple(_field(x, inner) for x in v)
    if pa.types.is_struct(t):
        fields = [(t.field(i).name, _converter(t.field(i).type)) for i in range(t.num_fields)]
        return lambda v: tuple(_field(v[name], conv) for name, conv in fields)
    return None


def _field(value: Any, convert: Callable[[Any], Any] | None) -> Any:
    return value if value is None or convert is None else convert(value)
