"""The materializer kernel against the per-key stage, and literal Z-set cases.

Equivalence: over random multi-batch inputs (several PKs and upsert keys, adds, retractions
of active and of never-added rows, identical copies, shared positions, TTL expiry) the kernel
and ``PerKeyAdapter`` emit the same changes in the same order, keep the same state, count the
same metrics and fail with the same error. The literal cases are in the style of Flink's
``SinkUpsertMaterializer`` harness tests: records in, records out."""

from __future__ import annotations

from collections import Counter
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemark.engine import state_codec
from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change
from tidemark.engine.driver import Bucket, PerKeyAdapter, batch_stage
from tidemark.engine.errors import ConflictError
from tidemark.engine.kernels.materializer import KERNEL_MIN_CHANGES, MaterializerKernel
from tidemark.engine.stage import BatchContext
from tidemark.engine.kernels.table_bucket import TableBucket
from tidemark.engine.stages.materializer import ActiveRows, CurrentRow, SinkMaterializer
from tidemark.engine.types import INT, STRING, make_type


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


def _in_time(batches: list[tuple[list[Change], int]]) -> list[tuple[list[Change], int]]:
    """Each drawn batch with its clock (the advances summed) and its positions prefixed by
    the batch's index: positions grow across batches, as a source's offsets do."""
    out, now = [], 0
    for i, (changes, advance) in enumerate(batches):
        now += advance
        out.append(([Change(x.kind, x.row, (i, *x.pos)) for x in changes], now))
    return out


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
    for changes, now in _in_time(batches):
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


# ---------------------------------------------------------------------- state read per touched PK

TYPED = (("id", INT), ("k", INT), ("v", STRING))


class StoredHost(Host):
    """The kernel with the state stored between batches, as the Spark host keeps it."""

    def __init__(self, stage: SinkMaterializer) -> None:
        super().__init__(MaterializerKernel(stage))
        self.stage = stage
        self.stored: bytes | None = None

    def run(self, changes: list[Change], now_ms: int = 0) -> list[tuple]:
        self.bucket = state_codec.decode_state(self.stage, self.stored)
        out = super().run(changes, now_ms)
        self.stored = state_codec.encode_state(self.stage, self.bucket)
        return out


@settings(max_examples=200, deadline=None)
@given(
    strategy=st.sampled_from(["DEDUPLICATE", "NOTHING", "ERROR"]),
    upsert_key=st.sampled_from([None, (1,)]),
    ttl_ms=st.sampled_from([None, 3]),
    batches=batches,
)
def test_stored_state_read_per_touched_pk_equals_the_whole_state(strategy, upsert_key, ttl_ms, batches):
    """Reading only the PKs a batch touches (``SinkMaterializer.read_keys``) emits and stores exactly
    what reading the whole state does: same output, same bytes."""
    stage = SinkMaterializer("t", (0,), ("id",), upsert_key, strategy, ttl_ms, columns=TYPED)
    lazy, whole = StoredHost(stage), Host(MaterializerKernel(stage))
    for changes, now in _in_time(batches):
        got, want = lazy.run(changes, now), whole.run(changes, now)
        assert got == want
        if want and want[0][0] == "error":
            return
        assert lazy.stored == state_codec.encode_state(stage, whole.bucket)
        assert lazy.metrics == whole.metrics


def test_a_batch_reads_only_the_pks_it_touches():
    stage = SinkMaterializer("t", (0,), ("id",), (1,), "NOTHING", columns=TYPED)
    host = StoredHost(stage)
    host.run([c("+I", pk, 10, "a", pos=pk) for pk in range(5)])
    bucket = state_codec.decode_state(stage, host.stored)
    assert isinstance(bucket, TableBucket)
    out = MaterializerKernel(stage).process_batch([ChangeBatch(changes=[c("+I", 3, 11, "b", pos=9)])], bucket, BatchContext())[1]
    # the other PK's rows stay as stored; a new row for PK 3 replaces nothing: NOTHING keeps the first
    assert [(x.kind, x.row) for x in out.changes()] == []
    assert list(bucket.unread.column("row").to_pylist()) == [{"id": i, "k": 10, "v": "a"} for i in (0, 1, 2, 4)]
    assert list(bucket.states) == [(3,)]
    assert bucket.states[(3,)].row == (3, 10, "a")


def test_a_bucket_not_loaded_reads_every_row():
    """The per-key adapter does not load: it sees the whole state."""
    stage = SinkMaterializer("t", (0,), ("id",), (1,), "DEDUPLICATE", columns=TYPED)
    host = StoredHost(stage)
    host.run([c("+I", pk, 10, "a", pos=pk) for pk in range(3)])
    bucket = state_codec.decode_state(stage, host.stored)
    assert sorted(bucket.states) == [(0,), (1,), (2,)]
    assert bucket.unread is None


@pytest.mark.parametrize(
    "stored, keys, want",
    [
        (pa.array([1, 2, 3, None], pa.int64()), pa.array([3, None, 7], pa.int32()), [False, False, True, True]),
        (pa.array(["a", "b"]), pa.array(["b"], pa.large_string()), [False, True]),
        (pa.array([1.0, -0.0]), pa.array([0.0]), None),  # -0.0 and 0.0: Python's equality, not Arrow's
        (pa.array([b"x"], pa.large_binary()), pa.array([b"x"], pa.large_binary()), None),  # pickled values
        (pa.array([1, 300]), pa.array([1, 300], pa.int64()).cast(pa.int16()), [True, True]),
    ],
)
def test_rows_with_keys(stored, keys, want):
    from tidemark.engine.state_tables import rows_with_keys

    rows = pa.StructArray.from_arrays([stored, pa.array(range(len(stored)))], names=["id", "n"])
    got = rows_with_keys(rows, (0,), pa.table([keys], names=["id"]))
    assert (got.to_pylist() if got is not None else None) == want


def test_rows_typed_differently_from_the_stored_ones_read_the_whole_bucket():
    """A DECIMAL of another scale is stored pickled (``state_tables``): the written rows and
    the unread ones then differ in type, and the bucket is written as a whole read gives it."""
    stage = SinkMaterializer("t", (0,), ("id",), (0,), "NOTHING", columns=(("id", INT), ("d", make_type("DECIMAL", (10, 2)))))
    lazy, whole = StoredHost(stage), Host(MaterializerKernel(stage))
    for changes in ([c("+I", 1, Decimal("1.10"), pos=1)], [c("+I", 2, Decimal("1.5"), pos=2)]):
        assert lazy.run(changes) == whole.run(changes)
        assert lazy.stored == state_codec.encode_state(stage, whole.bucket)
    assert state_codec.decode_state(stage, lazy.stored).states == {
        (1,): CurrentRow((1, Decimal("1.10")), 0, 0), (2,): CurrentRow((2, Decimal("1.5")), 0, 0),
    }
