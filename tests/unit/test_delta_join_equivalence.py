"""A delta join gives the regular join's results on random CDC workloads (many seeds).

- strong consistency: the same sink changes as the regular join, batch for batch, through
  the replay host with the embedded index, and through an index (``TableIndex``) fed with
  the whole workload *ahead* of the job and asked "as of" each batch's start offsets;
- eventual consistency: the same materialized sink table after every batch (embedded
  index, exactly at the batch end) and at the end when the index runs ahead of the job;
- the join stage keeps no state in the host, and the caches do not change results.
"""

from __future__ import annotations

from collections import Counter

import pytest

from tests.unit.delta_workload import sql, workload
from tidemark.engine.pipeline import compile_sql
from tidemark.engine.changelog import Change
from tidemark.engine.replay import ReplayHost
from tidemark.engine.stage import BatchContext
from tidemark.engine.stages.delta_join import DeltaJoin, DeltaSide
from tidemark.engine.stages.join import Join
from tidemark.index_client.local import LocalLookup, index_for

SEEDS = range(40)


def delta_node(pipeline):
    node = next(n for n in pipeline.nodes if n.kind == "join")
    assert isinstance(node.stage, DeltaJoin), node.detail.get("strategy_reason")
    return node


def run(pipeline, batches, before_batch=None):
    host = ReplayHost(pipeline)
    outs, tables = [], []
    for i, batch in enumerate(batches):
        if before_batch is not None:
            before_batch(i, batch)
        outs.append(Counter(host.run_batch(batch, now_ms=0)))
        tables.append(host.table())
    return host, outs, tables


def regular(batches, **kw):
    return run(compile_sql(sql("NONE", **kw)), batches)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("join", ["JOIN", "LEFT JOIN", "RIGHT JOIN", "FULL JOIN"])
def test_strong_embedded_equals_regular_change_for_change(seed: int, join: str) -> None:
    batches = workload(seed, reverts=seed % 4 != 3)
    kw = dict(join=join, residual="a.v <> b.w" if seed % 3 == 0 else "", where="WHERE a.v > 0" if seed % 4 == 1 else "")
    _, want, want_tables = regular(batches, **kw)
    p = compile_sql(sql("FORCE", "strong", cache_size=2 if seed % 2 else 10000, **kw))
    delta_node(p)
    host, got, got_tables = run(p, batches)
    assert got == want
    assert got_tables == want_tables
    assert host.state[delta_node(p).id] == {}  # no join state in the host


def lookup_fed_ahead(pipeline, batches):
    """A LocalLookup over TableIndex objects fed with every batch up front, and a hook
    giving the stage each batch's (start, end) offset fences."""
    indexes = {name: index_for(t) for name, t in pipeline.sources.items()}
    lookup = LocalLookup(indexes)
    fences = []
    for batch in batches:
        f = {}
        for name in indexes:
            start = lookup.offsets(name)
            end = lookup.feed(name, batch.get(name, []))
            f[name] = (start, end)
        fences.append(f)
    return lookup, fences


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("join", ["JOIN", "LEFT JOIN", "FULL JOIN"])
def test_strong_with_index_ahead_answers_as_of_each_batch(seed: int, join: str) -> None:
    batches = workload(seed, reverts=seed % 4 != 3)
    _, want, want_tables = regular(batches, join=join)
    p = compile_sql(sql("FORCE", "strong", join=join, cache_size=3))
    stage = delta_node(p).stage
    lookup, fences = lookup_fed_ahead(p, batches)
    stage.bind(lookup)

    def before(i, _batch):
        stage.begin_batch(i, fences[i])
        for name, (start, _end) in fences[i].items():
            lookup.tables[name].release(start)  # history older than this batch is never asked for again

    _, got, got_tables = run(p, batches, before)
    assert got == want
    assert got_tables == want_tables
    assert lookup.calls > 0


@pytest.mark.parametrize("seed", SEEDS)
def test_eventual_embedded_equals_regular_in_the_sink_after_every_batch(seed: int) -> None:
    batches = workload(seed, b_append=True, reverts=seed % 2 == 0)
    kw = dict(b_format="json", residual="a.v <> b.w" if seed % 3 == 0 else "")
    _, _, want_tables = regular(batches, **kw)
    p = compile_sql(sql("FORCE", "eventual", cache_size=2 if seed % 2 else 10000, **kw))
    assert delta_node(p).detail["delta_join"]["consistency"] == "eventual"
    host, _, got_tables = run(p, batches)
    assert got_tables == want_tables
    assert host.state[delta_node(p).id] == {}


@pytest.mark.parametrize("seed", SEEDS)
def test_eventual_with_index_ahead_is_right_at_the_end(seed: int) -> None:
    """The index has applied the whole workload before the first batch runs: lookups see
    the future, the seed's eventual consistency makes the final sink right anyway."""
    batches = workload(seed, b_append=True, reverts=seed % 2 == 0)
    _, _, want_tables = regular(batches, b_format="json")
    p = compile_sql(sql("FORCE", "eventual", b_format="json", cache_size=2))
    stage = delta_node(p).stage
    lookup, fences = lookup_fed_ahead(p, batches)
    stage.bind(lookup)
    _, _, got_tables = run(p, batches, lambda i, _b: stage.begin_batch(i, fences[i]))
    assert got_tables[-1] == want_tables[-1]


def test_eventual_emits_the_seed_duplicate_and_the_materializer_removes_it() -> None:
    """One batch with a matching row on each side: dA |x| (B + dB) and (A + dA) |x| dB both
    produce the pair; the stage emits it twice, the upsert sink (keyed by the pair of
    primary keys) writes the key twice and shows the row once."""
    p = compile_sql(sql("FORCE", "eventual", b_format="json"))
    node = delta_node(p)
    host = ReplayHost(p)
    out = host.run_batch({"a": [Change("+I", (1, 7, 1), (1,))], "b": [Change("+I", (1000, 7, 2), (2,))]}, now_ms=0)
    pair = [[Change("+I", (2, 8, 1), (3,))], [Change("+I", (1001, 8, 2), (4,))]]
    stage_out = node.stage.process_key((8,), pair, None, BatchContext(batch_id=1))[1]
    assert Counter(c.row for c in stage_out) == Counter({(2, 8, 1, 1001, 8, 2): 2})
    assert host.table() == {(1, 1000): (1, 1000, 1, 2)}
    assert Counter((c.kind, c.row) for c in out) == Counter({("+I", (1, 1000, 1, 2)): 2})


def test_cache_metrics_and_bounded_size() -> None:
    batches = workload(7, batches=30, per_batch=10, keys=6)
    p = compile_sql(sql("FORCE", "strong", cache_size=3))
    host, _, _ = run(p, batches)
    m = host.metrics
    for side in ("left", "right"):
        assert m[f"delta_join.{side}.cache_hits"] > 0
        assert m[f"delta_join.{side}.cache_misses"] > 0
        assert 0 < m[f"delta_join.{side}.cache_size"] <= 3  # reported as the current size
        assert m[f"delta_join.{side}.lookup_requests"] == m[f"delta_join.{side}.cache_misses"]


def test_cache_disabled_looks_every_key_up() -> None:
    batches = workload(3)
    p = compile_sql(sql("FORCE", "strong", cache="false"))
    host, _, tables = run(p, batches)
    assert host.metrics["delta_join.left.cache_hits"] == 0 and host.metrics["delta_join.right.cache_hits"] == 0
    assert host.metrics["delta_join.left.cache_size"] == 0
    assert tables == regular(batches)[2]


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("join_type", ["inner", "left", "full"])
def test_strong_process_batch_one_request_per_side_and_regular_changes(seed: int, join_type: str) -> None:
    """The batched path (what the Spark host calls): the non-NULL keys the batch touches
    are looked up in one request per side, the regular join's state is rebuilt from the
    before-images and the changes are the regular join's. An outer join looks every
    touched key up on both sides; an inner join skips a side that only adds to a key whose
    other side is unchanged."""
    batches = workload(seed, reverts=True)
    regular_join = Join(join_type, (1,), (1,), 3, 3)
    sides = tuple(DeltaSide(t, "by_k", ("k",), (0,)) for t in ("a", "b"))
    stage = DeltaJoin(join_type, (1,), (1,), 3, 3, sides=sides, consistency="strong", cache_enabled=False)
    p = compile_sql(sql("NONE"))
    lookup, fences = lookup_fed_ahead(p, batches)
    stage.bind(lookup)
    state: dict = {}
    skipped_inner_side = 0
    for i, batch in enumerate(batches):
        ctx = BatchContext(batch_id=i)
        inputs = [batch["a"], batch["b"]]
        want: Counter = Counter()
        groups: dict = {}
        for idx in (0, 1):
            for c in inputs[idx]:
                groups.setdefault(regular_join.key_of(c, idx), [[], []])[idx].append(c)
        for key, lists in groups.items():
            state[key], out = regular_join.process_key(key, lists, state.get(key), ctx)
            want.update(out)
        calls = lookup.calls
        stage.begin_batch(i, fences[i])
        got = Counter(stage.process_batch(inputs, ctx))
        assert got == want, f"batch {i}"
        touched = {k: lists for k, lists in groups.items() if None not in k}
        wanted = [0, 0]
        for lists in touched.values():
            for s in (0, 1):
                retracts = any(c.kind in ("-U", "-D") for c in lists[s])
                wanted[s] += join_type != "inner" or bool(lists[1 - s]) or retracts
        assert lookup.calls - calls == (wanted[0] > 0) + (wanted[1] > 0)
        assert ctx.metrics["delta_join.left.lookup_keys"] == wanted[0]
        assert ctx.metrics["delta_join.right.lookup_keys"] == wanted[1]
        skipped_inner_side += join_type == "inner" and sum(wanted) < 2 * len(touched)
    assert join_type != "inner" or skipped_inner_side > 0  # the workload exercises the skip


def test_strong_inner_shows_a_row_put_back_as_a_refresh_like_the_regular_join() -> None:
    """Harness style: a left row updated away and back within one batch nets to nothing,
    but Flink's record-by-record join retracts and re-emits its joined row, which then sits
    at the later position. The strong delta join emits exactly that."""
    sides = tuple(DeltaSide(t, "by_k", ("k",), (0,)) for t in ("a", "b"))
    stage = DeltaJoin("inner", (1,), (1,), 3, 3, sides=sides, consistency="strong", cache_enabled=False)
    a, a2, b = (1, 7, 1), (1, 8, 1), (1000, 7, 2)
    first = stage.process_batch([[Change("+I", a, (1,))], [Change("+I", b, (2,))]], BatchContext(batch_id=0))
    assert first == [Change("+I", a + b, (2,))]
    away_and_back = [Change("-U", a, (3,)), Change("+U", a2, (3,)), Change("-U", a2, (4,)), Change("+U", a, (4,))]
    second = stage.process_batch([away_and_back, []], BatchContext(batch_id=1))
    assert sorted(second) == sorted([Change("-U", a + b, (3,)), Change("+U", a + b, (4,))])
    # the row is still there after the refresh: a later right row joins it
    third = stage.process_batch([[], [Change("+I", (1001, 7, 3), (5,))]], BatchContext(batch_id=2))
    assert third == [Change("+I", a + (1001, 7, 3), (5,))]
