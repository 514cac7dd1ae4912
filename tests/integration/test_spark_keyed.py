"""Keyed stages hosted on Spark must do exactly what the same stage objects do in plain
Python with dict state: batch by batch, across a restart from the checkpoint, for 1- and
2-input stages, and for the real join and sink materializer chained in one query."""

from __future__ import annotations

import sys
import time
from collections import Counter

import pytest

from tidemark.engine import bucketing
from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change
from tidemark.engine.driver import Bucket, PerKeyAdapter
from tidemark.engine.errors import ConflictError
from tidemark.engine.state_codec import StateFormatError
from tidemark.engine.stage import BatchContext
from tidemark.engine.stages.aggregate import AggCall, GroupAggregate
from tidemark.engine.stages.join import Join
from tidemark.engine.stages.materializer import SinkMaterializer
from tidemark.engine.stages.normalize import Normalize
from tidemark.spark import keyed as K


pytestmark = pytest.mark.integration

# Stage classes defined here must reach Spark's Python workers, which cannot import this
# test module: ship them by value.
from pyspark import cloudpickle  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])


# ---------------------------------------------------------------------------- reference host


class PyHost:
    """The reference: one stage in plain Python through the driver loop the replay host
    uses (one bucket of state in memory, one process_key call per key per batch)."""

    def __init__(self, stage):
        self.stage = stage
        self.adapter = PerKeyAdapter(stage)
        self.bucket = Bucket()
        self.metrics: Counter = Counter()
        self.batch_id = 0

    @property
    def state(self) -> dict:
        return self.bucket.states

    def run(self, inputs: list[list[Change]], now_ms: int = 0) -> list[Change]:
        ctx = BatchContext(batch_id=self.batch_id, now_ms=now_ms)
        self.bucket, out = self.adapter.process_batch([ChangeBatch(changes=list(cs)) for cs in inputs], self.bucket, ctx)
        self.metrics.update({f"{self.stage.name}.{k}": v for k, v in ctx.metrics.items()})
        self.batch_id += 1
        return out.changes()


def bag(changes: list[Change]) -> Counter:
    return Counter(changes)


# ---------------------------------------------------------------------------- toy stages


class CountingStage:
    """Per key: number of live rows and the sum of their values. Emits the key's new
    (key, count, sum) with pos = (batch_id, greatest input offset), so a batch-id mismatch
    between hosts shows up as a difference."""

    name = "counting"
    n_inputs = 1

    def key_of(self, change: Change, input_index: int) -> tuple:
        return (change.row[0],)

    def process_key(self, key, inputs, state, ctx):
        count, total = state or (0, 0)
        for c in inputs[0]:
            count += c.weight
            total += c.weight * c.row[1]
            ctx.metrics["rows"] += 1
        ctx.metrics["keys"] += 1
        pos = (ctx.batch_id, max(c.pos[0] for c in inputs[0]))
        old = (key[0], *state) if state else None
        new = (key[0], count, total) if count else None
        out = []
        if old is not None:
            out.append(Change("-U" if new else "-D", old, pos))
        if new is not None:
            out.append(Change("+U" if old else "+I", new, pos))
        if new is None:
            ctx.metrics["keys_removed"] += 1
        return (None if new is None else (count, total)), out


class ClockStage:
    """Emits (key, batch_id, now_ms): shows what the host puts in the BatchContext."""

    name = "clock"
    n_inputs = 1

    def key_of(self, change, input_index):
        return (change.row[0],)

    def process_key(self, key, inputs, state, ctx):
        return None, [Change("+I", (key[0], ctx.batch_id, ctx.now_ms), ())]


class WakeupStage:
    """Asks to be woken one millisecond after it last saw records; when woken (called with
    no records) it emits one "woke" row and asks for nothing more."""

    name = "wakeup"
    n_inputs = 1

    def key_of(self, change, input_index):
        return (change.row[0],)

    def wakeup_ms(self, state):
        return state["due"]

    def process_key(self, key, inputs, state, ctx):
        if inputs[0]:
            return {"due": ctx.now_ms + 1}, [Change("+I", (key[0], "seen", ctx.batch_id), ())]
        ctx.metrics["woken"] += 1
        return {"due": None}, [Change("+I", (key[0], "woke", ctx.batch_id), ())]


def _ins(row, pos):
    return Change("+I", row, (pos,))


def _del(row, pos):
    return Change("-D", row, (pos,))


def buckets_of(state: dict, buckets: int = K.DEFAULT_STATE_BUCKETS) -> int:
    """State-store rows a host keeps for these keys' states: one per state bucket."""
    return len({bucketing.bucket_of_key(k, buckets) for k in state})


# ---------------------------------------------------------------------------- tests


@pytest.mark.parametrize(("operator", "buckets"), [(op, K.DEFAULT_STATE_BUCKETS) for op in K.OPERATORS]
                         + [(K.DEFAULT_OPERATOR, 1)])
def test_counting_stage_matches_python_host_across_restart(spark, spark_stream, operator, buckets):
    """``buckets=1``: every key's state in one bucket (read, updated, shrunk, restored)."""
    stage = CountingStage()
    metrics = K.StageMetrics(spark)

    def build(source):
        keyed = K.keyed_input(source.filter("input = 0"), stage, buckets=buckets)
        return K.run_keyed_stage([keyed], stage, metrics=metrics, operator=operator, buckets=buckets)

    batches = [
        # several rows for one key, keys with one row, and a key written twice
        [[_ins(("a", 1), 1), _ins(("a", 2), 2), _ins(("b", 5), 3), _ins(("c", 1), 4), _ins(("a", 2), 5)]],
        # a retraction, a key emptied (state must be removed), a new key
        [[_del(("a", 2), 6), _del(("c", 1), 7), _ins(("d", 4), 8)]],
        # after the restart: state of a, b, d must still be there
        [[_ins(("a", 10), 9), _del(("b", 5), 10), _ins(("e", 1), 11)]],
        [[_ins(("d", 1), 12), _ins(("e", 1), 13), _ins(("e", 2), 14)]],
    ]
    ref = PyHost(stage)
    stream = spark_stream(build)
    for i, inputs in enumerate(batches):
        if i == 2:
            stream.restart()
        got = stream.run_batch(inputs)
        want = ref.run(inputs)
        assert bag(got) == bag(want), f"batch {i}"
        assert K.state_rows_total(stream.query) == buckets_of(ref.state, buckets), f"state rows after batch {i}"
    assert metrics.value() == ref.metrics
    assert metrics.value()["counting.keys_removed"] == 2  # c, then b


@pytest.mark.parametrize("buckets", [K.DEFAULT_STATE_BUCKETS, 1])
def test_join_then_materializer_in_one_query_matches_python_hosts(spark, spark_stream, buckets):
    """The real stages, chained: s1 LEFT JOIN s2 ON s1.level = s2.id, then the sink
    materializer (DO DEDUPLICATE, PK s1.id); the join emits straight into the
    materializer's keyed layout (``downstream``), so two stateful operators run in one
    query. Ends with every input retracted: the join's Spark state must be empty."""
    join = Join("left", left_key=(1,), right_key=(0,), left_width=2, right_width=2)
    mat = SinkMaterializer("t1", pk=(0,), pk_names=("id",), upsert_key=None, strategy="DEDUPLICATE")
    metrics = K.StageMetrics(spark)

    def build(source):
        left = K.keyed_input(source.filter("input = 0"), join, 0, buckets=buckets)
        right = K.keyed_input(source.filter("input = 1"), join, 1, buckets=buckets)
        joined = K.run_keyed_stage([left, right], join, metrics=metrics, downstream=(mat, 0), buckets=buckets)
        return K.run_keyed_stage([joined], mat, metrics=metrics, buckets=buckets)

    s1 = lambda kind, i, lvl, pos: Change(kind, (i, lvl), (pos,))  # noqa: E731
    s2 = lambda kind, i, attr, pos: Change(kind, (i, attr), (pos,))  # noqa: E731
    batches = [
        [[s1("+I", 1, 10, 1)], [s2("+I", 10, "a1", 2), s2("+I", 20, "b1", 3)]],
        # the join key of s1 row 1 changes 10 -> 20; the -U/+U halves land on two keys
        [[s1("-U", 1, 10, 4), s1("+U", 1, 20, 4)], []],
        # after restart: right side update, and a left row with no partner (padded)
        [[s1("+I", 2, 30, 6)], [s2("-U", 20, "b1", 5), s2("+U", 20, "b2", 5)]],
        [[s1("-D", 1, 20, 7), s1("-D", 2, 30, 8)], [s2("-D", 10, "a1", 9), s2("-D", 20, "b2", 10)]],
    ]
    ref_join, ref_mat = PyHost(join), PyHost(mat)
    stream = spark_stream(build)
    for i, inputs in enumerate(batches):
        if i == 2:
            stream.restart()
        got = stream.run_batch(inputs)
        want = ref_mat.run([ref_join.run(inputs)])
        assert bag(got) == bag(want), f"batch {i}"
        # state_operators lists the operator nearest the sink first: materializer, join
        rows = [op["numRowsTotal"] for op in K.state_operators(stream.query.lastProgress)]
        assert rows == [buckets_of(ref_mat.state, buckets), buckets_of(ref_join.state, buckets)], f"state rows after batch {i}"
    ops = K.state_operators(stream.query.lastProgress)
    assert len(ops) == 2
    assert sum(op["numRowsTotal"] for op in ops) == 0  # join and materializer both empty
    assert metrics.value() == ref_join.metrics + ref_mat.metrics


def test_conflict_error_reaches_the_driver_as_itself(spark, spark_stream):
    mat = SinkMaterializer("t1", pk=(0,), pk_names=("id",), upsert_key=(1,), strategy="ERROR")

    def build(source):
        return K.run_keyed_stage([K.keyed_input(source, mat)], mat)

    batch = [[_ins((1, "x"), 1), _ins((1, "y"), 2)]]
    with pytest.raises(ConflictError) as expected:
        PyHost(mat).run(batch)
    stream = spark_stream(build)
    with pytest.raises(ConflictError) as got:
        stream.run_batch(batch)
    assert str(got.value) == str(expected.value)
    assert got.value.table == "t1" and got.value.pk == {"id": 1}
    assert got.value.exit_status == 3


class PickledStage:
    """A stage as hosted before it had typed state: the same keyed logic, state pickled."""

    def __init__(self, stage):
        self.stage, self.name, self.n_inputs = stage, stage.name, stage.n_inputs

    def key_of(self, change, input_index):
        return self.stage.key_of(change, input_index)

    def process_key(self, key, inputs, state, ctx):
        return self.stage.process_key(key, inputs, state, ctx)


def test_a_checkpoint_in_another_state_format_is_refused_at_the_first_read(spark, spark_stream):
    """A checkpoint whose buckets were stored pickled, restarted by a version that stores the
    stage typed: the first read fails the query with both formats named, nothing misread."""
    mat = SinkMaterializer("t1", pk=(0,), pk_names=("id",), upsert_key=(1,), strategy="NOTHING", name="materializer:t1")
    hosted = [PickledStage(mat)]

    def build(source):
        return K.run_keyed_stage([K.keyed_input(source, hosted[0])], hosted[0])

    stream = spark_stream(build)
    assert bag(stream.run_batch([[_ins((1, "x"), 1)]])) == bag([_ins((1, "x"), 1)])
    hosted[0] = mat
    stream.restart()
    with pytest.raises(StateFormatError) as err:
        stream.run_batch([[_ins((1, "y"), 2)]])
    assert str(err.value) == (
        "stage 'materializer:t1': the checkpoint holds state in format pickled-bucket/1, this version reads "
        "materializer-current-row/1; start a new checkpoint (or run the version that wrote it)"
    )


def test_batch_id_and_processing_time_reach_the_stage(spark, spark_stream):
    stage = ClockStage()
    stream = spark_stream(lambda source: K.run_keyed_stage([K.keyed_input(source, stage)], stage))
    seen = []
    for i in range(2):
        t0 = int(time.time() * 1000)
        out = stream.run_batch([[_ins(("k", i), i)]])
        t1 = int(time.time() * 1000)
        assert len(out) == 1
        key, batch_id, now_ms = out[0].row
        assert batch_id == i
        assert t0 <= now_ms <= t1
        seen.append(now_ms)
    assert seen[0] <= seen[1]


@pytest.mark.parametrize("buckets", [K.DEFAULT_STATE_BUCKETS, 1])
def test_stage_timer_wakes_a_key_without_records_exactly_once(spark, spark_stream, buckets):
    """With one bucket, every key shares one state value and one timer: each key must
    still be woken once, at its own time, and a key added later gets its own wakeup."""
    stage = WakeupStage()
    metrics = K.StageMetrics(spark)
    stream = spark_stream(
        lambda source: K.run_keyed_stage([K.keyed_input(source, stage, buckets=buckets)], stage, metrics=metrics, buckets=buckets)
    )
    stream.write_batch([[_ins(("a", 1), 1), _ins(("b", 1), 2)]])

    def rows(outputs):
        return [(b, c.row) for b, cs in sorted(outputs.items()) for c in cs]

    def woke(key):
        return [b for b, r in rows(stream.outputs) if r[:2] == (key, "woke")]

    stream.wait_for(lambda out: {r[0] for _, r in rows(out) if r[1] == "woke"} == {"a", "b"})
    for key in ("a", "b"):
        (seen_batch,) = [b for b, r in rows(stream.outputs) if r[:2] == (key, "seen")]
        (woke_batch,) = woke(key)
        assert woke_batch > seen_batch
        assert (woke_batch, (key, "woke", woke_batch)) in rows(stream.outputs)  # ctx.batch_id is Spark's
    stream.write_batch([[_ins(("c", 1), 3)]])
    stream.wait_for(lambda out: any(r[:2] == ("c", "woke") for _, r in rows(out)))
    # no-data batches keep running: no timer may fire again
    last = max(stream.outputs)
    stream.wait_for(lambda out: max(out) >= last + 3)
    assert [len(woke(k)) for k in "abc"] == [1, 1, 1]
    assert metrics.value()["wakeup.woken"] == 3


def test_normalize_then_aggregate_matches_python_hosts(spark, spark_stream):
    """An upsert source normalized by PK, then SUM/COUNT/MAX/AVG per group: upserts that
    move a row between groups, a delete, several upserts of one PK in one batch (the
    greatest position wins). Decimal values must survive the trip exactly."""
    from decimal import Decimal

    norm = Normalize(pk=(0,), width=3)
    agg = GroupAggregate(
        group_by=(1,),
        aggs=[AggCall("SUM", 2), AggCall("COUNT_STAR"), AggCall("MAX", 2), AggCall("AVG", 2)],
    )

    def build(source):
        normalized = K.run_keyed_stage([K.keyed_input(source, norm)], norm, downstream=(agg, 0))
        return K.run_keyed_stage([normalized], agg)

    up = lambda pk, grp, v, pos: Change("+I", (pk, grp, Decimal(v)), (pos,))  # noqa: E731
    batches = [
        [[up(1, "g1", "1.50", 1), up(2, "g1", "2.25", 2), up(3, "g2", "7", 3)]],
        # pk 1 updated twice in one batch (pos 5 wins), pk 2 moves to g2, pk 3 deleted
        [[up(1, "g1", "9", 5), up(1, "g1", "4", 4), up(2, "g2", "1", 6),
          Change("-D", (3, "g2", Decimal("7")), (7,))]],
        [[up(4, "g3", "0.10", 8), Change("-D", (1, "g1", Decimal("9")), (9,))]],
    ]
    ref_norm, ref_agg = PyHost(norm), PyHost(agg)
    stream = spark_stream(build)
    for i, inputs in enumerate(batches):
        got = stream.run_batch(inputs)
        want = ref_agg.run([ref_norm.run(inputs)])
        assert want, f"batch {i} should change some group"
        assert bag(got) == bag(want), f"batch {i}"
        assert all(type(v) is type(w) for c, d in zip(sorted(got), sorted(want)) for v, w in zip(c.row, d.row))
