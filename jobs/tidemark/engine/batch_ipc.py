"""A ``ChangeBatch`` as Arrow IPC bytes: the form changes take between two processes.

The Spark host moves changes between its passes and stages as binary cells, one Arrow IPC
stream per task and destination bucket (``tidemark.spark.keyed``), not one pickled row per
change: a cell holds thousands of changes, so Spark's per-row and per-group costs are paid
per bucket, and the receiver gets typed columns it can hand to a batch kernel as they are.
Nothing here knows Spark: encoding, decoding and splitting by bucket are plain functions,
so they are tested without a session.

Columns are typed by the planner's column types (``tidemark.engine.arrow_types``). Where a
node has a column of unknown type, or its values do not fit the declared types (a stage
computing a wider value than planned), the batch's types are inferred from the values
instead: a batch must always travel, and the values it carries are what it must keep.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from tidemark.engine.arrow_types import arrow_type
from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change
from tidemark.engine.types import SqlType

#: schema metadata naming the layout, so a blob from elsewhere is refused, not misread
_FORMAT_KEY = b"tidemark.batch"
_FORMAT = b"change-batch/1"


class BatchFormatError(ValueError):
    """Bytes that are not a change batch this version writes."""


def schema_of(columns: Sequence[str], types: Sequence[SqlType | None]) -> pa.Schema | None:
    """The Arrow schema of a node's row columns; None when a type is unknown or has no
    Arrow type (the values' own types are used then)."""
    fields = []
    for i, (name, t) in enumerate(zip(columns, types)):
        if t is None:
            return None
        try:
            # a planner's name for an unnamed expression ("$f3") would read as one of the
            # batch's own columns ("$kind", "$pos0"): it gets ChangeBatch's positional name
            fields.append(pa.field(f"_{i}" if name.startswith("$") else name, arrow_type(t)))
        except ValueError:
            return None
    return pa.schema(fields)


def table_of(changes: Sequence[Change], schema: pa.Schema | None) -> pa.Table:
    """The batch table of ``changes`` (``ChangeBatch``'s layout), typed by ``schema`` when
    the values fit it, else by the values (module docstring)."""
    if schema is not None:
        try:
            return ChangeBatch.from_changes(changes, schema).table()
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
            pass
    table = ChangeBatch.from_changes(changes).table()
    if schema is not None and len(schema) == table.num_columns - len(_own_columns(table)):
        table = table.rename_columns([*schema.names, *_own_columns(table)])
    return table


def typed_table(batch: ChangeBatch, schema: pa.Schema | None) -> pa.Table:
    """``batch`` as the table a blob of it carries: its columns as they stand when it is
    columnar (never through ``Change`` tuples), else built from its changes; typed by
    ``schema`` when the values fit it."""
    if batch.is_columnar:
        return typed(batch.table(), schema)
    return table_of(batch.changes(), schema)


def typed(table: pa.Table, schema: pa.Schema | None) -> pa.Table:
    """A batch table with its row columns named and typed by ``schema`` when its values
    fit it, else as it stands (module docstring)."""
    own = _own_columns(table)
    if schema is None or len(schema) != table.num_columns - len(own):
        return table
    target = pa.schema([*schema, *(table.schema.field(c) for c in own)])
    try:
        return table.rename_columns(target.names).cast(target)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError):
        return table.rename_columns(target.names)


def _own_columns(table: pa.Table) -> list[str]:
    return [c for c in table.column_names if c.startswith("$")]


def encode(table: pa.Table) -> bytes:
    """One Arrow IPC stream holding ``table``."""
    meta = dict(table.schema.metadata or {})
    meta[_FORMAT_KEY] = _FORMAT
    table = table.replace_schema_metadata(meta)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def decode(data: bytes) -> pa.Table:
    """The table ``encode`` wrote; anything else raises ``BatchFormatError``."""
    try:
        reader = pa.ipc.open_stream(data)
    except pa.ArrowInvalid as err:
        raise BatchFormatError(f"not an Arrow IPC stream ({len(data)} bytes): {err}") from None
    found = (reader.schema.metadata or {}).get(_FORMAT_KEY)
    if found != _FORMAT:
        raise BatchFormatError(
            f"an Arrow stream in format {found.decode() if found else 'none'}, expected {_FORMAT.decode()}"
        )
    return reader.read_all().replace_schema_metadata(None)


def decode_batch(blobs: Sequence[bytes]) -> ChangeBatch:
    """One ``ChangeBatch`` of several blobs of one node, in blob order. Blobs typed by
    their values (module docstring) may differ in type, e.g. a column all null in one:
    they are unified to the common type."""
    tables = [decode(b) for b in blobs]
    if len(tables) == 1:
        return ChangeBatch.from_table(tables[0])
    return ChangeBatch.from_table(pa.concat_tables(tables, promote_options="permissive"))


def split(table: pa.Table, buckets: Sequence[int] | np.ndarray) -> dict[int, pa.Table]:
    """``table``'s rows by bucket (``buckets[i]``: the bucket of row i), each bucket's rows
    in table order: one stable sort and one ``take``, each bucket a slice of it."""
    ids = np.asarray(buckets, dtype=np.int64)
    if table.num_rows != len(ids):
        raise ValueError(f"{len(ids)} buckets for a table of {table.num_rows} rows")
    if len(ids) == 0:
        return {}
    order = np.argsort(ids, kind="stable")
    found, starts = np.unique(ids[order], return_index=True)
    if len(found) == 1:
        return {int(found[0]): table}
    ordered = table.take(pa.array(order))
    ends = [*starts[1:], len(ids)]
    return {int(b): ordered.slice(int(s), int(e - s)) for b, s, e in zip(found, starts, ends)}
