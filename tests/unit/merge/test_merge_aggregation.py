"""The aggregation engine: Paimon's ``AggregateMergeFunctionTest`` cases, ported, and the
retraction rules (retract where Paimon allows it, ``ignore-retract``,
``aggregation.remove-record-on-delete``)."""

from __future__ import annotations

import pytest

from merge_harness import Feeder, c, harness
from tidemark.engine.errors import InputError, PlanError


def test_default_agg_func():
    h = harness("k,a,b,c,d", {"merge-engine": "aggregation",
                              "fields.default-aggregate-function": "first_non_null_value",
                              "fields.b.aggregate-function": "sum"})
    f = Feeder(h)
    f.add(1, None, 1, 1, 1)
    f.add(1, 2, None, 2, 2)
    f.add(1, 3, 3, None, 3)
    f.add(1, 4, 4, 4, None)
    f.add(1, 5, 5, 5, 5)
    assert h.row(1) == (1, 2, 13, 1, 1)


def test_listagg_func():
    h = harness("k,a,b,c,d", {"merge-engine": "aggregation",
                              "fields.a.aggregate-function": "listagg",
                              "fields.b.aggregate-function": "listagg",
                              "fields.b.list-agg-delimiter": "-",
                              "fields.d.aggregate-function": "listagg",
                              "fields.d.list-agg-delimiter": "/"})
    h.run([c("+I", 1, str(i), str(i), i, str(i), pos=i) for i in range(1, 6)])
    assert h.row(1) == (1, "1,2,3,4,5", "1-2-3-4-5", 5, "1/2/3/4/5")


def test_init_row_on_delete_removes_the_record():
    """testInitRowWithNullableFieldOnDelete: Paimon's result is a DELETE of the re-initialised
    row; here the key is gone, and a later insert starts from scratch."""
    h = harness("k,a,b,c", {"merge-engine": "aggregation",
                            "fields.default-aggregate-function": "sum",
                            "aggregation.remove-record-on-delete": "true"}, input_retracts=True)
    f = Feeder(h)
    f.add(1, 0, 0, 5)
    f.add(1, 2, 2, None, kind="-D")
    assert h.row(1) is None
    f.add(1, 1, 1, 1)
    assert h.row(1) == (1, 1, 1, 1)


def test_default_is_last_non_null_value():
    h = harness("k,a", {"merge-engine": "aggregation"})
    f = Feeder(h)
    f.add(1, "x")
    f.add(1, None)
    assert h.row(1) == (1, "x")


def test_retraction_of_sum_and_last_value():
    h = harness("k,total,last", {"merge-engine": "aggregation",
                                 "fields.total.aggregate-function": "sum",
                                 "fields.last.aggregate-function": "last_value"},
                input_retracts=True)
    h.run([c("+I", 1, 10, "a", pos=1), c("+I", 1, 5, "b", pos=2)])
    assert h.row(1) == (1, 15, "b")
    h.run([c("-U", 1, 5, "b", pos=3), c("+U", 1, 7, "c", pos=3)])
    assert h.row(1) == (1, 17, "c")
    h.run([c("-D", 1, 7, "c", pos=4)])
    assert h.row(1) == (1, 10, None)  # Paimon: a retracted last_value becomes null


def test_a_retraction_that_meets_no_row_creates_one():
    """As Paimon: the aggregation engine folds a lone -D into a fresh row (sum -> -x)."""
    h = harness("k,total", {"merge-engine": "aggregation", "fields.total.aggregate-function": "sum"},
                input_retracts=True)
    h.run([c("-D", 1, 4, pos=1)])
    assert h.row(1) == (1, -4)


def test_ignore_retract():
    h = harness("k,hi", {"merge-engine": "aggregation", "fields.hi.aggregate-function": "max",
                         "fields.hi.ignore-retract": "true"}, input_retracts=True)
    h.run([c("+I", 1, 9, pos=1)])
    h.run([c("-D", 1, 9, pos=2), c("+I", 1, 3, pos=3)])
    assert h.row(1) == (1, 9)


def test_non_retractable_function_refused_at_planning_for_a_retracting_input():
    with pytest.raises(PlanError, match="fields.hi.aggregate-function.*ignore-retract"):
        harness("k,hi", {"merge-engine": "aggregation", "fields.hi.aggregate-function": "max"},
                input_retracts=True)


def test_unexpected_retraction_at_runtime_names_table_key_and_column():
    h = harness("k,hi", {"merge-engine": "aggregation", "fields.hi.aggregate-function": "max"})
    h.run([c("+I", 1, 9, pos=1)])
    with pytest.raises(InputError, match=r"table 't'.*k=1.*column 'hi'.*ignore-retract"):
        h.run([c("-D", 1, 9, pos=2)])


def test_remove_record_on_delete_only_on_delete_not_update_before():
    h = harness("k,total", {"merge-engine": "aggregation", "fields.total.aggregate-function": "sum",
                            "aggregation.remove-record-on-delete": "true"}, input_retracts=True)
    h.run([c("+I", 1, 10, pos=1)])
    h.run([c("-U", 1, 10, pos=2), c("+U", 1, 3, pos=2)])
    assert h.row(1) == (1, 3)
    h.run([c("-D", 1, 3, pos=3), c("+I", 1, 8, pos=4)])  # delete, then a fresh row
    assert h.row(1) == (1, 8)


def test_count_over_batches():
    h = harness("k,n", {"merge-engine": "aggregation", "fields.n.aggregate-function": "count"},
                input_retracts=True)
    h.run([c("+I", 1, "a", pos=1), c("+I", 1, "b", pos=2), c("+I", 1, None, pos=3)])
    h.run([c("+I", 1, "c", pos=4)])
    assert h.row(1) == (1, 3)
    h.run([c("-D", 1, "a", pos=5)])
    assert h.row(1) == (1, 2)


def test_first_value_survives_batches():
    h = harness("k,v", {"merge-engine": "aggregation", "fields.v.aggregate-function": "first_value"})
    f = Feeder(h)
    f.add(1, None)
    f.add(1, "x")
    assert h.row(1) == (1, None)  # a null is a first value too


def test_bad_value_is_an_input_error():
    h = harness("k,total", {"merge-engine": "aggregation", "fields.total.aggregate-function": "sum"})
    h.run([c("+I", 1, 5, pos=1)])
    with pytest.raises(InputError, match="column 'total'.*cannot compute"):
        h.run([c("+I", 1, "five", pos=2)])


def test_integral_overflow_with_types():
    h = harness("k,total", {"merge-engine": "aggregation", "fields.total.aggregate-function": "sum"},
                types=["BIGINT", "INT"])
    h.run([c("+I", 1, 2**31 - 1, pos=1)])
    with pytest.raises(InputError, match="INT overflow"):
        h.run([c("+I", 1, 1, pos=2)])
