"""Normalize: turn an upsert stream into a full changelog.

An upsert source (``upsert-json``) carries only the new row per key, or a tombstone. Joins,
aggregates and materializers need exact before-images to retract, so this stage keeps the
last row per primary key and emits the net change per key per batch: ``+I`` for a new key,
``-U``/``+U`` for a changed row, ``-D`` for a deleted one, nothing when the row is unchanged.

Within a batch the records of one key form a *set*: the record with the greatest source
position wins, whatever order the host delivers them in. At equal positions an upsert beats
a delete (retractions before adds at the same position), and remaining ties are broken by the
row's repr so the result never depends on arrival order. ``-U`` records carry no information
in upsert mode (Flink ignores them too) and are dropped.

Refresh: the batch's records are replayed in that order the way Flink's ``ChangelogNormalize``
sees them one by one (an upsert identical to the current row is dropped, as Flink does with
state TTL off). When the row ends the batch with the value it started with but some record in
between changed it (deleted and re-inserted, or changed and changed back), Flink emitted
changes for it and the row now sits at the later position downstream; Tidemark emits
``-U X`` (position of the first change) / ``+U X`` (position of the last one) so positions
downstream advance the same way (a sink ``ON CONFLICT DO DEDUPLICATE`` picks the latest row by
position). A changed row is emitted at the position of the last record that changed it.
"""

from __future__ import annotations

from collections.abc import Sequence

from tidemark.engine.changelog import (
    DELETE,
    UPDATE_AFTER,
    UPDATE_BEFORE,
    Change,
    diff_to_changes,
)
from tidemark.engine.stage import BatchContext


class Normalize:
    """Keyed by the source primary key; state is the last row of that key (or ``None``)."""

    n_inputs = 1

    def __init__(self, pk: tuple[int, ...], width: int, name: str = "normalize"):
        self.pk = tuple(pk)
        self.width = width
        self.name = name

    def key_of(self, change: Change, input_index: int = 0) -> tuple:
        return tuple(change.row[i] for i in self.pk)

    def process_key(
        self, key: tuple, inputs: Sequence[list[Change]], state: tuple | None, ctx: BatchContext
    ) -> tuple[tuple | None, list[Change]]:
        records = [c for c in inputs[0] if c.kind != UPDATE_BEFORE]
        if not records:
            return state, []
        records.sort(key=_precedence)
        winner = records[-1]
        if winner.kind != DELETE and len(winner.row) != self.width:
            raise ValueError(
                f"{self.name}: row {winner.row!r} has {len(winner.row)} columns, "
                f"expected {self.width}"
            )
        # Replay record by record: which records would have changed the row (Flink emits
        # a change for each), the first and the last of them.
        cur, first, last = state, None, None
        for r in records:
            nxt = None if r.kind == DELETE else tuple(r.row)
            if nxt != cur:
                cur = nxt
                first = r.pos if first is None else first
                last = r.pos
        if cur is None:
            if state is None:
                # A tombstone for a key we never saw: nothing to retract. Counted, because
                # it usually means lost state (TTL) or a topic compacted before we started.
                if not any(r.is_add for r in records):
                    ctx.metrics["retractions_without_state"] += 1
                return None, []
            return None, diff_to_changes(state, None, first)
        if cur == state:
            if last is None:
                return state, []  # identical upserts only: Flink drops them
            return state, [Change(UPDATE_BEFORE, state, first), Change(UPDATE_AFTER, state, last)]
        if state is None:
            return cur, diff_to_changes(None, cur, last)
        # The old row stopped being current at the first changing record, the new one
        # became current at the last (Flink emits at each): downstream "latest" decisions
        # (an aggregate's output position, a materializer) see those positions.
        return cur, [Change(UPDATE_BEFORE, state, first), Change(UPDATE_AFTER, cur, last)]


def _precedence(c: Change) -> tuple:
    """Greatest source position wins; at a tie an upsert beats a delete, then repr decides."""
    return (c.pos, 1 if c.is_add else 0, repr(c.row))
