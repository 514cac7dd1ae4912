"""A ``Bucket`` read from its stored table only as far as someone reads it.

A host that stores state (the Spark host) decodes a bucket's table once per batch. A batch
kernel that works on the table itself never needs the per-key dict, whose rows cost a
Python tuple each to build, for every key of the bucket, touched or not; a kernel that
needs Python state for the keys its batch touches reads only those rows (``read_rows``)
and writes the others back as they were stored. Anything that reads ``states`` without
asking for rows first gets the whole dict, built on first use. For a stage with timers,
``due`` (the per-key path's index of wakeups) is built from ``states`` on first use too, so a
kernel that computes wakeups from the table never builds either.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tidemark.engine.driver import Bucket


class TableBucket(Bucket):
    """A bucket whose ``states`` are ``read(table)`` of the rows read so far: all of them on
    first access, unless ``read_rows`` read some first."""

    def __init__(self, table: pa.Table, read: Callable[[pa.Table], dict[Hashable, Any]], timers: Any = None) -> None:
        """``timers``: the stage whose ``wakeup_ms`` the bucket's ``due`` holds (None: the
        stage has no timers)."""
        self._unread: pa.Table | None = table
        self._read = read
        self._states: dict[Hashable, Any] | None = None
        self._timers = timers
        self._due: dict[Hashable, int] | None = None if timers is not None else {}

    @property
    def due(self) -> dict[Hashable, int]:
        if self._due is None:
            self._due = Bucket.load(self._timers, self.states).due
        return self._due

    @due.setter
    def due(self, value: dict[Hashable, int]) -> None:
        self._due = value

    @property
    def states(self) -> dict[Hashable, Any]:
        if self._states is None:
            self._states = self._read(self._unread)
            self._unread = None
        return self._states

    @states.setter
    def states(self, value: dict[Hashable, Any]) -> None:
        self._states, self._unread = value, None

    @property
    def table(self) -> pa.Table | None:
        """The stored table while nothing has read ``states`` (None after)."""
        return self._unread if self._states is None else None

    @property
    def unread(self) -> pa.Table | None:
        """The stored rows not read into ``states``: all of them until something reads,
        the others after ``read_rows``, None once ``states`` holds every row."""
        return self._unread

    def read_rows(self, mask: pa.Array) -> None:
        """Read the stored rows ``mask`` selects into ``states`` and keep the others unread;
        only before anything has read the bucket (afterwards ``states`` is what it holds)."""
        if self._states is not None:
            raise RuntimeError("read_rows on a bucket already read")
        self._states = self._read(self._unread.filter(mask))
        self._unread = self._unread.filter(pc.invert(mask))
