"""A ``Bucket`` read from its stored table only when someone reads its ``states``.

A host that stores state (the Spark host) decodes a bucket's table once per batch. A batch
kernel that works on the table itself never needs the per-key dict, whose rows cost a
Python tuple each to build, for every key of the bucket, touched or not. The per-key path
(and anything else that reads ``states``) still gets the dict, built on first use.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import pyarrow as pa

from tidemark.engine.driver import Bucket


class TableBucket(Bucket):
    """A bucket whose ``states`` are ``read(table)``, computed on first access; until then
    ``table`` is the stored table as it is."""

    def __init__(self, table: pa.Table, read: Callable[[pa.Table], dict[Hashable, Any]]) -> None:
        self.due = {}
        self._table: pa.Table | None = table
        self._read = read
        self._states: dict[Hashable, Any] | None = None

    @property
    def states(self) -> dict[Hashable, Any]:
        if self._states is None:
            self._states = self._read(self._table)
            self._table = None
        return self._states

    @states.setter
    def states(self, value: dict[Hashable, Any]) -> None:
        self._states, self._table = value, None

    @property
    def table(self) -> pa.Table | None:
        """The stored table while nothing has read ``states`` (None after)."""
        return self._table
