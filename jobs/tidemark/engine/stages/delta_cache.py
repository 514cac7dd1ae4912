"""The per-side LRU cache of a delta join: join key -> that side's rows for the key.

An entry holds the side's rows for one join key as they were at the end of the last batch
this stage instance processed (``row -> [count, position of its latest add]``); a change
arriving on the side updates the entry only if it is cached, so a present entry is
always current and a lookup is needed only on a miss. The LRU bookkeeping is cachetools'.
"""

from __future__ import annotations

from cachetools import LRUCache

SideRows = dict  # row -> [count, pos]


class SideCache:
    def __init__(self, size: int, enabled: bool = True):
        self.enabled = enabled and size > 0
        self.size = size
        self._lru: LRUCache | None = LRUCache(maxsize=size) if self.enabled else None
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple) -> SideRows | None:
        """The cached rows (counted as a hit), or None (a miss)."""
        if self._lru is not None:
            rows = self._lru.get(key)
            if rows is not None:
                self.hits += 1
                return rows
        self.misses += 1
        return None

    def peek(self, key: tuple) -> SideRows | None:
        """The cached rows without counting a hit or a miss: for updating an entry with a
        change that needed no lookup (it still counts as a recent use)."""
        return self._lru.get(key) if self._lru is not None else None

    def __contains__(self, key: tuple) -> bool:
        return self._lru is not None and key in self._lru

    def put(self, key: tuple, rows: SideRows) -> None:
        if self._lru is not None:
            self._lru[key] = rows

    def clear(self) -> None:
        if self._lru is not None:
            self._lru.clear()

    def __len__(self) -> int:
        return len(self._lru) if self._lru is not None else 0
