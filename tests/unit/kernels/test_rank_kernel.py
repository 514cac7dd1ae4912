"""The rank kernel: literal cases in the style of Flink's Top-N harness tests (records in,
records out), and a property against a record-by-record reference.

The reference applies each change in position order to a list per partition, as Flink's
``RetractableTopNFunction`` does (an add appended after the rows with an equal sort key, a
retraction removing the first equal row), and the kernel's net output of a batch must turn the
top rows before the batch into the top rows after it."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemark.engine import state_codec
from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change, canonical_sorted
from tidemark.engine.stage import BatchContext
from tidemark.engine.stages.rank import Rank, SortKey
from tidemark.engine.types import make_type

BIGINT, STRING = make_type("BIGINT"), make_type("STRING")
TYPES = [BIGINT, STRING, BIGINT]  # (partition p, name, score v)


def rank(start=1, end=2, output_rank=True, descending=True, append_only=False) -> Rank:
    return Rank([0], [SortKey(2, descending, not descending)], start, end, TYPES, output_rank, append_only)


def c(kind: str, *row, pos: int) -> Change:
    return Change(kind, tuple(row), (pos,))


class Host:
    """One rank stage's kernel, batch after batch, its state through the state codec (as
    a host stores it)."""

    def __init__(self, stage: Rank) -> None:
        self.stage = stage
        self.kernel = stage.batch_kernel()
        self.stored: bytes | None = None
        self.metrics: Counter = Counter()

    def run(self, changes: list[Change]) -> list[tuple]:
        state = state_codec.decode_state(self.stage, self.stored)
        ctx = BatchContext(metrics=self.metrics)
        state, out = self.kernel.process_batch([ChangeBatch(changes=list(changes))], state, ctx)
        self.stored = state_codec.encode_state(self.stage, state)
        return [(x.kind, x.row, x.pos) for x in out.changes()]


def test_top2_with_row_number_shifts_every_rank_below_a_new_row():
    h = Host(rank())
    assert h.run([c("+I", 1, "a", 10, pos=1), c("+I", 1, "b", 5, pos=2)]) == [
        ("+I", (1, "a", 10, 1), (2,)), ("+I", (1, "b", 5, 2), (2,))]
    assert h.run([c("+I", 1, "c", 20, pos=3)]) == [
        ("-U", (1, "a", 10, 1), (3,)), ("-U", (1, "b", 5, 2), (3,)),
        ("+U", (1, "c", 20, 1), (3,)), ("+U", (1, "a", 10, 2), (3,))]
    # below the top: nothing to emit
    assert h.run([c("+I", 1, "d", 1, pos=4)]) == []


def test_retracting_a_top_row_lets_the_next_one_in():
    h = Host(rank())
    h.run([c("+I", 1, "a", 10, pos=1), c("+I", 1, "b", 5, pos=2), c("+I", 1, "c", 1, pos=3)])
    assert h.run([c("-D", 1, "a", 10, pos=4)]) == [
        ("-U", (1, "a", 10, 1), (4,)), ("-U", (1, "b", 5, 2), (4,)),
        ("+U", (1, "b", 5, 1), (4,)), ("+U", (1, "c", 1, 2), (4,))]
    assert h.run([c("-D", 1, "b", 5, pos=5), c("-D", 1, "c", 1, pos=6)]) == [
        ("-D", (1, "b", 5, 1), (6,)), ("-D", (1, "c", 1, 2), (6,))]
    assert h.stored is None  # an empty bucket stores nothing


def test_equal_sort_keys_rank_by_arrival_and_an_update_arrives_again():
    h = Host(rank(end=1, output_rank=False))
    assert h.run([c("+I", 1, "a", 7, pos=1), c("+I", 1, "b", 7, pos=2)]) == [("+I", (1, "a", 7, None), (2,))]
    # a's update keeps its score but goes behind b (Flink appends it to the list of score 7)
    assert h.run([c("-U", 1, "a", 7, pos=3), c("+U", 1, "a2", 7, pos=3)]) == [
        ("-U", (1, "a", 7, None), (3,)), ("+U", (1, "b", 7, None), (3,))]


def test_arrival_is_the_source_position_not_the_order_in_the_batch():
    h = Host(rank(end=1, output_rank=False))
    assert h.run([c("+I", 1, "late", 7, pos=9), c("+I", 1, "early", 7, pos=2)]) == [
        ("+I", (1, "early", 7, None), (9,))]


def test_a_retraction_removes_the_oldest_identical_copy():
    h = Host(rank(end=2, output_rank=False))
    h.run([c("+I", 1, "x", 5, pos=1), c("+I", 1, "y", 5, pos=2), c("+I", 1, "x", 5, pos=3)])
    # top 2: x (pos 1), y; retracting x removes the copy at pos 1 and the other x (pos 3)
    # moves up: the top two are still one x and y, so nothing changes without the row number
    assert h.run([c("-D", 1, "x", 5, pos=4)]) == []
    h2 = Host(rank(end=2, output_rank=True))
    h2.run([c("+I", 1, "x", 5, pos=1), c("+I", 1, "y", 5, pos=2), c("+I", 1, "x", 5, pos=3)])
    assert h2.run([c("-D", 1, "x", 5, pos=4)]) == [
        ("-U", (1, "x", 5, 1), (4,)), ("-U", (1, "y", 5, 2), (4,)),
        ("+U", (1, "y", 5, 1), (4,)), ("+U", (1, "x", 5, 2), (4,))]


def test_retraction_of_a_row_never_added_is_counted_and_ignored():
    h = Host(rank())
    assert h.run([c("-D", 1, "ghost", 3, pos=1), c("+I", 1, "a", 1, pos=2)]) == [("+I", (1, "a", 1, 1), (2,))]
    assert h.metrics["retractions_without_state"] == 1


def test_range_with_an_offset_and_ascending_nulls_first():
    h = Host(Rank([0], [SortKey(2, False, True)], 2, 3, TYPES, True))
    assert h.run([c("+I", 1, "a", 3, pos=1), c("+I", 1, "n", None, pos=2), c("+I", 1, "b", 1, pos=3)]) == [
        ("+I", (1, "b", 1, 2), (3,)), ("+I", (1, "a", 3, 3), (3,))]


def test_partitions_with_a_null_key_are_one_partition():
    h = Host(rank(end=1, output_rank=False))
    h.run([c("+I", None, "a", 1, pos=1)])
    assert h.run([c("+I", None, "b", 2, pos=2)]) == [("-U", (None, "a", 1, None), (2,)), ("+U", (None, "b", 2, None), (2,))]


def test_append_only_input_keeps_only_the_top_rows():
    h = Host(rank(end=2, append_only=True))
    h.run([c("+I", 1, n, v, pos=i) for i, (n, v) in enumerate([("a", 1), ("b", 2), ("c", 3), ("d", 4)])])
    state = state_codec.decode_state(h.stage, h.stored)
    assert sorted(state["f1"].to_list()) == ["c", "d"]


def test_stored_state_names_its_kind_and_version():
    h = Host(rank())
    h.run([c("+I", 1, "a", 1, pos=1)])
    assert state_codec.format_of(h.stage) == "rank/1"
    assert state_codec._format_of_bytes(h.stored) == "rank/1"


# ----------------------------------------------------------------------------- property


def reference_top(changes: list[Change], stage: Rank) -> dict[tuple, list[tuple]]:
    """Per partition, the rows ranked ``start..end`` after applying ``changes`` record by
    record in the canonical order (Flink's list per sort key)."""
    lists: dict[tuple, list[tuple]] = {}
    key = stage.order[0]
    for ch in canonical_sorted(changes):
        rows = lists.setdefault((ch.row[0],), [])
        if ch.is_add:
            rows.append(ch.row)
        elif ch.row in rows:
            rows.remove(ch.row)  # the first equal row: the oldest copy
    out = {}
    for p, rows in lists.items():
        def sort_key(r, _k=key):
            v = r[_k.column]
            return (v is not None, v) if not _k.descending else (v is None, -(v or 0))
        ranked = sorted(rows, key=sort_key)  # stable: arrival order among equal keys
        out[p] = ranked[stage.start - 1: stage.end]
    return {p: rows for p, rows in out.items() if rows}


def apply_output(table: Counter, out: list[tuple]) -> None:
    for kind, row, _pos in out:
        table[row] += 1 if kind in ("+I", "+U") else -1
        if table[row] == 0:
            del table[row]


change_st = st.tuples(
    st.sampled_from(["+I", "-D"]), st.integers(0, 1), st.sampled_from(["a", "b", "c"]),
    st.one_of(st.none(), st.integers(0, 3)),
)


@settings(max_examples=150, deadline=None)
@given(
    batches=st.lists(st.lists(change_st, max_size=6), min_size=1, max_size=5),
    end=st.integers(1, 3),
    output_rank=st.booleans(),
)
def test_kernel_equals_record_by_record_reference(batches, end, output_rank):
    stage = rank(end=end, output_rank=output_rank)
    h = Host(stage)
    table: Counter = Counter()
    applied: list[Change] = []
    pos = 0
    for batch in batches:
        changes = []
        for kind, p, name, v in batch:
            pos += 1
            row = (p, name, v)
            live = Counter(ch.row for ch in applied if ch.is_add) - Counter(ch.row for ch in applied if not ch.is_add)
            if kind == "-D" and live[row] - sum(1 for x in changes if x.row == row and not x.is_add) <= 0:
                continue  # a valid changelog retracts only what is there
            changes.append(Change(kind, row, (pos,)))
        applied += changes
        apply_output(table, h.run(list(reversed(changes))))
        expected: Counter = Counter()
        for rows in reference_top(applied, stage).values():
            for i, r in enumerate(rows):
                expected[(*r, stage.start + i if output_rank else None)] += 1
        assert table == expected


@pytest.mark.parametrize("bad", [(0, 1), (3, 2)])
def test_an_empty_range_is_refused(bad):
    from tidemark.engine.errors import PlanError

    with pytest.raises(PlanError, match="rank range"):
        Rank([0], [SortKey(2)], bad[0], bad[1], TYPES)


def test_ties_last_keeps_the_latest_of_equal_sort_keys():
    """Flink's event-time Deduplicate keeping the last row: an equal event time replaces."""
    h = Host(Rank([0], [SortKey(2, True, False)], 1, 1, TYPES, False, True, ties="last"))
    assert h.run([c("+I", 1, "a", 7, pos=1), c("+I", 1, "b", 7, pos=2)]) == [("+I", (1, "b", 7, None), (2,))]
    assert h.run([c("+I", 1, "c", 7, pos=3)]) == [("-U", (1, "b", 7, None), (3,)), ("+U", (1, "c", 7, None), (3,))]
    assert h.run([c("+I", 1, "d", 6, pos=4)]) == []


def test_changes_without_a_source_position():
    h = Host(rank())
    assert h.run([Change("+I", (1, "a", 1)), Change("+I", (1, "b", 2))]) == [
        ("+I", (1, "b", 2, 1), ()), ("+I", (1, "a", 1, 2), ())]


def test_per_key_entry_gives_the_kernels_changes():
    """``Rank.process_key`` (for hosts that call stages per key) runs the kernel on one
    partition: same changes as the kernel over the whole batch."""
    from tidemark.engine.driver import Bucket, PerKeyAdapter

    batches = [[c("+I", 1, "a", 1, pos=1), c("+I", 2, "b", 2, pos=2), c("+I", 1, "c", 3, pos=3)],
               [c("-D", 1, "c", 3, pos=4), c("+I", 2, "d", 5, pos=5)]]
    h = Host(rank())
    adapter, bucket = PerKeyAdapter(rank()), Bucket()
    for batch in batches:
        expected = sorted(h.run(batch), key=repr)
        bucket, out = adapter.process_batch([ChangeBatch(changes=batch)], bucket, BatchContext())
        assert sorted(((x.kind, x.row, x.pos) for x in out.changes()), key=repr) == expected
