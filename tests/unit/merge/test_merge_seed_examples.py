"""The examples of the seed documents (paimon-merge-engine.txt, table-store-primary-key-table.txt),
with the results the seeds state."""

from __future__ import annotations

from merge_harness import Feeder, c, harness


def test_partial_update_example():
    h = harness("k,price,qty,descr", {"merge-engine": "partial-update"})
    f = Feeder(h)
    f.add(1, 23.0, 10, None)
    f.add(1, None, None, "This is a book")
    f.add(1, 25.2, None, None)
    assert h.row(1) == (1, 25.2, 10, "This is a book")


def test_partial_update_example_in_one_batch_in_any_order():
    h = harness("k,price,qty,descr", {"merge-engine": "partial-update"})
    h.run([c("+I", 1, 25.2, None, None, pos=3), c("+I", 1, 23.0, 10, None, pos=1),
           c("+I", 1, None, None, "This is a book", pos=2)])
    assert h.row(1) == (1, 25.2, 10, "This is a book")


def test_aggregation_example():
    h = harness("product_id,price,sales", {
        "merge-engine": "aggregation",
        "fields.price.aggregate-function": "max",
        "fields.sales.aggregate-function": "sum",
    })
    h.run([c("+I", 1, 23.0, 15, pos=1)])
    h.run([c("+I", 1, 30.2, 20, pos=2)])
    assert h.row(1) == (1, 30.2, 35)


def test_sequence_group_example():
    h = harness("k,a,b,g_1,c,d,g_2", {
        "merge-engine": "partial-update",
        "fields.g_1.sequence-group": "a,b",
        "fields.g_2.sequence-group": "c,d",
    })
    f = Feeder(h)
    f.add(1, 1, 1, 1, 1, 1, 1)
    f.add(1, 2, 2, 2, 2, 2, None)  # g_2 is null: c, d not updated
    assert h.row(1) == (1, 2, 2, 2, 1, 1, 1)
    f.add(1, 3, 3, 1, 3, 3, 3)  # g_1 is smaller: a, b not updated
    assert h.row(1) == (1, 2, 2, 2, 3, 3, 3)


def test_aggregation_for_partial_update_example():
    h = harness("k,a,b,c,d", {
        "merge-engine": "partial-update",
        "fields.a.sequence-group": "b",
        "fields.b.aggregate-function": "first_value",
        "fields.c.sequence-group": "d",
        "fields.d.aggregate-function": "sum",
    })
    f = Feeder(h)
    f.add(1, 1, 1, None, None)
    f.add(1, None, None, 1, 1)
    f.add(1, 2, 2, None, None)
    f.add(1, None, None, 2, 2)
    assert h.row(1) == (1, 2, 1, 2, 3)


def test_nested_update_example_order_wide():
    h = harness("order_id,user_name,address,sub_orders", {
        "merge-engine": "aggregation",
        "fields.sub_orders.aggregate-function": "nested_update",
        "fields.sub_orders.nested-key": "sub_order_id",
    })
    f = Feeder(h)
    f.add(1, "alice", "street 1", None)
    f.add(1, None, None, [{"sub_order_id": 1, "product_name": "pen", "price": 2}])
    f.add(1, None, None, [{"sub_order_id": 2, "product_name": "ink", "price": 5}])
    f.add(1, None, None, [{"sub_order_id": 1, "product_name": "pen", "price": 3}])
    assert h.row(1) == (1, "alice", "street 1", (
        {"sub_order_id": 1, "product_name": "pen", "price": 3},
        {"sub_order_id": 2, "product_name": "ink", "price": 5},
    ))


def test_collect_retraction_caveat_from_the_seed():
    """Seed: a -U['A'] that arrives before +I['A','B'] can do nothing; the result keeps A."""
    h = harness("k,v", {"merge-engine": "aggregation", "fields.v.aggregate-function": "collect"},
                input_retracts=True)
    h.run([c("-U", 1, ["A"], pos=1)])
    h.run([c("+I", 1, ["A", "B"], pos=2)])
    assert h.row(1) == (1, ("A", "B"))


def test_merge_map_retraction_caveat_from_the_seed():
    """Seed: +I[1->A], +I[1->B], -D[1->B] leaves an empty map, not [1->A]."""
    h = harness("k,m", {"merge-engine": "aggregation", "fields.m.aggregate-function": "merge_map"},
                input_retracts=True)
    f = Feeder(h)
    f.add(1, {1: "A"})
    f.add(1, {1: "B"})
    f.add(1, {1: "B"}, kind="-D")
    assert h.row(1) == (1, ())  # the empty MAP


def test_deduplicate_keeps_latest_and_delete_deletes():
    h = harness("k,v")
    f = Feeder(h)
    f.add(1, "a")
    f.add(1, "b")
    assert h.row(1) == (1, "b")
    f.add(1, "b", kind="-D")
    assert h.table() == {}


def test_first_row_keeps_first_and_emits_insert_only():
    h = harness("k,v", {"merge-engine": "first-row", "changelog-producer": "lookup"})
    f = Feeder(h)
    assert [ch.kind for ch in f.add(1, "a")] == ["+I"]
    assert f.add(1, "b") == []
    assert h.row(1) == (1, "a")
