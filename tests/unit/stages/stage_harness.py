"""A tiny operator harness in the spirit of Flink's ``KeyedOneInputStreamOperatorTestHarness``:
feed one batch of changes, get back what the stage emitted, look at the state per key.

It hosts a ``KeyedStage`` exactly as the contract in ``tidemark.engine.stage`` says: group each
input's changes by ``key_of``, one ``process_key`` call per key, state ``None`` means cleared.
``shuffle`` reorders records inside the batch (and keys) so tests can show order never matters.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

from tidemark.engine.changelog import Change, zset
from tidemark.engine.stage import BatchContext


class Harness:
    def __init__(self, stage, now_ms: int = 0):
        self.stage = stage
        self.state: dict = {}
        self.metrics: Counter = Counter()
        self.now_ms = now_ms
        self.batch_id = 0
        self.emitted: list[Change] = []

    def run(self, *inputs: Sequence[Change], shuffle: random.Random | None = None) -> list[Change]:
        """One batch. ``inputs`` is one list of changes per stage input."""
        assert len(inputs) == self.stage.n_inputs, "one list of changes per input"
        groups: dict[tuple, list[list[Change]]] = {}
        for i, changes in enumerate(inputs):
            for c in changes:
                key = self.stage.key_of(c, i)
                groups.setdefault(key, [[] for _ in inputs])[i].append(c)
        keys = list(groups)
        if shuffle is not None:
            shuffle.shuffle(keys)
            for per_input in groups.values():
                for lst in per_input:
                    shuffle.shuffle(lst)
        ctx = BatchContext(batch_id=self.batch_id, now_ms=self.now_ms, metrics=self.metrics)
        out: list[Change] = []
        for key in keys:
            new_state, emitted = self.stage.process_key(key, groups[key], self.state.get(key), ctx)
            if new_state is None:
                self.state.pop(key, None)
            else:
                self.state[key] = new_state
            out.extend(emitted)
        self.batch_id += 1
        self.emitted.extend(out)
        return out

    def table(self) -> Counter:
        """Everything emitted so far, consolidated: the Z-set a downstream table would hold."""
        return zset(self.emitted)


def kinds(changes: Sequence[Change]) -> list[tuple[str, tuple]]:
    """(kind, row) pairs in a canonical order, for asserting emitted changes."""
    return sorted(((c.kind, c.row) for c in changes), key=repr)


def c(kind: str, *row, pos: int | tuple = ()) -> Change:
    """Shorthand: ``c("+I", 1, 10, "a1", pos=1)``."""
    return Change(kind, tuple(row), pos if isinstance(pos, tuple) else (pos,))
