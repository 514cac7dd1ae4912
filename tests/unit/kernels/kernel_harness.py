"""What the kernel-against-per-key tests share: random and literal changes, each key's view
of an output, and a host that stores a stage's bucket between batches as the Spark host does."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from hypothesis import strategies as st

from tidemark.engine import state_codec
from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change
from tidemark.engine.driver import PerKeyAdapter
from tidemark.engine.stage import BatchContext


#: random changes of rows ``(id, grp, v)``: several of one key, repeated rows and positions,
#: NULLs, positions of one and two fields
POSITIONS = st.one_of(st.integers(0, 6).map(lambda p: (p,)), st.tuples(st.integers(0, 6), st.integers(0, 2)))
RECORDS = st.lists(
    st.tuples(
        st.sampled_from(["+I", "+U", "-U", "-D"]),
        st.sampled_from([0, 1, 2, None]),  # id
        st.sampled_from(["a", "b", None]),  # grp
        st.sampled_from([1, 2, None]),  # v
        POSITIONS,
    ),
    max_size=14,
)


def c(kind: str, *row, pos: int | tuple = ()) -> Change:
    return Change(kind, tuple(row), pos if isinstance(pos, tuple) else (pos,))


def per_key_view(stage: Any, changes: list[Change]) -> dict[tuple, list[Change]]:
    """Each key's changes in emitted order: what a reader keyed like the stage sees of it."""
    out: dict[tuple, list[Change]] = defaultdict(list)
    for ch in changes:
        out[stage.key_of(ch)].append(ch)
    return dict(out)


class StoredHost:
    """A stage whose bucket is stored between batches (``state_codec``), each batch run by
    ``kernel`` or the per-key adapter as it asks; counts the kernel's calls that it handed to
    its own per-key path (``fell_back``)."""

    def __init__(self, stage: Any, kernel: Any) -> None:
        self.stage = stage
        self.kernel = kernel
        self.per_key = PerKeyAdapter(stage)
        self.stored: bytes | None = None
        self.metrics: Counter = Counter()
        self.fell_back = 0
        inner = kernel._per_key.process_batch

        def counted(*args: Any) -> Any:
            self.fell_back += 1
            return inner(*args)

        kernel._per_key.process_batch = counted

    def run(self, batch: ChangeBatch, kernel: bool = True, now_ms: int = 0) -> list[Change]:
        state = state_codec.decode_state(self.stage, self.stored)
        runner = self.kernel if kernel else self.per_key
        state, out = runner.process_batch([batch], state, BatchContext(metrics=self.metrics, now_ms=now_ms))
        self.stored = state_codec.encode_state(self.stage, state)
        return out.changes()
