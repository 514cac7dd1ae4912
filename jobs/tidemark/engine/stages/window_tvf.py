"""The window table functions TUMBLE, HOP and CUMULATE: each row gets the event-time windows
it falls in, as ``window_start``, ``window_end`` and ``window_time`` (``window_end`` less
1 ms, Flink's rowtime of the window), one output row per window.

The assignment is Flink's (``TimeWindow.getWindowStartWithOffset``): a tumbling window of
``size`` starts at ``t - (t mod size)``; a hopping window of ``size`` every ``slide`` is
every such start, ``slide`` apart, whose window still holds ``t``; a cumulating window of
``step`` up to ``size`` starts where the tumbling window of ``size`` does and ends at every
``step`` after ``t``; a session window of gap ``size`` is ``[t, t + size)``, merged with the
other sessions of its key by the window aggregate. A row whose time is NULL has no window and is dropped (Flink fails
the job on it).
"""

from __future__ import annotations

from dataclasses import dataclass

from tidemark.engine.changelog import Change
from tidemark.engine.event_time import epoch_ms, from_epoch_ms

KINDS = ("TUMBLE", "HOP", "CUMULATE")


@dataclass(frozen=True)
class WindowSpec:
    """A window's shape: ``size`` (TUMBLE's, HOP's and CUMULATE's whole window, SESSION's
    gap) and ``step`` (HOP's slide, CUMULATE's step; ``size`` otherwise), in ms."""

    kind: str
    size_ms: int
    step_ms: int

    def windows(self, t: int) -> list[tuple[int, int]]:
        """The ``(start, end)`` of every window holding event time ``t`` (ms), earliest first."""
        if self.kind == "SESSION":  # the record's own window; the aggregate merges them per key
            return [(t, t + self.size_ms)]
        if self.kind == "CUMULATE":
            start = t - t % self.size_ms
            first_end = t - t % self.step_ms + self.step_ms
            return [(start, end) for end in range(first_end, start + self.size_ms + 1, self.step_ms)]
        last_start = t - t % self.step_ms
        starts = range(last_start, t - self.size_ms, -self.step_ms)
        return [(s, s + self.size_ms) for s in reversed(starts)]


class WindowAssign:
    """Stateless: each change becomes one change per window its row falls in (kinds and
    positions kept), the three window columns appended to the row."""

    def __init__(self, spec: WindowSpec, time_index: int, name: str = "window") -> None:
        self.spec = spec
        self.time_index = time_index
        self.name = name

    def process(self, changes: list[Change]) -> list[Change]:
        out: list[Change] = []
        for c in changes:
            t = c.row[self.time_index]
            if t is None:
                continue
            for start, end in self.spec.windows(epoch_ms(t)):
                bounds = (from_epoch_ms(start), from_epoch_ms(end), from_epoch_ms(end - 1))
                out.append(Change(c.kind, c.row + bounds, c.pos))
        return out
