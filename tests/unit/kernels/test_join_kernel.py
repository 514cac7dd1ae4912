"""The join kernel against the per-key join stage, and literal Z-set cases.

Equivalence: over random multi-batch inputs (duplicates, retractions before adds and of rows
never added, NULL keys, many changes at one position, positions of different lengths, one-
and two-column keys, with and without a residual condition, all four join types) the kernel
and ``PerKeyAdapter`` emit the same changes in the same order and count the same metrics. The
kernel's state goes through ``state_codec`` between batches, as on the Spark host, so the
typed Arrow state is part of what is compared. The literal cases are records in, records
out, in the style of Flink's join operator harness tests."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemark.engine import state_codec
from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change
from tidemark.engine.driver import Bucket, PerKeyAdapter, batch_stage
from tidemark.engine.kernels.join import JoinKernel
from tidemark.engine.stage import BatchContext
from tidemark.engine.stages.join import KERNEL_ENV, Join

# left (id, level), right (id, attr); ON left.level = right.id
LEFT = pa.schema([("id", pa.int64()), ("level", pa.int64())])
RIGHT = pa.schema([("rid", pa.int64()), ("attr", pa.string())])


def join(kind: str, residual=None) -> Join:
    return Join(kind, (1,), (0,), 2, 2, residual=residual, input_schemas=(LEFT, RIGHT))


def c(kind: str, *row, pos: int | tuple = ()) -> Change:
    return Change(kind, tuple(row), pos if isinstance(pos, tuple) else (pos,))


class Host:
    """One stage under one ``process_batch`` implementation. The kernel's state is stored
    between batches as the Spark host stores it (``state_codec``); the per-key adapter's
    ``Bucket`` stays in memory."""

    def __init__(self, stage: Join, runner=None) -> None:
        self.stage = stage
        self.runner = runner if runner is not None else batch_stage(stage)
        self.bucket = Bucket()
        self.stored: bytes | None = None
        self.metrics: Counter = Counter()

    def run(self, left: list[Change], right: list[Change]) -> list[Change]:
        ctx = BatchContext(metrics=self.metrics)
        batches = [ChangeBatch(changes=list(left)), ChangeBatch(changes=list(right))]
        if isinstance(self.runner, PerKeyAdapter):
            self.bucket, out = self.runner.process_batch(batches, self.bucket, ctx)
        else:
            state = state_codec.decode_state(self.stage, self.stored)
            state, out = self.runner.process_batch(batches, state, ctx)
            self.stored = state_codec.encode_state(self.stage, state)
        return out.changes()


# ---------------------------------------------------------------------- literal cases


@pytest.fixture(autouse=True)
def kernel_on(monkeypatch):
    monkeypatch.setenv(KERNEL_ENV, "1")


def test_the_kernel_is_what_the_stage_runs_and_its_state_is_typed():
    stage = join("inner")
    assert isinstance(batch_stage(stage), JoinKernel)
    assert state_codec.format_of(stage) == "join/1"
    assert isinstance(batch_stage(Join("inner", (1,), (0,), 2, 2)), PerKeyAdapter)  # no schemas: per key


def test_kernel_on_unless_switched_off(monkeypatch):
    monkeypatch.delenv(KERNEL_ENV, raising=False)
    assert isinstance(batch_stage(join("inner")), JoinKernel)
    monkeypatch.setenv(KERNEL_ENV, "0")
    assert isinstance(batch_stage(join("inner")), PerKeyAdapter)
    assert state_codec.format_of(join("inner")) == state_codec.FORMAT_PICKLED


def test_update_moves_a_row_between_keys():
    h = Host(join("inner"))
    assert h.run([c("+I", 1, 10, pos=1)], [c("+I", 10, "a1", pos=1), c("+I", 20, "b1", pos=1)]) == [
        c("+I", 1, 10, 10, "a1", pos=1)
    ]
    # the update's halves land on keys 10 and 20: each key's net change, key 10 first (its
    # change came first in the batch)
    assert h.run([c("-U", 1, 10, pos=2), c("+U", 1, 20, pos=2)], []) == [
        c("-D", 1, 10, 10, "a1", pos=2),
        c("+I", 1, 20, 20, "b1", pos=2),
    ]


def test_left_join_pads_unpads_and_repads():
    h = Host(join("left"))
    assert h.run([c("+I", 1, 10, pos=1)], []) == [c("+I", 1, 10, None, None, pos=1)]
    assert h.run([], [c("+I", 10, "a", pos=2)]) == [c("-U", 1, 10, None, None, pos=2), c("+U", 1, 10, 10, "a", pos=2)]
    assert h.run([], [c("+I", 10, "a2", pos=3)]) == [c("+I", 1, 10, 10, "a2", pos=3)]
    assert h.run([], [c("-D", 10, "a", pos=4)]) == [c("-D", 1, 10, 10, "a", pos=4)]
    assert h.run([], [c("-D", 10, "a2", pos=5)]) == [c("-U", 1, 10, 10, "a2", pos=5), c("+U", 1, 10, None, None, pos=5)]
    assert h.run([c("-D", 1, 10, pos=6)], []) == [c("-D", 1, 10, None, None, pos=6)]
    assert h.stored is None  # nothing left to store


def test_full_join_pads_both_sides_and_null_keys_pass_through():
    h = Host(join("full"))
    out = h.run([c("+I", 1, 10, pos=1), c("+I", 2, None, pos=1)], [c("+I", 20, "b", pos=2), c("+I", None, "x", pos=2)])
    # keys in order of first appearance (left, then right): 10, NULL (both sides' rows), 20
    assert out == [
        c("+I", 1, 10, None, None, pos=1),
        c("+I", 2, None, None, None, pos=1),
        c("+I", None, None, None, "x", pos=2),
        c("+I", None, None, 20, "b", pos=2),
    ]
    assert h.run([c("-D", 2, None, pos=3)], []) == [c("-D", 2, None, None, None, pos=3)]


def test_multiplicities_and_the_later_input_position():
    h = Host(join("inner"))
    assert h.run([c("+I", 1, 10, pos=1), c("+I", 1, 10, pos=2)], [c("+I", 10, "a", pos=3)]) == [
        c("+I", 1, 10, 10, "a", pos=3),
        c("+I", 1, 10, 10, "a", pos=3),
    ]
    assert h.run([c("-D", 1, 10, pos=4)], []) == [c("-D", 1, 10, 10, "a", pos=4)]
    h.run([], [c("+I", 20, "z", pos=9)])
    assert h.run([c("+I", 5, 20, pos=7)], []) == [c("+I", 5, 20, 20, "z", pos=9)]


def test_a_row_deleted_and_readded_in_one_batch_refreshes_its_joined_rows():
    """Flink retracts and re-emits the joined row; downstream it then sits at the later position."""
    h = Host(join("inner"))
    h.run([c("+I", 1, 10, pos=1)], [c("+I", 10, "a", pos=1)])
    assert h.run([c("-D", 1, 10, pos=2), c("+I", 1, 10, pos=3)], []) == [
        c("-U", 1, 10, 10, "a", pos=2),
        c("+U", 1, 10, 10, "a", pos=3),
    ]


def test_residual_condition_decides_padding():
    h = Host(join("left", residual=lambda row: row[3] != "bad"))
    assert h.run([c("+I", 1, 10, pos=1)], [c("+I", 10, "bad", pos=1)]) == [c("+I", 1, 10, None, None, pos=1)]
    assert h.run([], [c("+I", 10, "good", pos=2)]) == [c("-U", 1, 10, None, None, pos=2), c("+U", 1, 10, 10, "good", pos=2)]
    assert h.run([], [c("-D", 10, "bad", pos=3)]) == []


def test_retraction_of_an_unknown_row_is_counted():
    h = Host(join("left"))
    assert h.run([c("-D", 9, 10, pos=1), c("-D", 9, 10, pos=1)], []) == []
    assert h.metrics["retractions_without_state"] == 2


def test_columnar_input_with_net_weights_is_read_as_its_changes():
    changes = [c("+I", 1, 10, pos=1), c("+I", 1, 10, pos=1), c("+I", 2, 10, pos=2)]
    netted = ChangeBatch.from_changes(changes, LEFT).consolidate()
    assert netted.table().num_rows == 2  # one row with weight 2
    right = [c("+I", 10, "a", pos=0)]
    kernel = batch_stage(join("inner"))
    _, from_table = kernel.process_batch([netted, ChangeBatch(changes=right)], kernel.empty_state(), BatchContext())
    _, from_changes = kernel.process_batch(
        [ChangeBatch(changes=changes), ChangeBatch(changes=right)], kernel.empty_state(), BatchContext()
    )
    assert from_table.changes() == from_changes.changes()
    assert len(from_table.changes()) == 3


def test_a_pickled_join_checkpoint_is_refused_naming_both_formats():
    per_key = Join("inner", (1,), (0,), 2, 2)
    stored = state_codec.encode_state(per_key, Bucket({(10,): [{(1, 10): [1, (1,), 0]}, {}]}))
    with pytest.raises(state_codec.StateFormatError, match="pickled-bucket/1.*join/1"):
        state_codec.decode_state(join("inner"), stored)


# ---------------------------------------------------------------------- equivalence

KINDS = ("+I", "-U", "+U", "-D")
WIDE_LEFT = pa.schema([("id", pa.int64()), ("k1", pa.int32()), ("k2", pa.string())])
WIDE_RIGHT = pa.schema([("k1", pa.int64()), ("k2", pa.string()), ("v", pa.float64())])


def _positions() -> st.SearchStrategy[tuple]:
    return st.one_of(
        st.tuples(st.integers(0, 4)),
        st.tuples(st.integers(0, 2), st.integers(0, 2)),
        st.just(()),
    )


def _change(row: st.SearchStrategy[tuple]) -> st.SearchStrategy[Change]:
    return st.builds(Change, st.sampled_from(KINDS), row, _positions())


NARROW = (
    st.tuples(st.integers(0, 3), st.one_of(st.none(), st.integers(0, 2))),
    st.tuples(st.one_of(st.none(), st.integers(0, 2)), st.sampled_from([None, "a", "b"])),
)
WIDE = (
    st.tuples(st.integers(0, 2), st.one_of(st.none(), st.integers(0, 1)), st.sampled_from(["x", "y", None])),
    st.tuples(st.one_of(st.none(), st.integers(0, 1)), st.sampled_from(["x", "y"]), st.sampled_from([0.5, -1.0, None])),
)


def _batches(rows) -> st.SearchStrategy[list]:
    side = [st.lists(_change(r), max_size=8) for r in rows]
    return st.lists(st.tuples(*side), min_size=1, max_size=5)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kind=st.sampled_from(("inner", "left", "right", "full")),
    wide=st.booleans(),
    with_residual=st.booleans(),
    data=st.data(),
)
def test_kernel_equals_the_per_key_stage(kind, wide, with_residual, data):
    if wide:
        batches = data.draw(_batches(WIDE))
        residual = (lambda row: row[5] is None or row[5] > 0) if with_residual else None
        stage = Join(kind, (1, 2), (0, 1), 3, 3, residual=residual, input_schemas=(WIDE_LEFT, WIDE_RIGHT))
    else:
        batches = data.draw(_batches(NARROW))
        residual = (lambda row: row[3] != "b") if with_residual else None
        stage = join(kind, residual)
    kernel, per_key = Host(stage), Host(stage, PerKeyAdapter(stage))
    assert isinstance(kernel.runner, JoinKernel)
    for left, right in batches:
        assert kernel.run(left, right) == per_key.run(left, right)
    assert kernel.metrics == per_key.metrics


# ---------------------------------------------------------------------- stored rows apart


def _random_changes(rng, n: int, row) -> list[Change]:
    return [Change(rng.choice(KINDS), row(), (rng.randint(0, 3),)) for _ in range(n)]


@pytest.mark.parametrize("kind", ["inner", "left", "right", "full"])
def test_stored_rows_the_batch_cannot_reach_are_kept_apart_and_stored_as_they_were(kind, monkeypatch):
    """A call reads only the stored rows its batch changes or joins with (``_Run._split``):
    the same changes and the same stored bytes as a call over every stored row, on batches
    that each touch a few of many stored rows."""
    import random

    import tidemark.engine.kernels.join as join_module

    rng = random.Random(kind)
    stage = join(kind)
    split, whole = Host(stage), Host(stage)
    kept_apart = []
    original = join_module._Run._split

    def counting(self, side, stored, batches):
        active, rest = original(self, side, stored, batches)
        kept_apart.append(0 if rest is None else rest.height)
        return active, rest

    def left_row():
        return (rng.randint(0, 60), rng.choice([None, *range(8)]))

    def right_row():
        return (rng.choice([None, *range(8)]), rng.choice(["a", "b", None]))

    for n in range(40):
        sizes = (60, 8) if n == 0 else (rng.randint(0, 6), rng.randint(0, 1))
        left, right = _random_changes(rng, sizes[0], left_row), _random_changes(rng, sizes[1], right_row)
        with monkeypatch.context() as m:
            m.setattr(join_module._Run, "_split", counting)
            got = split.run(left, right)
        with monkeypatch.context() as m:
            m.setattr(join_module, "_splittable", lambda schema: False)
            assert got == whole.run(left, right)
        assert split.stored == whole.stored
    assert sum(kept_apart) > 200  # most calls kept most stored rows apart
