"""Window aggregation: ``GROUP BY window_start, window_end, ...`` over a window table
function, Flink's window aggregate.

Its input is append-only (the planner refuses anything else, as Flink does) and its output
is too: a window's row is emitted once, as ``+I``, when the stage's watermark (the least
of its upstream sources', ``tidemark.engine.event_time``) passes the window's end, that is
when ``window_end - 1 <= watermark``. A record whose window had already fired before the
batch that carries it is late: it is dropped from that window, as Flink drops it, and a
record dropped from every window it falls in is counted in the
``late_records_dropped`` metric. Until its window fires a group keeps its accumulators in
state; then the state is gone. A host buckets the stage by the group columns other than
the window's (``key_of``); without such columns all windows share one bucket, as they
share one operator instance in Flink.

The stage is a batch kernel only (``tidemark.engine.kernels.window``, or
``kernels.session`` for session windows): windows fire for every open group of a bucket
when the watermark moves, records or not.
"""

from __future__ import annotations

from collections.abc import Sequence

from tidemark.engine.changelog import Change
from tidemark.engine.errors import PlanError
from tidemark.engine.stages.aggregate import AggCall

#: what a window aggregate computes (append-only input: no retraction to support)
WINDOW_FUNCS = ("COUNT", "COUNT_STAR", "SUM", "MIN", "MAX", "AVG")


class WindowAggregate:
    """``group_by`` are input positions, among them the window's ``window_start`` and
    ``window_end`` (``window``: their positions in the input row); ``sources`` the tables
    whose watermarks the stage waits for; ``session``: the windows are session windows,
    merged per key (``tidemark.engine.kernels.session``). Output: the group columns, then
    one column per call."""

    n_inputs = 1

    def __init__(
        self,
        group_by: Sequence[int],
        calls: Sequence[AggCall],
        window: tuple[int, int],
        sources: Sequence[str],
        session: bool = False,
        name: str = "window_aggregate",
    ) -> None:
        for call in calls:
            if call.func not in WINDOW_FUNCS or call.distinct:
                what = f"{call.func}(DISTINCT)" if call.distinct else call.func
                raise PlanError(
                    f"{what} in a window aggregate is not supported yet ({', '.join(WINDOW_FUNCS[:1] + WINDOW_FUNCS[2:])} and COUNT(*) are)"
                )
        if not set(window) <= set(group_by):
            raise PlanError("a window aggregate groups by window_start and window_end")
        self.group_by = tuple(group_by)
        self.calls = list(calls)
        self.window_start_index, self.window_end_index = window
        self.sources = tuple(sorted(sources))
        self.session = session
        self.name = name

    @property
    def watermark_sources(self) -> tuple[str, ...]:
        """What makes it an event-time stage to a host (``tidemark.spark.event_clock``)."""
        return self.sources

    def key_columns(self, input_index: int = 0) -> tuple[int, ...]:
        """The group columns without the window's, as Flink keys a window aggregate: every
        window of a key is in one bucket, so session windows merge there and a record's
        HOP or CUMULATE windows are judged late together (its count is one)."""
        bounds = (self.window_start_index, self.window_end_index)
        return tuple(i for i in self.group_by if i not in bounds)

    def key_of(self, change: Change, input_index: int) -> tuple:
        return tuple(change.row[i] for i in self.key_columns(input_index))

    def batch_kernel(self):  # noqa: ANN201  (the kernel modules import polars and pyarrow)
        if self.session:
            from tidemark.engine.kernels.session import SessionKernel

            return SessionKernel(self)
        from tidemark.engine.kernels.window import WindowAggregateKernel

        return WindowAggregateKernel(self)
