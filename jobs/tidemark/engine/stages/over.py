"""OVER aggregation: ``agg(x) OVER (PARTITION BY k ORDER BY ts <frame>)``, Flink's
``OverAggregate`` on event time.

Each input row comes out once, as ``+I``, with one value per aggregate call appended: the
aggregate over the rows of its partition in its frame. Frames, all ending at the current
row:

- ``ROWS BETWEEN n PRECEDING AND CURRENT ROW``: the row and the ``n`` rows before it;
- ``RANGE BETWEEN INTERVAL 'd' unit PRECEDING AND CURRENT ROW``: every row whose time is
  within ``d`` before the row's, the row's own time included (rows of equal time share
  one result);
- ``UNBOUNDED PRECEDING`` with ROWS or RANGE: every row up to the current one (RANGE:
  up to the last row of the current time). An OVER without a frame is ``RANGE UNBOUNDED
  PRECEDING``, the SQL default.

Why it waits for the watermark: a row's frame holds the rows before it in event time, which
may still be on their way. So a row is held in state until the stage's watermark (the least
of its upstream sources', ``tidemark.engine.event_time``) reaches its time, then emitted in
time order, as Flink's event-time OVER operators do; rows of equal time and partition are
ordered by arrival (the source position). A row whose time is not after the watermark the
stage had before the batch that carries it is late: it is dropped and counted in
``late_records_dropped`` (a NULL time counts as late). The input is append-only (the planner
refuses anything else, as Flink does), so nothing is ever retracted.

State per partition: the rows still waiting for the watermark; for a bounded frame the
emitted rows the next frames still reach (the last ``n`` rows, or the rows within ``d`` of
the watermark); for an unbounded frame one accumulator per call.

The stage is a batch kernel only (``tidemark.engine.kernels.over``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tidemark.engine.changelog import Change
from tidemark.engine.errors import PlanError
from tidemark.engine.stages.aggregate import AggCall
from tidemark.engine.types import SqlType

#: the aggregate functions an OVER aggregation computes (append-only input: no retraction)
OVER_FUNCS = ("COUNT", "COUNT_STAR", "SUM", "AVG", "MIN", "MAX")


@dataclass(frozen=True)
class Frame:
    """``kind`` ROWS or RANGE; ``preceding`` the rows (ROWS) or milliseconds (RANGE) before
    the current row, None for UNBOUNDED PRECEDING."""

    kind: str
    preceding: int | None

    def __post_init__(self) -> None:
        if self.kind not in ("ROWS", "RANGE"):
            raise PlanError(f"an OVER frame is ROWS or RANGE, not {self.kind!r}")
        if self.preceding is not None and self.preceding < 0:
            raise PlanError(f"an OVER frame's PRECEDING bound must not be negative ({self.preceding})")

    def describe(self) -> str:
        if self.preceding is None:
            start = "UNBOUNDED"
        elif self.kind == "ROWS":
            start = str(self.preceding)
        else:
            start = f"{self.preceding} ms"
        return f"{self.kind} BETWEEN {start} PRECEDING AND CURRENT ROW"


class OverAggregate:
    """``partition`` and ``time_column`` are input positions (the time column a TIMESTAMP
    event-time attribute); ``sources`` the tables whose watermarks the stage waits for;
    ``types`` the input's column types, ``result_types`` the calls'. Output: the input row,
    then one column per call."""

    n_inputs = 1

    def __init__(
        self,
        partition: Sequence[int],
        time_column: int,
        frame: Frame,
        calls: Sequence[AggCall],
        sources: Sequence[str],
        types: Sequence[SqlType | None],
        result_types: Sequence[SqlType | None],
        name: str = "over_aggregate",
    ) -> None:
        for call in calls:
            if call.func not in OVER_FUNCS or call.distinct:
                what = f"{call.func}(DISTINCT)" if call.distinct else call.func
                raise PlanError(f"{what} in an OVER aggregation is not supported (COUNT, SUM, AVG, MIN and MAX are)")
        if not calls:
            raise PlanError("an OVER aggregation computes at least one aggregate call")
        self.partition = tuple(partition)
        self.time_column = time_column
        self.frame = frame
        self.calls = list(calls)
        self.sources = tuple(sorted(sources))
        self.types = list(types)
        self.result_types = list(result_types)
        self.name = name
        self._kernel: Any = None

    @property
    def width(self) -> int:
        return len(self.types)

    @property
    def watermark_sources(self) -> tuple[str, ...]:
        """What makes it an event-time stage to a host (``tidemark.spark.event_clock``)."""
        return self.sources

    def key_columns(self, input_index: int = 0) -> tuple[int, ...]:
        """The row columns the state bucket's key is (``tidemark.engine.bucketing``)."""
        return self.partition

    def key_of(self, change: Change, input_index: int) -> tuple:
        return tuple(change.row[i] for i in self.partition)

    def batch_kernel(self) -> Any:
        from tidemark.engine.kernels.over import OverKernel

        if self._kernel is None:
            self._kernel = OverKernel(self)
        return self._kernel

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_kernel": None}
