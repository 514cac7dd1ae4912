"""The normalize kernel against the per-key normalize stage.

Equivalence: over random multi-batch upsert inputs (several records of one key in a batch,
records at one position, tombstones for keys never seen, ``-U`` records, NULLs in compared
and uncompared columns, positions of different lengths, one- and two-column keys, with and
without ``compared``) the kernel emits, per key, the same changes in the same order as
``PerKeyAdapter`` and counts the same metrics. Its state goes through ``state_codec`` between
batches, as on the Spark host, and each batch picks the kernel or the per-key path over the
same stored state, so a checkpoint written by either is read by the other."""

from __future__ import annotations

from collections import Counter
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_harness import RECORDS, StoredHost, c, per_key_view

from tidemark.engine import state_codec
from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change
from tidemark.engine.driver import Bucket, PerKeyAdapter, batch_stage
from tidemark.engine.kernels.normalize import KERNEL_MIN_CHANGES, NormalizeKernel
from tidemark.engine.stage import BatchContext
from tidemark.engine.stages.normalize import KERNEL_ENV, Normalize
from tidemark.engine.types import parse_type

COLUMNS = (("id", parse_type("BIGINT")), ("grp", parse_type("STRING")), ("v", parse_type("INT")))


def normalize(pk=(0,), compared=None, columns=COLUMNS) -> Normalize:
    return Normalize(pk, len(columns), name="normalize:t", columns=columns, compared=compared)


def stored_host(stage: Normalize) -> StoredHost:
    return StoredHost(stage, NormalizeKernel(stage))


# ---------------------------------------------------------------------- literal cases


def test_the_kernel_is_what_the_stage_runs_unless_turned_off(monkeypatch):
    stage = normalize()
    assert isinstance(batch_stage(stage), NormalizeKernel)
    assert batch_stage(stage).min_changes == KERNEL_MIN_CHANGES
    assert state_codec.format_of(stage) == "normalize-last-row/1"
    monkeypatch.setenv(KERNEL_ENV, "0")
    assert isinstance(batch_stage(stage), PerKeyAdapter)
    assert state_codec.format_of(stage) == "normalize-last-row/1"


def test_record_by_record_within_a_batch():
    host = stored_host(normalize())
    assert host.run(ChangeBatch(changes=[c("+I", 1, "a", 1, pos=1)])) == [c("+I", 1, "a", 1, pos=1)]
    out = host.run(ChangeBatch(changes=[
        c("+U", 1, "b", 2, pos=3), c("-D", 1, "x", 0, pos=4), c("+I", 1, "a", 1, pos=2),  # arrival order is not position order
        c("+I", 2, "z", 9, pos=5), c("+I", 2, "z", 9, pos=6),  # the second is unchanged: dropped
        c("-D", 3, "q", 1, pos=7),  # never seen: counted
    ]))  # fmt: skip
    assert out == [
        c("-U", 1, "a", 1, pos=3), c("+U", 1, "b", 2, pos=3), c("-D", 1, "b", 2, pos=4), c("+I", 2, "z", 9, pos=5),
    ]  # fmt: skip
    assert host.metrics == Counter({"retractions_without_state": 1})
    assert state_codec.decode_state(host.stage, host.stored).states == {(2,): (2, "z", 9)}


def test_an_upsert_equal_on_the_compared_columns_keeps_the_stored_row():
    host = stored_host(normalize(compared=(0, 1)))
    host.run(ChangeBatch(changes=[c("+I", 1, "a", 1, pos=1)]))
    assert host.run(ChangeBatch(changes=[c("+U", 1, "a", 7, pos=2), c("+U", 1, "b", 8, pos=3)])) == [
        c("-U", 1, "a", 1, pos=3), c("+U", 1, "b", 8, pos=3),  # the before-image is the row the stored one kept
    ]  # fmt: skip


def test_batches_it_cannot_type_take_the_per_key_path():
    """A DECIMAL in ``Change`` tuples keeps its own scale only on the per-key path; a stage
    without column types has no Arrow schema to type the batch with."""
    dec = (("id", parse_type("BIGINT")), ("p", parse_type("DECIMAL(10, 2)")))
    host = stored_host(normalize(columns=dec))
    assert host.run(ChangeBatch(changes=[c("+I", 1, Decimal("1.5"), pos=1)])) == [c("+I", 1, Decimal("1.5"), pos=1)]
    assert str(host.run(ChangeBatch(changes=[c("-D", 1, Decimal("1.5"), pos=2)]))[0].row[1]) == "1.5"
    untyped = Normalize((0,), 2)
    assert NormalizeKernel(untyped).process_batch([ChangeBatch(changes=[c("+I", 1, [1], pos=1)])], Bucket(), BatchContext())[1].changes() == [
        c("+I", 1, [1], pos=1)
    ]  # fmt: skip


# ---------------------------------------------------------------------- equivalence



@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=st.lists(st.tuples(RECORDS, st.booleans(), st.booleans()), min_size=1, max_size=5),
    pk=st.sampled_from([(0,), (0, 1)]),
    compared=st.sampled_from([None, (0, 1), (0,)]),
)
def test_kernel_equals_the_per_key_stage(batches, pk, compared):
    """Per batch: whether the stored host runs the kernel, and whether the batch arrives as
    Arrow columns (the Spark host's form) or ``Change`` tuples (the replay host's). A bucket
    kept in memory runs through both paths too, as the replay host's would."""
    if compared is not None and not set(pk) <= set(compared):
        compared = tuple(sorted({*compared, *pk}))
    stage = normalize(pk=pk, compared=compared)
    reference, ref_bucket, ref_metrics = PerKeyAdapter(stage), Bucket(), Counter()
    host = stored_host(stage)
    in_memory = Bucket()  # the replay host's: one bucket kept between batches, never stored
    schema = pa.schema([(n, pa.int64() if t.name == "BIGINT" else pa.string() if t.name == "STRING" else pa.int32()) for n, t in COLUMNS])
    for records, kernel, columnar in batches:
        changes = [Change(kind, (i, g, v), pos) for kind, i, g, v, pos in records]
        ref_bucket, want = reference.process_batch([ChangeBatch(changes=list(changes))], ref_bucket, BatchContext(metrics=ref_metrics))
        batch = ChangeBatch.from_table(ChangeBatch.from_changes(changes, schema).table()) if columnar else ChangeBatch(changes=list(changes))
        got = host.run(batch, kernel=kernel)
        assert per_key_view(stage, got) == per_key_view(stage, want.changes())
        in_memory, got = (host.kernel if columnar else host.per_key).process_batch([batch], in_memory, BatchContext())
        assert per_key_view(stage, got.changes()) == per_key_view(stage, want.changes())
        assert in_memory.states == ref_bucket.states
        assert state_codec.decode_state(stage, host.stored).states == ref_bucket.states
    assert +host.metrics == +ref_metrics


@pytest.mark.parametrize("kernel", [True, False])
def test_stored_state_is_the_same_table_whichever_path_wrote_it(kernel):
    changes = [c("+I", 2, "b", 1, pos=1), c("+I", 1, "a", None, pos=2), c("+U", 2, None, 3, pos=3)]
    host = stored_host(normalize())
    host.run(ChangeBatch(changes=changes), kernel=kernel)
    table = state_codec.read_table(host.stored)
    assert table.schema.field("row").type == pa.struct([("id", pa.int64()), ("grp", pa.string()), ("v", pa.int32())])
    assert sorted(table.column("row").to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "grp": "a", "v": None}, {"id": 2, "grp": None, "v": 3},
    ]  # fmt: skip


def test_a_row_of_another_width_is_refused_as_the_per_key_stage_refuses_it():
    kernel = NormalizeKernel(normalize())
    with pytest.raises(ValueError, match=r"^normalize:t: row \(1, 'a'\) has 2 columns, expected 3$"):
        kernel.process_batch([ChangeBatch(changes=[c("+I", 1, "a", pos=1)])], Bucket(), BatchContext())
