"""Sink records of a batch of changes built from columns, byte for byte what the per-record
``Encoder`` (``codecs``) writes.

A JSON record is the concatenation of one text fragment per column (``"name":value``), so
each column's fragments are built at once: integers and booleans are rendered by Arrow,
strings escaped by Arrow's string kernels the way ``json.dumps(ensure_ascii=False)`` escapes
them; a column holding anything else (floats, whose text is Python's ``repr``, DECIMAL,
DATE, TIMESTAMP, composite values, or values of an unexpected Python type) is rendered value
by value with ``to_json_value`` and ``json.dumps``, the per-record encoder's own steps.
Avro formats are encoded record by record.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tidemark.engine.catalog import TableDef
from tidemark.engine.changelog import DELETE, UPDATE_BEFORE, Change
from tidemark.engine.types import SqlType, to_json_value
from tidemark.formats.codecs import Encoder

#: json.dumps's escapes of the characters it must escape (ensure_ascii=False)
_ESCAPES = [("\\", "\\\\"), ('"', '\\"'), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"), ("\b", "\\b"), ("\f", "\\f")]
_ESCAPES += [(chr(c), f"\\u{c:04x}") for c in range(0x20) if chr(c) not in "\n\r\t\b\f"]


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _value_text(t: SqlType, value: Any) -> str:
    """``_dumps(to_json_value(t, value))``, without the detour for the common classes (their
    text never needs escaping)."""
    cls = type(value)
    if cls is float:
        return repr(value) if math.isfinite(value) else ("NaN" if value != value else "Infinity" if value > 0 else "-Infinity")
    if cls is Decimal:
        return f'"{value}"'
    if cls is _dt.datetime:
        return f'"{value.isoformat(sep=" ")}"'
    if cls is _dt.date:
        return f'"{value.isoformat()}"'
    return _dumps(to_json_value(t, value))


def fragments(t: SqlType, values: Sequence[Any]) -> pa.Array:
    """The JSON text of each value of a column of type ``t`` (``null`` for None)."""
    if t.is_composite:
        return pa.array([_value_text(t, v) for v in values], pa.string())
    try:
        arr = pa.array(values, from_pandas=False)
    except (pa.ArrowException, OverflowError, TypeError, UnicodeError):  # rendered value by value
        arr = None
    if arr is not None and (pa.types.is_int64(arr.type) or pa.types.is_boolean(arr.type)):
        text = arr.cast(pa.string())
    elif arr is not None and pa.types.is_string(arr.type):
        text = arr
        if pc.any(pc.match_substring_regex(text, r'[\\"\x00-\x1f]')).as_py():
            for raw, escaped in _ESCAPES:
                text = pc.replace_substring(text, raw, escaped)
        text = pc.binary_join_element_wise('"', text, '"', "")
    elif arr is not None and pa.types.is_null(arr.type):
        text = pa.nulls(len(values), pa.string())
    else:
        return pa.array([_value_text(t, v) for v in values], pa.string())
    return pc.fill_null(text, "null")


class BatchEncoder:
    """Encodes a batch of changes of a sink table; ``encode`` returns, per change, what
    ``Encoder.encode`` returns for it."""

    def __init__(self, table: TableDef, registry_url: str | None = None):
        self.encoder = Encoder(table, registry_url)
        self.table = table
        self.json = self.encoder.spec.encoding == "json"
        self.names = table.column_names
        self.types = table.types
        self.pk = table.pk_indexes
        self._labels = [_dumps(n) + ":" for n in self.names]

    def encode_keys(self, rows: Sequence[tuple], topic: str | None = None) -> list[bytes | None]:
        """``Encoder.encode_key`` of each row."""
        if not self.pk or not rows:
            return [None] * len(rows)
        if not self.json:
            return [self.encoder.encode_key(r, topic) for r in rows]
        columns = list(zip(*rows))
        return self._objects(columns, self.pk, None).to_pylist()

    def encode(self, changes: Sequence[Change], topic: str | None = None) -> list[tuple[bytes | None, bytes | None] | None]:
        if not self.json or not changes:
            return [self.encoder.encode(c, topic) for c in changes]
        written = [c for c in changes if not (self.encoder.upsert and c.kind == UPDATE_BEFORE)]
        rows = [c.row for c in written]
        columns = list(zip(*rows)) if rows else []
        keys = self.encode_keys(rows, topic)
        everything = range(len(self.names))
        if self.encoder.upsert:
            values = self._objects(columns, everything, None).to_pylist() if rows else []
            values = [None if c.kind == DELETE else v for c, v in zip(written, values)]
        else:
            kinds = pa.array(['{"op":' + _dumps(c.kind) + "," for c in written], pa.string()) if rows else None
            values = self._objects(columns, everything, kinds).to_pylist() if rows else []
        out = iter(zip(keys, values))
        return [None if self.encoder.upsert and c.kind == UPDATE_BEFORE else next(out) for c in changes]

    def _objects(self, columns: list[tuple], which: Sequence[int], head: pa.Array | None) -> pa.Array:
        """``{...}`` of the columns ``which`` (``head``: each record's text after ``{``)
        as bytes."""
        parts: list[Any] = [head if head is not None else "{"]
        for j, i in enumerate(which):
            parts += ([","] if j else []) + [self._labels[i], fragments(self.types[i], columns[i])]
        parts.append("}")
        return pc.binary_join_element_wise(*parts, "").cast(pa.binary())
