"""DO DEDUPLICATE on the stored table (``kernels.deduplicate``) against the per-key stage.

Equivalence: over random multi-batch inputs (a few PKs, with and without an upsert key,
adds, retractions of active and never-added rows, identical copies, shared positions), with
the state stored between batches as the Spark host stores it, the columnar path emits the
same changes in the same order, stores the same bytes and counts the same metrics as
``PerKeyAdapter``. The literal cases are records in, records out."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemark.engine import state_codec
from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change
from tidemark.engine.driver import PerKeyAdapter, batch_stage
from tidemark.engine.kernels.deduplicate import DeduplicateKernel
from tidemark.engine.kernels.materializer import COLUMNAR_MIN_CHANGES, KERNEL_MIN_CHANGES, MaterializerKernel
from tidemark.engine.stage import BatchContext
from tidemark.engine.stages.materializer import SinkMaterializer
from tidemark.engine.types import INT, STRING
from test_materializer_kernel import change  # the random changes of the per-key equivalence

TYPED = (("id", INT), ("k", INT), ("v", STRING))
SCHEMA = pa.schema([("id", pa.int32()), ("k", pa.int32()), ("v", pa.string())])


def sink(upsert_key) -> SinkMaterializer:
    return SinkMaterializer("t", (0,), ("id",), upsert_key, "DEDUPLICATE", columns=TYPED)


class StoredHost:
    """One ``process_batch`` implementation with the bucket stored between batches."""

    def __init__(self, stage: SinkMaterializer, runner) -> None:
        self.stage, self.runner = stage, runner
        self.stored: bytes | None = None
        self.metrics: Counter = Counter()

    def run(self, changes: list[Change]) -> list[tuple]:
        bucket = state_codec.decode_state(self.stage, self.stored)
        batch = ChangeBatch.from_table(ChangeBatch.from_changes(changes, SCHEMA).table())
        bucket, out = self.runner.process_batch([batch], bucket, BatchContext(metrics=self.metrics))
        self.stored = state_codec.encode_state(self.stage, bucket)
        return [(x.kind, x.row, x.pos) for x in out.changes()]


def columnar_calls(monkeypatch, kernel: type = DeduplicateKernel) -> list[bool]:
    """Whether each call of ``kernel.run`` took the columnar path (True) or handed the batch
    back (False)."""
    calls: list[bool] = []
    run = kernel.run

    def counted(self, *args):
        done = run(self, *args)
        calls.append(done is not None)
        return done

    monkeypatch.setattr(kernel, "run", counted)
    return calls


batches = st.lists(st.lists(change, min_size=1, max_size=14), min_size=1, max_size=5)


@settings(max_examples=400, deadline=None)
@given(upsert_key=st.sampled_from([None, (1,), (1, 2)]), batches=batches, overlap=st.booleans())
def test_the_columnar_path_equals_the_per_key_stage(upsert_key, batches, overlap):
    """``overlap``: two batches at a time share their positions, so an add can be as old as
    (or older than) a stored copy of its row."""
    stage = sink(upsert_key)
    columnar, per_key = StoredHost(stage, MaterializerKernel(stage)), StoredHost(stage, PerKeyAdapter(stage))
    for i, changes in enumerate(batches):
        timed = [Change(x.kind, x.row, (i // 2 if overlap else i, *x.pos)) for x in changes]
        assert columnar.run(timed) == per_key.run(timed)
        assert columnar.stored == per_key.stored
        assert columnar.metrics == per_key.metrics


def test_typed_batches_take_the_columnar_path(monkeypatch):
    calls = columnar_calls(monkeypatch)
    host = StoredHost(sink(None), MaterializerKernel(sink(None)))
    host.run([Change("+I", (1, 10, "x"), (0,)), Change("+I", (1, 20, "y"), (1,))])
    host.run([Change("-D", (1, 20, "y"), (2,))])
    assert calls == [True, True]


def test_rolls_back_to_the_row_active_before():
    host = StoredHost(sink(None), MaterializerKernel(sink(None)))
    assert host.run([Change("+I", (1, 10, "x"), (1,)), Change("+I", (1, 20, "y"), (2,))]) == [("+I", (1, 20, "y"), (2,))]
    assert host.run([Change("-D", (1, 20, "y"), (3,))]) == [("-U", (1, 20, "y"), (3,)), ("+U", (1, 10, "x"), (3,))]
    assert host.run([Change("-D", (1, 10, "x"), (4,))]) == [("-D", (1, 10, "x"), (4,))]
    assert host.stored is None


def test_a_retraction_removes_the_oldest_identical_copy():
    """Flink's ``findFirst``: of two copies of ``x``, the older goes; ``x`` stays latest."""
    host = StoredHost(sink(None), MaterializerKernel(sink(None)))
    host.run([Change("+I", (1, 10, "x"), (1,)), Change("+I", (1, 20, "y"), (2,)), Change("+I", (1, 10, "x"), (3,))])
    assert host.run([Change("-D", (1, 10, "x"), (4,))]) == []
    assert host.run([Change("-D", (1, 10, "x"), (5,))]) == [("-U", (1, 10, "x"), (5,)), ("+U", (1, 20, "y"), (5,))]


def test_an_add_older_than_the_stored_copy_takes_the_per_pk_path(monkeypatch):
    stage = sink(None)
    calls = columnar_calls(monkeypatch)
    columnar, per_key = StoredHost(stage, MaterializerKernel(stage)), StoredHost(stage, PerKeyAdapter(stage))
    for changes in ([Change("+I", (1, 10, "x"), (5,)), Change("+I", (1, 20, "y"), (6,))],
                    [Change("+I", (1, 10, "x"), (2,)), Change("-D", (1, 10, "x"), (7,))]):  # fmt: skip
        assert columnar.run(changes) == per_key.run(changes)
        assert columnar.stored == per_key.stored
    assert calls == [True, False]


def test_untyped_or_net_weighted_batches_are_handed_back():
    stage = sink(None)
    ctx = BatchContext(metrics=Counter())
    untyped = ChangeBatch.from_changes([Change("+I", (1, 10, "x"), (1,))]).table()  # int64, not INT
    assert DeduplicateKernel(stage).run(untyped, None, ctx) is None
    typed = ChangeBatch.from_changes([Change("+I", (1, 10, "x"), (1,))] * 2, SCHEMA).consolidate().table()
    assert typed.column("$weight").to_pylist() == [2]
    assert DeduplicateKernel(stage).run(typed, None, ctx) is None
    assert not DeduplicateKernel(SinkMaterializer("t", (0,), ("id",), None, "DEDUPLICATE", ttl_ms=5, columns=TYPED)).enabled
    assert not DeduplicateKernel(SinkMaterializer("t", (0,), ("id",), None, "NOTHING", columns=TYPED)).enabled


def test_the_stage_asks_for_the_columnar_path_above_its_fixed_cost():
    kernel = batch_stage(sink(None))
    assert (kernel.min_changes, kernel.columnar_min_changes) == (KERNEL_MIN_CHANGES, COLUMNAR_MIN_CHANGES)
    assert COLUMNAR_MIN_CHANGES > KERNEL_MIN_CHANGES


W2 = """
CREATE TABLE s1 (id BIGINT, level BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 's1', 'format' = 'debezium-json');
CREATE TABLE s2 (id BIGINT, attr STRING, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 's2', 'format' = 'debezium-json');
CREATE TABLE t1 (id BIGINT, level BIGINT, attr STRING, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 't1', 'format' = 'upsert-json');
INSERT INTO t1 SELECT s1.id, s1.level, s2.attr FROM s1 JOIN s2 ON s1.level = s2.id ON CONFLICT DO DEDUPLICATE
"""


def test_the_spark_hosts_batches_of_a_planned_sink_take_the_columnar_path(monkeypatch):
    """The materializer of a planned pipeline, called as a Spark worker calls a bucket: its
    input blobs are typed by the planner, its state stored between batches."""
    from tidemark.engine import batch_ipc
    from tidemark.engine.pipeline import compile_sql
    from tidemark.spark.keyed import _BucketRunner, blob_rows, changes_of_blobs

    pipeline = compile_sql(W2)
    node = next(n for n in pipeline.nodes if isinstance(n.stage, SinkMaterializer))
    feed = pipeline.node(node.inputs[0])
    schema = batch_ipc.schema_of(feed.columns, feed.types)
    runner = _BucketRunner(node.stage, None, None, schema=batch_ipc.schema_of(node.columns, node.types), buckets=1)
    calls = columnar_calls(monkeypatch)
    n = COLUMNAR_MIN_CHANGES
    first = [Change("+I", (pk, pk % 7, f"a{pk % 7}"), (0, pk)) for pk in range(n)]
    moved = [c for pk in range(0, n, 2) for c in (Change("-U", (pk, pk % 7, f"a{pk % 7}"), (1, pk)),
                                                  Change("+U", (pk, 9, "a9"), (1, pk)))]  # fmt: skip
    stored: list = [None]
    outs = []
    for changes in (first, moved):
        res = runner.run([[blob for _, _, blob in blob_rows(changes, schema, None, 1)]], stored, 0)
        stored = res.stored
        outs.append(changes_of_blobs([r[2] for r in res.rows]))
    assert calls == [True, True]
    assert len(outs[0]) == n and {c.kind for c in outs[0]} == {"+I"}
    assert sorted(c.row for c in outs[1] if c.kind == "+U") == [(pk, 9, "a9") for pk in range(0, n, 2)]
