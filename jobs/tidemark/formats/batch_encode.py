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

from tidemark.engine.arrow_types import pylist, python_values
from tidemark.engine.batch import KIND, WEIGHT
from tidemark.engine.batch_columns import to_changes
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
        return _one_by_one(t, values)
    try:
        arr = pa.array(values, from_pandas=False)
    except (pa.ArrowException, OverflowError, TypeError, UnicodeError):  # rendered value by value
        return _one_by_one(t, values)
    return column_fragments(t, arr, values)


def column_fragments(t: SqlType, arr: pa.Array, values: Sequence[Any] | None = None) -> pa.Array:
    """The JSON text of each value of the Arrow column ``arr`` of type ``t``; ``values``: the
    same values as rows hold them, when the caller has them already."""
    if t.is_composite:
        text = None
    elif pa.types.is_integer(arr.type) or pa.types.is_boolean(arr.type):
        text = arr.cast(pa.string())
    elif pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        text = arr.cast(pa.string())
        if pc.any(pc.match_substring_regex(text, r'[\\"\x00-\x1f]')).as_py():
            for raw, escaped in _ESCAPES:
                text = pc.replace_substring(text, raw, escaped)
        text = pc.binary_join_element_wise('"', text, '"', "")
    elif pa.types.is_null(arr.type):
        text = pa.nulls(len(arr), pa.string())
    else:
        text = None
    if text is None:
        return _one_by_one(t, values if values is not None else python_values(arr))
    return pc.fill_null(text, "null")


def _one_by_one(t: SqlType, values: Sequence[Any]) -> pa.Array:
    return pa.array([_value_text(t, v) for v in values], pa.string())


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

    def encode(self, changes: Sequence[Change], topic: str | None = None) -> list[tuple[bytes | None, bytes | None] | None]:
        if not self.json or not changes:
            return [self.encoder.encode(c, topic) for c in changes]
        written = [c for c in changes if not (self.encoder.upsert and c.kind == UPDATE_BEFORE)]
        columns = list(zip(*(c.row for c in written))) if written else [() for _ in self.names]
        frags = [fragments(t, col) for t, col in zip(self.types, columns)]
        return self._records(pa.array([c.kind for c in changes], pa.string()), frags)

    def encode_table(self, table: pa.Table, topic: str | None = None) -> list[tuple[bytes | None, bytes | None] | None]:
        """``encode`` of the changes of a batch table (``ChangeBatch``'s layout), from its
        columns: no ``Change`` tuple is built for a JSON format."""
        weights = pc.abs(table.column(WEIGHT))
        if not self.json or table.num_rows == 0 or pc.max(weights).as_py() != 1:
            return self.encode(to_changes(table), topic)
        kinds = table.column(KIND)
        if self.encoder.upsert:
            table = table.filter(pc.not_equal(kinds, UPDATE_BEFORE))
        frags = [column_fragments(t, table.column(i).combine_chunks()) for i, t in enumerate(self.types)]
        return self._records(kinds, frags)

    def _records(self, kinds: pa.Array | pa.ChunkedArray, frags: list[pa.Array]) -> list[tuple[bytes | None, bytes | None] | None]:
        """Each change's (key, value), from every change's kind and the text fragments of the
        columns of the changes written (all of them, but an upsert format's ``-U``, which
        writes nothing: None in its place). Built as columns; Python sees each record once,
        as the bytes it is produced with."""
        upsert = self.encoder.upsert
        skipped = pc.equal(kinds, UPDATE_BEFORE) if upsert else None
        written = kinds.filter(pc.invert(skipped)) if skipped is not None else kinds
        n = len(written)
        keys = pylist(self._objects(frags, self.pk, None)) if self.pk and n else [None] * n
        everything = range(len(self.names))
        if not n:
            values: list[bytes | None] = []
        elif upsert:  # a delete is a tombstone
            rows = self._objects(frags, everything, None)
            values = pylist(pc.if_else(pc.equal(written, DELETE), pa.scalar(None, pa.binary()), rows))
        else:  # a kind is two characters that need no escaping
            values = pylist(self._objects(frags, everything, pc.binary_join_element_wise('{"op":"', written, '",', "")))
        records = list(zip(keys, values))
        if skipped is None or not pc.any(skipped).as_py():
            return records
        out = iter(records)
        return [None if s else next(out) for s in pylist(skipped)]

    def _objects(self, frags: Sequence[pa.Array], which: Sequence[int], head: pa.Array | None) -> pa.Array:
        """``{...}`` of the columns ``which`` (``frags``: each column's text fragments;
        ``head``: each record's text after ``{``) as bytes."""
        parts: list[Any] = [head if head is not None else "{"]
        for j, i in enumerate(which):
            parts += ([","] if j else []) + [self._labels[i], frags[i]]
        parts.append("}")
        return pc.binary_join_element_wise(*parts, "").cast(pa.binary())
