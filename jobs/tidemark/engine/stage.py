"""The contract between stages and the hosts that run them.

A stage is a plain Python object that knows nothing of Spark, Kafka or HTTP. Hosts (the
in-process replay host, the Spark job) feed it one micro-batch at a time. The barrier is
the micro-batch: a stateful stage sees, per key, every change of the batch at once, in no
particular order, and emits only the net change for that key.

- ``StatelessStage.process(changes)``: row-at-a-time transforms (calc). Kinds preserved.
- ``StatelessMultiStage.process_inputs([changes, ...])``: a stateless stage with several
  inputs (``UNION ALL``): one list of changes per input, in the node's input order, the
  batch's whole lists at once. ``run_stateless`` is how hosts call either kind.
- ``KeyedStage``: the host groups each input's changes of one batch by ``key_of`` and
  calls ``process_key`` once per key with that key's state (``None`` when it has none).
  Every host does this through the one loop in ``tidemark.engine.driver``
  (``PerKeyAdapter``), which also states the batch contract stages move to.
  The stage returns the new state (``None`` clears it) and the changes it emits. State is
  any picklable Python value; hosts decide where it lives (a dict, Spark's state store).
  One state read and one state write per key per batch, whatever the number of rows.
- Optional ``KeyedStage.wakeup_ms(state) -> int | None``: a stage whose output depends on
  processing time as well as on records (the merge engine's ``full-compaction`` changelog
  producer emits at interval barriers) says, per key, from when it must be called again
  even if no record for that key arrives. After grouping a batch, a host also calls
  ``process_key(key, [[]] * n_inputs, state, ctx)`` for every key without records whose
  ``wakeup_ms(state)`` is not None and ``<= ctx.now_ms``, in the same batch (its output
  flows downstream with the batch's). A host may keep these times in an index instead of
  scanning states; it must ask again after every state write. Stages without the method
  are only called for keys with records. A stage whose timers depend on its configuration
  sets ``uses_timers = False`` when this instance never wakes: a host running in
  processing-time mode for timers never goes idle (Spark runs an empty batch per trigger),
  so it should only pay for that when timers can fire.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from tidemark.engine.changelog import Change


@dataclass
class BatchContext:
    """What a host tells a stage about the batch being processed.

    ``now_ms`` is processing time (state TTL, ``wakeup_ms`` timers); hosts set it once
    per batch, as they set the event-time watermarks (the replay host: wall clock unless the caller gives one). ``metrics`` is where stages count
    events a user wants to see (``conflicts_dropped``, ``retractions_without_state``...);
    the host sums them across keys and batches and exposes them.
    """

    batch_id: int = 0
    now_ms: int = 0
    metrics: Counter = field(default_factory=Counter)
    #: event time (``tidemark.engine.event_time``): each source table's watermark after this
    #: batch's records, and before them; a table without WATERMARK, or that has read nothing
    #: yet, is absent
    watermarks: dict[str, int] = field(default_factory=dict)
    previous_watermarks: dict[str, int] = field(default_factory=dict)
    #: the last batch of a bounded input (``ReplayHost.finish``): processing-time windows do
    #: not fire in it, as Flink ends such a job without firing them
    end_of_input: bool = False


@runtime_checkable
class StatelessStage(Protocol):
    name: str

    def process(self, changes: list[Change]) -> list[Change]: ...


@runtime_checkable
class StatelessMultiStage(Protocol):
    name: str
    n_inputs: int

    def process_inputs(self, inputs: Sequence[list[Change]]) -> list[Change]: ...


def run_stateless(stage: Any, inputs: Sequence[list[Change]]) -> list[Change]:
    """One batch through a stateless stage: ``inputs`` holds one list per node input."""
    if hasattr(stage, "process_inputs"):
        return stage.process_inputs(inputs)
    return stage.process(inputs[0])


@runtime_checkable
class KeyedStage(Protocol):
    name: str
    #: number of inputs (1, or 2 for joins); ``process_key`` gets one list per input
    n_inputs: int

    #: optional, ``key_columns(input_index) -> tuple[int, ...] | None``: the row columns
    #: ``key_of`` picks, so a host buckets a whole batch by them (``tidemark.engine.bucketing``)

    def key_of(self, change: Change, input_index: int) -> tuple: ...

    def process_key(
        self, key: tuple, inputs: Sequence[list[Change]], state: Any, ctx: BatchContext
    ) -> tuple[Any, list[Change]]: ...


def uses_timers(stage: Any) -> bool:
    """Whether a host must run ``stage`` with timers (see the module docstring)."""
    return bool(getattr(stage, "uses_timers", hasattr(stage, "wakeup_ms")))


def wakeup_of(stage: Any, state: Any) -> int | None:
    """``stage.wakeup_ms(state)`` for stages that have timers, else None (see the module
    docstring): the one place hosts ask, so a stage without the method costs nothing."""
    fn = getattr(stage, "wakeup_ms", None)
    return None if fn is None or state is None else fn(state)
