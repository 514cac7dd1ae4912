"""``first-row``: the first row of a key stays forever, so the output is insert-only.

"First" means the earliest source position among the records of the batch that first saw
the key; a row kept in state is never replaced, even by a record with a smaller position
arriving later, because replacing it would emit an update and break the insert-only
promise. Retractions are refused at planning unless ``ignore-delete`` drops them.
"""

from __future__ import annotations

from collections.abc import Sequence

from tidemark.engine.changelog import ADDS
from tidemark.engine.stages.merge.aggregators import MergeError
from tidemark.engine.stages.merge.ordering import Item


class FirstRowMerge:
    def merge(self, items: Sequence[Item]) -> tuple[tuple | None, None]:
        if any(item.kind not in ADDS for item in items):
            raise MergeError(
                "merge-engine 'first-row' cannot take retractions (-U/-D); "
                "set 'ignore-delete' = 'true' to drop them"
            )
        for item in items:
            if item.is_state:
                return item.row, None
        for item in items:
            if item.kind in ADDS:
                return item.row, None
        return None, None
