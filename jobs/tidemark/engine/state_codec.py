"""A keyed stage's bucket state as stored bytes: the one seam between stages and a host's
state store (the Spark host keeps one value per state bucket; ``tidemark.spark.keyed``).

Hosts never look inside a state: they ask this module for an empty one, hand it to the
stage's ``process_batch`` (``tidemark.engine.driver``), and store what ``encode_state``
gives back. A stored value says which format wrote it, so a checkpoint written by another
format is refused with both named instead of being misread.

Formats, by stage:

- a stage that implements the typed state protocol below stores one Arrow IPC stream per
  bucket whose schema metadata names the stage kind and its state version;
- any other stage stores its ``Bucket`` pickled (``FORMAT_PICKLED``): the format the typed
  one replaces, stage by stage. docs/running.md lists which stages still use it.

The typed state protocol (a stage, or the batch kernel ``batch_stage`` returns for it):

- ``state_kind: str`` and ``state_version: int``: what the stored schema is, and its version;
- ``empty_state() -> S``: the state of a bucket that has none;
- ``state_to_table(state: S) -> pa.Table | None``: the bucket's state as typed columns
  (None when empty: the host then removes the stored value);
- ``state_from_table(table: pa.Table) -> S``: the inverse.
"""

from __future__ import annotations

import pickle
from typing import Any

from tidemark.engine.driver import Bucket, batch_stage
from tidemark.engine.errors import TidemarkError

FORMAT_PICKLED = "pickled-bucket/1"
_PICKLED_MAGIC = b"TMPB1\n"
_KIND = b"tidemark.state.kind"
_VERSION = b"tidemark.state.version"


class StateFormatError(TidemarkError):
    """A stored state was written in a format this version does not read."""

    exit_status = 2


def is_typed(stage: Any) -> bool:
    """Whether ``stage`` (or its batch kernel) stores typed Arrow state."""
    target = batch_stage(stage)
    return all(hasattr(target, attr) for attr in ("state_kind", "state_version", "state_to_table", "state_from_table"))


def format_of(stage: Any) -> str:
    """The stored format ``stage`` writes, as messages and docs name it."""
    if is_typed(stage):
        target = batch_stage(stage)
        return f"{target.state_kind}/{target.state_version}"
    return FORMAT_PICKLED


def empty_state(stage: Any) -> Any:
    """The state of a bucket with nothing stored."""
    target = batch_stage(stage)
    return target.empty_state() if hasattr(target, "empty_state") else Bucket()


def encode_state(stage: Any, state: Any) -> bytes | None:
    """The bytes to store for a bucket's ``state``; None when the bucket is empty."""
    if is_typed(stage):
        import pyarrow as pa

        target = batch_stage(stage)
        table = target.state_to_table(state)
        if table is None or table.num_rows == 0:
            return None
        meta = dict(table.schema.metadata or {})
        meta[_KIND] = target.state_kind.encode()
        meta[_VERSION] = str(target.state_version).encode()
        table = table.replace_schema_metadata(meta)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
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
    if not is_typed(stage):
        return Bucket.load(stage, pickle.loads(data[len(_PICKLED_MAGIC):]))
    import pyarrow as pa

    table = pa.ipc.open_stream(data).read_all()
    return batch_stage(stage).state_from_table(table)


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
