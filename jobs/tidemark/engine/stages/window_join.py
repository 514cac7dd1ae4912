"""Window join: ``... FROM L JOIN R ON L.window_start = R.window_start AND L.window_end =
R.window_end AND ...`` where both sides are windowed (a window table function or a window
aggregate, with the same window), Flink's ``WindowJoin``: inner, left, right and full outer.

Both inputs are insert-only (the planner refuses anything else, as Flink does) and so is the
output: a window's rows of both sides are kept until the stage's watermark (the least of
both sides' sources') passes the window's end (``window_end - 1 <= watermark``); then they
are joined on the equi keys (the window bounds among them; NULL keys never match) and the
residual condition, outer sides padded with NULLs where no partner passed, the result
emitted as ``+I`` and the window's rows forgotten. A joined row carries the greater of its
two rows' source positions, a padded row its own. A row whose window had fired before the
batch that carries it is late: dropped and counted in ``late_records_dropped``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tidemark.engine.changelog import Change
from tidemark.engine.types import SqlType


class WindowJoin:
    """The stage object the planner builds in place of a regular join between two windowed
    inputs; ``window_end`` holds each side's position of ``window_end`` (in that side's
    row), ``sources`` the tables whose watermarks the stage waits for. Its kernel
    (``tidemark.engine.kernels.window_join``) does the work."""

    n_inputs = 2

    def __init__(
        self,
        join_type: str,
        left_key: tuple[int, ...],
        right_key: tuple[int, ...],
        types: tuple[Sequence[SqlType | None], Sequence[SqlType | None]],
        window_end: tuple[int, int],
        sources: Sequence[str],
        window_start: tuple[int, int] | None = None,
        residual: Callable[[tuple], bool] | None = None,
        name: str = "window_join",
    ) -> None:
        self.join_type = join_type
        self.left_key, self.right_key = left_key, right_key
        self.types = (list(types[0]), list(types[1]))
        self.window_end = window_end
        # the state bucket's key per side: the join key without the window's bounds, so every
        # window of a key is in one bucket and a record late for all its HOP windows counts once
        starts = window_start or (None, None)
        self.bucket_keys = tuple(
            tuple(k for k in key if k not in (window_end[side], starts[side]))
            for side, key in enumerate((left_key, right_key))
        )
        self.sources = tuple(sorted(sources))
        self.residual = residual
        self.name = name

    @property
    def watermark_sources(self) -> tuple[str, ...]:
        """What makes it an event-time stage to a host (``tidemark.spark.event_clock``)."""
        return self.sources

    @property
    def widths(self) -> tuple[int, int]:
        return len(self.types[0]), len(self.types[1])

    def key_columns(self, input_index: int = 0) -> tuple[int, ...]:
        """The row columns of side ``input_index`` the state bucket's key is."""
        return self.bucket_keys[input_index]

    def key_of(self, change: Change, input_index: int) -> tuple:
        return tuple(change.row[i] for i in self.bucket_keys[input_index])

    def batch_kernel(self) -> Any:
        from tidemark.engine.kernels.window_join import WindowJoinKernel

        return WindowJoinKernel(self)
