"""Avro schemas: derived from a table's columns, or loaded from the ``.avsc`` files in
``proto/`` for the envelopes Tidemark defines (the dead-letter record, the changelog-avro
envelope).

``proto/`` ships inside the wheel as ``tidemark/proto`` (pyproject force-include); in a
source checkout it is the repository's ``proto/`` directory. Both places are tried.

Type mapping (Flink's Avro mapping): integers -> int/long, FLOAT/DOUBLE -> float/double,
DECIMAL(p, s) -> bytes with the decimal logical type, DATE -> int/date, TIMESTAMP(p) ->
long/timestamp-millis (p <= 3) or timestamp-micros, strings -> string. Primary-key columns
are non-null, every other column is a ``["null", T]`` union.
"""

from __future__ import annotations

import copy
import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from fastavro.schema import expand_schema, load_schema, parse_schema

from tidemark.engine.catalog import TableDef
from tidemark.engine.types import SqlType
from tidemark.formats.errors import FormatError

ROW_NAME = "tidemark.Row"

_HERE = Path(__file__).resolve()
PROTO_CANDIDATES = (
    _HERE.parents[1] / "proto",  # installed wheel: site-packages/tidemark/proto
    _HERE.parents[3] / "proto",  # source checkout: <repo>/proto
)


def proto_dir() -> Path:
    for candidate in PROTO_CANDIDATES:
        if (candidate / "dead_letter.avsc").is_file():
            return candidate
    raise FileNotFoundError(
        "Tidemark's Avro schemas (proto/*.avsc) were not found; looked in "
        + ", ".join(str(c) for c in PROTO_CANDIDATES)
        + ". Reinstall the package (the wheel ships them as tidemark/proto)."
    )


def avro_type(t: SqlType) -> Any:
    name = t.name
    if name in ("BIGINT",):
        return "long"
    if name in ("INT", "SMALLINT", "TINYINT"):
        return "int"
    if name == "DOUBLE":
        return "double"
    if name == "FLOAT":
        return "float"
    if name == "BOOLEAN":
        return "boolean"
    if t.is_string:
        return "string"
    if name == "DECIMAL":
        p, s = t.params
        return {"type": "bytes", "logicalType": "decimal", "precision": p, "scale": s}
    if name == "DATE":
        return {"type": "int", "logicalType": "date"}
    if name == "TIMESTAMP":
        precision = t.params[0] if t.params else 6
        return {"type": "long", "logicalType": "timestamp-millis" if precision <= 3 else "timestamp-micros"}
    raise FormatError(f"column type {t} has no Avro mapping")


_AVRO_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _fields(table: TableDef, only_pk: bool = False) -> list[dict[str, Any]]:
    pk = set(table.pk_indexes)
    fields = []
    for i, col in enumerate(table.columns):
        if only_pk and i not in pk:
            continue
        if not _AVRO_NAME.match(col.name):
            raise FormatError(
                f"table '{table.name}': column name '{col.name}' is not a valid Avro field name"
            )
        t = avro_type(col.type)
        if i in pk:
            fields.append({"name": col.name, "type": t})
        else:
            fields.append({"name": col.name, "type": ["null", t], "default": None})
    return fields


def row_schema(table: TableDef) -> dict[str, Any]:
    """The table's row record (named ``tidemark.Row``), unparsed."""
    return {"type": "record", "name": "Row", "namespace": "tidemark", "fields": _fields(table)}


def key_schema(table: TableDef) -> dict[str, Any]:
    """The record of the table's primary key (record keys of upsert topics)."""
    return {"type": "record", "name": "Key", "namespace": "tidemark", "fields": _fields(table, True)}


def debezium_schema(table: TableDef) -> dict[str, Any]:
    """Debezium's envelope as its Avro converter writes it (``before``/``after`` rows,
    ``op``, ``ts_ms``); a writer may add more fields (``source``...), which are ignored."""
    row = row_schema(table)
    row["name"] = "Value"
    return {
        "type": "record",
        "name": "Envelope",
        "namespace": "tidemark",
        "fields": [
            {"name": "before", "type": ["null", row], "default": None},
            {"name": "after", "type": ["null", "tidemark.Value"], "default": None},
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": ["null", "long"], "default": None},
        ],
    }


def changelog_schema(table: TableDef) -> dict[str, Any]:
    """``proto/changelog_envelope.avsc`` with ``tidemark.Row`` bound to the table's row."""
    named: dict[str, Any] = {}
    parse_schema(row_schema(table), named_schemas=named)
    path = proto_dir() / "changelog_envelope.avsc"
    return expanded(load_schema(str(path), named_schemas=named))


@lru_cache(maxsize=1)
def dead_letter_schema() -> dict[str, Any]:
    return load_schema(str(proto_dir() / "dead_letter.avsc"))


def _clean(node: Any) -> Any:
    """Drop fastavro's private bookkeeping keys from a parsed schema."""
    if isinstance(node, dict):
        return {k: _clean(v) for k, v in node.items() if not k.startswith("__")}
    if isinstance(node, list):
        return [_clean(v) for v in node]
    return node


def expanded(schema: Any) -> dict[str, Any]:
    """A schema loaded with external named types (``load_schema``) made self-contained:
    each named type inlined where it is first used."""
    return _clean(expand_schema(copy.deepcopy(schema)))


def schema_json(schema: Any) -> str:
    """The JSON text of a self-contained schema, as a schema registry is given it."""
    return json.dumps(_clean(parse_schema(copy.deepcopy(schema))))
