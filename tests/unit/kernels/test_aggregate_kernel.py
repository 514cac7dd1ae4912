"""The group aggregate kernel against the per-key stage, literal Z-set cases, and its typed
state.

Equivalence: over random valid multi-batch changelogs (adds, retractions of active rows,
updates as ``-U``/``+U`` at one position, NULLs, DECIMAL and DOUBLE values, groups emptied
and coming back, records shuffled inside a batch) the kernel and ``PerKeyAdapter`` emit the
same changes in the same order, keep the same state and count the same metrics; with the
kernel's state stored and read back through ``state_codec`` after every batch and its batches
given as Arrow tables, as the Spark host does."""

from __future__ import annotations

import random
from collections import Counter
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemark.engine import state_codec
from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change
from tidemark.engine.driver import Bucket, PerKeyAdapter, batch_stage
from tidemark.engine.kernels.aggregate import AggregateKernel
from tidemark.engine.kernels.table_bucket import TableBucket
from tidemark.engine.stage import BatchContext
from tidemark.engine.stages.aggregate import AggCall, GroupAggregate
from tidemark.engine.types import make_type

# input row: (g BIGINT, s STRING, i BIGINT, d DECIMAL(10, 2), f DOUBLE)
TYPES = [make_type("BIGINT"), make_type("STRING"), make_type("BIGINT"), make_type("DECIMAL", (10, 2)),
         make_type("DOUBLE")]
G, S, INT, D, F = range(5)

TOTALS = [AggCall("SUM", INT), AggCall("COUNT_STAR"), AggCall("COUNT", S), AggCall("AVG", INT), AggCall("SUM", D),
          AggCall("SUM", F), AggCall("AVG", F)]
EXTREMES = [AggCall("MIN", S), AggCall("MAX", INT), AggCall("MIN", D), AggCall("COUNT_STAR")]
DISTINCT = [AggCall("COUNT", S, distinct=True), AggCall("SUM", INT, distinct=True), AggCall("AVG", F, distinct=True),
            AggCall("SUM", D, distinct=True), AggCall("COUNT_STAR")]
STAGES = {
    "totals": ((G,), TOTALS),
    "extremes": ((G, S), EXTREMES),
    "extremes-of-one-column": ((G,), [AggCall("MIN", S), AggCall("MAX", S), AggCall("MAX", INT), AggCall("MIN", INT),
                                       AggCall("COUNT_STAR")]),
    "distinct": ((G,), DISTINCT),
    "last-value": ((G,), [AggCall("LAST_VALUE", INT), AggCall("LAST_VALUE", S)]),
    "decimal-avg": ((G,), [AggCall("AVG", D), AggCall("COUNT_STAR")]),
    "select-distinct": ((G, S), []),
    "global": ((), [AggCall("SUM", INT), AggCall("COUNT_STAR")]),
    # accumulators only: the stored table's own path (``aggregate_table``)
    "accumulators": ((G,), [AggCall("SUM", INT), AggCall("COUNT_STAR"), AggCall("COUNT", S), AggCall("AVG", INT),
                            AggCall("SUM", F), AggCall("AVG", F), AggCall("COUNT", INT)]),
    "accumulators-by-text": ((S, G), [AggCall("SUM", INT), AggCall("COUNT", F)]),
}
#: the stages the table path takes
ON_TABLE = {"global", "accumulators", "accumulators-by-text"}


def stage(name: str) -> GroupAggregate:
    group_by, aggs = STAGES[name]
    return GroupAggregate(group_by, aggs, name=name, input_types=TYPES)


def c(kind: str, *row, pos: int) -> Change:
    return Change(kind, tuple(row), (pos,))


class Host:
    """One stage under one ``process_batch`` implementation, batch after batch; ``stored``:
    the state goes through ``state_codec`` between batches and the batches come as Arrow
    tables (the Spark host's round trip and input)."""

    def __init__(self, runner, stored: bool = False) -> None:
        self.runner = runner
        self.stored = stored
        self.bucket = Bucket()
        self.metrics: Counter = Counter()

    def run(self, changes: list[Change]) -> list[tuple]:
        ctx = BatchContext(now_ms=0, metrics=self.metrics)
        batch = ChangeBatch(changes=list(changes))
        if self.stored and changes:
            batch = ChangeBatch.from_table(ChangeBatch.from_changes(changes, self.runner.stage.input_schema).table())
        self.bucket, out = self.runner.process_batch([batch], self.bucket, ctx)
        if self.stored:
            data = state_codec.encode_state(self.runner.stage, self.bucket)
            self.bucket = state_codec.decode_state(self.runner.stage, data)
        return [(x.kind, x.row, x.pos) for x in out.changes()]

    def visible_state(self) -> dict:
        stage = self.runner.stage
        return {key: (s.rows, stage._output(key, s)) for key, s in self.bucket.states.items()}


@pytest.fixture(autouse=True, scope="module")
def kernel_on():
    """The stage's stored format follows its batch kernel (``state_codec``): switch it on."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIDEMARK_AGGREGATE_KERNEL", "1")
        yield


# ---------------------------------------------------------------------- equivalence

values = st.fixed_dictionaries({
    "g": st.integers(0, 2),
    "s": st.sampled_from([None, "a", "b", "c"]),
    "i": st.sampled_from([None, -3, 0, 1, 2, 5]),
    "d": st.sampled_from([None, Decimal("1.10"), Decimal("2.50"), Decimal("-0.25")]),
    "f": st.sampled_from([None, 0.5, -1.0, 2.25]),
})
ops = st.lists(st.tuples(st.sampled_from(["add", "retract", "update"]), values, st.integers(0, 99)), max_size=14)


def changelog(batches: list[list[tuple]], seed: int) -> list[list[Change]]:
    """Valid changelog batches from the drawn ops: a retraction or update takes an active
    row (chosen by the drawn number); positions grow, an update's halves share one; each
    batch is shuffled (arrival order is not position order)."""
    active: list[tuple] = []
    pos = 0
    out = []
    rng = random.Random(seed)
    for ops_ in batches:
        batch = []
        for op, v, pick in ops_:
            pos += 1
            row = (v["g"], v["s"], v["i"], v["d"], v["f"])
            if op != "add" and active:
                old = active.pop(pick % len(active))
                if op == "retract":
                    batch.append(Change("-D", old, (pos,)))
                    continue
                batch.append(Change("-U", old, (pos,)))
                batch.append(Change("+U", row, (pos,)))
            else:
                batch.append(Change("+I", row, (pos,)))
            active.append(row)
        rng.shuffle(batch)
        out.append(batch)
    return out


@pytest.mark.parametrize("name", sorted(STAGES))
@pytest.mark.parametrize("stored", [False, True], ids=["changes-in-memory", "arrow-stored"])
@settings(max_examples=60, deadline=None)
@given(batches=st.lists(ops, min_size=1, max_size=5), seed=st.integers(0, 1000))
def test_kernel_equals_per_key_stage(name, stored, batches, seed):
    s = stage(name)
    kernel, per_key = Host(AggregateKernel(s), stored=stored), Host(PerKeyAdapter(s))
    for batch in changelog(batches, seed):
        assert kernel.run(batch) == per_key.run(batch)
        if batch and name in ON_TABLE:  # the state stayed a table: no GroupState was built
            assert isinstance(kernel.bucket, TableBucket) and kernel.bucket.table is not None or not kernel.bucket.states
        assert kernel.visible_state() == per_key.visible_state()
    assert kernel.metrics == per_key.metrics


def unchecked(batches: list[list[tuple]], seed: int) -> list[list[Change]]:
    """Like ``changelog``, but a retraction may take a row that is not active (a changelog
    whose start was missed): counts the per-key path clamps, groups found empty."""
    rng = random.Random(seed)
    valid = changelog(batches, seed)
    return [[Change("-D", x.row, x.pos) if x.kind == "+I" and rng.random() < 0.3 else x for x in b] for b in valid]


@pytest.mark.parametrize("name", sorted(ON_TABLE))
@settings(max_examples=60, deadline=None)
@given(batches=st.lists(ops, min_size=1, max_size=5), seed=st.integers(0, 1000))
def test_the_table_path_equals_the_per_group_path_on_retractions_without_state(name, batches, seed):
    # groups whose counts would clamp take the stage's own step inside the table path. The
    # reference is the kernel's per-group path, not the per-key stage: a retraction of a
    # value never added makes their totals differ by design (the module docstring's "known
    # differences"), the same for both of the kernel's paths
    s = stage(name)
    table, per_group = Host(AggregateKernel(s), stored=True), Host(AggregateKernel(s, on_table=False), stored=True)
    for batch in unchecked(batches, seed):
        assert table.run(batch) == per_group.run(batch)
        assert table.visible_state() == per_group.visible_state()
    assert table.metrics == per_group.metrics


# ---------------------------------------------------------------------- literal Z-set cases


def run(name: str, *batches: list[Change]) -> list[list[tuple]]:
    h = Host(AggregateKernel(stage(name)))
    return [h.run(b) for b in batches]


def row(g, s=None, i=None, d=None, f=None) -> tuple:
    return (g, s, i, d, f)


def test_kernel_on_unless_switched_off(monkeypatch):
    stage = GroupAggregate((0,), [AggCall("SUM", 1)])
    monkeypatch.delenv("TIDEMARK_AGGREGATE_KERNEL", raising=False)
    assert isinstance(batch_stage(stage), AggregateKernel)
    assert state_codec.format_of(stage) == "group-aggregate/1"
    monkeypatch.setenv("TIDEMARK_AGGREGATE_KERNEL", "0")
    assert isinstance(batch_stage(stage), PerKeyAdapter)
    assert state_codec.format_of(stage) == state_codec.FORMAT_PICKLED


def test_new_group_existing_group_and_deleted_group():
    first, second = run(
        "global",
        [c("+I", *row(1, i=2), pos=1), c("+I", *row(2, i=3), pos=2)],
        [c("-D", *row(1, i=2), pos=3), c("-D", *row(2, i=3), pos=4)],
    )
    assert first == [("+I", (5, 2), (2,))]
    assert second == [("-D", (5, 2), (4,))]


def test_several_changes_emit_at_the_last_changing_record():
    # SUM(i) per g: +0 at pos 3 changes nothing but COUNT(*), so the last changing record
    # is pos 3; the totals stage's output carries COUNT(*) too, so every record changes it
    (out,) = run("totals", [c("+I", *row(1, "a", 2), pos=1), c("+I", *row(1, "b", 5), pos=2)])
    assert out == [("+I", (1, 7, 2, 2, 3, None, None, None), (2,))]


def test_output_changed_and_changed_back_is_refreshed():
    # the row (1, 'a') goes and comes back: COUNT(*) 1 -> 2 -> 1 -> 2? No: +I x at 3, -D y at 4
    # leave COUNT(*) and MIN as they were; Flink emitted at each, so the row moves to pos 4
    out = run(
        "extremes",
        [c("+I", *row(1, "a", 2), pos=1)],
        [c("+I", *row(1, "a", 2), pos=3), c("-D", *row(1, "a", 2), pos=4)],
    )
    assert out[1] == [("-U", (1, "a", "a", 2, None, 1), (3,)), ("+U", (1, "a", "a", 2, None, 1), (4,))]


def test_exact_pair_in_one_group_with_an_unchanged_output_emits_nothing_for_a_neutral_add():
    # SELECT DISTINCT: a second copy of an existing row leaves the group's row as it is
    out = run("select-distinct", [c("+I", *row(1, "a"), pos=1)], [c("+I", *row(1, "a"), pos=2)])
    assert out == [[("+I", (1, "a"), (1,))], []]


def test_min_and_max_take_retractions_from_the_multiset_without_the_per_group_path(monkeypatch):
    s = GroupAggregate((G,), [AggCall("MIN", INT), AggCall("MAX", INT), AggCall("MIN", S)], name="m", input_types=TYPES)
    kernel = AggregateKernel(s)
    monkeypatch.setattr(kernel, "_per_group", lambda *a: pytest.fail("a group took the per-group path"))
    host = Host(kernel, stored=True)
    assert host.run([c("+I", 0, "b", 1, None, None, pos=1), c("+I", 0, "a", 3, None, None, pos=2),
                     c("+I", 0, "c", 5, None, None, pos=3)]) == [("+I", (0, 1, 5, "a"), (3,))]
    # both extremes retracted: the next ones come from the stored multiset
    assert host.run([c("-D", 0, "b", 1, None, None, pos=4), c("-D", 0, "c", 5, None, None, pos=5),
                     c("+I", 0, "c", 4, None, None, pos=6)]) == [("-U", (0, 1, 5, "a"), (6,)), ("+U", (0, 3, 4, "a"), (6,))]
    # an update that puts the same row back changed the output in between: a refresh
    assert host.run([c("-U", 0, "a", 3, None, None, pos=7), c("+U", 0, "a", 3, None, None, pos=7)]) == [
        ("-U", (0, 3, 4, "a"), (7,)), ("+U", (0, 3, 4, "a"), (7,)),
    ]
    # the group empties inside the batch and starts again
    assert host.run([c("-D", 0, "a", 3, None, None, pos=8), c("-D", 0, "c", 4, None, None, pos=8),
                     c("+I", 0, "d", 2, None, None, pos=9)]) == [("-U", (0, 3, 4, "a"), (9,)), ("+U", (0, 2, 2, "d"), (9,))]


def test_last_value_rolls_back_on_retractions_without_the_per_group_path(monkeypatch):
    s = GroupAggregate((G,), [AggCall("LAST_VALUE", S), AggCall("LAST_VALUE", INT)], name="lv", input_types=TYPES)
    kernel = AggregateKernel(s)
    monkeypatch.setattr(kernel, "_per_group", lambda *a: pytest.fail("a group took the per-group path"))
    host, per_key = Host(kernel, stored=True), Host(PerKeyAdapter(s))

    def both(batch: list[Change]) -> list[tuple]:
        out = host.run(batch)
        assert out == per_key.run(batch)
        assert host.visible_state() == per_key.visible_state()
        return out

    a, b, b2, d = row(0, "a", 1), row(0, "b", 2), row(0, "b", 7), row(0, "d", 4)
    # a later partition's position sorts after the batch's: "a" stays the latest value
    assert both([Change("+I", b, (0, 1)), Change("+I", a, (1, 1))]) == [("+I", (0, "a", 1), (1, 1))]
    # the latest "a" retracted: back to "b"; a second "b" row keeps "b" as the latest string
    # once the first "b" row goes, and INT's latest is the second row's 7
    assert both([Change("-D", a, (1, 2)), Change("+I", b2, (1, 3)), Change("-D", b, (1, 4))]) == [
        ("-U", (0, "a", 1), (1, 3)), ("+U", (0, "b", 7), (1, 3)),
    ]
    # one position, two values: repr breaks the tie ("'d'" > "'b'"); then "d" leaves again
    # within the batch: the output changed and changed back, so a refresh pair
    assert both([Change("+I", d, (1, 5)), Change("-D", d, (1, 6))]) == [
        ("-U", (0, "b", 7), (1, 5)), ("+U", (0, "b", 7), (1, 6)),
    ]
    # in the record-by-record replay a value whose count reaches 0 and comes back has the new
    # add's position as its latest, here below its old one and below "c"'s: "c" (and its 3)
    # take over at the retraction and keep the output at the add. The batch's own result
    # removes the earliest of all "b" instances, the new one: the old row again, a refresh
    # whose last change is the retraction
    c3 = row(0, "c", 3)
    assert both([Change("+I", c3, (0, 8))]) == []
    assert both([Change("-D", b2, (0, 3)), Change("+I", b2, (0, 5))]) == [
        ("-U", (0, "b", 7), (0, 3)), ("+U", (0, "b", 7), (0, 3)),
    ]


def test_last_value_group_above_the_pair_limit_goes_per_group(monkeypatch):
    from tidemark.engine.kernels import aggregate

    monkeypatch.setattr(aggregate, "_PAIRS_PER_GROUP", 1)
    s = GroupAggregate((G,), [AggCall("LAST_VALUE", INT)], name="lv", input_types=TYPES)
    kernel = AggregateKernel(s)
    per_group = []
    run_per_group = kernel._per_group
    monkeypatch.setattr(kernel, "_per_group", lambda groups, *a: per_group.append(list(groups)) or run_per_group(groups, *a))
    host = Host(kernel, stored=True)
    a, b = row(0, "a", 1), row(0, "b", 2)
    assert host.run([c("+I", *a, pos=1), c("+I", *b, pos=2)]) == [("+I", (0, 2), (2,))]
    # the latest row leaves and comes back: 1 in between, so a refresh pair
    assert host.run([c("-D", *b, pos=3), c("+I", *b, pos=4)]) == [("-U", (0, 2), (3,)), ("+U", (0, 2), (4,))]
    assert per_group == [[(0,)]]


def test_retraction_without_state_is_counted_not_applied():
    h = Host(AggregateKernel(stage("totals")))
    assert h.run([c("-D", *row(1, i=2), pos=1)]) == []
    assert h.metrics["retractions_without_state"] == 1
    assert h.bucket.states == {}


def test_typed_state_names_its_kind_and_round_trips():
    s = stage("extremes")
    kernel = AggregateKernel(s)
    bucket, _ = kernel.process_batch(
        [ChangeBatch(changes=[c("+I", *row(1, "a", 2, Decimal("1.10")), pos=1)])], Bucket(), BatchContext()
    )
    assert state_codec.format_of(s) == "group-aggregate/1"
    table = kernel.state_to_table(bucket)
    assert table.column_names == ["key0", "key1", "rows", "values0", "counts0", "values1", "counts1",
                                  "values2", "counts2", "n3"]
    assert str(table.schema.field("values2").type) == "list<item: decimal128(10, 2)>"
    back = kernel.state_from_table(table)
    assert {k: s._output(k, v) for k, v in back.states.items()} == {(1, "a"): (1, "a", "a", 2, Decimal("1.10"), 1)}


def test_typed_state_keeps_a_hosts_group_ids():
    # the Spark host's per-key adapter keys a bucket by the encoded key bytes it shuffled on
    s = stage("totals")
    adapter = PerKeyAdapter(s)
    changes = [c("+I", *row(1, "a", 2), pos=1), c("+I", *row(2, "b", 3), pos=2)]
    batch = ChangeBatch(changes=changes, groups=[b"k1", b"k2"])
    bucket, _ = adapter.process_batch([batch], Bucket(), BatchContext())
    back = state_codec.decode_state(s, state_codec.encode_state(s, bucket))
    assert {g: st.rows for g, st in back.states.items()} == {b"k1": 1, b"k2": 1}
    more = ChangeBatch(changes=[c("+I", *row(1, "c", 5), pos=3)], groups=[b"k1"])
    _, out = adapter.process_batch([more], back, BatchContext())
    assert [(x.kind, x.row) for x in out.changes()] == [
        ("-U", (1, 2, 1, 1, 2, None, None, None)), ("+U", (1, 7, 2, 2, 3, None, None, None))]
