"""The one driver loop for keyed stages: every host and test harness runs them through here.

The batch contract (DESIGN.md, "The data path"): a keyed stage processes one bucket of keys
per call, ``process_batch(inputs, state, ctx) -> (state, output)``, with one ``ChangeBatch``
per stage input, the bucket's ``Bucket`` of state, and a ``ChangeBatch`` out. A batch
kernel (a stage without ``process_key``) is called as it is; a stage with ``process_key``
runs behind ``PerKeyAdapter``, which is the keyed loop of
``tidemark.engine.stage``'s contract written once: group each input by key, one
``process_key`` per key with that key's state, ``None`` clears it, and the keys whose
``wakeup_ms`` is due called with no records in the same batch.

Hosts differ only in where a bucket lives and how many there are: the replay host keeps one
bucket per stage in memory for the run; the Spark host decodes one per state bucket per
batch (``tidemark.spark.keyed``, through ``tidemark.engine.state_codec``). A host that
already knows each change's group (Spark's encoded key) passes it as
``ChangeBatch.groups``; for a stage on the pickled state format the adapter then keys state
by it and takes the key tuple from the stored entry or ``key_of``. A stage with typed state
(``has_typed_state``) stores its key columns itself, so its bucket is always keyed by the
key tuple, whichever host runs it and whether the batch kernel or the adapter does.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change
from tidemark.engine.stage import BatchContext, KeyedStage, uses_timers, wakeup_of


@dataclass
class Bucket:
    """One bucket of a keyed stage's state.

    ``states`` maps a group (the key, or the host's group id) to the stage's state for it;
    for a stage with timers keyed by a host group id the entry is ``(key, state)``, because
    a key woken without records has no change to take its key from (``entry_pairs``). ``due``
    maps a group to its ``wakeup_ms`` (stages with timers only): an index, so a batch does
    not scan every state to find the due keys, kept up to date after every state write."""

    states: dict[Hashable, Any] = field(default_factory=dict)
    due: dict[Hashable, int] = field(default_factory=dict)

    @classmethod
    def load(cls, stage: KeyedStage, states: dict[Hashable, Any]) -> Bucket:
        """A bucket read back from storage (only ``states`` is stored): rebuild the index."""
        due: dict[Hashable, int] = {}
        if uses_timers(stage):
            pairs = entry_pairs(stage)
            for group, entry in states.items():
                t = wakeup_of(stage, entry[1] if pairs else entry)
                if t is not None:
                    due[group] = t
        return cls(states, due)

    def next_wakeup(self) -> int | None:
        """The earliest wakeup of the bucket's keys (a host's one timer per bucket)."""
        return min(self.due.values()) if self.due else None


TYPED_STATE = ("state_kind", "state_version", "empty_state", "state_to_table", "state_from_table")


def has_typed_state(stage: Any) -> bool:
    """Whether ``stage`` itself implements the typed state protocol
    (``tidemark.engine.state_codec``)."""
    return all(hasattr(stage, attr) for attr in TYPED_STATE)


def entry_pairs(stage: Any) -> bool:
    """Whether a bucket entry of ``stage`` is ``(key, state)`` (``Bucket``): a stage with
    timers whose state may be keyed by a host's group id rather than by its key."""
    return uses_timers(stage) and not has_typed_state(stage)


class BatchStage(Protocol):
    name: str
    n_inputs: int

    def process_batch(
        self, inputs: Sequence[ChangeBatch], state: Bucket, ctx: BatchContext
    ) -> tuple[Bucket, ChangeBatch]: ...


class PerKeyAdapter:
    """``process_batch`` for a stage that has only ``process_key`` (module docstring).
    Hosts that report a failing key differently override ``call_key``."""

    def __init__(self, stage: KeyedStage) -> None:
        self.stage = stage
        self.name = stage.name
        self.n_inputs = stage.n_inputs
        self.timers = uses_timers(stage)
        self.pairs = entry_pairs(stage)
        self.by_key = has_typed_state(stage)  # groups are always the stage's keys

    def call_key(self, key: tuple, inputs: list[list[Change]], state: Any, ctx: BatchContext) -> tuple[Any, list[Change]]:
        return self.stage.process_key(key, inputs, state, ctx)

    def process_batch(
        self, inputs: Sequence[ChangeBatch], state: Bucket, ctx: BatchContext
    ) -> tuple[Bucket, ChangeBatch]:
        stage, timers, pairs, n = self.stage, self.timers, self.pairs, self.n_inputs
        by_key = self.by_key or all(b.groups is None for b in inputs)  # groups are the stage's keys
        groups: dict[Hashable, list[list[Change]]] = {}
        for idx, batch in enumerate(inputs):
            changes = batch.changes()
            ids = batch.groups if batch.groups is not None and not self.by_key else [stage.key_of(c, idx) for c in changes]
            for group, c in zip(ids, changes):
                lists = groups.get(group)
                if lists is None:
                    lists = groups[group] = [[] for _ in range(n)]
                lists[idx].append(c)
        states, due = state.states, state.due
        if timers:
            for group, t in list(due.items()):
                if t <= ctx.now_ms and group not in groups:
                    groups[group] = [[] for _ in range(n)]
        emitted: list[Change] = []
        # the hook costs a Python call per key: go straight to the stage when not overridden
        call = self.stage.process_key if type(self).call_key is PerKeyAdapter.call_key else self.call_key
        for group, lists in groups.items():
            if pairs:
                entry = states.get(group)
                key, current = entry if entry is not None else (None, None)
            else:
                key, current = None, states.get(group)
            if key is None:
                key = group if by_key else _key_of_first(stage, lists)
            new_state, out = call(key, lists, current, ctx)
            if new_state is None:
                states.pop(group, None)
            else:
                states[group] = (key, new_state) if pairs else new_state
            if timers:
                t = wakeup_of(stage, new_state)
                if t is None:
                    due.pop(group, None)
                else:
                    due[group] = t
            emitted.extend(out)
        return state, ChangeBatch(changes=emitted)


def _key_of_first(stage: KeyedStage, lists: list[list[Change]]) -> tuple:
    first = next(i for i, lst in enumerate(lists) if lst)
    return stage.key_of(lists[first][0], first)


def batch_stage(stage: Any) -> BatchStage:
    """``stage`` under the batch contract: a stage with ``process_key`` runs per key behind
    ``PerKeyAdapter`` (the delta join's own ``process_batch(inputs, ctx)`` is its lookup
    prefetch for Spark, not this contract); a batch kernel is called as it is. A stage that
    offers ``batch_kernel()`` chooses its own (it may still answer with the adapter)."""
    if hasattr(stage, "batch_kernel"):
        return stage.batch_kernel()
    return PerKeyAdapter(stage) if hasattr(stage, "process_key") else stage
