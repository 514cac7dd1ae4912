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
"""

from __future__ import annotations

from collections.abc import Sequence

from tidemark.engine.changelog import DELETE, UPDATE_BEFORE, Change, diff_to_changes
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
        winner = max(records, key=_precedence)
        if winner.kind == DELETE:
            if state is None:
                # A tombstone for a key we never saw: nothing to retract. Counted, because
                # it usually means lost state (TTL) or a topic compacted before we started.
                if not any(r.is_add for r in records):
                    ctx.metrics["retractions_without_state"] += 1
                return None, []
            return None, diff_to_changes(state, None, winner.pos)
        if len(winner.row) != self.width:
            raise ValueError(
                f"{self.name}: row {winner.row!r} has {len(winner.row)} columns, "
                f"expected {self.width}"
            )
        new = tuple(winner.row)
        return new, diff_to_changes(state, new, winner.pos)


def _precedence(c: Change) -> tuple:
    """Greatest source position wins; at a tie an upsert beats a delete, then repr decides."""
    return (c.pos, 1 if c.is_add else 0, repr(c.row))
