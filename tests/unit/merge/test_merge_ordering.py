"""Order: ``sequence.field`` wins over arrival and position, also across batches; a batch is
a set (shuffling it never changes the result); exact +X/-X pairs cancel; ties are broken
deterministically."""

from __future__ import annotations

import itertools
import random

import pytest

from merge_harness import c, harness


@pytest.mark.parametrize("engine", ["deduplicate", "partial-update", "aggregation"])
def test_largest_sequence_wins_whatever_the_arrival_order(engine):
    records = [c("+I", 1, 3, "c", pos=1), c("+I", 1, 1, "a", pos=2), c("+I", 1, 2, "b", pos=3)]
    for perm in itertools.permutations(records):
        h = harness("k,ts,v", {"merge-engine": engine, "sequence.field": "ts"})
        h.run(list(perm))
        assert h.row(1) == (1, 3, "c")


@pytest.mark.parametrize("engine", ["deduplicate", "partial-update", "aggregation"])
def test_largest_sequence_wins_across_batches(engine):
    h = harness("k,ts,v", {"merge-engine": engine, "sequence.field": "ts"})
    h.run([c("+I", 1, 5, "new", pos=1)])
    h.run([c("+I", 1, 2, "late", pos=2)])
    assert h.row(1) == (1, 5, "new")
    h.run([c("+I", 1, 6, "newer", pos=3)])
    assert h.row(1) == (1, 6, "newer")


def test_late_record_only_fills_nulls_in_partial_update():
    h = harness("k,ts,a,b", {"merge-engine": "partial-update", "sequence.field": "ts"})
    h.run([c("+I", 1, 5, "a5", None, pos=1)])
    h.run([c("+I", 1, 2, "a2", "b2", pos=2)])  # older: it lands before the merged row
    assert h.row(1) == (1, 5, "a5", "b2")


def test_older_delete_does_not_delete_newer_row():
    h = harness("k,ts,v", {"sequence.field": "ts"}, input_retracts=True)
    h.run([c("+I", 1, 5, "x", pos=1)])
    h.run([c("-D", 1, 4, "x", pos=2)])
    assert h.row(1) == (1, 5, "x")
    h.run([c("-D", 1, 6, "x", pos=3)])
    assert h.row(1) is None


def test_descending_sort_order_smallest_wins():
    h = harness("k,ts,v", {"sequence.field": "ts", "sequence.field.sort-order": "descending"})
    h.run([c("+I", 1, 1, "small", pos=1), c("+I", 1, 9, "big", pos=2)])
    assert h.row(1) == (1, 1, "small")


def test_several_sequence_fields_compare_in_order():
    h = harness("k,s1,s2,v", {"sequence.field": "s1,s2"})
    h.run([c("+I", 1, 2, 1, "x", pos=1), c("+I", 1, 1, 9, "y", pos=2), c("+I", 1, 2, 0, "z", pos=3)])
    assert h.row(1) == (1, 2, 1, "x")


def test_null_sequence_is_oldest():
    h = harness("k,ts,v", {"sequence.field": "ts"})
    h.run([c("+I", 1, 1, "one", pos=1), c("+I", 1, None, "null", pos=2)])
    assert h.row(1) == (1, 1, "one")


def test_float_sequence_orders_like_java():
    h = harness("k,ts,v", {"sequence.field": "ts"})
    h.run([c("+I", 1, 0.0, "pos0", pos=1), c("+I", 1, -0.0, "neg0", pos=2)])
    assert h.row(1) == (1, 0.0, "pos0")  # -0.0 < 0.0
    h2 = harness("k,ts,v", {"sequence.field": "ts"})
    h2.run([c("+I", 1, float("nan"), "nan", pos=1), c("+I", 1, float("inf"), "inf", pos=2)])
    assert h2.row(1)[2] == "nan"  # NaN above infinity


def test_without_sequence_field_position_decides_not_arrival():
    h = harness("k,v")
    h.run([c("+I", 1, "second", pos=2), c("+I", 1, "first", pos=1)])
    assert h.row(1) == (1, "second")


def test_retraction_before_add_at_same_position():
    h = harness("k,v", input_retracts=True)
    h.run([c("+I", 1, "a", pos=1)])
    h.run([c("+U", 1, "b", pos=2), c("-U", 1, "a", pos=2)])
    assert h.row(1) == (1, "b")


def test_exact_pairs_cancel_wherever_they_sit():
    """+I(a2) -U(a2) in one batch cancel: the earlier row stays (Paimon would delete)."""
    h = harness("k,v", input_retracts=True)
    h.run([c("+I", 1, "a1", pos=1)])
    h.run([c("-D", 1, "a2", pos=3), c("+I", 1, "a2", pos=2)])
    assert h.row(1) == (1, "a1")
    assert h.metrics["merge_pairs_cancelled"] == 1


def test_full_ties_are_deterministic():
    rows = [c("+I", 1, v, pos=1) for v in ("x", "y", "z")]
    results = set()
    for perm in itertools.permutations(rows):
        h = harness("k,v")
        h.run(list(perm))
        results.add(h.row(1))
    assert len(results) == 1


ENGINE_OPTIONS = [
    {"merge-engine": "deduplicate", "sequence.field": "s"},
    {"merge-engine": "deduplicate"},
    {"merge-engine": "partial-update"},
    {"merge-engine": "partial-update", "sequence.field": "s"},
    {"merge-engine": "partial-update", "fields.s.sequence-group": "a", "fields.b.aggregate-function": "sum",
     "fields.s2.sequence-group": "b"},
    {"merge-engine": "aggregation", "fields.a.aggregate-function": "listagg",
     "fields.b.aggregate-function": "sum", "fields.s2.aggregate-function": "first_value"},
    {"merge-engine": "aggregation", "sequence.field": "s", "fields.a.aggregate-function": "last_value",
     "fields.b.aggregate-function": "max"},
    {"merge-engine": "first-row"},
]


@pytest.mark.parametrize("options", ENGINE_OPTIONS)
def test_a_batch_is_a_set(options):
    rng = random.Random(7)
    batches = []
    for b in range(6):
        batch = []
        for _ in range(rng.randint(1, 8)):
            batch.append(c("+I", rng.randint(1, 3), rng.choice([None, 1, 2, 3]),
                           rng.choice([None, "p", "q", "r"]), rng.choice([None, 1, 2, 5]),
                           rng.choice([None, 1, 2]), pos=rng.randint(0, 30)))
        batches.append(batch)
    reference = harness("k,s,a,b,s2", options)
    ref_out = [sorted(map(repr, reference.run(batch))) for batch in batches]
    for seed in range(5):
        h = harness("k,s,a,b,s2", options)
        out = [sorted(map(repr, h.run(batch, shuffle=random.Random(seed)))) for batch in batches]
        assert h.table() == reference.table()
        assert out == ref_out
