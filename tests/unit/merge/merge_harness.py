"""Operator harness for the merge engine stage, in the spirit of Flink's keyed operator test
harness: feed a batch, get the emitted changes, look at the merged table.

It hosts the stage through the hosts' driver loop (``tidemark.engine.driver``: group by
``key_of``, one ``process_key`` per key, ``None`` clears state, ``wakeup_ms`` honoured by
calling ``process_key`` with no records for keys that asked for it), and round-trips the
state through its stored format (``tidemark.engine.state_codec``) between batches as
Spark's state store would.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

from tidemark.engine import state_codec
from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change
from tidemark.engine.driver import Bucket, PerKeyAdapter
from tidemark.engine.stage import BatchContext
from tidemark.engine.stages.merge_engine import build_merge_engine


class MergeHarness:
    def __init__(self, stage):
        self.stage = stage
        self.adapter = PerKeyAdapter(stage)
        self.bucket = Bucket()
        self.metrics: Counter = Counter()
        self.batch_id = 0
        self.emitted: list[Change] = []

    @property
    def state(self) -> dict:
        """key -> that key's state."""
        return dict(self.bucket.states)

    def run(self, changes: Sequence[Change], now_ms: int = 0,
            shuffle: random.Random | None = None) -> list[Change]:
        changes = list(changes)
        if shuffle is not None:
            shuffle.shuffle(changes)
        # state read back from storage, as Spark's state store gives it to the next batch
        bucket = state_codec.decode_state(self.stage, state_codec.encode_state(self.stage, self.bucket))
        ctx = BatchContext(batch_id=self.batch_id, now_ms=now_ms, metrics=self.metrics)
        self.bucket, out = self.adapter.process_batch([ChangeBatch(changes=changes)], bucket, ctx)
        self.batch_id += 1
        self.emitted.extend(out.changes())
        return out.changes()

    def table(self) -> dict[tuple, tuple]:
        """The merged table: primary key -> merged row."""
        return {k: s.row for k, s in self.state.items() if s.row is not None}

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
