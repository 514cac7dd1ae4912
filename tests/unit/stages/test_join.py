"""Regular join with retraction in operator-harness style (input 0 = left, 1 = right)."""

from __future__ import annotations

import pytest

from stage_harness import Harness, c, kinds
from tidemark.engine.errors import PlanError
from tidemark.engine.stages.join import Join


def join(kind: str, residual=None) -> Join:
    # left (id, level), right (id, attr); ON left.level = right.id
    return Join(kind, left_key=(1,), right_key=(0,), left_width=2, right_width=2, residual=residual)


def test_seed_join_update_moves_row_between_keys():
    h = Harness(join("inner"))
    h.run([c("+I", 1, 10, pos=1)], [c("+I", 10, "a1", pos=1), c("+I", 20, "b1", pos=1)])
    assert h.table() == {(1, 10, 10, "a1"): 1}
    # s1 updates id=1 from level 10 to 20: the halves land on different join keys
    out = h.run([c("-U", 1, 10, pos=2), c("+U", 1, 20, pos=2)], [])
    assert kinds(out) == [("+I", (1, 20, 20, "b1")), ("-D", (1, 10, 10, "a1"))]
    assert all(ch.pos == (2,) for ch in out)
    assert h.table() == {(1, 20, 20, "b1"): 1}


def test_inner_join_retraction_and_update_of_one_key():
    h = Harness(join("inner"))
    assert h.run([c("+I", 1, 10, pos=1)], [c("+I", 10, "a", pos=2)]) == [c("+I", 1, 10, 10, "a", pos=2)]
    out = h.run([], [c("-U", 10, "a", pos=3), c("+U", 10, "b", pos=3)])
    assert out == [c("-U", 1, 10, 10, "a", pos=3), c("+U", 1, 10, 10, "b", pos=3)]
    assert h.run([], [c("-D", 10, "b", pos=4)]) == [c("-D", 1, 10, 10, "b", pos=4)]
    assert h.run([c("-D", 1, 10, pos=5)], []) == []
    assert h.state == {}


def test_left_join_pads_unpads_and_repads():
    h = Harness(join("left"))
    assert h.run([c("+I", 1, 10, pos=1)], []) == [c("+I", 1, 10, None, None, pos=1)]
    assert h.run([], [c("+I", 10, "a", pos=2)]) == [
        c("-U", 1, 10, None, None, pos=2),
        c("+U", 1, 10, 10, "a", pos=2),
    ]
    assert h.run([], [c("+I", 10, "a2", pos=3)]) == [c("+I", 1, 10, 10, "a2", pos=3)]
    assert h.run([], [c("-D", 10, "a", pos=4)]) == [c("-D", 1, 10, 10, "a", pos=4)]
    # the last partner leaves: padded again, at the position of the retraction
    assert h.run([], [c("-D", 10, "a2", pos=5)]) == [
        c("-U", 1, 10, 10, "a2", pos=5),
        c("+U", 1, 10, None, None, pos=5),
    ]
    assert h.run([c("-D", 1, 10, pos=6)], []) == [c("-D", 1, 10, None, None, pos=6)]
    assert h.state == {}


def test_right_and_full_join_pad_their_sides():
    h = Harness(join("right"))
    assert h.run([c("+I", 1, 10, pos=1)], [c("+I", 20, "b", pos=2)]) == [c("+I", None, None, 20, "b", pos=2)]
    h = Harness(join("full"))
    out = h.run([c("+I", 1, 10, pos=1)], [c("+I", 20, "b", pos=2)])
    assert kinds(out) == [("+I", (1, 10, None, None)), ("+I", (None, None, 20, "b"))]
    # the update's halves land on keys 10 and 20: each key emits its own net change
    out = h.run([c("-U", 1, 10, pos=3), c("+U", 1, 20, pos=3)], [])
    assert kinds(out) == [
        ("+U", (1, 20, 20, "b")),
        ("-D", (1, 10, None, None)),
        ("-U", (None, None, 20, "b")),
    ]
    assert h.table() == {(1, 20, 20, "b"): 1}


def test_pad_and_unpad_in_one_batch_cancel():
    h = Harness(join("left"))
    assert h.run([c("+I", 1, 10, pos=1)], [c("+I", 10, "a", pos=1)]) == [c("+I", 1, 10, 10, "a", pos=1)]


def test_null_keys_never_match_but_outer_sides_still_pad():
    h = Harness(join("full"))
    out = h.run([c("+I", 1, None, pos=1)], [c("+I", None, "x", pos=2)])
    assert kinds(out) == [("+I", (1, None, None, None)), ("+I", (None, None, None, "x"))]
    assert h.state == {}  # nothing stored for NULL keys
    assert kinds(h.run([c("-D", 1, None, pos=3)], [])) == [("-D", (1, None, None, None))]
    h = Harness(join("inner"))
    assert h.run([c("+I", 1, None, pos=1)], [c("+I", None, "x", pos=2)]) == []


def test_residual_predicate_and_outer_padding():
    # ON l.level = r.id AND r.attr <> 'bad'
    h = Harness(join("left", residual=lambda row: row[3] != "bad"))
    assert h.run([c("+I", 1, 10, pos=1)], [c("+I", 10, "bad", pos=1)]) == [c("+I", 1, 10, None, None, pos=1)]
    assert h.run([], [c("+I", 10, "good", pos=2)]) == [
        c("-U", 1, 10, None, None, pos=2),
        c("+U", 1, 10, 10, "good", pos=2),
    ]
    assert h.run([], [c("-D", 10, "bad", pos=3)]) == []  # never matched: no change


def test_multiplicities():
    h = Harness(join("inner"))
    h.run([c("+I", 1, 10, pos=1), c("+I", 1, 10, pos=2)], [c("+I", 10, "a", pos=3)])
    assert h.table() == {(1, 10, 10, "a"): 2}
    assert h.run([c("-D", 1, 10, pos=4)], []) == [c("-D", 1, 10, 10, "a", pos=4)]
    assert h.table() == {(1, 10, 10, "a"): 1}


def test_retraction_of_unknown_row_is_counted():
    h = Harness(join("left"))
    assert h.run([c("-D", 9, 10, pos=1)], []) == []
    assert h.metrics["retractions_without_state"] == 1


def test_joined_row_position_is_the_later_input():
    h = Harness(join("inner"))
    h.run([], [c("+I", 10, "a", pos=7)])
    assert h.run([c("+I", 1, 10, pos=3)], []) == [c("+I", 1, 10, 10, "a", pos=7)]


def test_bad_configuration():
    with pytest.raises(PlanError, match="cross"):
        Join("cross", (0,), (0,), 1, 1)
    with pytest.raises(PlanError, match="key"):
        Join("inner", (0, 1), (0,), 2, 2)
