"""A keyed stage's bucket state as stored bytes: the one seam between stages and a host's
state store (the Spark host keeps one value per state bucket; ``tidemark.spark.keyed``).

Hosts never look inside a state: they ask this module for an empty one, hand it to the
stage's ``process_batch`` (``tidemark.engine.driver``), and store what ``encode_state``
gives back. A stored value says which format wrote it, so a checkpoint written by another
format is refused with both named instead of being misread.

Formats, by stage:

- a stage that implements the typed state protocol below stores one Arrow IPC stream per
  bucket (zstd-compressed buffers, ``_ZSTD_LEVEL``) whose schema metadata names the stage's state kind and
  its version, ``<kind>/<version>``; docs/running.md, "State formats", lists which stages do
  and what their tables hold;
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

import pickle
from typing import Any

from tidemark.engine.driver import Bucket, batch_stage, has_typed_state
from tidemark.engine.errors import TidemarkError

FORMAT_PICKLED = "pickled-bucket/1"
_PICKLED_MAGIC = b"TMPB1\n"
_KIND = b"tidemark.state.kind"
_VERSION = b"tidemark.state.version"


#: zstd's default level: a touched bucket is re-encoded whole at every batch, so encode time
#: grows with the state; higher levels store fewer bytes at a throughput cost that
#: docs/benchmarks.md ("The zstd level of stored state") measures. Any level reads back.
_ZSTD_LEVEL = 3


def _write_options() -> Any:
    import pyarrow as pa

    return pa.ipc.IpcWriteOptions(compression=pa.Codec("zstd", compression_level=_ZSTD_LEVEL))


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
        import pyarrow as pa

        table = target.state_to_table(state)
        if table is None or table.num_rows == 0:
            return None
        meta = dict(table.schema.metadata or {})
        meta[_KIND] = target.state_kind.encode()
        meta[_VERSION] = str(target.state_version).encode()
        table = table.replace_schema_metadata(meta)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema, options=_write_options()) as writer:
            writer.write_table(table)
        return sink.getvalue().to_pybytes()
    if not state.states:
        return None
    return _PICKLED_MAGIC + pickle.dumps(state.states, pickle.HIGHEST_PROTOCOL)


def decode_state(stage: Any, data: bytes | None) -> Any:
    """A bucket's state from stored bytes (None: nothing stored). Bytes written in another
    format than the one ``stage`` writes raise ``StateFormatError`` naming both."""
    if data is None:
        return empty_state(stage)
    found = _format_of_bytes(data)
    expected = format_of(stage)
    if found != expected:
        raise StateFormatError(
            f"stage '{getattr(stage, 'name', stage)}': the checkpoint holds state in format {found}, "
            f"this version reads {expected}; start a new checkpoint (or run the version that wrote it)"
        )
    target = _typed(stage)
    if target is None:
        return Bucket.load(stage, pickle.loads(data[len(_PICKLED_MAGIC):]))
    import pyarrow as pa

    return target.state_from_table(pa.ipc.open_stream(data).read_all())


def _format_of_bytes(data: bytes) -> str:
    if data.startswith(_PICKLED_MAGIC):
        return FORMAT_PICKLED
    try:
        import pyarrow as pa

        meta = pa.ipc.open_stream(data).schema.metadata or {}
    except Exception:
        return "unversioned pickle (before state formats were recorded)"
    kind, version = meta.get(_KIND), meta.get(_VERSION)
    if kind is None or version is None:
        return "an Arrow stream without a state kind and version"
    return f"{kind.decode()}/{version.decode()}"
