"""``net_upserts`` (the upsert sink's one change per key, over a whole batch) against
``net_upsert`` applied to each key's changes, and literal cases: changes in, the records
an upsert sink writes out."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from tidemark.engine.batch import ChangeBatch
from tidemark.engine.batch_ipc import schema_of
from tidemark.engine.changelog import KINDS, Change
from tidemark.engine.kernels.upsert import net_upsert, net_upserts
from tidemark.engine.types import parse_type

SCHEMA = schema_of(["id", "v", "x"], [parse_type("BIGINT"), parse_type("STRING"), parse_type("DOUBLE")])


def run(changes: list[Change], pk=(0,)) -> set[Change]:
    return set(net_upserts(ChangeBatch.from_changes(changes, SCHEMA), pk).changes())


def c(kind: str, *row, pos: int) -> Change:
    return Change(kind, tuple(row), (pos,))


def test_an_update_writes_the_new_row():
    assert run([c("+I", 1, "a", 0.5, pos=1), c("-U", 1, "a", 0.5, pos=2), c("+U", 1, "b", 0.5, pos=2)]) == {
        c("+U", 1, "b", 0.5, pos=2)
    }


def test_a_key_inserted_and_deleted_in_one_batch_writes_nothing():
    assert run([c("+I", 1, "a", 0.5, pos=1), c("-D", 1, "a", 0.5, pos=2), c("+I", 2, "z", None, pos=3)]) == {
        c("+U", 2, "z", None, pos=3)
    }


def test_a_delete_of_a_row_from_an_earlier_batch_is_a_tombstone():
    assert run([c("-D", 1, "a", 0.5, pos=4)]) == {c("-D", 1, "a", 0.5, pos=4)}


def test_arrival_order_does_not_matter_only_positions_do():
    """The ``-U`` of a move arrives after the ``+U`` of the same position."""
    assert run([c("+U", 1, "b", 0.0, pos=2), c("-U", 1, "a", 0.0, pos=2), c("+I", 1, "a", 0.0, pos=1)]) == {
        c("+U", 1, "b", 0.0, pos=2)
    }


def test_a_key_of_two_columns():
    changes = [c("+I", 1, "a", 1.0, pos=1), c("+I", 1, "b", 2.0, pos=2), c("-U", 1, "a", 1.0, pos=3), c("+U", 1, "a", 3.0, pos=3)]
    assert run(changes, pk=(0, 1)) == {c("+U", 1, "a", 3.0, pos=3), c("+U", 1, "b", 2.0, pos=2)}


row = st.tuples(st.integers(0, 3), st.sampled_from(["a", "b", "é\"\n"]), st.none() | st.sampled_from([0.5, -1.0, 2.0]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(KINDS), row, st.integers(0, 6), st.integers(0, 2)), max_size=30))
def test_net_upserts_is_net_upsert_per_key(draw):
    changes = [Change(kind, r, (p, q)) for kind, r, p, q in draw]
    per_key = defaultdict(list)
    for ch in changes:
        per_key[ch.row[0]].append(ch)
    expected = {f for run_ in per_key.values() if (f := net_upsert(run_)) is not None}
    assert run(changes) == expected
