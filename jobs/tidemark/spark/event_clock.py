"""The watermark a state bucket of an event-time stage keeps (``tidemark.spark.watermark``
says why it is kept there).

A keyed stage is an event-time stage when it has ``watermark_sources``: the source tables
whose watermarks it waits for (a window aggregate). Each of its buckets receives, per
micro-batch, one tick row (``input`` = ``TICK_INPUT``) per task that read one of those
sources: the watermark of that task's records, ``{table: ms}``. The bucket keeps the
greatest watermark per table in a value state of its own (``MARKS_SCHEMA``, beside the
stage's state), so the batch's watermarks before its records are what is stored and after
them the stored ones raised by the ticks: replay's ``previous_watermarks`` and
``watermarks`` (``tidemark.engine.event_time``), the same for every bucket since every
bucket gets every tick. At the end of a bounded source its tick carries ``END_OF_INPUT``
(``tidemark.spark.source``, "Bounded"): the greatest value, so it is kept from then on, also
across restarts, with no state of its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from pyspark.sql.types import BinaryType, StructField, StructType

#: the ``input`` of a tick row (``BLOB_SCHEMA``): its ``batch`` is JSON ``{table: watermark ms}``
TICK_INPUT = -1
#: a type, not DDL text, for the reason ``tws_processor.STATE_SCHEMA`` gives
MARKS_SCHEMA = StructType([StructField("watermarks", BinaryType())])

#: a batch's watermarks per table, before and after its records
Watermarks = tuple[dict[str, int], dict[str, int]]


def watermark_sources(stage: Any) -> tuple[str, ...]:
    """The sources whose watermarks ``stage`` waits for; empty for a stage without event time."""
    return tuple(getattr(stage, "watermark_sources", ()))


def encode_tick(marks: dict[str, int]) -> bytes:
    return json.dumps(marks, sort_keys=True).encode()


def _decode(data: bytes | None) -> dict[str, int]:
    return {str(k): int(v) for k, v in json.loads(bytes(data)).items()} if data else {}


def split_ticks(pairs: Iterable[tuple[int, bytes]]) -> tuple[list[tuple[int, bytes]], list[bytes]]:
    """``(input, blob)`` pairs as (the data pairs, the tick blobs)."""
    data: list[tuple[int, bytes]] = []
    ticks: list[bytes] = []
    for inp, blob in pairs:
        if inp == TICK_INPUT:
            ticks.append(blob)
        else:
            data.append((inp, blob))
    return data, ticks


def advance(stored: bytes | None, ticks: Iterable[bytes]) -> tuple[Watermarks, bytes | None]:
    """The bucket's stored watermarks raised by ``ticks``: ((before, after), the bytes to
    store, None when nothing moved)."""
    before = _decode(stored)
    after = dict(before)
    for tick in ticks:
        for table, ms in _decode(tick).items():
            if ms > after.get(table, ms - 1):
                after[table] = ms
    return (before, after), (encode_tick(after) if after != before else None)


class BucketClock:
    """A bucket's watermarks in a transformWithStateInPandas value state: read and written
    at most once per batch (each is a JVM round trip)."""

    def __init__(self, handle: Any) -> None:
        self.state = handle.getValueState("watermarks", MARKS_SCHEMA)

    def tick(self, ticks: list[bytes]) -> Watermarks:
        """Fold this batch's ticks in; the batch's watermarks before and after them."""
        got = self.state.get()
        marks, changed = advance(bytes(got[0]) if got is not None else None, ticks)
        if changed is not None:
            self.state.update((changed,))
        return marks
