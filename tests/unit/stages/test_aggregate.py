"""GroupAggregate with retraction in operator-harness style."""

from __future__ import annotations

import pickle
from decimal import Decimal

import pytest

from stage_harness import Harness, c
from tidemark.engine.errors import PlanError
from tidemark.engine.stages.aggregate import AggCall, GroupAggregate

ALL = [
    AggCall("SUM", 1),
    AggCall("COUNT", 1),
    AggCall("COUNT_STAR"),
    AggCall("MIN", 1),
    AggCall("MAX", 1),
    AggCall("AVG", 1),
    AggCall("LAST_VALUE", 1),
]


def harness(aggs=ALL) -> Harness:
    return Harness(GroupAggregate(group_by=(0,), aggs=list(aggs)))


def test_insert_then_retract_every_function():
    h = harness()
    out = h.run([c("+I", "g", 5, pos=1), c("+I", "g", -8, pos=2), c("+I", "g", None, pos=3)])
    # SUM, COUNT(col), COUNT(*), MIN, MAX, AVG (-3/2 truncates toward zero), LAST_VALUE
    assert out == [c("+I", "g", -3, 2, 3, -8, 5, -1, -8, pos=3)]
    out = h.run([c("-D", "g", -8, pos=4)])
    assert out == [c("-U", "g", -3, 2, 3, -8, 5, -1, -8, pos=4), c("+U", "g", 5, 1, 2, 5, 5, 5, 5, pos=4)]
    out = h.run([c("-D", "g", 5, pos=5)])
    # only the null row is left: SUM/MIN/MAX/AVG/LAST_VALUE are NULL, COUNT(col) 0
    assert out == [c("-U", "g", 5, 1, 2, 5, 5, 5, 5, pos=5), c("+U", "g", None, 0, 1, None, None, None, None, pos=5)]
    assert h.run([c("-D", "g", None, pos=6)]) == [c("-D", "g", None, 0, 1, None, None, None, None, pos=6)]
    assert h.state == {}


def test_retracting_the_minimum_finds_the_next_one():
    h = harness([AggCall("MIN", 1), AggCall("MAX", 1)])
    h.run([c("+I", "g", v, pos=v) for v in (3, 1, 1, 7)])
    assert h.run([c("-D", "g", 1, pos=10)]) == []  # another 1 is still there
    assert h.run([c("-D", "g", 1, pos=11)]) == [c("-U", "g", 1, 7, pos=11), c("+U", "g", 3, 7, pos=11)]
    assert h.run([c("-D", "g", 7, pos=12)]) == [c("-U", "g", 3, 7, pos=12), c("+U", "g", 3, 3, pos=12)]


def test_last_value_rolls_back_when_the_latest_is_retracted():
    h = harness([AggCall("LAST_VALUE", 1)])
    h.run([c("+I", "g", "a", pos=1)])
    h.run([c("+I", "g", "b", pos=2)])
    assert h.run([c("+I", "g", "c", pos=3)]) == [c("-U", "g", "b", pos=3), c("+U", "g", "c", pos=3)]
    assert h.run([c("-D", "g", "c", pos=4)]) == [c("-U", "g", "c", pos=4), c("+U", "g", "b", pos=4)]
    assert h.run([c("-D", "g", "a", pos=5)]) == []


def test_last_value_follows_position_not_arrival():
    h = harness([AggCall("LAST_VALUE", 1)])
    h.run([c("+I", "g", "late", pos=9)])
    assert h.run([c("+I", "g", "early", pos=2)]) == []


def test_output_changed_and_changed_back_in_one_batch_is_refreshed_as_flink():
    # Flink applies records one by one, so an output that changes and changes back inside a
    # batch was emitted again downstream: a -U/+U refresh (first / last changing position).
    h = harness([AggCall("SUM", 1)])
    h.run([c("+I", "g", 4, pos=1)])
    assert h.run([c("+I", "g", 6, pos=2), c("-D", "g", 6, pos=3)]) == [c("-U", "g", 4, pos=2), c("+U", "g", 4, pos=3)]
    # an update that keeps the sum: the retraction empties the group first (-D in Flink)
    assert h.run([c("-U", "g", 4, pos=4), c("+U", "g", 4, pos=4)]) == [c("-U", "g", 4, pos=4), c("+U", "g", 4, pos=4)]
    # a SUM-neutral add never changes the output: nothing, as Flink
    assert h.run([c("+I", "g", 0, pos=5), c("+I", "g", 0, pos=6)]) == []


def test_output_position_is_the_greatest_of_the_batch():
    h = harness([AggCall("COUNT_STAR")])
    assert h.run([c("+I", "g", 1, pos=(3, 1)), c("+I", "g", 2, pos=(2, 9))]) == [c("+I", "g", 2, pos=(3, 1))]


def test_avg_types():
    h = harness([AggCall("AVG", 1)])
    assert h.run([c("+I", "i", -7, pos=1), c("+I", "i", 0, pos=2)])[0].row == ("i", -3)
    assert h.run([c("+I", "f", 1.0, pos=1), c("+I", "f", 2.0, pos=2)])[0].row == ("f", 1.5)
    assert h.run([c("+I", "d", Decimal("1"), pos=1), c("+I", "d", Decimal("2"), pos=2)])[0].row == (
        "d",
        Decimal("1.5"),
    )


def test_distinct_sum_and_count():
    h = harness([AggCall("SUM", 1, distinct=True), AggCall("COUNT", 1, distinct=True), AggCall("SUM", 1)])
    assert h.run([c("+I", "g", 5, pos=1), c("+I", "g", 5, pos=2), c("+I", "g", 2, pos=3)]) == [
        c("+I", "g", 7, 2, 12, pos=3)
    ]
    assert h.run([c("-D", "g", 5, pos=4)]) == [c("-U", "g", 7, 2, 12, pos=4), c("+U", "g", 7, 2, 7, pos=4)]
    assert h.run([c("-D", "g", 5, pos=5)]) == [c("-U", "g", 7, 2, 7, pos=5), c("+U", "g", 2, 1, 2, pos=5)]


def test_sum_of_only_nulls_is_null():
    h = harness([AggCall("SUM", 1), AggCall("COUNT", 1)])
    assert h.run([c("+I", "g", None, pos=1)]) == [c("+I", "g", None, 0, pos=1)]


def test_retraction_never_added_is_counted_and_does_not_crash():
    h = harness()
    assert h.run([c("-D", "g", 5, pos=1)]) == []
    assert h.metrics["retractions_without_state"] == 1
    h.run([c("+I", "g", 5, pos=2)])
    assert h.run([c("-D", "g", 5, pos=3), c("-D", "g", 6, pos=3)])[0].kind == "-D"
    assert h.metrics["retractions_without_state"] == 2
    assert h.state == {}


def test_group_by_several_columns_and_state_pickles():
    h = Harness(GroupAggregate(group_by=(0, 1), aggs=[AggCall("MAX", 2), AggCall("LAST_VALUE", 2)]))
    h.run([c("+I", "a", 1, 10, pos=1), c("+I", "a", 2, 20, pos=2), c("+I", "a", 1, 30, pos=3)])
    assert h.table() == {("a", 1, 30, 30): 1, ("a", 2, 20, 20): 1}
    st = pickle.loads(pickle.dumps(h.state[("a", 1)]))
    h.state[("a", 1)] = st
    assert h.run([c("-D", "a", 1, 30, pos=4)]) == [c("-U", "a", 1, 30, 30, pos=4), c("+U", "a", 1, 10, 10, pos=4)]


def test_bad_calls_are_plan_errors():
    with pytest.raises(PlanError, match="MEDIAN"):
        AggCall("MEDIAN", 1)
    with pytest.raises(PlanError, match="argument"):
        AggCall("SUM")


def test_last_value_retraction_removes_the_earliest_copy_of_a_value():
    """As Flink's LastValueWithRetract (removes the first recorded order of the value)."""
    h = harness([AggCall("LAST_VALUE", 1)])
    h.run([c("+I", "g", "x", pos=0)])
    h.run([c("+I", "g", "y", pos=1)])
    h.run([c("+I", "g", "x", pos=2)])
    # x@0 goes, x@2 stays and is still the latest
    assert h.run([c("-D", "g", "x", pos=3)]) == []
    assert h.state[("g",)].accs[0].positions == {"x": [(2,)], "y": [(1,)]}
    # same inside one batch: the earlier copy is removed whichever copy the batch holds
    h = harness([AggCall("LAST_VALUE", 1)])
    h.run([c("+I", "g", "x", pos=0), c("+I", "g", "y", pos=1)])
    # the output changes at x@2 only (the -D at 3 leaves it x): Flink emits at 2
    assert h.run([c("+I", "g", "x", pos=2), c("-D", "g", "x", pos=3)]) == [
        c("-U", "g", "y", pos=2),
        c("+U", "g", "x", pos=2),
    ]


def test_a_new_group_carries_the_position_of_its_last_changing_row():
    """Flink emits an aggregate's row at each record that changes it; a record that leaves it
    as it is (a DISTINCT group's second row, a MAX under the maximum) emits nothing. So a
    group new in this batch reaches the sink at its last changing record, not at the batch's
    greatest position (which decides NOTHING's first row and DEDUPLICATE's latest row)."""
    distinct = Harness(GroupAggregate(group_by=(0, 1), aggs=[]))
    out = distinct.run([c("+I", "c2", "eu", pos=9), c("+I", "c2", "eu", pos=11), c("-U", "c2", "eu", pos=12),
                        c("+U", "c2", "eu", pos=13)])
    assert out == [c("+I", "c2", "eu", pos=9)]
    maximum = harness([AggCall("MAX", 1)])
    assert maximum.run([c("+I", "g", 7, pos=1), c("+I", "g", 3, pos=2)]) == [c("+I", "g", 7, pos=1)]
