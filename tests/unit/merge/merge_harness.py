"""Operator harness for the merge engine stage, in the spirit of Flink's keyed operator test
harness: feed a batch, get the emitted changes, look at the merged table.

It hosts the stage as the ``KeyedStage`` contract says (group by ``key_of``, one
``process_key`` per key, ``None`` clears state), round-trips every state through pickle as
Spark's state store would, and honours ``wakeup_ms`` (full-compaction barriers) by calling
``process_key`` with no records for keys that asked for it.
"""

from __future__ import annotations

import pickle
import random
from collections import Counter
from collections.abc import Sequence

from tidemark.engine.changelog import Change
from tidemark.engine.stage import BatchContext
from tidemark.engine.stages.merge_engine import build_merge_engine


class MergeHarness:
    def __init__(self, stage):
        self.stage = stage
        self.state: dict = {}
        self.metrics: Counter = Counter()
        self.batch_id = 0
        self.emitted: list[Change] = []

    def run(self, changes: Sequence[Change], now_ms: int = 0,
            shuffle: random.Random | None = None) -> list[Change]:
        groups: dict[tuple, list[Change]] = {}
        for ch in changes:
            groups.setdefault(self.stage.key_of(ch, 0), []).append(ch)
        keys = list(groups)
        for key, st in self.state.items():
            due = self.stage.wakeup_ms(st) if hasattr(self.stage, "wakeup_ms") else None
            if key not in groups and due is not None and due <= now_ms:
                keys.append(key)
                groups[key] = []
        if shuffle is not None:
            shuffle.shuffle(keys)
            for lst in groups.values():
                shuffle.shuffle(lst)
        ctx = BatchContext(batch_id=self.batch_id, now_ms=now_ms, metrics=self.metrics)
        out: list[Change] = []
        for key in keys:
            state = self.state.get(key)
            if state is not None:
                state = pickle.loads(pickle.dumps(state))
            new_state, emitted = self.stage.process_key(key, [groups[key]], state, ctx)
            if new_state is None:
                self.state.pop(key, None)
            else:
                self.state[key] = new_state
            out.extend(emitted)
        self.batch_id += 1
        self.emitted.extend(out)
        return out

    def table(self) -> dict[tuple, tuple]:
        """The merged table: primary key -> merged row."""
        return {k: s[0] for k, s in self.state.items() if s[0] is not None}

    def row(self, *key) -> tuple | None:
        return self.table().get(tuple(key))


def harness(columns: Sequence[str] | str, options: dict[str, str] | None = None,
            pk: tuple[int, ...] = (0,), input_retracts: bool = False, types=None) -> MergeHarness:
    if isinstance(columns, str):
        columns = [c.strip() for c in columns.split(",")]
    stage = build_merge_engine("t", list(columns), pk, dict(options or {}), input_retracts,
                               types=types)
    return MergeHarness(stage)


class Feeder:
    """Feeds one record per batch with increasing positions, like Paimon's merge-function
    tests add one KeyValue after another with increasing sequence numbers."""

    def __init__(self, h: MergeHarness):
        self.h = h
        self.pos = 0

    def add(self, *row, kind: str = "+I") -> list[Change]:
        self.pos += 1
        return self.h.run([Change(kind, tuple(row), (self.pos,))])


def kinds(changes: Sequence[Change]) -> list[tuple[str, tuple]]:
    return [(c.kind, c.row) for c in changes]


def c(kind: str, *row, pos: int | tuple = ()) -> Change:
    return Change(kind, tuple(row), pos if isinstance(pos, tuple) else (pos,))
