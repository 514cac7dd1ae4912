"""Refresh of a re-produced row: a stage's output row retracted and produced again with the
same value inside one batch. Flink applies records one by one, so the row is emitted again
and sits at the later position downstream; a sink ``ON CONFLICT DO DEDUPLICATE`` (latest
position wins) must then show it (docs/conformance.md, ``dedup-reinserted-same-row-keeps-
old-position`` / ``dedup-rejoined-same-row-keeps-old-position``). Each stage is fed its
batch in harness style, and its output goes through the sink materializer."""

from __future__ import annotations

import random

import pytest

from stage_harness import Harness, c
from tidemark.engine.stages.aggregate import AggCall, GroupAggregate
from tidemark.engine.stages.join import Join
from tidemark.engine.stages.materializer import SinkMaterializer


def shown(h: Harness) -> list[tuple]:
    """Rows the materialized sink shows (emitted changes consolidated)."""
    return sorted(r for r, n in h.table().items() if n > 0)


# -- aggregate: GROUP BY category, region into a sink keyed by category ---------------------
# events (id, category, region, v); output (category, region, COUNT(*), SUM(v))


def group_agg() -> GroupAggregate:
    return GroupAggregate((1, 2), [AggCall("COUNT_STAR"), AggCall("SUM", 3)])


def dedup_by_category() -> SinkMaterializer:
    return SinkMaterializer("per_category", (0,), ("category",), None, "DEDUPLICATE")


@pytest.mark.parametrize("seed", [None, 1, 2, 3])
def test_group_emptied_and_recreated_moves_to_the_later_position(seed):
    rnd = random.Random(seed) if seed is not None else None
    agg, sink = Harness(group_agg()), Harness(dedup_by_category())
    sink.run(agg.run([c("+I", 1, "c", "eu", 1, pos=1), c("+I", 2, "c", "us", 1, pos=2)], shuffle=rnd))
    assert shown(sink) == [("c", "us", 1, 1)]
    out = agg.run([c("-D", 1, "c", "eu", 1, pos=3), c("+I", 3, "c", "eu", 1, pos=4)], shuffle=rnd)
    assert out == [c("-U", "c", "eu", 1, 1, pos=3), c("+U", "c", "eu", 1, 1, pos=4)]
    sink.run(out, shuffle=rnd)
    assert shown(sink) == [("c", "eu", 1, 1)]  # Flink 2.3 shows the re-created eu row


def test_aggregate_refresh_needs_an_output_change_at_some_step():
    agg = Harness(GroupAggregate((0,), [AggCall("SUM", 1), AggCall("MAX", 1)]))
    agg.run([c("+I", "g", 5, pos=1)])
    # adds that leave the output equal at every step: nothing (Flink, state TTL off)
    assert agg.run([c("+I", "g", 0, pos=3), c("+I", "g", 0, pos=2)]) == []
    # changed and changed back (listed out of order): refreshed at the first / last step
    out = agg.run([c("-D", "g", 3, pos=5), c("+I", "g", 3, pos=4)])
    assert out == [c("-U", "g", 5, 5, pos=4), c("+U", "g", 5, 5, pos=5)]
    # a single change that leaves the output equal cannot have changed it
    assert agg.run([c("-D", "g", 0, pos=6)]) == []


def test_aggregate_group_created_and_emptied_in_one_batch_emits_nothing():
    agg = Harness(group_agg())
    assert agg.run([c("+I", 1, "c", "eu", 1, pos=1), c("-D", 1, "c", "eu", 1, pos=2)]) == []
    assert agg.state == {}


# -- join: s1 (id, level) JOIN s2 (id, attr) ON s1.level = s2.id into t2 keyed by attr -------
# output (s1.id, s1.level, s2.id, s2.attr); sink PK = attr (index 3)


def dedup_by_attr() -> SinkMaterializer:
    return SinkMaterializer("t2", (3,), ("attr",), None, "DEDUPLICATE")


@pytest.mark.parametrize("seed", [None, 1, 2, 3])
def test_row_deleted_and_reinserted_through_a_join_moves_to_the_later_position(seed):
    rnd = random.Random(seed) if seed is not None else None
    join = Harness(Join("inner", (1,), (0,), 2, 2))
    sink = Harness(dedup_by_attr())
    sink.run(join.run([], [c("+I", 10, "x", pos=1), c("+I", 20, "x", pos=2)], shuffle=rnd))
    sink.run(join.run([c("+I", 1, 10, pos=3), c("+I", 2, 20, pos=4)], [], shuffle=rnd))
    assert shown(sink) == [(2, 20, 20, "x")]
    out = join.run([c("-D", 1, 10, pos=5), c("+I", 1, 10, pos=6)], [], shuffle=rnd)
    assert out == [c("-U", 1, 10, 10, "x", pos=5), c("+U", 1, 10, 10, "x", pos=6)]
    sink.run(out, shuffle=rnd)
    assert shown(sink) == [(1, 10, 10, "x")]  # Flink 2.3 shows the re-joined row


def test_join_pair_that_nets_to_nothing_without_a_prior_row_emits_nothing():
    join = Harness(Join("inner", (1,), (0,), 2, 2))
    join.run([], [c("+I", 10, "x", pos=1)])
    # a joined row added and retracted at one position (e.g. from an upstream join) cancels
    assert join.run([c("+I", 1, 10, pos=7), c("-D", 1, 10, pos=7)], []) == []
    assert join.metrics["retractions_without_state"] == 0
    # inserted then deleted: gone again, nothing to refresh
    assert join.run([c("+I", 1, 10, pos=8), c("-D", 1, 10, pos=9)], []) == []


def test_left_join_partner_added_and_removed_repads_at_the_later_position():
    join = Harness(Join("left", (1,), (0,), 2, 2))
    join.run([c("+I", 1, 10, pos=1)], [])
    out = join.run([], [c("-D", 10, "x", pos=3), c("+I", 10, "x", pos=2)])
    assert out == [c("-U", 1, 10, None, None, pos=2), c("+U", 1, 10, None, None, pos=3)]
