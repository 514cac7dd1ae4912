"""Changelog producers: what the sink writes for one key after a batch merged into it.

- ``none``: upserts of the merged row -- ``+I`` for a new key, ``+U`` (no before-image)
  for a changed row, ``-D`` for a removed one. Enough for upsert topics and databases.
- ``input``: the records as received (after ``ignore-delete``), in source-position order.
- ``lookup``: the full changelog per batch, from the row before and after: ``+I``,
  ``-U``/``+U``, ``-D``. With ``changelog-producer.row-deduplicate`` a batch that leaves
  the row unchanged emits nothing; without it, the unchanged row is re-emitted as a
  ``-U``/``+U`` pair (Paimon's behaviour).
- ``full-compaction``: the same diff, but only at compaction barriers, against the row
  emitted at the previous barrier; changes in between are merged away. Paimon compacts
  every ``changelog-producer.compaction-interval``; here the barrier is the micro-batch: a
  key changed at processing time ``t`` emits in the first batch whose ``now_ms`` lies in a
  later interval bucket (buckets are ``now_ms // interval``, aligned for all keys). An
  interval of 0 (the default) makes every batch a barrier. A key that sees no more records
  is reached through ``wakeup_ms``: the host must call ``process_key`` with no records once
  ``now_ms`` reaches it.
"""

from __future__ import annotations

from collections.abc import Sequence

from tidemark.engine.changelog import (
    DELETE,
    INSERT,
    UPDATE_AFTER,
    UPDATE_BEFORE,
    Change,
    canonical_sorted,
)


def upserts(old: tuple | None, new: tuple | None, pos: tuple) -> list[Change]:
    if old == new:
        return []
    if new is None:
        return [Change(DELETE, old, pos)]
    return [Change(INSERT if old is None else UPDATE_AFTER, new, pos)]


def full_diff(old: tuple | None, new: tuple | None, pos: tuple, dedupe: bool) -> list[Change]:
    if old is None and new is None:
        return []
    if old is None:
        return [Change(INSERT, new, pos)]
    if new is None:
        return [Change(DELETE, old, pos)]
    if dedupe and old == new:
        return []
    return [Change(UPDATE_BEFORE, old, pos), Change(UPDATE_AFTER, new, pos)]


def input_records(records: Sequence[Change]) -> list[Change]:
    return canonical_sorted(records)


def barrier_due(dirty_since_ms: int, now_ms: int, interval_ms: int) -> bool:
    """Whether a key changed at ``dirty_since_ms`` emits in a batch at ``now_ms``."""
    if interval_ms <= 0:
        return True
    return now_ms // interval_ms > dirty_since_ms // interval_ms


def next_barrier_ms(dirty_since_ms: int, interval_ms: int) -> int:
    if interval_ms <= 0:
        return dirty_since_ms
    return (dirty_since_ms // interval_ms + 1) * interval_ms
