"""The ``transformWithStateInPandas`` processor of a keyed stage, in a module that imports no
more than pyspark's processor API.

Spark runs a processor's ``init`` on the driver as well, at each query start, in a Python
worker of its own that only learns the processor's state variables
(``pyspark.sql.streaming.transform_with_state_driver_worker``). That worker unpickles the
processor, and imports whatever the processor references. A processor holding the stage's
runner made it import pandas, pyarrow, polars and the engine, over 100 MB that lived beside
a starting query's other processes, when a job's memory peaks. So the runner travels as
bytes, unpickled at the first call that processes rows, in the task's worker (which has the
engine imported already: ``tidemark.spark.worker_daemon``); the keyed host's helpers are
imported there too.

One value state per bucket, read once and written at most once per batch (each is a JVM
round trip). With ``timers`` (stages that have ``wakeup_ms``) a bucket keeps one
processing-time timer at its keys' earliest wakeup time, moved only when that time changes.
An event-time stage's bucket keeps its watermarks in a second value state
(``event_clock.BucketClock``). The members of a fused stage (``tidemark.engine.fusion``)
share the one value state, a field each (``state_schema``): each value state costs a
``getValueState`` in every task, and a get and an update in every bucket call, all JVM
round trips, whatever the size of what they carry.

Pandas rather than pyspark's row-based ``transformWithState``: that one converts every
input cell with its own Arrow scalar and every output row through ``Row.asDict``; pandas
converts whole columns.
"""

from __future__ import annotations

import itertools
import pickle
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.streaming import StatefulProcessor
from pyspark.sql.types import BinaryType, StructField, StructType

from tidemark.spark.event_clock import BucketClock, split_ticks, watermark_sources

if TYPE_CHECKING:
    import pandas as pd

#: each value state of a bucket: the stage's stored state (``tidemark.engine.state_codec``).
#: A type, not its DDL text ("state binary"): pyspark sends DDL text to the JVM to be parsed,
#: twice per ``getValueState``, each a blocking round trip in every task of every batch.
STATE_SCHEMA = StructType([StructField("state", BinaryType())])
#: the name of a bucket's value state
STATE_NAME = "stage"


def state_schema(members: int) -> StructType:
    """The value state of an operator of ``members`` stages: a stored state per member, the
    first under the field a single stage's state has always had; a member with no state
    stored holds null."""
    return StructType([*STATE_SCHEMA.fields, *(StructField(f"state{k}", BinaryType()) for k in range(1, members))])


def _none_stored(stored: Sequence[bytes | None]) -> bool:
    return all(value is None for value in stored)


class StageProcessor(StatefulProcessor):
    """The processor over the state buckets of one keyed (or fused) stage."""

    def __init__(self, runner: bytes, members: int, n_inputs: int, timers: bool, clocked: bool) -> None:
        """``runner``: the pickled ``tidemark.spark.keyed._BucketRunner``; ``members``: its
        stages (a field each of the value state); ``clocked``: an event-time stage."""
        self._pickled_runner = runner
        self._runner: Any = None
        self.members = members
        self.n_inputs = n_inputs
        self.timers = timers
        self.clocked = clocked

    @property
    def runner(self) -> Any:
        if self._runner is None:
            self._runner = pickle.loads(self._pickled_runner)
        return self._runner

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.state = handle.getValueState(STATE_NAME, state_schema(self.members))
        self.clock = BucketClock(handle) if self.clocked else None

    def _stored(self) -> list[bytes | None]:
        got = self.state.get()
        if got is None:
            return [None] * self.members
        return [bytes(value) if value is not None else None for value in got]

    def _apply(self, key: tuple, old: list[bytes | None], res: Any, fired: int | None = None) -> Iterator[pd.DataFrame]:
        from tidemark.spark.keyed import frame

        runner = self.runner
        runner.report_stored(key, res.stored)
        if _none_stored(res.stored):
            if not _none_stored(old):
                self.state.clear()
        elif list(res.stored) != old:
            self.state.update(tuple(res.stored))
        if self.timers and res.old_wakeup != res.new_wakeup:
            # a fired timer is deleted by Spark after handleExpiredTimer
            if res.old_wakeup is not None and res.old_wakeup != fired:
                self.handle.deleteTimer(res.old_wakeup)
            if res.new_wakeup is not None:
                self.handle.registerTimer(res.new_wakeup)
        if res.rows:
            yield frame(res.rows, runner.columns)

    def handleInputRows(self, key: tuple, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        from tidemark.spark.keyed import blobs_by_input, pandas_pairs

        old = self._stored()
        first = next(rows)  # a group always has at least one frame
        now = int(first["now_ms"].iloc[0])
        pairs = pandas_pairs(itertools.chain([first], rows))
        marks = None
        if self.clock is not None:
            pairs, ticks = split_ticks(pairs)
            marks = self.clock.tick(ticks)
            if _none_stored(old) and not pairs:  # only a tick, and no window open: nothing to fire
                return
        blobs = blobs_by_input(pairs, self.n_inputs)
        yield from self._apply(key, old, self.runner.run(blobs, old, now, marks))

    def handleExpiredTimer(self, key: tuple, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        old = self._stored()
        if _none_stored(old):
            return
        res = self.runner.run([[] for _ in range(self.n_inputs)], old, timerValues.getCurrentProcessingTimeInMs())
        yield from self._apply(key, old, res, fired=expiredTimerInfo.getExpiryTimeInMs())

    def close(self) -> None:
        pass


def stage_processor(runner: Any, timers: bool) -> StageProcessor:
    """The processor of ``runner`` (a ``tidemark.spark.keyed._BucketRunner``), the runner
    pickled by pyspark's cloudpickle as Spark would pickle it inside the processor."""
    from pyspark import cloudpickle

    return StageProcessor(
        cloudpickle.dumps(runner, pickle.HIGHEST_PROTOCOL), len(runner.members), runner.stage.n_inputs, timers,
        bool(watermark_sources(runner.stage)),
    )
