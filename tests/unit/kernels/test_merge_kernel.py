"""The merge engine kernel (``deduplicate``, ``first-row``, ``partial-update`` and
``aggregation``) against the per-key merge stage.

Equivalence: over random multi-batch inputs (several records of one key in a batch, exact
``+X``/``-X`` pairs that cancel, records at one position, retractions of keys never stored,
positions that sort before the stored row's, NULLs, one- and two-column keys) with each
producer the kernel takes (``none``, ``input``, ``lookup``), ``ignore-delete``,
``changelog-producer.row-deduplicate``, ``partial-update.remove-record-on-delete``, a
sequence group, ``sequence.field`` (one and two fields, NULLs, either sort order, so tombstones and late
records with smaller sequences), and ``aggregation`` functions (with retractions,
``ignore-retract`` and ``aggregation.remove-record-on-delete``), the kernel emits per key the
same changes in the same order as ``PerKeyAdapter``, counts the same metrics and stores the
same states. The state goes through ``state_codec`` between batches, as on the Spark host, and
each batch picks the kernel or the per-key path over the same stored state."""

from __future__ import annotations

import random
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
from tidemark.engine.errors import InputError
from tidemark.engine.kernels.merge import KERNEL_MIN_CHANGES, MergeKernel, supports
from tidemark.engine.stage import BatchContext
from tidemark.engine.stages.merge.stage import KERNEL_ENV, MergeEngineStage, MergeState
from tidemark.engine.stages.merge_engine import build_merge_engine
from tidemark.engine.types import parse_type

NAMES = ["id", "grp", "v"]
TYPES = [parse_type("BIGINT"), parse_type("STRING"), parse_type("INT")]
SCHEMA = pa.schema([("id", pa.int64()), ("grp", pa.string()), ("v", pa.int32())])


def merge(engine: str = "deduplicate", producer: str = "lookup", pk=(0,), **options: str) -> MergeEngineStage:
    opts = {"merge-engine": engine, "changelog-producer": producer, **options}
    return build_merge_engine("t", NAMES, pk, opts, input_retracts=engine != "first-row", types=TYPES)


def stored_host(stage: MergeEngineStage) -> StoredHost:
    return StoredHost(stage, MergeKernel(stage))


def columns(changes: list[Change]) -> ChangeBatch:
    return ChangeBatch.from_table(ChangeBatch.from_changes(changes, SCHEMA).table())


# ---------------------------------------------------------------------- literal cases


def test_the_kernel_runs_the_engines_it_computes_unless_turned_off(monkeypatch):
    monkeypatch.delenv(KERNEL_ENV, raising=False)
    for stage in (merge(), merge("first-row", "none"), merge(producer="input"), merge(**{"sequence.field": "v"}),
                  merge("partial-update", **{"ignore-delete": "true"}), merge(producer="full-compaction")):
        assert isinstance(batch_stage(stage), MergeKernel)
        assert batch_stage(stage).min_changes == KERNEL_MIN_CHANGES
    assert isinstance(batch_stage(merge("partial-update", **{
        "fields.v.sequence-group": "grp", "fields.grp.aggregate-function": "max", "ignore-delete": "true"})), MergeKernel)
    for stage in (
        merge("partial-update", **{"fields.v.sequence-group": "grp", "fields.grp.aggregate-function": "first_value",
                                   "ignore-delete": "true"}),
        merge("aggregation", **{"fields.grp.aggregate-function": "listagg", "fields.grp.distinct": "true",
                                "fields.grp.list-agg-delimiter": ", ", "ignore-delete": "true"}),
        build_merge_engine("t", ["id", "x"], (0,), {}, input_retracts=True, types=[parse_type("BIGINT"), parse_type("DOUBLE")]),
    ):
        assert not supports(stage) and isinstance(batch_stage(stage), PerKeyAdapter)
    monkeypatch.setenv(KERNEL_ENV, "0")
    assert isinstance(batch_stage(merge()), PerKeyAdapter)


def test_deduplicate_keeps_the_last_record_and_emits_the_lookup_changelog():
    host = stored_host(merge())
    assert host.run(columns([c("+I", 1, "a", 1, pos=1), c("+I", 1, "b", 2, pos=2), c("+I", 2, "x", 1, pos=3)])) == [
        c("+I", 1, "b", 2, pos=2),
        c("+I", 2, "x", 1, pos=3),
    ]
    assert host.run(columns([c("-D", 2, "x", 1, pos=5), c("+I", 1, "c", 3, pos=4)])) == [
        c("-D", 2, "x", 1, pos=5),
        c("-U", 1, "b", 2, pos=4),
        c("+U", 1, "c", 3, pos=4),
    ]
    assert host.fell_back == 0
    assert state_codec.decode_state(host.stage, host.stored).states[(1,)].row == (1, "c", 3)


def test_an_exact_pair_cancels_and_a_record_before_the_stored_position_loses_to_the_stored_row():
    host = stored_host(merge(producer="none"))
    host.run(columns([c("+I", 1, "a", 1, pos=(1, 9))]))
    # (0, 5) sorts before the stored (1, 9): the stored row folds last and stays
    assert host.run(columns([c("+I", 1, "z", 0, pos=(0, 5)), c("+I", 2, "p", 1, pos=(2, 1)), c("-D", 2, "p", 1, pos=(2, 2))])) == []
    assert host.metrics == Counter({"merge_pairs_cancelled": 1})
    assert state_codec.decode_state(host.stage, host.stored).states[(1,)].pos == (1, 9)
    assert host.fell_back == 0


def test_first_row_keeps_the_stored_row_and_a_tie_at_the_first_position_takes_the_per_key_path():
    host = stored_host(merge("first-row", "lookup"))
    assert host.run(columns([c("+I", 1, "b", 2, pos=3), c("+I", 1, "a", 1, pos=2)])) == [c("+I", 1, "a", 1, pos=3)]
    assert host.run(columns([c("+I", 1, "z", 0, pos=1)])) == []
    assert host.fell_back == 0
    assert host.run(columns([c("+I", 2, "b", 1, pos=7), c("+I", 2, "a", 1, pos=7)])) == [c("+I", 2, "a", 1, pos=7)]
    assert host.fell_back == 1  # the tie is the rows' repr's to break


def test_a_sequence_field_keeps_the_largest_sequence_and_a_tombstone_across_batches():
    host = stored_host(merge(producer="none", **{"sequence.field": "v"}))
    # the largest v wins whatever the positions; a null sequence sorts first
    assert host.run(columns([c("+I", 1, "a", 5, pos=1), c("+I", 1, "b", 2, pos=2), c("+I", 2, "x", None, pos=3)])) == [
        c("+I", 1, "a", 5, pos=2),
        c("+I", 2, "x", None, pos=3),
    ]
    # a delete of the largest sequence leaves a tombstone; a later record of a smaller v loses to it
    assert host.run(columns([c("-D", 1, "a", 7, pos=4)])) == [c("-D", 1, "a", 5, pos=4)]
    assert host.run(columns([c("+I", 1, "c", 6, pos=5), c("+I", 2, "y", 1, pos=6)])) == [c("+U", 2, "y", 1, pos=6)]
    state = state_codec.decode_state(host.stage, host.stored).states[(1,)]
    assert (state.row, state.tombstone, state.pos) == (None, (1, "a", 7), (5,))
    assert host.run(columns([c("+I", 1, "d", 8, pos=7)])) == [c("+I", 1, "d", 8, pos=7)]
    assert host.fell_back == 0


def test_partial_update_completes_a_row_field_by_field_and_a_delete_removes_it():
    host = stored_host(merge("partial-update", "lookup", **{"partial-update.remove-record-on-delete": "true"}))
    assert host.run(columns([c("+I", 1, "a", None, pos=1), c("+I", 1, None, 5, pos=2), c("+I", 2, None, 1, pos=3)])) == [
        c("+I", 1, "a", 5, pos=2),
        c("+I", 2, None, 1, pos=3),
    ]
    # a null never overwrites; the stored row is the first item of the fold
    assert host.run(columns([c("+U", 1, None, 6, pos=4)])) == [c("-U", 1, "a", 5, pos=4), c("+U", 1, "a", 6, pos=4)]
    # after a -D only what later adds carry is left
    assert host.run(columns([c("-D", 1, "a", 6, pos=5), c("+I", 1, None, 7, pos=6), c("-D", 2, None, 1, pos=7)])) == [
        c("-U", 1, "a", 6, pos=6),
        c("+U", 1, None, 7, pos=6),
        c("-D", 2, None, 1, pos=7),
    ]
    assert state_codec.decode_state(host.stage, host.stored).states == {
        (1,): MergeState(row=(1, None, 7), pos=(6,))
    }
    assert host.fell_back == 0


@pytest.mark.parametrize("kinds", [["+I"], ["+I", "+U", "-U", "-D"]], ids=["inserts", "retractions"])
def test_partial_update_sequence_groups_take_the_last_update_of_the_greatest_sequence(kinds):
    """Random batches into a free column ``f`` and a group ``s`` -> ``m``, the kernel on
    every other batch, against the per-key stage: the same changes and stored states."""
    names, types = ["id", "f", "s", "m"], [parse_type(t) for t in ("BIGINT", "STRING", "INT", "STRING")]
    schema = pa.schema([("id", pa.int64()), ("f", pa.string()), ("s", pa.int32()), ("m", pa.string())])
    opts = {"merge-engine": "partial-update", "changelog-producer": "lookup", "fields.s.sequence-group": "m"}
    stage = build_merge_engine("t", names, (0,), opts, input_retracts=True, types=types)
    host = StoredHost(stage, MergeKernel(stage))
    # the last item of the greatest sequence sets the group, nulls included; a retraction
    # there nulls the members; a null sequence says nothing about the group
    assert host.run(ChangeBatch.from_table(ChangeBatch.from_changes([
        c("+I", 1, "a", 2, "x", pos=1), c("+I", 1, None, 1, "old", pos=2), c("+I", 1, "b", None, "none", pos=3),
        c("+I", 1, None, 2, "y", pos=4), c("-U", 1, "z", 3, "y", pos=5),
    ], schema).table())) == [c("+I", 1, "b", 3, None, pos=5)]
    rng = random.Random(3)
    assert_random_batches_equal_per_key(stage, schema, lambda n: [
        c(rng.choice(kinds), rng.randrange(4), rng.choice(["a", "b", None]), rng.choice([1, 2, 3, None]),
          rng.choice(["x", "y", None]), pos=n * 10 + rng.randrange(8)) for _ in range(rng.randrange(1, 6))])


def assert_random_batches_equal_per_key(stage: MergeEngineStage, schema: pa.Schema, batch) -> None:
    """200 batches ``batch(n)`` as Arrow columns, the kernel on every other one, against
    the per-key stage: the same changes per key and stored states; most kernel calls stay on
    the kernel (the rest are ties of two records at one position)."""
    host, reference, bucket = StoredHost(stage, MergeKernel(stage)), PerKeyAdapter(stage), Bucket()
    kernel_calls = 0
    for n in range(200):
        changes = batch(n)
        bucket, want = reference.process_batch([ChangeBatch(changes=list(changes))], bucket, BatchContext())
        got = host.run(ChangeBatch.from_table(ChangeBatch.from_changes(changes, schema).table()), kernel=n % 2 == 0)
        assert per_key_view(stage, got) == per_key_view(stage, want.changes())
        assert state_codec.decode_state(stage, host.stored).states == bucket.states
        kernel_calls += n % 2 == 0
    assert host.fell_back < kernel_calls / 2


@pytest.mark.parametrize("kinds", [["+I"], ["+I", "+U", "-U", "-D"]], ids=["inserts", "retractions"])
def test_sequence_group_members_fold_with_their_functions(kinds):
    """A group ``s`` -> ``m`` (sum), ``b`` (bool_or, retractions ignored), ``x`` (max,
    retractions ignored), ``t`` (no function), ``l`` (last_value), and a free column ``f``:
    every record that names the group's sequence folds into the orderless functions, older
    ones too; last_value takes the last record that moved the sequence, or null after a later
    retraction. Random batches, the kernel on every other batch, against the per-key stage:
    the same changes and stored states."""
    names = ["id", "f", "s", "m", "b", "x", "t", "l"]
    types = [parse_type(t) for t in ("BIGINT", "STRING", "INT", "INT", "BOOLEAN", "BIGINT", "STRING", "STRING")]
    schema = pa.schema([("id", pa.int64()), ("f", pa.string()), ("s", pa.int32()), ("m", pa.int32()),
                        ("b", pa.bool_()), ("x", pa.int64()), ("t", pa.string()), ("l", pa.string())])
    opts = {"merge-engine": "partial-update", "changelog-producer": "lookup", "fields.s.sequence-group": "m,b,x,t,l",
            "fields.m.aggregate-function": "sum", "fields.b.aggregate-function": "bool_or",
            "fields.b.ignore-retract": "true", "fields.x.aggregate-function": "max", "fields.x.ignore-retract": "true",
            "fields.l.aggregate-function": "last_value"}
    stage = build_merge_engine("t", names, (0,), opts, input_retracts=True, types=types)
    assert supports(stage)
    host = StoredHost(stage, MergeKernel(stage))
    # an older record still adds to the sum and reaches max, not last_value; a null sequence
    # says nothing
    assert host.run(ChangeBatch.from_table(ChangeBatch.from_changes([
        c("+I", 1, "a", 2, 5, False, 7, "x", "new", pos=1), c("+I", 1, None, 1, 3, True, 9, "old", "old", pos=2),
        c("+I", 1, "b", None, 100, None, 100, "none", "none", pos=3),
    ], schema).table())) == [c("+I", 1, "b", 2, 8, True, 9, "x", "new", pos=3)]
    # a later retraction nulls last_value, whatever its sequence
    assert host.run(ChangeBatch.from_table(ChangeBatch.from_changes([
        c("-U", 1, None, 1, 3, None, None, None, "old", pos=4),
    ], schema).table())) == [c("-U", 1, "b", 2, 8, True, 9, "x", "new", pos=4), c("+U", 1, "b", 2, 5, True, 9, "x", None, pos=4)]
    rng = random.Random(5)
    assert_random_batches_equal_per_key(stage, schema, lambda n: [
        c(rng.choice(kinds), rng.randrange(4), rng.choice(["a", None]), rng.choice([1, 2, 3, None]),
          rng.choice([1, -2, None]), rng.choice([True, False, None]), rng.choice([4, 8, None]),
          rng.choice(["x", None]), rng.choice(["p", "q", None]), pos=n * 10 + rng.randrange(8))
        for _ in range(rng.randrange(1, 6))])


def test_a_sequence_group_sum_past_its_type_and_a_retracted_max_take_the_per_key_path():
    names, types = ["id", "s", "m"], [parse_type(t) for t in ("BIGINT", "INT", "INT")]
    schema = pa.schema([("id", pa.int64()), ("s", pa.int32()), ("m", pa.int32())])
    for function, changes, error in (
        ("sum", [c("+I", 1, 1, 2**31 - 1, pos=1), c("+I", 1, 2, 1, pos=2)], "INT overflow in 'sum'"),
        ("max", [c("+I", 1, 1, 5, pos=1), c("-U", 1, 2, 5, pos=2)], "does not support retraction"),
    ):
        opts = {"merge-engine": "partial-update", "fields.s.sequence-group": "m", "fields.m.aggregate-function": function}
        # a max on an input that declares no retractions (the planner refuses it on one that does)
        stage = build_merge_engine("t", names, (0,), opts, input_retracts=function == "sum", types=types)
        host = StoredHost(stage, MergeKernel(stage))
        with pytest.raises(InputError, match=error):
            host.run(ChangeBatch.from_table(ChangeBatch.from_changes(changes, schema).table()))
        assert host.fell_back == 1


def test_aggregation_folds_each_column_with_its_function_and_an_overflow_takes_the_per_key_path():
    host = stored_host(merge("aggregation", "lookup", **{
        "fields.v.aggregate-function": "sum", "fields.grp.aggregate-function": "first_non_null_value", "ignore-delete": "true",
    }))
    assert host.run(columns([c("+I", 1, None, 2, pos=1), c("+I", 1, "b", None, pos=2), c("+I", 1, "c", 3, pos=3)])) == [
        c("+I", 1, "b", 5, pos=3),
    ]
    assert host.run(columns([c("+I", 1, "d", 2**31 - 10, pos=4), c("-D", 1, "e", 7, pos=5)])) == [
        c("-U", 1, "b", 5, pos=4), c("+U", 1, "b", 2**31 - 5, pos=4),
    ]
    assert host.fell_back == 0
    with pytest.raises(InputError, match="column 'v': INT overflow in 'sum'"):
        host.run(columns([c("+I", 1, None, 5, pos=6)]))
    assert host.fell_back == 1


def test_aggregation_multiplies_and_joins_strings_skipping_blanks():
    host = stored_host(merge("aggregation", "lookup", **{
        "fields.v.aggregate-function": "product", "fields.grp.aggregate-function": "listagg",
        "fields.grp.list-agg-delimiter": "; ", "ignore-delete": "true",
    }))
    # a blank or null value never enters listagg; product skips nulls
    assert host.run(columns([c("+I", 1, "a", 3, pos=1), c("+I", 1, " ", None, pos=2), c("+I", 1, "b", -2, pos=3),
                             c("+I", 2, None, 5, pos=4)])) == [c("+I", 1, "a; b", -6, pos=3), c("+I", 2, None, 5, pos=4)]
    # the stored row is the first factor and the first part
    assert host.run(columns([c("+I", 1, "\x1c", 2**20, pos=5), c("+I", 2, "z", 0, pos=6)])) == [
        c("-U", 1, "a; b", -6, pos=5), c("+U", 1, "a; b", -(6 * 2**20), pos=5),
        c("-U", 2, None, 5, pos=6), c("+U", 2, "z", 0, pos=6),
    ]
    assert host.fell_back == 0
    # 6 * 2**20 * 2**10 leaves INT: the per-key path reports it
    with pytest.raises(InputError, match="column 'v': INT overflow in 'product'"):
        host.run(columns([c("+I", 1, "c", 2**10, pos=7)]))
    assert host.fell_back == 1


def test_distinct_listagg_appends_each_token_at_its_first_occurrence():
    host = stored_host(merge("aggregation", "lookup", **{
        "fields.grp.aggregate-function": "listagg", "fields.grp.distinct": "true", "ignore-delete": "true",
    }))
    assert supports(host.stage)
    # the first non-blank value stays whole (its repeated and blank tokens too); a later
    # token is appended where it first occurs, blank tokens never
    assert host.run(columns([c("+I", 1, " ", 1, pos=1), c("+I", 1, "a,a, ,b", 1, pos=2), c("+I", 1, "c,a,,c", 1, pos=3),
                             c("+I", 1, "b,d", 1, pos=4), c("+I", 2, "x", 1, pos=5), c("+I", 3, None, 1, pos=6)])) == [
        c("+I", 1, "a,a, ,b,c,d", 1, pos=4), c("+I", 2, "x", 1, pos=5), c("+I", 3, None, 1, pos=6),
    ]
    # the stored row is the first value of the next fold; a record that adds nothing leaves it
    assert host.run(columns([c("+I", 1, "d,e,a", 2, pos=7), c("+I", 2, "x,x", 2, pos=8)])) == [
        c("-U", 1, "a,a, ,b,c,d", 1, pos=7), c("+U", 1, "a,a, ,b,c,d,e", 2, pos=7),
        c("-U", 2, "x", 1, pos=8), c("+U", 2, "x", 2, pos=8),
    ]
    assert host.fell_back == 0


def test_distinct_listagg_equals_the_per_key_stage_on_random_tokens():
    """Values of a few tokens (blank ones, repeats, a value that is only delimiters) in merge
    order across batches, with and without ``sequence.field`` (which puts later records
    before the stored row), each batch through the kernel and the per-key path."""
    words = [None, "", " ", ",", "a", "b", "a,b", "b,a,a", " ,c", "c, a", "a,,b"]
    for sequenced in (False, True):
        opts = {"fields.grp.aggregate-function": "listagg", "fields.grp.distinct": "true", "ignore-delete": "true"}
        if sequenced:
            opts["sequence.field"] = "v"
        stage = merge("aggregation", "lookup", **opts)
        rng = random.Random(7)
        host, reference, bucket = stored_host(stage), PerKeyAdapter(stage), Bucket()
        for b in range(30):
            changes = [c("+I", rng.randrange(4), rng.choice(words), rng.randrange(100), pos=(b, i)) for i in range(8)]
            bucket, want = reference.process_batch([ChangeBatch(changes=list(changes))], bucket, BatchContext())
            assert per_key_view(stage, host.run(columns(changes))) == per_key_view(stage, want.changes())
            assert state_codec.decode_state(stage, host.stored).states == bucket.states
        assert host.fell_back == 0


def test_decimal_sums_fold_as_decimals_and_a_sum_past_the_exact_range_takes_the_per_key_path():
    """``sum`` on DECIMAL columns, retractions included, against the per-key stage: exact
    where the per-key fold's Python decimals are (and the type holds the sum), per key beyond."""
    names, pk = ["id", "amt", "wide"], (0,)
    types = [parse_type(t) for t in ("BIGINT", "DECIMAL(10, 2)", "DECIMAL(38, 20)")]
    opts = {"merge-engine": "aggregation", "changelog-producer": "lookup",
            "fields.amt.aggregate-function": "sum", "fields.wide.aggregate-function": "sum"}
    schema = pa.schema([("id", pa.int64()), ("amt", pa.decimal128(10, 2)), ("wide", pa.decimal128(38, 20))])
    stage = build_merge_engine("t", names, pk, opts, input_retracts=True, types=types)
    assert supports(stage)
    host, reference, bucket = StoredHost(stage, MergeKernel(stage)), PerKeyAdapter(stage), Bucket()
    rng = random.Random(3)

    def record(kind: str, i: int, pos: int, scale: int = 1) -> Change:
        amt = Decimal(rng.randrange(-10**6, 10**6) * scale) / 100 if rng.random() < 0.9 else None
        wide = Decimal(rng.randrange(-10**9, 10**9)) / 10**20 if rng.random() < 0.9 else None
        return c(kind, i, amt, wide, pos=pos)

    def run(changes: list[Change]) -> None:
        nonlocal bucket
        bucket, want = reference.process_batch([ChangeBatch(changes=list(changes))], bucket, BatchContext())
        assert host.run(ChangeBatch.from_table(ChangeBatch.from_changes(changes, schema).table())) == want.changes()
        assert state_codec.decode_state(stage, host.stored).states == bucket.states

    pos = 0
    for _ in range(20):
        changes = []
        for _ in range(12):
            pos += 1
            changes.append(record(rng.choice(["+I", "+I", "-U", "-D"]), rng.randrange(5), pos))
        run(changes)
    assert host.fell_back == 0
    # a sum of DECIMAL(10, 2) at 10**8 or more leaves the type: the per-key path decides
    run([c("+I", 9, Decimal("99999999.99"), None, pos=pos + 1), c("+I", 9, Decimal("0.01"), None, pos=pos + 2)])
    assert host.fell_back == 1


def test_aggregation_folds_retractions_and_a_delete_removes_the_row():
    host = stored_host(merge("aggregation", "lookup", **{
        "aggregation.remove-record-on-delete": "true",
        "fields.v.aggregate-function": "sum", "fields.grp.aggregate-function": "last_non_null_value",
    }))
    # a -U subtracts, and a retracted non-null value leaves last_non_null_value null
    assert host.run(columns([c("+I", 1, "a", 5, pos=1), c("+I", 1, None, 2, pos=2), c("-U", 1, "a", 3, pos=3)])) == [
        c("+I", 1, None, 4, pos=3),
    ]
    # only the items after the key's last -D fold
    assert host.run(columns([c("-D", 1, None, 0, pos=4), c("+I", 1, "b", 1, pos=5)])) == [
        c("-U", 1, None, 4, pos=5), c("+U", 1, "b", 1, pos=5),
    ]
    assert host.run(columns([c("-D", 1, "b", 1, pos=6)])) == [c("-D", 1, "b", 1, pos=6)]
    assert state_codec.decode_state(host.stage, host.stored).states == {}
    assert host.fell_back == 0


def test_aggregation_counts_and_folds_booleans_as_the_per_key_stage():
    names, pk = ["id", "flag", "any", "n"], (0,)
    types = [parse_type(t) for t in ("BIGINT", "BOOLEAN", "BOOLEAN", "INT")]
    opts = {"merge-engine": "aggregation", "changelog-producer": "lookup", "ignore-delete": "true",
            "fields.flag.aggregate-function": "bool_and", "fields.any.aggregate-function": "bool_or",
            "fields.n.aggregate-function": "count"}
    schema = pa.schema([("id", pa.int64()), ("flag", pa.bool_()), ("any", pa.bool_()), ("n", pa.int32())])
    stage = build_merge_engine("t", names, pk, opts, input_retracts=True, types=types)
    host, reference, bucket = StoredHost(stage, MergeKernel(stage)), PerKeyAdapter(stage), Bucket()
    batches = [
        [c("+I", 1, True, None, None, pos=1), c("+I", 1, None, False, 9, pos=2), c("+I", 2, None, None, None, pos=3)],
        [c("+I", 1, False, True, 1, pos=4), c("+I", 2, True, None, 4, pos=5), c("+I", 3, True, True, 0, pos=0)],
    ]
    for changes in batches:
        bucket, want = reference.process_batch([ChangeBatch(changes=list(changes))], bucket, BatchContext())
        assert host.run(ChangeBatch.from_table(ChangeBatch.from_changes(changes, schema).table())) == want.changes()
        assert state_codec.decode_state(stage, host.stored).states == bucket.states
    assert host.fell_back == 0
    assert {k: s.row for k, s in bucket.states.items()} == {
        (1,): (1, False, True, 2), (2,): (2, True, None, 1), (3,): (3, True, True, 1),
    }


def test_the_input_producer_passes_every_record_on_in_the_canonical_order():
    host = stored_host(merge(producer="input", **{"ignore-delete": "true"}))
    got = host.run(columns([c("+I", 2, "b", 1, pos=2), c("-D", 1, "a", 1, pos=1), c("+I", 1, "a", 1, pos=3)]))
    assert got == [c("+I", 2, "b", 1, pos=2), c("+I", 1, "a", 1, pos=3)]
    assert host.metrics == Counter({"merge_deletes_ignored": 1})


def test_full_compaction_emits_at_barriers_what_changed_since_the_last_one():
    stage = merge(producer="full-compaction", **{"changelog-producer.compaction-interval": "1 s"})
    host = stored_host(stage)
    assert host.run(columns([c("+I", 1, "a", 1, pos=1), c("+I", 2, "b", 1, pos=2)]), now_ms=0) == []
    # key 2 is deleted before its first barrier: it stays, without a row, until the barrier
    assert host.run(columns([c("-D", 2, "b", 1, pos=3), c("+I", 1, "a", 2, pos=4)]), now_ms=500) == []
    assert state_codec.decode_state(stage, host.stored).states[(2,)] == MergeState(None, (3,), None, None, 0)
    # the barrier at 1,000 ms: keys 1 and 2 changed in the interval before; key 3 changes in this one
    assert host.run(columns([c("+I", 3, "c", 1, pos=5)]), now_ms=1000) == [c("+I", 1, "a", 2, pos=4)]
    states = state_codec.decode_state(stage, host.stored)
    assert set(states.states) == {(1,), (3,)} and host.kernel.next_wakeup(states) == 2000
    # key 1 written again (the same row) at 2,000 ms is pending until 3,000
    assert host.run(columns([c("+I", 1, "a", 2, pos=6), c("+I", 4, "d", 1, pos=7)]), now_ms=2000) == [c("+I", 3, "c", 1, pos=5)]
    got = host.run(columns([c("+I", 5, "e", 1, pos=8)]), now_ms=3000)
    assert per_key_view(stage, got) == {
        (1,): [c("-U", 1, "a", 2, pos=6), c("+U", 1, "a", 2, pos=6)],  # no row-deduplicate: an unchanged row is re-emitted
        (4,): [c("+I", 4, "d", 1, pos=7)],
    }
    assert host.fell_back == 0


# ---------------------------------------------------------------------- equivalence

CONFIGS = st.sampled_from([
    ("deduplicate", "none", {}),
    ("deduplicate", "lookup", {}),
    ("deduplicate", "lookup", {"changelog-producer.row-deduplicate": "true"}),
    ("deduplicate", "input", {}),
    ("deduplicate", "none", {"ignore-delete": "true"}),
    ("deduplicate", "lookup", {"ignore-delete": "true"}),
    ("first-row", "none", {"ignore-delete": "true"}),
    ("first-row", "lookup", {"ignore-delete": "true"}),
    ("deduplicate", "none", {"sequence.field": "v"}),
    ("deduplicate", "lookup", {"sequence.field": "v", "sequence.field.sort-order": "descending"}),
    ("deduplicate", "input", {"sequence.field": "v"}),
    ("deduplicate", "lookup", {"sequence.field": "grp,v", "changelog-producer.row-deduplicate": "true"}),
    ("deduplicate", "none", {"sequence.field": "grp", "sequence.field.sort-order": "descending", "ignore-delete": "true"}),
    ("partial-update", "none", {"ignore-delete": "true"}),
    ("partial-update", "lookup", {"partial-update.remove-record-on-delete": "true"}),
    ("partial-update", "input", {"partial-update.remove-record-on-delete": "true"}),
    ("partial-update", "lookup", {"partial-update.remove-record-on-delete": "true", "sequence.field": "v"}),
    ("partial-update", "none", {"ignore-delete": "true", "sequence.field": "v", "sequence.field.sort-order": "descending"}),
    ("partial-update", "lookup", {"fields.v.sequence-group": "grp", "ignore-delete": "true"}),
    ("partial-update", "none", {"fields.v.sequence-group": "grp"}),
    ("partial-update", "input", {"fields.v.sequence-group": "grp", "ignore-delete": "true"}),
    ("partial-update", "lookup", {"fields.v.sequence-group": "grp", "partial-update.remove-record-on-sequence-group": "v"}),
    ("partial-update", "lookup", {"fields.v.sequence-group": "grp", "fields.grp.aggregate-function": "max",
                                  "ignore-delete": "true"}),
    ("partial-update", "none", {"fields.v.sequence-group": "grp", "fields.grp.aggregate-function": "min",
                                "fields.grp.ignore-retract": "true"}),
    ("partial-update", "lookup", {"fields.v.sequence-group": "grp", "fields.grp.aggregate-function": "last_value"}),
    ("aggregation", "lookup", {"fields.v.aggregate-function": "sum", "fields.grp.aggregate-function": "max", "ignore-delete": "true"}),
    ("aggregation", "none", {"fields.v.aggregate-function": "count", "fields.grp.aggregate-function": "last_non_null_value",
                             "ignore-delete": "true"}),
    ("aggregation", "input", {"fields.v.aggregate-function": "min", "fields.grp.aggregate-function": "first_value",
                              "ignore-delete": "true"}),
    ("aggregation", "lookup", {"fields.v.aggregate-function": "max", "fields.grp.aggregate-function": "first_non_null_value",
                               "changelog-producer.row-deduplicate": "true", "ignore-delete": "true"}),
    ("aggregation", "lookup", {"fields.v.aggregate-function": "sum", "fields.grp.aggregate-function": "last_value"}),
    ("aggregation", "none", {"sequence.field": "v", "fields.grp.aggregate-function": "last_value", "ignore-delete": "true"}),
    ("aggregation", "lookup", {"sequence.field": "v", "sequence.field.sort-order": "descending",
                               "fields.grp.aggregate-function": "min", "ignore-delete": "true"}),
    ("aggregation", "none", {"fields.v.aggregate-function": "count", "fields.grp.aggregate-function": "last_non_null_value"}),
    ("aggregation", "lookup", {"fields.v.aggregate-function": "max", "fields.v.ignore-retract": "true",
                               "fields.grp.aggregate-function": "first_value", "fields.grp.ignore-retract": "true"}),
    ("aggregation", "lookup", {"aggregation.remove-record-on-delete": "true", "fields.v.aggregate-function": "sum",
                               "fields.grp.aggregate-function": "last_non_null_value"}),
    ("aggregation", "none", {"aggregation.remove-record-on-delete": "true", "sequence.field": "v",
                             "fields.grp.aggregate-function": "last_value"}),
    ("aggregation", "input", {"aggregation.remove-record-on-delete": "true", "sequence.field": "v",
                              "sequence.field.sort-order": "descending", "fields.grp.aggregate-function": "min",
                              "fields.grp.ignore-retract": "true"}),
    ("aggregation", "lookup", {"fields.v.aggregate-function": "product", "fields.grp.aggregate-function": "listagg",
                               "ignore-delete": "true"}),
    ("aggregation", "lookup", {"fields.v.aggregate-function": "sum", "fields.grp.aggregate-function": "listagg",
                               "fields.grp.distinct": "true", "fields.grp.ignore-retract": "true"}),
    ("aggregation", "none", {"fields.v.aggregate-function": "product", "fields.v.ignore-retract": "true",
                             "fields.grp.aggregate-function": "listagg", "fields.grp.list-agg-delimiter": " | ",
                             "fields.grp.ignore-retract": "true"}),
    ("deduplicate", "full-compaction", {}),
    ("deduplicate", "full-compaction", {"changelog-producer.compaction-interval": "1 s"}),
    ("deduplicate", "full-compaction", {"changelog-producer.compaction-interval": "1 s", "sequence.field": "v",
                                        "changelog-producer.row-deduplicate": "true"}),
    ("partial-update", "full-compaction", {"changelog-producer.compaction-interval": "1 s", "ignore-delete": "true"}),
    ("partial-update", "full-compaction", {"partial-update.remove-record-on-delete": "true"}),
    ("aggregation", "full-compaction", {"changelog-producer.compaction-interval": "1 s", "fields.v.aggregate-function": "sum",
                                        "fields.grp.aggregate-function": "last_non_null_value"}),
])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=st.lists(st.tuples(RECORDS, st.booleans(), st.booleans(), st.sampled_from([0, 400, 1000])), min_size=1, max_size=5),
    pk=st.sampled_from([(0,), (0, 1)]),
    config=CONFIGS,
)
def test_kernel_equals_the_per_key_stage(batches, pk, config):
    """Per batch: whether the stored host runs the kernel, whether the batch arrives as
    Arrow columns (the Spark host's form) or ``Change`` tuples (the replay host's), and how
    far processing time moved (``full-compaction``'s barriers)."""
    engine, producer, options = config
    if any(k.endswith(".sequence-group") for k in options):
        pk = (0,)  # a key column cannot be in a sequence group
    stage = merge(engine, producer, pk=pk, **options)
    reference, ref_bucket, ref_metrics = PerKeyAdapter(stage), Bucket(), Counter()
    host = stored_host(stage)
    now_ms = 0
    for records, kernel, columnar, step_ms in batches:
        now_ms += step_ms
        changes = [Change(kind, (i, g, v), pos) for kind, i, g, v, pos in records]
        ctx = BatchContext(metrics=ref_metrics, now_ms=now_ms)
        ref_bucket, want = reference.process_batch([ChangeBatch(changes=list(changes))], ref_bucket, ctx)
        batch = columns(changes) if columnar else ChangeBatch(changes=list(changes))
        got = host.run(batch, kernel=kernel, now_ms=now_ms)
        assert per_key_view(stage, got) == per_key_view(stage, want.changes())
        assert state_codec.decode_state(stage, host.stored).states == ref_bucket.states
        assert host.kernel.next_wakeup(state_codec.decode_state(stage, host.stored)) == (ref_bucket.next_wakeup() if stage.full else None)
    assert +host.metrics == +ref_metrics


def test_stored_state_is_the_same_table_whichever_path_wrote_it():
    changes = [c("+I", 2, "b", 1, pos=1), c("+I", 1, "a", None, pos=2), c("+U", 2, None, 3, pos=(3, 1))]
    tables = []
    for kernel in (True, False):
        host = stored_host(merge())
        host.run(columns(changes), kernel=kernel)
        tables.append(state_codec.read_table(host.stored))
    assert tables[0].equals(tables[1])
    assert tables[0].column_names == ["key", "row", "pos", "tombstone"]
    assert tables[0].column("pos").to_pylist() == [[3, 1], [2]]
