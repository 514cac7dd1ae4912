"""Rows between their decoded form (a JSON object or an Avro record, both dicts) and the
tuple in the table's column order that stages work on.

Decoding is Flink-like rather than strict: fields the table does not declare are ignored
(Debezium rows carry extra columns) and a missing non-key field is NULL, unless the table
sets ``'json.fail-on-missing-field' = 'true'``. A missing or null primary key, or a value
of the wrong type, is a ``DecodeError`` naming the column.
"""

from __future__ import annotations

from typing import Any

from tidemark.engine.catalog import TableDef
from tidemark.engine.types import coerce_value, to_json_value
from tidemark.formats.errors import DecodeError


def _show(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class RowCodec:
    """Validates decoded rows of one table and renders rows for output."""

    def __init__(self, table: TableDef):
        self.table = table
        self.names = table.column_names
        self.types = table.types
        self.pk = table.pk_indexes
        self.pk_names = tuple(self.names[i] for i in self.pk)
        self._index = {n: i for i, n in enumerate(self.names)}
        self._index_ci = {n.lower(): i for i, n in enumerate(self.names)}
        strict = table.options.get("json.fail-on-missing-field", "false").lower() == "true"
        self.fail_on_missing = strict

    def _lookup(self, field: str) -> int | None:
        i = self._index.get(field)
        return i if i is not None else self._index_ci.get(field.lower())

    def row(self, obj: Any, where: str = "row", *, key_only: bool = False) -> tuple:
        """The row tuple for a decoded object. ``key_only``: only the primary key is
        expected (a tombstone's key); other columns are NULL."""
        if not isinstance(obj, dict):
            raise DecodeError(f"{where}: expected an object, got {_show(obj)}", "bad_envelope")
        values: list[Any] = [None] * len(self.names)
        seen = [False] * len(self.names)
        for field, raw in obj.items():
            i = self._lookup(field) if isinstance(field, str) else None
            if i is None:
                continue
            try:
                values[i] = coerce_value(self.types[i], raw)
            except ValueError as err:
                raise DecodeError(f"{where}: column '{self.names[i]}': {err}", "wrong_type") from None
            seen[i] = True
        for i in self.pk:
            if not seen[i]:
                raise DecodeError(f"{where}: missing primary key column '{self.names[i]}'", "missing_pk")
            if values[i] is None:
                raise DecodeError(f"{where}: primary key column '{self.names[i]}' is null", "missing_pk")
        if self.fail_on_missing and not key_only:
            missing = [self.names[i] for i in range(len(self.names)) if not seen[i]]
            if missing:
                raise DecodeError(
                    f"{where}: missing column(s) {', '.join(missing)} (json.fail-on-missing-field)",
                    "missing_field",
                )
        return tuple(values)

    def key_row(self, obj: Any, where: str = "key") -> tuple:
        """A row holding only the primary key (from a record key), others NULL."""
        return self.row(obj, where, key_only=True)

    # ------------------------------------------------------------------ output
    def to_json(self, row: tuple) -> dict[str, Any]:
        return {n: to_json_value(t, v) for n, t, v in zip(self.names, self.types, row)}

    def key_to_json(self, row: tuple) -> dict[str, Any]:
        return {self.names[i]: to_json_value(self.types[i], row[i]) for i in self.pk}

    def to_record(self, row: tuple) -> dict[str, Any]:
        """For Avro: Python values as they are (fastavro encodes Decimal/datetime)."""
        return dict(zip(self.names, row))

    def key_to_record(self, row: tuple) -> dict[str, Any]:
        return {self.names[i]: row[i] for i in self.pk}

    def pk_of(self, row: tuple) -> tuple:
        return tuple(row[i] for i in self.pk)
