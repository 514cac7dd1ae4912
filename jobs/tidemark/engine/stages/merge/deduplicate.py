"""``deduplicate`` (the default): the last record in merge order wins; if it is a
retraction (``-D``, or ``-U`` as in Paimon), the key is deleted and that record is the
tombstone (kept only with ``sequence.field``, see ``stage``)."""

from __future__ import annotations

from collections.abc import Sequence

from tidemark.engine.changelog import ADDS
from tidemark.engine.stages.merge.ordering import Item


class DeduplicateMerge:
    def merge(self, items: Sequence[Item]) -> tuple[tuple | None, tuple | None]:
        """(merged row, None) or (None, the record that deleted the key)."""
        last = items[-1]
        return (last.row, None) if last.kind in ADDS else (None, last.row)
