"""A tiny operator harness in the spirit of Flink's ``KeyedOneInputStreamOperatorTestHarness``:
feed one batch of changes, get back what the stage emitted, look at the state per key.

It hosts a ``KeyedStage`` through the hosts' own driver loop (``tidemark.engine.driver``): group
each input's changes by ``key_of``, one ``process_key`` call per key, state ``None`` means cleared.
``shuffle`` reorders records inside the batch (and keys) so tests can show order never matters.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

from tidemark.engine import state_codec
from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change, zset
from tidemark.engine.driver import Bucket, PerKeyAdapter, has_typed_state
from tidemark.engine.stage import BatchContext


class Harness:
    def __init__(self, stage, now_ms: int = 0, stored: bool = True):
        """``stored``: before each batch, the state of a stage with typed state goes through
        its stored format (``tidemark.engine.state_codec``) and back, as on Spark."""
        self.stage = stage
        self.stored = stored and has_typed_state(stage)
        self.adapter = PerKeyAdapter(stage)
        self.bucket = Bucket()
        self.metrics: Counter = Counter()
        self.now_ms = now_ms
        self.batch_id = 0
        self.emitted: list[Change] = []

    @property
    def state(self) -> dict:
        """key -> that key's state (what the stage keeps; tests may replace an entry)."""
        return self.bucket.states

    @state.setter
    def state(self, states: dict) -> None:
        self.bucket = Bucket.load(self.stage, states)

    def run(self, *inputs: Sequence[Change], shuffle: random.Random | None = None) -> list[Change]:
        """One batch through the host's driver loop. ``inputs`` is one list of changes per
        stage input; ``shuffle`` reorders each input first (so keys and each key's records
        reach the stage in another order)."""
        assert len(inputs) == self.stage.n_inputs, "one list of changes per input"
        lists = [list(changes) for changes in inputs]
        if shuffle is not None:
            for lst in lists:
                shuffle.shuffle(lst)
        ctx = BatchContext(batch_id=self.batch_id, now_ms=self.now_ms, metrics=self.metrics)
        if self.stored:  # state read back from storage, as Spark's state store gives it
            self.bucket = state_codec.decode_state(self.stage, state_codec.encode_state(self.stage, self.bucket))
        self.bucket, out = self.adapter.process_batch([ChangeBatch(changes=lst) for lst in lists], self.bucket, ctx)
        self.batch_id += 1
        self.emitted.extend(out.changes())
        return out.changes()

    def table(self) -> Counter:
        """Everything emitted so far, consolidated: the Z-set a downstream table would hold."""
        return zset(self.emitted)


def kinds(changes: Sequence[Change]) -> list[tuple[str, tuple]]:
    """(kind, row) pairs in a canonical order, for asserting emitted changes."""
    return sorted(((c.kind, c.row) for c in changes), key=repr)


def c(kind: str, *row, pos: int | tuple = ()) -> Change:
    """Shorthand: ``c("+I", 1, 10, "a1", pos=1)``."""
    return Change(kind, tuple(row), pos if isinstance(pos, tuple) else (pos,))
