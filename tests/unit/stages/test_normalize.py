"""Normalize (upsert -> full changelog) in operator-harness style."""

from __future__ import annotations

import itertools

from stage_harness import Harness, c
from tidemark.engine.stages.normalize import Normalize


def harness() -> Harness:
    return Harness(Normalize(pk=(0,), width=3))


def test_insert_update_delete_become_full_changelog():
    h = harness()
    assert h.run([c("+I", 1, "a", 10, pos=1)]) == [c("+I", 1, "a", 10, pos=1)]
    assert h.run([c("+U", 1, "b", 10, pos=2)]) == [c("-U", 1, "a", 10, pos=2), c("+U", 1, "b", 10, pos=2)]
    # an upsert tombstone only carries the key: the -D carries the full before-image
    assert h.run([c("-D", 1, None, None, pos=3)]) == [c("-D", 1, "b", 10, pos=3)]
    assert h.state == {}


def test_unchanged_upsert_emits_nothing():
    h = harness()
    h.run([c("+I", 1, "a", 10, pos=1)])
    assert h.run([c("+U", 1, "a", 10, pos=2)]) == []
    assert h.state[(1,)] == (1, "a", 10)


def test_greatest_position_wins_in_any_order():
    batch = [c("+U", 1, "x", 1, pos=5), c("+U", 1, "y", 2, pos=9), c("-D", 1, None, None, pos=7)]
    for perm in itertools.permutations(batch):
        h = harness()
        h.run([c("+I", 1, "a", 0, pos=1)])
        # a stopped being current at 5 (the first change), y became current at 9
        assert h.run(list(perm)) == [c("-U", 1, "a", 0, pos=5), c("+U", 1, "y", 2, pos=9)]


def test_delete_last_in_batch_deletes():
    h = harness()
    h.run([c("+I", 1, "a", 0, pos=1)])
    # a was replaced at 5 (Flink: -U a, +U x at 5, then -D x at 8): the net -D is at 5
    assert h.run([c("-D", 1, None, None, pos=8), c("+U", 1, "x", 1, pos=5)]) == [c("-D", 1, "a", 0, pos=5)]


def test_insert_and_delete_of_new_key_in_one_batch_emit_nothing():
    h = harness()
    assert h.run([c("+I", 2, "a", 0, pos=1), c("-D", 2, None, None, pos=2)]) == []
    assert h.state == {}
    assert h.metrics["retractions_without_state"] == 0  # the delete found its insert


def test_delete_for_unknown_key_is_counted():
    h = harness()
    assert h.run([c("-D", 3, None, None, pos=1)]) == []
    assert h.metrics["retractions_without_state"] == 1


def test_update_before_is_ignored_in_upsert_mode():
    h = harness()
    h.run([c("+I", 1, "a", 0, pos=1)])
    assert h.run([c("-U", 1, "a", 0, pos=2)]) == []
    assert h.state[(1,)] == (1, "a", 0)


def test_composite_key():
    h = Harness(Normalize(pk=(0, 1), width=3))
    out = h.run([c("+I", 1, 1, "a", pos=1), c("+I", 1, 2, "b", pos=2)])
    assert sorted(out) == [c("+I", 1, 1, "a", pos=1), c("+I", 1, 2, "b", pos=2)]
    assert set(h.state) == {(1, 1), (1, 2)}


def test_ties_at_one_position_upsert_beats_delete_in_any_order():
    for batch in ([c("-D", 1, None, None, pos=4), c("+U", 1, "x", 1, pos=4)],
                  [c("+U", 1, "x", 1, pos=4), c("-D", 1, None, None, pos=4)]):
        h = harness()
        h.run([c("+I", 1, "a", 0, pos=1)])
        assert h.run(batch) == [c("-U", 1, "a", 0, pos=4), c("+U", 1, "x", 1, pos=4)]
