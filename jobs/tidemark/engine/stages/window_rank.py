"""Window Top-N: ``ROW_NUMBER() OVER (PARTITION BY window_start, window_end, ... ORDER BY ...)``
bounded by ``rn <= N`` (or another constant range) over a window table function or a window
aggregate, Flink's ``WindowRank`` (with ``rn = 1`` ordered by the event time, its
``WindowDeduplicate``).

Its input is insert-only (the planner refuses anything else, as Flink does) and so is its
output: a window's rows are ranked once, when the stage's watermark passes the window's end
(``window_end - 1 <= watermark``, as for the window aggregate), and the rows in the range are
emitted as ``+I``, each at its own source position. Until then the stage keeps, per
partition, only the rows that can still be in the range (the first ``end`` in rank order:
an insert-only input never takes a row back); once the window fires its rows are gone. A
row whose window had fired before the batch that carries it is late: dropped and counted in
``late_records_dropped``.

Rank order is the ORDER BY (NULLs as Flink sorts them, ``tidemark.engine.stages.rank``),
then arrival, the source position: earlier first, or latest first with ``ties="last"``
(deduplication keeping the last row by event time, where an equal event time replaces).
The row number is output only when the enclosing query reads it, else NULL, as for the
regular rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tidemark.engine.changelog import Change
from tidemark.engine.stages.rank import SortKey
from tidemark.engine.types import SqlType


class WindowRank:
    """The stage object the planner builds from a closed ``Rank`` whose partition holds the
    window's bounds; ``window_end_index`` is the input position of ``window_end``,
    ``sources`` the tables whose watermarks the stage waits for. Its kernel
    (``tidemark.engine.kernels.window_rank``) does the work."""

    n_inputs = 1

    def __init__(
        self,
        partition: Sequence[int],
        order: Sequence[SortKey],
        start: int,
        end: int,
        types: Sequence[SqlType | None],
        window_end_index: int,
        sources: Sequence[str],
        window_start_index: int | None = None,
        output_rank: bool = True,
        ties: str = "first",
        name: str = "window_rank",
    ) -> None:
        self.partition = tuple(partition)
        self.order = tuple(order)
        self.start, self.end = start, end
        self.types = list(types)
        self.window_end_index = window_end_index
        # the state bucket's key: the partition without the window's bounds, so every window
        # of a key is in one bucket and a record late for all its HOP windows counts once
        bounds = {window_end_index, window_start_index}
        self.bucket_key = tuple(i for i in self.partition if i not in bounds)
        self.sources = tuple(sorted(sources))
        self.output_rank = output_rank
        self.ties = ties
        self.name = name

    @property
    def watermark_sources(self) -> tuple[str, ...]:
        """What makes it an event-time stage to a host (``tidemark.spark.event_clock``)."""
        return self.sources

    @property
    def width(self) -> int:
        return len(self.types)

    def key_columns(self, input_index: int = 0) -> tuple[int, ...]:
        """The row columns the state bucket's key is (``tidemark.engine.bucketing``)."""
        return self.bucket_key

    def key_of(self, change: Change, input_index: int) -> tuple:
        return tuple(change.row[i] for i in self.bucket_key)

    def batch_kernel(self) -> Any:
        from tidemark.engine.kernels.window_rank import WindowRankKernel

        return WindowRankKernel(self)
