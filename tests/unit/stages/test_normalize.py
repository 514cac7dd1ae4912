"""Normalize (upsert -> full changelog) in operator-harness style."""

from __future__ import annotations

import itertools

import pytest

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


def test_records_replay_in_position_order_whatever_the_arrival_order():
    batch = [c("+U", 1, "x", 1, pos=5), c("+U", 1, "y", 2, pos=9), c("-D", 1, None, None, pos=7)]
    for perm in itertools.permutations(batch):
        h = harness()
        h.run([c("+I", 1, "a", 0, pos=1)])
        # Flink's ChangelogNormalize emits one change per record, each at its position
        assert h.run(list(perm)) == [
            c("-U", 1, "a", 0, pos=5), c("+U", 1, "x", 1, pos=5),
            c("-D", 1, "x", 1, pos=7),
            c("+I", 1, "y", 2, pos=9),
        ]
        assert h.state == {(1,): (1, "y", 2)}


def test_delete_last_in_batch_deletes():
    h = harness()
    h.run([c("+I", 1, "a", 0, pos=1)])
    assert h.run([c("-D", 1, None, None, pos=8), c("+U", 1, "x", 1, pos=5)]) == [
        c("-U", 1, "a", 0, pos=5), c("+U", 1, "x", 1, pos=5), c("-D", 1, "x", 1, pos=8)]
    assert h.state == {}


def test_insert_and_delete_of_new_key_in_one_batch_pass_the_visit_on():
    # conformance dedup-upsert-insert-delete-in-batch-no-refresh: downstream (an aggregate)
    # must see the row's visit to re-emit its group, as Flink's does
    h = harness()
    assert h.run([c("-D", 2, None, None, pos=2), c("+I", 2, "a", 0, pos=1)]) == [
        c("+I", 2, "a", 0, pos=1), c("-D", 2, "a", 0, pos=2)]
    assert h.state == {}
    assert h.metrics["retractions_without_state"] == 0  # the delete found its insert


def test_update_into_a_row_and_out_again_passes_every_step_on():
    h = harness()
    h.run([c("+I", 1, "a", 0, pos=1)])
    out = h.run([c("-D", 1, None, None, pos=4), c("+U", 1, "b", 0, pos=3), c("+U", 1, "b", 0, pos=2)])
    # the identical upsert at 3 changes nothing and is dropped, as Flink does
    assert out == [c("-U", 1, "a", 0, pos=2), c("+U", 1, "b", 0, pos=2), c("-D", 1, "b", 0, pos=4)]


def test_repeated_tombstones_retract_once():
    h = harness()
    h.run([c("+I", 1, "a", 0, pos=1)])
    assert h.run([c("-D", 1, None, None, pos=3), c("-D", 1, None, None, pos=2)]) == [
        c("-D", 1, "a", 0, pos=2)]
    assert h.metrics["retractions_without_state"] == 0


def test_wrong_width_names_the_stage_and_row():
    h = harness()
    with pytest.raises(ValueError, match=r"normalize: row \(1, 'a'\) has 2 columns, expected 3"):
        h.run([c("+I", 1, "a", pos=1), c("+U", 1, "b", 0, pos=2)])


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
        # the delete goes first at a tie (retractions before adds), so x is the row left
        assert h.run(batch) == [c("-D", 1, "a", 0, pos=4), c("+I", 1, "x", 1, pos=4)]
        assert h.state == {(1,): (1, "x", 1)}


def test_identical_upsert_is_dropped_as_flink():
    h = Harness(Normalize((0,), 2))
    h.run([c("+I", 1, "a", pos=1)])
    assert h.run([c("+U", 1, "a", pos=2)]) == []


@pytest.mark.parametrize(
    "batch, expected",
    [
        # deleted and re-inserted
        ([c("-D", 1, None, pos=2), c("+I", 1, "a", pos=3)],
         [c("-D", 1, "a", pos=2), c("+I", 1, "a", pos=3)]),
        # changed and changed back: b's visit is passed on (an aggregate re-emits b's group)
        ([c("+U", 1, "b", pos=2), c("+U", 1, "a", pos=3)],
         [c("-U", 1, "a", pos=2), c("+U", 1, "b", pos=2), c("-U", 1, "b", pos=3), c("+U", 1, "a", pos=3)]),
    ],
)
def test_row_back_to_its_value_passes_each_step_on(batch, expected):
    # (moved from test_refresh.py: normalize no longer compresses these to -U a / +U a)
    h = Harness(Normalize((0,), 2))
    h.run([c("+I", 1, "a", pos=1)])
    assert h.run(list(reversed(batch))) == expected
    assert h.state == {(1,): (1, "a")}


def test_upsert_changing_only_uncompared_columns_is_dropped():
    # compared=(0, 1): column 2 is read by no consumer (Flink prunes it below its normalize)
    h = Harness(Normalize(pk=(0,), width=3, compared=(0, 1)))
    h.run([c("+I", 1, "a", 10, pos=1)])
    assert h.run([c("+U", 1, "a", 11, pos=2)]) == []
    assert h.run([c("+U", 1, "b", 12, pos=3)]) == [c("-U", 1, "a", 10, pos=3), c("+U", 1, "b", 12, pos=3)]
    assert h.run([c("-D", 1, None, None, pos=4)]) == [c("-D", 1, "b", 12, pos=4)]


def _normalize_of(sql: str) -> Normalize:
    from tidemark.engine.pipeline import compile_sql

    return next(n.stage for n in compile_sql(sql).nodes if n.kind == "normalize")


_EVENTS = ("CREATE TABLE events (id BIGINT, category STRING, region STRING, v BIGINT, PRIMARY KEY (id) NOT ENFORCED) "
           "WITH ('format' = 'upsert-json');")


@pytest.mark.parametrize("query, compared", [
    ("SELECT DISTINCT category, region FROM events", (0, 1, 2)),
    ("SELECT category, COUNT(*) FROM events WHERE v > 1 GROUP BY category", (0, 1, 3)),
    ("SELECT id, category, region, v FROM events", None),
])
def test_planner_compares_the_columns_consumers_read(query, compared):
    sink = ("CREATE TABLE out_t (a STRING, b STRING, PRIMARY KEY (a) NOT ENFORCED) WITH ('format' = 'upsert-json');"
            if "DISTINCT" in query else
            "CREATE TABLE out_t (a STRING, n BIGINT, PRIMARY KEY (a) NOT ENFORCED) WITH ('format' = 'upsert-json');"
            if "COUNT" in query else
            "CREATE TABLE out_t (id BIGINT, c STRING, r STRING, v BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ('format' = 'upsert-json');")
    sql = f"{_EVENTS}\n{sink}\nINSERT INTO out_t {query} ON CONFLICT DO NOTHING;"
    assert _normalize_of(sql).compared == compared
