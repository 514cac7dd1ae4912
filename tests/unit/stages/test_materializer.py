"""SinkMaterializer in operator-harness style: feed batches, assert emitted changes and state."""

from __future__ import annotations

import itertools
import random

import pytest

from stage_harness import Harness, c, kinds
from tidemark.engine import state_codec
from tidemark.engine.errors import ConflictError, PlanError
from tidemark.engine.stages.materializer import ActiveRows, SinkMaterializer

# The seed's s1 JOIN s2 example: sink t1(id, level, attr) with PK id; the join's output has
# no upsert key. s1 updates id=1 from level 10 to 20 at position 2: the -U/+U pair shares it.
I_A1 = c("+I", 1, 10, "a1", pos=1)
U_A1 = c("-U", 1, 10, "a1", pos=2)
U_B1 = c("+U", 1, 20, "b1", pos=2)
ORDERINGS = {
    "ideal": [I_A1, U_A1, U_B1],
    "disorder2": [U_B1, I_A1, U_A1],
    "disorder3": [I_A1, U_B1, U_A1],
}


def t1(strategy: str, upsert_key=None, ttl_ms=None) -> SinkMaterializer:
    return SinkMaterializer("t1", (0,), ("id",), upsert_key, strategy, ttl_ms)


def sink_table(h: Harness) -> dict:
    return {r[0]: r for r, w in h.table().items() if w > 0}


@pytest.mark.parametrize("strategy", ["DEDUPLICATE", "NOTHING", "ERROR"])
@pytest.mark.parametrize("ordering", list(ORDERINGS))
def test_seed_disorder_in_one_batch(strategy, ordering):
    h = Harness(t1(strategy))
    out = h.run(ORDERINGS[ordering])
    # Internal consistency: the sink never sees a1, only the final row.
    assert kinds(out) == [("+I", (1, 20, "b1"))]
    assert sink_table(h) == {1: (1, 20, "b1")}


@pytest.mark.parametrize("ordering", list(ORDERINGS))
def test_seed_disorder_spread_over_batches_deduplicate(ordering):
    """Every split of every ordering into batches keeps each retraction after its add."""
    records = ORDERINGS[ordering]
    for cuts in itertools.product([False, True], repeat=len(records) - 1):
        h = Harness(t1("DEDUPLICATE"))
        batch = [records[0]]
        for rec, cut in zip(records[1:], cuts):
            if cut:
                h.run(batch)
                batch = []
            batch.append(rec)
        h.run(batch)
        assert sink_table(h) == {1: (1, 20, "b1")}, (ordering, cuts)
        assert [n.row for n in h.state[(1,)].nodes.values()] == [(1, 20, "b1")]


def test_deduplicate_disorder3_spread_emits_no_flicker_on_late_retraction():
    h = Harness(t1("DEDUPLICATE"))
    assert kinds(h.run([I_A1])) == [("+I", (1, 10, "a1"))]
    assert h.run([U_B1]) == [c("-U", 1, 10, "a1", pos=2), c("+U", 1, 20, "b1", pos=2)]
    assert h.run([U_A1]) == []  # a1 was not the latest: removed silently
    assert h.state[(1,)].rows_in_order() == [(1, 20, "b1")]


def test_deduplicate_disorder2_spread_late_older_add_does_not_win():
    h = Harness(t1("DEDUPLICATE"))
    h.run([U_B1])
    assert h.run([I_A1]) == []  # position 1 < 2: a1 is older than b1 although it arrived later
    assert h.state[(1,)].rows_in_order() == [(1, 10, "a1"), (1, 20, "b1")]
    assert h.run([U_A1]) == []
    assert sink_table(h) == {1: (1, 20, "b1")}


def test_nothing_keeps_first_row_and_drops_others_for_good():
    h = Harness(t1("NOTHING"))
    assert kinds(h.run([I_A1])) == [("+I", (1, 10, "a1"))]
    assert h.run([U_B1]) == []  # b1 conflicts with a1: dropped
    assert h.metrics["conflicts_dropped"] == 1
    assert h.state[(1,)].row == (1, 10, "a1")
    # the current row is retracted: the dropped b1 is gone, so the PK is deleted
    assert h.run([U_A1]) == [c("-D", 1, 10, "a1", pos=2)]
    assert h.state == {}
    assert h.run([c("-U", 1, 20, "b1", pos=3)]) == []
    assert h.metrics["retractions_without_state"] == 1


def test_nothing_first_by_position_within_a_batch():
    h = Harness(t1("NOTHING"))
    out = h.run([c("+I", 1, 7, "late", pos=9), c("+I", 1, 5, "early", pos=4)])
    assert out == [c("+I", 1, 5, "early", pos=9)]
    assert h.metrics["conflicts_dropped"] == 1


def test_nothing_add_then_retract_of_current_in_one_batch_keeps_the_other():
    """Flink compacts the whole step: a conflict that resolves within the batch is no conflict."""
    h = Harness(t1("NOTHING"))
    h.run([I_A1])
    out = h.run([c("+I", 1, 30, "c1", pos=5), c("-D", 1, 10, "a1", pos=6)])
    assert out == [c("-U", 1, 10, "a1", pos=6), c("+U", 1, 30, "c1", pos=6)]
    assert h.metrics["conflicts_dropped"] == 0


def test_nothing_current_retracted_while_two_rows_remain_never_shows_retracted_row():
    """Documented difference from Flink 2.3, which would keep showing a1 here."""
    h = Harness(t1("NOTHING"))
    h.run([I_A1])
    out = h.run([c("-D", 1, 10, "a1", pos=3), c("+I", 1, 30, "c1", pos=4), c("+I", 1, 40, "d1", pos=5)])
    assert out == [c("-U", 1, 10, "a1", pos=5), c("+U", 1, 30, "c1", pos=5)]
    assert h.state[(1,)].row == (1, 30, "c1")
    assert h.metrics["conflicts_dropped"] == 1


A0_1 = c("+I", 1, 10, "a1", pos=1)  # the shown row
A0_2 = c("+I", 1, 10, "a1", pos=2)  # an identical copy from another source row: dropped


def _shown_row_with_a_dropped_copy() -> Harness:
    h = Harness(t1("NOTHING"))
    assert kinds(h.run([A0_1])) == [("+I", (1, 10, "a1"))]
    assert h.run([A0_2]) == []  # two copies: NOTHING keeps the shown one
    assert h.state[(1,)].dropped == 1  # ... and counts the dropped identical copy
    return h


def test_nothing_retraction_may_mean_a_dropped_identical_copy_keeps_the_shown_row():
    """Flink 2.3 keeps the shown row here; with a dropped identical copy that is right as far as
    the sink can know (docs/conformance.md, nothing-retracted-*-copy-*)."""
    h = _shown_row_with_a_dropped_copy()
    out = h.run([c("-D", 1, 10, "a1", pos=3), c("+I", 1, 30, "c1", pos=4), c("+I", 1, 40, "d1", pos=5)])
    assert out == []
    assert h.state[(1,)].row == (1, 10, "a1") and h.state[(1,)].dropped == 0
    assert h.metrics["conflicts_dropped"] == 1 + 2


def test_nothing_dropped_copies_are_used_up_by_retractions():
    """Two retractions of the row and only one dropped copy: no copy is left, so the first
    surviving row is shown (Flink would keep showing the retracted row)."""
    h = _shown_row_with_a_dropped_copy()
    out = h.run([c("-D", 1, 10, "a1", pos=3), c("-D", 1, 10, "a1", pos=4),
                 c("+I", 1, 30, "c1", pos=5), c("+I", 1, 40, "d1", pos=6)])
    assert out == [c("-U", 1, 10, "a1", pos=6), c("+U", 1, 30, "c1", pos=6)]
    assert h.state[(1,)].dropped == 0


def test_nothing_dropped_copy_is_no_candidate_when_nothing_else_remains():
    """As in Flink: the shown row retracted and no other row in the step -> the key is
    deleted, even though a dropped identical copy may still be active upstream."""
    h = _shown_row_with_a_dropped_copy()
    assert h.run([c("-D", 1, 10, "a1", pos=3)]) == [c("-D", 1, 10, "a1", pos=3)]
    assert h.state == {}


def test_nothing_identical_adds_in_one_batch_count_as_dropped_copies():
    h = Harness(t1("NOTHING"))
    h.run([c("+I", 1, 10, "a1", pos=1), c("+I", 1, 10, "a1", pos=2), c("+I", 1, 20, "b1", pos=3)])
    assert h.state[(1,)].row == (1, 10, "a1") and h.state[(1,)].dropped == 1


def test_nothing_with_upsert_key_never_counts_dropped_copies():
    """With an upsert key a retraction names its row: no ambiguity, so the retracted current
    row is replaced by the first surviving row (Flink would keep showing it)."""
    h = Harness(t1("NOTHING", upsert_key=(1,)))
    h.run([c("+I", 1, 10, "a1", pos=1)])
    h.run([c("+I", 1, 20, "a1", pos=2)])
    assert h.state[(1,)].dropped == 0
    out = h.run([c("-D", 1, 10, "a1", pos=3), c("+I", 1, 30, "c1", pos=4), c("+I", 1, 40, "d1", pos=5)])
    assert out == [c("-U", 1, 10, "a1", pos=5), c("+U", 1, 30, "c1", pos=5)]


def test_error_raises_naming_table_and_pk():
    h = Harness(t1("ERROR"))
    h.run([I_A1])
    with pytest.raises(ConflictError) as err:
        h.run([U_B1])
    assert err.value.table == "t1" and err.value.pk == {"id": 1}
    assert "t1" in str(err.value) and "id=1" in str(err.value)
    assert err.value.exit_status == 3


def test_error_within_one_batch_update_is_fine_and_duplicates_conflict():
    h = Harness(t1("ERROR"))
    h.run([I_A1])
    assert h.run([U_A1, U_B1]) == [c("-U", 1, 10, "a1", pos=2), c("+U", 1, 20, "b1", pos=2)]
    assert h.state[(1,)].row == (1, 20, "b1")
    # no upsert key: two copies of one row are two active rows for the PK (as in Flink)
    with pytest.raises(ConflictError):
        h.run([c("+I", 1, 20, "b1", pos=5)])


@pytest.mark.parametrize("strategy", ["DEDUPLICATE", "NOTHING", "ERROR"])
def test_upsert_key_retraction_removes_the_key_whatever_its_values(strategy):
    """Upsert key = column 1. A retraction of key 10 with different non-key values still
    removes key 10's row (Flink: non-key columns may be non-deterministic)."""
    h = Harness(t1(strategy, upsert_key=(1,)))
    h.run([c("+I", 1, 10, "a1", pos=1)])
    assert h.run([c("-D", 1, 10, "other", pos=2)]) == [c("-D", 1, 10, "a1", pos=2)]
    assert h.state == {}
    assert h.metrics["retractions_without_state"] == 0


@pytest.mark.parametrize("strategy", ["DEDUPLICATE", "NOTHING", "ERROR"])
def test_design_example_pair_cancels_and_upsert_replaces(strategy):
    """DESIGN.md: upsert key f0, batch +I(1,1,a1) +U(1,1,a2) -U(1,1,a1) -> sink (1,1,a2)."""
    m = SinkMaterializer("t", (1,), ("f1",), (0,), strategy)
    h = Harness(m)
    batch = [c("+I", 1, 1, "a1", pos=1), c("+U", 1, 1, "a2", pos=2), c("-U", 1, 1, "a1", pos=2)]
    for perm in itertools.permutations(batch):
        h = Harness(m)
        assert h.run(list(perm)) == [c("+I", 1, 1, "a2", pos=2)]


def test_football_rollback_at_the_materializer():
    """The proposal's inventory example: sink PK name, upsert key product_id (column 2)."""
    m = SinkMaterializer("inventory", (0,), ("name",), (2,), "DEDUPLICATE")
    h = Harness(m)
    assert h.run([c("+I", "Football", 5, 1, pos=1)]) == [c("+I", "Football", 5, 1, pos=1)]
    assert h.run([c("+I", "Football", 6, 2, pos=2)]) == [
        c("-U", "Football", 5, 1, pos=2),
        c("+U", "Football", 6, 2, pos=2),
    ]
    # order 3 pushes product 2 to 13 which the filter drops: only the -U reaches the sink
    assert h.run([c("-U", "Football", 6, 2, pos=3)]) == [
        c("-U", "Football", 6, 2, pos=3),
        c("+U", "Football", 5, 1, pos=3),
    ]
    assert h.state[("Football",)].rows_in_order() == [("Football", 5, 1)]
    assert h.run([c("-D", "Football", 5, 1, pos=4)]) == [c("-D", "Football", 5, 1, pos=4)]
    assert h.state == {}


def test_deduplicate_rolls_back_through_several_and_middle_retraction_is_silent():
    m = SinkMaterializer("t", (0,), ("k",), (1,), "DEDUPLICATE")
    h = Harness(m)
    h.run([c("+I", 0, i, f"v{i}", pos=i) for i in range(5)])
    assert sink_table(h) == {0: (0, 4, "v4")}
    assert h.run([c("-D", 0, 2, "v2", pos=10)]) == []
    assert h.run([c("-D", 0, 4, "v4", pos=11), c("-D", 0, 3, "v3", pos=11)]) == [
        c("-U", 0, 4, "v4", pos=11),
        c("+U", 0, 1, "v1", pos=11),
    ]
    assert h.state[(0,)].rows_in_order() == [(0, 0, "v0"), (0, 1, "v1")]


def test_deduplicate_no_upsert_key_counts_identical_rows():
    h = Harness(t1("DEDUPLICATE"))
    h.run([c("+I", 1, 5, "x", pos=1), c("+I", 1, 5, "x", pos=2), c("+I", 1, 6, "y", pos=3)])
    assert sink_table(h) == {1: (1, 6, "y")}
    h.run([c("-D", 1, 6, "y", pos=4)])
    assert sink_table(h) == {1: (1, 5, "x")}
    assert h.run([c("-D", 1, 5, "x", pos=5)]) == []  # one copy of x is still active
    assert h.run([c("-D", 1, 5, "x", pos=6)]) == [c("-D", 1, 5, "x", pos=6)]
    assert h.state == {}


def test_out_of_position_add_lands_in_place():
    m = SinkMaterializer("t", (0,), ("k",), (1,), "DEDUPLICATE")
    h = Harness(m)
    h.run([c("+I", 0, 1, "a", pos=1)])
    h.run([c("+I", 0, 3, "c", pos=3)])
    assert h.run([c("+I", 0, 2, "b", pos=2)]) == []
    assert h.state[(0,)].rows_in_order() == [(0, 1, "a"), (0, 2, "b"), (0, 3, "c")]
    assert h.run([c("+I", 0, 0, "z", pos=0)]) == []
    h.run([c("-D", 0, 3, "c", pos=4)])
    assert sink_table(h) == {0: (0, 2, "b")}
    assert h.state[(0,)].rows_in_order() == [(0, 0, "z"), (0, 1, "a"), (0, 2, "b")]


@pytest.mark.parametrize("strategy", ["DEDUPLICATE", "NOTHING", "ERROR"])
def test_ttl_drops_expired_state_and_counts_unmatched_retraction(strategy):
    h = Harness(t1(strategy, upsert_key=(1,), ttl_ms=1000), now_ms=0)
    h.run([c("+I", 1, 10, "a1", pos=1)])
    h.now_ms = 500
    h.run([c("+U", 1, 10, "a2", pos=2)])  # writes state: TTL restarts
    h.now_ms = 1400
    assert (1,) in h.state
    assert h.run([c("-D", 1, 10, "a2", pos=3)]) == [c("-D", 1, 10, "a2", pos=3)]
    h.run([c("+I", 1, 11, "b", pos=4)])
    h.now_ms = 3000
    assert h.run([c("-D", 1, 11, "b", pos=5)]) == []  # expired: nothing known to retract
    assert h.metrics["state_expired"] == 1
    assert h.metrics["retractions_without_state"] == 1
    assert h.state == {}


@pytest.mark.parametrize("strategy", ["DEDUPLICATE", "NOTHING", "ERROR"])
def test_retraction_without_state_is_counted_not_raised(strategy):
    h = Harness(t1(strategy))
    assert h.run([c("-D", 1, 10, "a1", pos=1)]) == []
    assert h.metrics["retractions_without_state"] == 1
    assert h.state == {}


def test_state_stores_flat_with_a_long_history():
    m = SinkMaterializer("t", (0,), ("k",), (1,), "DEDUPLICATE")
    h = Harness(m)
    h.run([c("+I", 0, i, "v", pos=i) for i in range(20000)])
    stored = state_codec.encode_state(m, h.bucket)  # no recursion through linked nodes
    st = state_codec.decode_state(m, stored).states[(0,)]
    assert isinstance(st, ActiveRows) and st.latest() == (0, 19999, "v")
    assert len(st.rows_in_order()) == 20000


def test_shuffled_batches_give_identical_output_and_state():
    rng = random.Random(7)
    m = SinkMaterializer("t", (0,), ("k",), (1,), "DEDUPLICATE")
    batch = [c("+I", 0, i % 4, f"v{i}", pos=i // 3) for i in range(12)]
    ref = Harness(m)
    expected = kinds(ref.run(batch))
    for _ in range(20):
        h = Harness(m)
        assert kinds(h.run(list(batch), shuffle=rng)) == expected
        assert h.state[(0,)].rows_in_order() == ref.state[(0,)].rows_in_order()


def test_bad_configuration_is_a_plan_error():
    with pytest.raises(PlanError, match="UPDATE"):
        SinkMaterializer("t", (0,), ("k",), None, "UPDATE")
    with pytest.raises(PlanError, match="primary key"):
        SinkMaterializer("t", (0, 1), ("k",), None, "NOTHING")


def test_deduplicate_delete_and_reinsert_in_one_batch_makes_the_row_latest():
    """-X then +X (by position) is not a cancelling pair: the old copy goes, the new copy is
    the latest add. Flink's DEDUPLICATE does the same (the re-added row goes to the end)."""
    h = Harness(t1("DEDUPLICATE"))
    h.run([c("+I", 1, 1, "x", pos=0), c("+I", 1, 0, "y", pos=1)])
    assert sink_table(h) == {1: (1, 0, "y")}
    out = h.run([c("+I", 1, 1, "x", pos=3), c("-D", 1, 1, "x", pos=2)])
    assert out == [c("-U", 1, 0, "y", pos=3), c("+U", 1, 1, "x", pos=3)]
    assert h.state[(1,)].rows_in_order() == [(1, 0, "y"), (1, 1, "x")]


def test_nothing_cancels_pairs_in_any_position_order():
    """NOTHING/ERROR cancel exact pairs inside the step like Flink's compacting materializer,
    so a delete-and-reinsert of the current row keeps it first ahead of a competing add."""
    h = Harness(t1("NOTHING"))
    h.run([c("+I", 1, 1, "x", pos=0)])
    out = h.run([c("+I", 1, 2, "y", pos=1), c("-D", 1, 1, "x", pos=2), c("+I", 1, 1, "x", pos=3)])
    assert out == []
    assert h.state[(1,)].row == (1, 1, "x")
    assert h.metrics["conflicts_dropped"] == 1


def test_consolidate_cancels_pairs_anywhere_for_nothing_and_error():
    from tidemark.engine.stages.materializer import consolidate

    x = (1,)
    batch = [c("+I", *x, pos=1), c("+I", *x, pos=2), c("-D", *x, pos=3), c("-D", *x, pos=0)]
    assert consolidate(batch) == []  # two pairs cancel, whatever their positions
    # more adds than retractions: the earliest adds cancel, the latest survives
    assert consolidate([c("+I", *x, pos=4), c("-D", *x, pos=1), c("+I", *x, pos=2)]) == [((4,), True, x)]


def test_in_position_order_puts_retractions_first_and_never_uses_arrival_order():
    from tidemark.engine.stages.materializer import in_position_order

    x, y = (1,), (2,)
    batch = [c("+U", *x, pos=5), c("+I", *y, pos=5), c("-U", *x, pos=5), c("-D", *y, pos=1)]
    expected = [((1,), False, y), ((5,), False, x), ((5,), True, x), ((5,), True, y)]
    for perm in itertools.permutations(batch):
        assert in_position_order(list(perm)) == expected


# --- identical copies without an upsert key (docs/conformance.md
# "dedup-identical-copies-retract-oldest", "...-newest"): sink t(name, v), PK name. ---


def projection(strategy: str) -> SinkMaterializer:
    return SinkMaterializer("t", (0,), ("name",), None, strategy)


@pytest.mark.parametrize("case", ["retract-oldest", "retract-newest"])
def test_deduplicate_identical_copies_retraction_removes_the_oldest_copy(case):
    """Batch 1 +I('a',2) (source id 1); batch 2 +I('a',1) (id 2), +I('a',2) (id 3) and a -D
    of ('a',2) from id 1 (``-oldest``) or id 3 (``-newest``). The sink cannot tell which
    source row the -D came from: both cases feed it the same changes, and Flink 2.3 removes
    the oldest copy in both, leaving the position-3 copy of ('a',2) as the latest row."""
    batch2 = [c("+I", "a", 1, pos=2), c("+I", "a", 2, pos=3), c("-D", "a", 2, pos=4)]
    for perm in itertools.permutations(batch2):
        h = Harness(projection("DEDUPLICATE"))
        assert h.run([c("+I", "a", 2, pos=1)]) == [c("+I", "a", 2, pos=1)]
        assert h.run(list(perm)) == [], case  # Flink: ('a',2) throughout
        st = h.state[("a",)]
        assert st.rows_in_order() == [("a", 1), ("a", 2)]
        assert st.copies(("a", 2)) == [(3,)]  # the copy at position 1 went
        assert sink_table(h) == {"a": ("a", 2)}


@pytest.mark.parametrize("deleted_id, case", [(1, "retract-oldest"), (3, "retract-newest")])
def test_pipeline_identical_copies_match_flink(deleted_id, case):
    """The conformance reproductions end to end (SQL, source ids): Flink 2.3 shows ('a',2)
    after both batches in both cases."""
    from tidemark.engine.changelog import Change
    from tidemark.engine.pipeline import compile_sql
    from tidemark.engine.replay import ReplayHost

    sql = "\n".join([
        "CREATE TABLE s (id BIGINT, name STRING, v BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 's', 'format' = 'debezium-json');",
        "CREATE TABLE t (name STRING, v BIGINT, PRIMARY KEY (name) NOT ENFORCED) WITH ('topic' = 't', 'format' = 'upsert-json');",
        "INSERT INTO t SELECT name, v FROM s ON CONFLICT DO DEDUPLICATE;",
    ])
    host = ReplayHost(compile_sql(sql))
    host.run_batch({"s": [Change("+I", (1, "a", 2), (1,))]}, now_ms=0)
    assert list(host.table().values()) == [("a", 2)]
    batch2 = [Change("+I", (2, "a", 1), (2,)), Change("+I", (3, "a", 2), (3,)),
              Change("-D", (deleted_id, "a", 2), (4,))]
    host.run_batch({"s": batch2[::-1]}, now_ms=1)
    assert list(host.table().values()) == [("a", 2)], case


def test_deduplicate_in_batch_pair_cancels_when_no_older_copy():
    h = Harness(projection("DEDUPLICATE"))
    h.run([c("+I", "a", 1, pos=1)])
    assert h.run([c("-D", "a", 2, pos=3), c("+I", "a", 2, pos=2)]) == []
    assert h.state[("a",)].rows_in_order() == [("a", 1)]
    assert h.metrics["retractions_without_state"] == 0


def test_deduplicate_in_batch_pair_with_an_older_copy_retracts_the_older_one():
    """Flink: list [X, Y], +X appends -> [X, Y, X], -X removes the first X -> [Y, X]: X is
    the latest row, so the sink changes from Y to X."""
    h = Harness(projection("DEDUPLICATE"))
    h.run([c("+I", "a", 1, pos=1), c("+I", "a", 2, pos=2)])
    assert sink_table(h) == {"a": ("a", 2)}
    out = h.run([c("-D", "a", 1, pos=4), c("+I", "a", 1, pos=3)])
    assert out == [c("-U", "a", 2, pos=4), c("+U", "a", 1, pos=4)]
    assert h.state[("a",)].rows_in_order() == [("a", 2), ("a", 1)]
    assert h.state[("a",)].copies(("a", 1)) == [(3,)]


def test_deduplicate_copies_keep_position_order_across_batches():
    h = Harness(projection("DEDUPLICATE"))
    h.run([c("+I", "a", 1, pos=5), c("+I", "a", 2, pos=4)])
    assert sink_table(h) == {"a": ("a", 1)}
    assert h.run([c("+I", "a", 1, pos=2)]) == []  # a late, older copy: sorted in, not latest
    assert h.state[("a",)].copies(("a", 1)) == [(2,), (5,)]
    assert h.run([c("-D", "a", 1, pos=6)]) == []  # the oldest copy (position 2) goes
    assert h.state[("a",)].copies(("a", 1)) == [(5,)]
    assert h.run([c("-D", "a", 1, pos=7)]) == [c("-U", "a", 1, pos=7), c("+U", "a", 2, pos=7)]
    st = state_codec.decode_state(h.stage, state_codec.encode_state(h.stage, h.bucket)).states[("a",)]
    assert st.rows_in_order() == [("a", 2)] and st.copies(("a", 2)) == [(4,)]


def test_deduplicate_many_copies_of_one_value_retract_oldest_first():
    h = Harness(projection("DEDUPLICATE"))
    h.run([c("+I", "a", 1, pos=i) for i in range(0, 10, 2)] + [c("+I", "a", 2, pos=5)])
    assert sink_table(h) == {"a": ("a", 1)}  # newest copy of ('a',1) is at 8
    h.run([c("-D", "a", 1, pos=20), c("-D", "a", 1, pos=21)])
    assert h.state[("a",)].copies(("a", 1)) == [(4,), (6,), (8,)]
    assert sink_table(h) == {"a": ("a", 1)}


def test_nothing_identical_copies_keep_the_current_row_like_flink():
    """Flink's compacting step cancels +X/-X inside its buffer before the current row is
    consulted: current X, batch +Y, +X, -X -> [X, Y] -> NOTHING keeps X, drops Y. Removing
    the current (oldest) copy instead would keep Y."""
    h = Harness(projection("NOTHING"))
    h.run([c("+I", "a", 1, pos=1)])
    assert h.run([c("+I", "a", 2, pos=2), c("+I", "a", 1, pos=3), c("-D", "a", 1, pos=4)]) == []
    assert h.state[("a",)].row == ("a", 1)
    assert h.metrics["conflicts_dropped"] == 1


def test_error_identical_copies_conflict_whichever_copy_is_retracted():
    h = Harness(projection("ERROR"))
    h.run([c("+I", "a", 1, pos=1)])
    with pytest.raises(ConflictError):
        h.run([c("+I", "a", 2, pos=2), c("+I", "a", 1, pos=3), c("-D", "a", 1, pos=4)])


def test_deduplicate_upsert_key_batch_applies_record_by_record_like_flink():
    """Upsert key = column 1. x, then y for the same key (an upsert: y replaces x), then a
    retraction of x: it removes the key's row whatever its values, as Flink does record by
    record. Cancelling the x pair first would leave y active."""
    m = SinkMaterializer("t", (0,), ("k",), (1,), "DEDUPLICATE")
    batch = [c("+I", 0, 1, "x", pos=1), c("+U", 0, 1, "y", pos=2), c("-U", 0, 1, "x", pos=3)]
    for perm in itertools.permutations(batch):
        h = Harness(m)
        assert h.run(list(perm)) == []
        assert h.state == {}
        assert h.metrics["retractions_without_state"] == 0
