"""The materializer kernel against the per-key stage, and literal Z-set cases.

Equivalence: over random multi-batch inputs (several PKs and upsert keys, adds, retractions
of active and of never-added rows, identical copies, shared positions, TTL expiry) the kernel
and ``PerKeyAdapter`` emit the same changes in the same order, keep the same state, count the
same metrics and fail with the same error. The literal cases are in the style of Flink's
``SinkUpsertMaterializer`` harness tests: records in, records out."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change
from tidemark.engine.driver import Bucket, PerKeyAdapter, batch_stage
from tidemark.engine.errors import ConflictError
from tidemark.engine.kernels.materializer import KERNEL_MIN_CHANGES, MaterializerKernel
from tidemark.engine.stage import BatchContext
from tidemark.engine.stages.materializer import ActiveRows, CurrentRow, SinkMaterializer


def sink(strategy: str, upsert_key=(1,), ttl_ms=None) -> SinkMaterializer:
    """Sink ``t(id, k, v)`` with PK ``id``; rows come from upstream keys ``k``."""
    return SinkMaterializer("t", (0,), ("id",), upsert_key, strategy, ttl_ms)


def c(kind: str, *row, pos: int) -> Change:
    return Change(kind, tuple(row), (pos,))


class Host:
    """One stage under one ``process_batch`` implementation, batch after batch."""

    def __init__(self, runner, groups: bool = False) -> None:
        """``groups``: batches carry host group ids, as the Spark host's do."""
        self.runner = runner
        self.groups = groups
        self.bucket = Bucket()
        self.metrics: Counter = Counter()

    def run(self, changes: list[Change], now_ms: int = 0) -> list[tuple]:
        ctx = BatchContext(now_ms=now_ms, metrics=self.metrics)
        try:
            ids = [repr(x.row[0]).encode() for x in changes] if self.groups else None
            batch = ChangeBatch(changes=list(changes), groups=ids)
            self.bucket, out = self.runner.process_batch([batch], self.bucket, ctx)
        except ConflictError as e:
            return [("error", str(e))]
        return [(x.kind, x.row, x.pos) for x in out.changes()]

    def visible_state(self) -> dict:
        """What the state says per PK, comparable across hosts (``ActiveRows`` has no ``==``)."""
        out = {}
        for key, s in self.bucket.states.items():
            if isinstance(s, ActiveRows):
                out[key] = [(ident, s.copies(ident), s.nodes[ident].row) for ident in _idents(s)], s.touched_ms
            else:
                out[key] = s
        return out


def _idents(rows: ActiveRows) -> list:
    out, cur = [], rows.head
    while cur is not None:
        out.append(cur)
        cur = rows.nodes[cur].next
    return out


# ---------------------------------------------------------------------- equivalence

row_values = st.tuples(st.integers(0, 2), st.integers(0, 2), st.sampled_from([None, "a", "b"]))
change = st.builds(
    lambda kind, row, pos: Change(kind, row, (pos,)),
    st.sampled_from(["+I", "+U", "-U", "-D"]),
    row_values,
    st.integers(0, 6),
)
batches = st.lists(st.tuples(st.lists(change, max_size=12), st.integers(0, 4)), min_size=1, max_size=5)


@settings(max_examples=300, deadline=None)
@given(
    strategy=st.sampled_from(["DEDUPLICATE", "NOTHING", "ERROR"]),
    upsert_key=st.sampled_from([None, (1,), (1, 2)]),
    ttl_ms=st.sampled_from([None, 3]),
    batches=batches,
)
def test_kernel_equals_per_key_stage(strategy, upsert_key, ttl_ms, batches):
    stage = sink(strategy, upsert_key, ttl_ms)
    kernel, per_key = Host(MaterializerKernel(stage)), Host(PerKeyAdapter(stage))
    spark = Host(MaterializerKernel(stage), groups=True)  # the Spark host's batches
    now = 0
    for i, (changes, advance) in enumerate(batches):
        now += advance
        # positions grow across batches, as a source's offsets do
        changes = [Change(x.kind, x.row, (i, *x.pos)) for x in changes]
        got, want = kernel.run(changes, now), per_key.run(changes, now)
        assert got == want
        assert spark.run(changes, now) == want
        if want and want[0][0] == "error":
            return
        assert kernel.visible_state() == per_key.visible_state() == spark.visible_state()
        assert kernel.metrics == per_key.metrics == spark.metrics


def test_the_stage_chooses_the_kernel(monkeypatch):
    assert isinstance(batch_stage(sink("NOTHING")), MaterializerKernel)
    assert batch_stage(sink("NOTHING")).min_changes == KERNEL_MIN_CHANGES
    monkeypatch.setenv("TIDEMARK_MATERIALIZER_KERNEL", "0")
    assert type(batch_stage(sink("NOTHING"))) is PerKeyAdapter


# ---------------------------------------------------------------------- literal Z-set cases


def test_deduplicate_rolls_back_to_the_row_active_before():
    h = Host(MaterializerKernel(sink("DEDUPLICATE")))
    assert h.run([c("+I", 1, 10, "x", pos=1), c("+I", 1, 20, "y", pos=2)]) == [("+I", (1, 20, "y"), (2,))]
    assert h.run([c("-D", 1, 20, "y", pos=3)]) == [
        ("-U", (1, 20, "y"), (3,)),
        ("+U", (1, 10, "x"), (3,)),
    ]
    assert h.run([c("-D", 1, 10, "x", pos=4)]) == [("-D", (1, 10, "x"), (4,))]
    assert h.bucket.states == {}


def test_nothing_keeps_the_first_add_after_the_last_retraction():
    """Upstream key 10 is retracted and re-added after key 20's add: 20 is now first."""
    h = Host(MaterializerKernel(sink("NOTHING")))
    out = h.run(
        [
            c("+I", 1, 10, "a", pos=1),
            c("+I", 1, 20, "b", pos=2),
            c("-U", 1, 10, "a", pos=3),
            c("+U", 1, 10, "c", pos=3),
        ]
    )
    assert out == [("+I", (1, 20, "b"), (3,))]
    assert h.metrics["conflicts_dropped"] == 1


def test_nothing_cancels_exact_pairs_before_the_current_row_is_consulted():
    h = Host(MaterializerKernel(sink("NOTHING", upsert_key=None)))
    h.run([c("+I", 1, 10, "a", pos=1)])
    # the in-batch +X/-X pair cancels: the current row stays, nothing is emitted
    assert h.run([c("-D", 1, 10, "a", pos=3), c("+I", 1, 10, "a", pos=2)]) == []
    assert h.bucket.states[(1,)] == CurrentRow((1, 10, "a"), 0, 0)  # the current row, as it was


def test_error_names_the_table_and_the_pk_value():
    h = Host(MaterializerKernel(sink("ERROR")))
    with pytest.raises(ConflictError, match=r"'t'.*id.*7"):
        h.runner.process_batch(
            [ChangeBatch(changes=[c("+I", 7, 10, "a", pos=1), c("+I", 7, 20, "b", pos=2)])],
            h.bucket,
            BatchContext(),
        )


def test_retractions_without_state_and_ttl_are_counted():
    h = Host(MaterializerKernel(sink("NOTHING", ttl_ms=5)))
    assert h.run([c("-D", 1, 10, "a", pos=1)], now_ms=0) == []
    assert h.run([c("+I", 1, 10, "a", pos=2)], now_ms=1) == [("+I", (1, 10, "a"), (2,))]
    # state untouched for longer than the TTL: expired, the sink row is unknown, so +I again
    assert h.run([c("+I", 1, 10, "b", pos=3)], now_ms=10) == [("+I", (1, 10, "b"), (3,))]
    assert h.metrics == Counter(retractions_without_state=1, state_expired=1)


def test_a_batch_built_from_arrow_columns_with_net_weights():
    """A consolidated table (weight 2 for two identical copies) is one change per unit."""
    batch = ChangeBatch.from_changes([c("+I", 1, 10, "a", pos=1)] * 2).consolidate()
    kernel = MaterializerKernel(sink("NOTHING", upsert_key=None))
    state, out = kernel.process_batch([batch], Bucket(), BatchContext())
    assert [(x.kind, x.row) for x in out.changes()] == [("+I", (1, 10, "a"))]
    assert state.states[(1,)].dropped == 1  # one identical copy dropped, remembered


@pytest.mark.parametrize(
    "rows",
    [
        [(1, 1, 1), (1, 1, "x")],  # a column mixing types
        [(1, 1, 2**70)],  # beyond 64 bits
        [(1, 1, (1, "a")), (1, 2, (2, "b"))],  # tuples mixing types
    ],
    ids=["mixed-types", "bigint", "mixed-tuple"],
)
@pytest.mark.parametrize("strategy", ["DEDUPLICATE", "NOTHING"])
def test_changes_arrow_cannot_type_run_per_key(rows, strategy):
    changes = [Change("+I", row, (i,)) for i, row in enumerate(rows)]
    stage = sink(strategy, upsert_key=None)
    kernel, per_key = Host(MaterializerKernel(stage)), Host(PerKeyAdapter(stage))
    assert kernel.run(changes) == per_key.run(changes) != []
    assert kernel.visible_state() == per_key.visible_state()
