"""Processing-time windows: ``TUMBLE(TABLE v, DESCRIPTOR(p), INTERVAL ...)`` where ``p`` is
a view's ``PROCTIME() AS p`` item, aggregated under ``GROUP BY window_start, window_end``.

A row's window is the tumbling window holding the processing time of the batch that
carries it (``BatchContext.now_ms``), so it is known only when the aggregate runs: the
window stage (``ProctimeWindow``) appends the three window columns empty, and the aggregate
(``ProctimeWindowAggregate``) sets ``window_start`` and ``window_end`` from the batch's
``now_ms`` before aggregating. A window fires (one ``+I`` per group) in the first batch whose
``now_ms`` reaches ``window_end - 1``, Flink's processing-time trigger. Nothing fires at the
end of a bounded input: Flink 2.3 ends such a job without firing the open processing-time
windows (docs/conformance.md), and so does Tidemark.
"""

from __future__ import annotations

from tidemark.engine.changelog import Change
from tidemark.engine.stages.window_aggregate import WindowAggregate
from tidemark.engine.stages.window_tvf import WindowSpec

_UNSET = (None, None, None)


class ProctimeWindow:
    """Stateless: the three window columns appended, unset (the aggregate sets them)."""

    def __init__(self, spec: WindowSpec, name: str = "window") -> None:
        self.spec = spec
        self.name = name

    def process(self, changes: list[Change]) -> list[Change]:
        return [Change(c.kind, c.row + _UNSET, c.pos) for c in changes]


class ProctimeWindowAggregate(WindowAggregate):
    """A ``WindowAggregate`` over ``ProctimeWindow`` rows of tumbling windows of ``size_ms``:
    no watermark, its clock is the host's processing time: a host with timers (Spark) wakes
    a bucket at its kernel's ``next_wakeup``, when its earliest open window is due."""

    uses_timers = True

    def __init__(self, group_by, calls, window, size_ms: int, name: str = "window_aggregate") -> None:  # noqa: ANN001
        super().__init__(group_by, calls, window, (), name=name)
        self.size_ms = size_ms

    def batch_kernel(self):  # noqa: ANN201  (the kernel module imports polars)
        from tidemark.engine.kernels.window import ProctimeWindowKernel

        return ProctimeWindowKernel(self)
