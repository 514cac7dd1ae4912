"""A keyed stage's bucket state as stored bytes: the one seam between stages and a host's
state store (the Spark host keeps one value per state bucket; ``tidemark.spark.keyed``).

Hosts never look inside a state: they ask this module for an empty one, hand it to the
stage's ``process_batch`` (``tidemark.engine.driver``), and store what ``encode_state``
gives back. A stored value says which format wrote it, so a checkpoint written by another
format is refused with both named instead of being misread.

Formats, by stage:

- a stage that implements the typed state protocol below stores its bucket's table as one
  Parquet file (``_table_bytes``) whose schema metadata names the stage's state kind and its
  version, ``<kind>/<version>``; docs/running.md, "State formats", lists which stages do and
  what their tables hold. The container is not part of the format: a table Parquet cannot
  hold is stored as an Arrow IPC stream, and both read back;
- any other stage stores its ``Bucket`` pickled (``FORMAT_PICKLED``): the format the typed
  one replaces, stage by stage. docs/running.md lists which stages still use it.

A checkpoint records each stage's format in its plan fingerprint
(``tidemark.engine.fingerprint``), so a run on a checkpoint of another format is refused
before the query starts; ``decode_state`` refuses it again at the first read, for a
checkpoint written before formats were recorded.

The typed state protocol, implemented by the stage itself or by the batch kernel
``batch_stage`` returns for it (``driver.has_typed_state``):

- ``state_kind: str`` and ``state_version: int``: what the stored schema is, and its version
  (a change to the stored columns is a new version);
- ``empty_state() -> S``: the state of a bucket that has none;
- ``state_to_table(state: S) -> pa.Table | None``: the bucket's state as typed columns
  (None or no rows when empty: the host then removes the stored value);
- ``state_from_table(table: pa.Table) -> S``: the inverse.

A stage that implements it itself gets ``S = Bucket`` keyed by the key tuple
(``tidemark.engine.driver``), whichever of its kernel or the per-key adapter runs it.
"""

from __future__ import annotations

import functools
import pickle
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tidemark.engine.driver import Bucket, batch_stage, has_typed_state
from tidemark.engine.errors import TidemarkError

if TYPE_CHECKING:
    import pyarrow as pa

FORMAT_PICKLED = "pickled-bucket/1"
_PICKLED_MAGIC = b"TMPB1\n"
_KIND = b"tidemark.state.kind"
_VERSION = b"tidemark.state.version"


#: zstd's default level: a touched bucket is re-encoded whole at every batch, so encode time
#: grows with the state; higher levels store fewer bytes at a throughput cost that
#: docs/benchmarks.md ("The zstd level of stored state") measures. Any level reads back.
_ZSTD_LEVEL = 3
_PARQUET_MAGIC = b"PAR1"
#: Parquet's encodings by physical type. Why not Arrow IPC's plain buffers: state tables are
#: sorted by key, so keys and positions are runs of small differences (delta encodings) and
#: neighbouring strings share prefixes; zstd then finds far less to do. Booleans keep the
#: default (bit-packed) encoding. Integers inside lists are the exception (``_parquet_encodings``):
#: a list of a position's fields is stored as one sequence of values, its fields interleaved
#: (batch, source, partition, offset, batch, ...), so neighbours differ by as much as the
#: values; split into byte streams, their high bytes are runs of zeros for zstd.
_ENCODING_BY_PHYSICAL_TYPE = {
    "INT32": "DELTA_BINARY_PACKED",
    "INT64": "DELTA_BINARY_PACKED",
    "BYTE_ARRAY": "DELTA_BYTE_ARRAY",
    "FIXED_LEN_BYTE_ARRAY": "DELTA_BYTE_ARRAY",
    "FLOAT": "BYTE_STREAM_SPLIT",
    "DOUBLE": "BYTE_STREAM_SPLIT",
}


@functools.lru_cache(maxsize=256)
def _parquet_encodings(schema: pa.Schema) -> dict[str, str] | None:
    """Parquet column path -> encoding for tables of ``schema`` (without metadata); None when
    Parquet cannot hold such a table as it is (a struct without fields; a dictionary column,
    which the delta decoders do not read back into a dictionary), so IPC stores it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if any(_has_dictionary(f.type) for f in schema):
        return None
    sink = pa.BufferOutputStream()
    try:
        pq.write_table(schema.empty_table(), sink)
    except pa.ArrowNotImplementedError:
        return None
    columns = pq.ParquetFile(pa.BufferReader(sink.getvalue())).schema
    encodings = {}
    for i in range(len(columns)):
        column = columns.column(i)
        encoding = _ENCODING_BY_PHYSICAL_TYPE.get(column.physical_type)
        if column.max_repetition_level > 0 and column.physical_type in ("INT32", "INT64"):
            encoding = "BYTE_STREAM_SPLIT"
        if encoding is not None:
            encodings[column.path] = encoding
    return encodings


def _repeated_strings(table: pa.Table) -> list[str]:
    """Paths of the string columns, at the top or in structs, that hold each value at least
    twice on average: stored as a dictionary and indexes rather than delta-encoded (a sink
    row's attribute of a joined dimension repeats across keys that need not be neighbours)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    paths = []
    columns = [(f.name, table.column(i)) for i, f in enumerate(table.schema)]
    while columns:
        path, column = columns.pop()
        if pa.types.is_struct(column.type):
            columns += [(f"{path}.{column.type.field(i).name}", pc.struct_field(column, [i]))
                        for i in range(column.type.num_fields)]
        elif pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            present = len(column) - column.null_count
            if present and 2 * pc.count_distinct(column).as_py() <= present:
                paths.append(path)
    return sorted(paths)


def _has_dictionary(t: pa.DataType) -> bool:
    import pyarrow as pa

    return pa.types.is_dictionary(t) or any(_has_dictionary(t.field(i).type) for i in range(t.num_fields))


def _table_bytes(table: pa.Table) -> bytes:
    """One stored value for ``table``: Parquet where it can hold it, else an Arrow IPC stream."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    encodings = _parquet_encodings(table.schema.remove_metadata())
    if encodings is None:
        options = pa.ipc.IpcWriteOptions(compression=pa.Codec("zstd", compression_level=_ZSTD_LEVEL))
        with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
            writer.write_table(table)
    else:
        dictionary = _repeated_strings(table)
        encodings = {path: e for path, e in encodings.items() if path not in dictionary}
        pq.write_table(table, sink, compression="zstd", compression_level=_ZSTD_LEVEL, use_dictionary=dictionary,
                       column_encoding=encodings, write_statistics=False)
    return sink.getvalue().to_pybytes()


def _open_table(data: bytes) -> tuple[pa.Schema, Callable[[], pa.Table]]:
    """A stored table's schema, and how to read the table (either container)."""
    import pyarrow as pa

    if data.startswith(_PARQUET_MAGIC):
        import pyarrow.parquet as pq

        file = pq.ParquetFile(pa.BufferReader(data))
        schema = _written_schema(file)
        return schema, lambda: file.read(use_threads=False).cast(schema)
    stream = pa.ipc.open_stream(data)
    return stream.schema, stream.read_all


def _written_schema(file: Any) -> pa.Schema:
    """The Arrow schema the table was written with. Why not ``file.schema_arrow``: Parquet's
    reader renames a list's item field (``element``) and a map's entries, so a bucket read
    and written back unchanged would not give the same bytes, nor concatenate with a table
    built in memory."""
    stored = (file.metadata.metadata or {}).get(b"ARROW:schema")
    if stored is None:
        return file.schema_arrow
    return _schema_from(stored)


@functools.lru_cache(maxsize=256)
def _schema_from(serialized: bytes) -> pa.Schema:
    """A stage's buckets share one schema: decoded once, not at every bucket read."""
    import base64

    import pyarrow as pa

    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(serialized)))


def read_table(data: bytes) -> pa.Table:
    """The table a typed stored value holds, its schema metadata included."""
    return _open_table(data)[1]()


class StateFormatError(TidemarkError):
    """A stored state was written in a format this version does not read."""

    exit_status = 2


def _typed(stage: Any) -> Any | None:
    """What implements the typed state protocol for ``stage``: the stage, its batch kernel,
    or None (the pickled format)."""
    if has_typed_state(stage):
        return stage
    target = batch_stage(stage)
    return target if has_typed_state(target) else None


def is_typed(stage: Any) -> bool:
    """Whether ``stage`` (or its batch kernel) stores typed Arrow state."""
    return _typed(stage) is not None


def format_of(stage: Any) -> str:
    """The stored format ``stage`` writes, as messages and docs name it."""
    target = _typed(stage)
    return f"{target.state_kind}/{target.state_version}" if target is not None else FORMAT_PICKLED


def empty_state(stage: Any) -> Any:
    """The state of a bucket with nothing stored."""
    target = _typed(stage)
    return target.empty_state() if target is not None else Bucket()


def encode_state(stage: Any, state: Any) -> bytes | None:
    """The bytes to store for a bucket's ``state``; None when the bucket is empty."""
    target = _typed(stage)
    if target is not None:
        table = target.state_to_table(state)
        if table is None or table.num_rows == 0:
            return None
        meta = dict(table.schema.metadata or {})
        meta[_KIND] = target.state_kind.encode()
        meta[_VERSION] = str(target.state_version).encode()
        return _table_bytes(table.replace_schema_metadata(meta))
    if not state.states:
        return None
    return _PICKLED_MAGIC + pickle.dumps(state.states, pickle.HIGHEST_PROTOCOL)


def decode_state(stage: Any, data: bytes | None) -> Any:
    """A bucket's state from stored bytes (None: nothing stored). Bytes written in another
    format than the one ``stage`` writes raise ``StateFormatError`` naming both."""
    if data is None:
        return empty_state(stage)
    found, read = _opened(data)
    expected = format_of(stage)
    if found != expected:
        raise StateFormatError(
            f"stage '{getattr(stage, 'name', stage)}': the checkpoint holds state in format {found}, "
            f"this version reads {expected}; start a new checkpoint (or run the version that wrote it)"
        )
    target = _typed(stage)
    if target is None:
        return Bucket.load(stage, pickle.loads(data[len(_PICKLED_MAGIC):]))
    return target.state_from_table(read())


def _opened(data: bytes) -> tuple[str, Callable[[], pa.Table] | None]:
    """The format a stored value was written in, and for a typed one how to read its table."""
    if data.startswith(_PICKLED_MAGIC):
        return FORMAT_PICKLED, None
    try:
        schema, read = _open_table(data)
    except Exception:
        return "unversioned pickle (before state formats were recorded)", None
    meta = schema.metadata or {}
    kind, version = meta.get(_KIND), meta.get(_VERSION)
    if kind is None or version is None:
        return "an Arrow table without a state kind and version", None
    return f"{kind.decode()}/{version.decode()}", read


def _format_of_bytes(data: bytes) -> str:
    return _opened(data)[0]
