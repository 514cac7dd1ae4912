"""ChangeBatch as literal Z-sets: records in, records out.

``z(...)`` writes a batch the way the design writes one: ``("+I", row, pos)`` per change.
"""

from __future__ import annotations

import datetime as dt
import random
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemark.engine.arrow_types import arrow_type
from tidemark.engine.batch import KIND, WEIGHT, ChangeBatch
from tidemark.engine.changelog import Change, canonical_key, canonical_sorted, sorted_ops, zset
from tidemark.engine.types import array_of, make_type, map_of, row_of


def z(*changes: tuple) -> list[Change]:
    return [Change(kind, row, pos if isinstance(pos, tuple) else (pos,)) for kind, row, pos in changes]


def out(batch: ChangeBatch) -> list[tuple]:
    return [(c.kind, c.row, c.pos) for c in batch.changes()]


# ---------------------------------------------------------------------- round trips


def test_changes_round_trip_through_arrow_with_their_kinds_and_positions():
    cs = z(("+I", (1, "a"), 3), ("-U", (1, "a"), 4), ("+U", (1, None), 4), ("-D", (2, "b"), ()))
    table = ChangeBatch.from_changes(cs).table()
    assert table.column_names == ["f0", "f1", KIND, WEIGHT, "$pos0"]
    assert table.column(WEIGHT).to_pylist() == [1, -1, 1, -1]
    assert table.column("$pos0").to_pylist() == [3, 4, 4, None]  # () padded with a null
    assert ChangeBatch.from_table(table).changes() == cs


def test_typed_columns_keep_every_python_value_exact():
    types = [
        ("id", make_type("BIGINT")),
        ("price", make_type("DECIMAL", (10, 2))),
        ("at", make_type("TIMESTAMP", (3,))),
        ("day", make_type("DATE")),
        ("ratio", make_type("FLOAT")),
        ("tags", array_of(make_type("STRING"))),
        ("attrs", map_of(make_type("STRING"), make_type("INT"))),
        ("addr", row_of([("city", make_type("STRING")), ("zip", make_type("INT"))])),
    ]
    schema = pa.schema([(n, arrow_type(t)) for n, t in types])
    row = (7, Decimal("1.10"), dt.datetime(2026, 11, 24, 1, 2, 3, 456000), dt.date(2026, 11, 24), 0.1,
           ("a", None), (("k", 1), ("l", None)), ("Oslo", 150))
    cs = z(("+I", row, (1, 2)), ("-D", (8,) + (None,) * 7, (1, 3)))
    table = ChangeBatch.from_changes(cs, schema=schema).table()
    assert table.schema.field("price").type == pa.decimal128(10, 2)
    back = ChangeBatch.from_table(table).changes()
    assert back == cs
    assert repr(back[0].row) == repr(row)  # Decimal('1.10') keeps its scale


def test_positions_of_different_lengths_compare_as_python_tuples():
    cs = z(("+I", (1,), (1, 0)), ("+I", (2,), ()), ("+I", (3,), (1,)))
    assert out(ChangeBatch.from_changes(cs).sorted()) == [
        ("+I", (2,), ()), ("+I", (3,), (1,)), ("+I", (1,), (1, 0))
    ]  # fmt: skip


def test_from_arrow_builds_weights_from_kinds_and_refuses_unknown_kinds():
    rows = pa.table({"id": [1, 2]})
    batch = ChangeBatch.from_arrow(rows, ["+I", "-D"], [pa.array([5, 6])])
    assert out(batch) == [("+I", (1,), (5,)), ("-D", (2,), (6,))]
    with pytest.raises(ValueError, match=r"change 1: kind 'X' is not one of \+I, -U, \+U, -D"):
        ChangeBatch.from_arrow(rows, ["+I", "X"], [pa.array([5, 6])])
    with pytest.raises(ValueError, match=r"column '\$kind': names starting with '\$' are reserved"):
        ChangeBatch.from_arrow(pa.table({"$kind": [1]}), ["+I"], [])


def test_rows_of_the_wrong_width_are_named():
    with pytest.raises(ValueError, match=r"change 1: row \(1, 2\) has 2 columns, expected 1"):
        ChangeBatch.from_changes(z(("+I", (1,), 1), ("+I", (1, 2), 2))).table()


# ---------------------------------------------------------------------- canonical order


def test_canonical_order_is_position_then_retractions_then_repr():
    cs = z(("+U", (1, "b"), 2), ("+I", (9, "z"), 1), ("-U", (1, "a"), 2), ("+U", (1, "a"), 2), ("-D", (0, "x"), 2))
    assert out(ChangeBatch.from_changes(cs).sorted()) == [
        ("+I", (9, "z"), (1,)),
        ("-D", (0, "x"), (2,)), ("-U", (1, "a"), (2,)),  # retractions first, then by repr
        ("+U", (1, "a"), (2,)), ("+U", (1, "b"), (2,)),
    ]  # fmt: skip


def test_repr_tiebreak_is_repr_not_the_typed_order():
    """``repr`` orders 10 before 9: the batch agrees with ``canonical_key`` here too."""
    cs = z(("+I", (9,), 1), ("+I", (10,), 1))
    assert out(ChangeBatch.from_changes(cs).sorted()) == [("+I", (10,), (1,)), ("+I", (9,), (1,))]


_rows = st.tuples(st.integers(0, 3), st.one_of(st.none(), st.sampled_from(["a", "b", "10", "9"])))
_changes = st.lists(
    st.builds(Change, st.sampled_from(["+I", "-U", "+U", "-D"]), _rows, st.tuples(st.integers(0, 4))),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(_changes)
def test_vectorized_order_agrees_with_canonical_key(cs):
    expected = sorted(cs, key=canonical_key)
    assert ChangeBatch.from_changes(cs).sorted().changes() == expected
    assert canonical_sorted(cs) == expected  # the per-key paths' shortcut, too
    ops = [(c.pos, c.kind in ("+I", "+U"), c.row) for c in cs]
    assert sorted_ops(ops) == [(c.pos, c.kind in ("+I", "+U"), c.row) for c in expected]


# ---------------------------------------------------------------------- consolidation


def test_exact_pairs_cancel_wherever_they_sit():
    # the design's example: +I(1,1,a1) +U(1,1,a2) -U(1,1,a1) -> only a2 remains
    cs = z(("+I", (1, 1, "a1"), 1), ("+U", (1, 1, "a2"), 2), ("-U", (1, 1, "a1"), 2))
    assert out(ChangeBatch.from_changes(cs).consolidate()) == [("+U", (1, 1, "a2"), (2,))]


def test_net_weights_keep_the_latest_change_of_the_surviving_sign():
    cs = z(
        ("+I", (1, "a"), 5), ("+I", (1, "a"), 2), ("-D", (1, "a"), 9),  # net +1: latest add at 5
        ("-D", (2, "b"), 3), ("-U", (2, "b"), 7), ("+I", (2, "b"), 8),  # net -1: latest retraction at 7
        ("+I", (3, "c"), 1), ("+I", (3, "c"), 4),  # net +2
    )
    batch = ChangeBatch.from_changes(cs).consolidate()
    assert batch.table().column(WEIGHT).to_pylist() == [2, 1, -1]  # in the canonical order
    assert out(batch) == [
        ("+I", (3, "c"), (4,)), ("+I", (3, "c"), (4,)), ("+I", (1, "a"), (5,)), ("-U", (2, "b"), (7,))
    ]  # fmt: skip
    assert len(batch) == 4


def test_null_is_a_value_like_any_other():
    cs = z(("+I", (1, None), 1), ("-D", (1, None), 2), ("+I", (None, None), 3))
    assert out(ChangeBatch.from_changes(cs).consolidate()) == [("+I", (None, None), (3,))]


@settings(max_examples=200, deadline=None)
@given(_changes, st.randoms(use_true_random=False))
def test_consolidation_is_the_zset_whatever_the_order(cs, rnd: random.Random):
    shuffled = list(cs)
    rnd.shuffle(shuffled)
    a = ChangeBatch.from_changes(cs).consolidate()
    b = ChangeBatch.from_changes(shuffled).consolidate()
    assert zset(a.changes()) == zset(cs)
    assert a.changes() == b.changes()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.builds(Change, st.sampled_from(["+I", "-U", "+U", "-D"]), _rows, st.tuples(st.integers(0, 4))),
                max_size=20, unique_by=lambda c: c.row))
def test_a_batch_of_distinct_rows_is_its_own_consolidation(cs):
    """Each row's one change is its net, at its own place: no pair to cancel."""
    batch = ChangeBatch.from_changes(cs)
    assert batch.consolidate().changes() == batch.sorted().changes()


def test_an_empty_batch_stays_empty():
    batch = ChangeBatch.from_changes([])
    assert len(batch) == 0
    assert batch.sorted().changes() == [] and batch.consolidate().changes() == []
