"""The in-process host runs compiled pipelines end to end: the seed examples give the
seeds' answers under every batching and order that keeps each retraction after its add."""

from __future__ import annotations

from collections import Counter
from itertools import permutations

import pytest

from tidemark.engine.changelog import Change
from tidemark.engine.errors import ConflictError, InputError
from tidemark.engine.pipeline import compile_sql
from tidemark.engine.replay import ReplayHost, apply_to_table

SEED_JOIN = """
CREATE TABLE s1 (id BIGINT, level BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 's1', 'format' = 'debezium-json');
CREATE TABLE s2 (id BIGINT, attr STRING, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 's2', 'format' = 'debezium-json');
CREATE TABLE t1 (id BIGINT, level BIGINT, attr STRING, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 't1', 'format' = 'upsert-json');
INSERT INTO t1 SELECT s1.id, s1.level, s2.attr FROM s1 JOIN s2 ON s1.level = s2.id
"""

SEED_ROLLBACK = """
CREATE TABLE orders (product_id BIGINT, quantity BIGINT) WITH ('topic' = 'orders', 'format' = 'json');
CREATE TABLE products (id BIGINT, name STRING, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 'products', 'format' = 'debezium-json');
CREATE TABLE inventory (name STRING, quantity BIGINT, PRIMARY KEY (name) NOT ENFORCED) WITH ('topic' = 'inventory', 'format' = 'upsert-json');
INSERT INTO inventory
SELECT name, quantity
FROM (SELECT product_id, SUM(quantity) AS quantity FROM orders GROUP BY product_id) o
JOIN products p ON o.product_id = p.id
WHERE quantity < 10
"""

S2_ROWS = [Change("+I", (10, "a1"), (1,)), Change("+I", (20, "b1"), (2,))]
S1_CHANGES = [Change("+I", (1, 10), (3,)), Change("-U", (1, 10), (4,)), Change("+U", (1, 20), (4,))]
PRODUCTS = [Change("+I", (1, "Football"), (0,)), Change("+I", (2, "Football"), (0,)), Change("+I", (3, "Basketball"), (0,))]


def _valid_orders():
    """Orders of the s1 changes that keep the retraction after its add."""
    for order in permutations(S1_CHANGES):
        if order.index(S1_CHANGES[0]) < order.index(S1_CHANGES[1]):
            yield order


def _splits(seq):
    """Every way to cut a sequence into consecutive non-empty batches."""
    n = len(seq)
    for mask in range(2 ** (n - 1)):
        batches, cur = [], [seq[0]]
        for i in range(1, n):
            if mask >> (i - 1) & 1:
                batches.append(cur)
                cur = []
            cur.append(seq[i])
        batches.append(cur)
        yield batches


def _pair_together(batches) -> bool:
    return any(S1_CHANGES[1] in b and S1_CHANGES[2] in b for b in batches)


@pytest.mark.parametrize("strategy, expected_runs", [("DEDUPLICATE", 12), ("NOTHING", 5), ("ERROR", 5)])
def test_seed_join_ends_with_the_latest_row_under_any_valid_batching(strategy, expected_runs):
    """DEDUPLICATE: any batching. NOTHING/ERROR rely on the barrier never splitting a -U/+U
    pair (the proposal's premise), so for them only batchings that keep the pair together."""
    pipeline = compile_sql(SEED_JOIN + f" ON CONFLICT DO {strategy}")
    seen = 0
    for order in _valid_orders():
        for batches in _splits(list(order)):
            if strategy != "DEDUPLICATE" and not _pair_together(batches):
                continue
            host = ReplayHost(pipeline)
            host.run_batch({"s2": S2_ROWS})
            for batch in batches:
                host.run_batch({"s1": batch})
            assert host.table() == {(1,): (1, 20, "b1")}, (strategy, batches)
            seen += 1
    assert seen == expected_runs  # 3 valid orders x 4 batchings (x pair kept together)


def test_seed_join_pair_in_one_batch_emits_only_the_final_row():
    host = ReplayHost(compile_sql(SEED_JOIN + " ON CONFLICT DO DEDUPLICATE"))
    host.run_batch({"s2": S2_ROWS})
    for order in _valid_orders():
        h = ReplayHost(host.pipeline)
        h.run_batch({"s2": S2_ROWS})
        out = h.run_batch({"s1": list(order)})
        assert out == [Change("+I", (1, 20, "b1"), (4,))]  # no -U/+U flicker


def test_seed_rollback_example():
    host = ReplayHost(compile_sql(SEED_ROLLBACK + " ON CONFLICT DO DEDUPLICATE"))
    host.run_batch({"products": PRODUCTS})
    host.run_batch({"orders": [Change("+I", (1, 5), (1,))]})
    assert host.table() == {("Football",): ("Football", 5)}
    host.run_batch({"orders": [Change("+I", (2, 6), (2,))]})
    assert host.table() == {("Football",): ("Football", 6)}
    out = host.run_batch({"orders": [Change("+I", (2, 1), (3,))]})  # product 2 sums to 7... still < 10
    assert host.table() == {("Football",): ("Football", 7)}
    out = host.run_batch({"orders": [Change("+I", (2, 6), (4,))]})  # product 2 -> 13: filtered out
    assert [c.kind for c in out] == ["-U", "+U"]
    assert host.table() == {("Football",): ("Football", 5)}  # rolled back to product 1


def test_seed_rollback_with_do_error_fails_naming_table_and_key():
    host = ReplayHost(compile_sql(SEED_ROLLBACK + " ON CONFLICT DO ERROR"))
    host.run_batch({"products": PRODUCTS})
    host.run_batch({"orders": [Change("+I", (1, 5), (1,))]})
    with pytest.raises(ConflictError) as info:
        host.run_batch({"orders": [Change("+I", (2, 6), (2,))]})
    assert "'inventory'" in str(info.value) and "name='Football'" in str(info.value)


def test_aggregate_pipeline_without_materializer():
    sql = """
    CREATE TABLE a (k BIGINT, v BIGINT, w BIGINT, PRIMARY KEY (k) NOT ENFORCED) WITH ('format' = 'debezium-json');
    CREATE TABLE agg (v BIGINT, n BIGINT, total BIGINT, PRIMARY KEY (v) NOT ENFORCED) WITH ('format' = 'upsert-json');
    INSERT INTO agg SELECT v, COUNT(*), SUM(w) FROM a WHERE w > 0 GROUP BY v
    """
    p = compile_sql(sql)
    assert p.materializer is None
    host = ReplayHost(p)
    host.run_batch({"a": [Change("+I", (1, 7, 10), (1,)), Change("+I", (2, 7, 5), (2,)), Change("+I", (3, 8, -1), (3,))]})
    assert host.table() == {(7,): (7, 2, 15)}
    out = host.run_batch({"a": [Change("-U", (1, 7, 10), (4,)), Change("+U", (1, 8, 10), (4,))]})
    assert sorted(out) == sorted([
        Change("-U", (7, 2, 15), (4,)), Change("+U", (7, 1, 5), (4,)), Change("+I", (8, 1, 10), (4,)),
    ])  # fmt: skip
    assert host.table() == {(7,): (7, 1, 5), (8,): (8, 1, 10)}
    host.run_batch({"a": [Change("-D", (2, 7, 5), (5,))]})
    assert host.table() == {(8,): (8, 1, 10)}
    assert host.rows() == [(8, 1, 10)]


def test_upsert_source_is_normalized_before_the_sink():
    sql = """
    CREATE TABLE u (k BIGINT, v STRING, PRIMARY KEY (k) NOT ENFORCED) WITH ('format' = 'upsert-json');
    CREATE TABLE o (k BIGINT, v STRING, PRIMARY KEY (k) NOT ENFORCED) WITH ('format' = 'changelog-json');
    INSERT INTO o SELECT k, v FROM u
    """
    host = ReplayHost(compile_sql(sql))
    assert host.run_batch({"u": [Change("+I", (1, "a"), (1,))]}) == [Change("+I", (1, "a"), (1,))]
    out = host.run_batch({"u": [Change("+U", (1, "b"), (2,))]})
    assert out == [Change("-U", (1, "a"), (2,)), Change("+U", (1, "b"), (2,))]
    assert host.table() == {(1,): (1, "b")}


def test_keyed_stages_are_called_once_per_key_per_batch_with_their_state():
    pipeline = compile_sql(SEED_JOIN + " ON CONFLICT DO DEDUPLICATE")
    mat = pipeline.materializer
    calls: Counter = Counter()
    inner = mat.stage

    class Spy:
        name, n_inputs = inner.name, inner.n_inputs

        def key_of(self, change, i):
            return inner.key_of(change, i)

        def process_key(self, key, inputs, state, ctx):
            calls[(ctx.batch_id, key)] += 1
            return inner.process_key(key, inputs, state, ctx)

    mat.stage = Spy()
    host = ReplayHost(pipeline)
    host.run_batch({"s2": S2_ROWS})
    host.run_batch({"s1": list(S1_CHANGES)})
    assert calls == Counter({(1, (1,)): 1})
    assert set(host.state[mat.id]) == {(1,)}


def test_unknown_input_table_is_an_input_error():
    host = ReplayHost(compile_sql(SEED_JOIN + " ON CONFLICT DO NOTHING"))
    with pytest.raises(InputError, match="input 'nope': the pipeline reads no table of that name \\(it reads: s1, s2\\)"):
        host.run_batch({"nope": []})


def test_stage_metrics_are_summed_across_batches():
    host = ReplayHost(compile_sql(SEED_JOIN + " ON CONFLICT DO NOTHING"))
    host.run_batch({"s2": S2_ROWS})
    host.run_batch({"s1": list(S1_CHANGES)})
    assert host.metrics["records_in:s2"] == 2
    assert host.metrics["records_in:s1"] == 3
    assert host.metrics["sink_changes"] == 1


# --------------------------------------------------------------------- the sink table


def test_table_cancels_pairs_and_applies_retractions_before_adds():
    table: dict = {(1,): (1, "a")}
    apply_to_table(table, [Change("+U", (1, "b"), (2,)), Change("-U", (1, "a"), (2,))], (0,))
    assert table == {(1,): (1, "b")}  # order inside the batch does not matter
    apply_to_table(table, [Change("+I", (2, "x"), (3,)), Change("-D", (2, "x"), (4,)), Change("-D", (1, "b"), (5,))], (0,))
    assert table == {}


def test_table_two_adds_for_one_key_at_one_position_resolve_by_the_canonical_order():
    """A join can emit two rows for one sink key at one source position: the one applied
    last wins, and that must not be whichever arrived last (the Spark changelog sink
    writes them in the canonical order: the repr of the row decides)."""
    adds = [Change("+I", (1, "b"), (7,)), Change("+I", (1, "a"), (7,))]
    for batch in (adds, adds[::-1]):
        table: dict = {}
        apply_to_table(table, batch, (0,))
        assert table == {(1,): (1, "b")}  # repr "(1, 'b')" sorts after "(1, 'a')"


def test_table_retraction_of_a_row_it_does_not_hold_is_counted_not_applied():
    table: dict = {(1,): (1, "a")}
    metrics: Counter = Counter()
    apply_to_table(table, [Change("-D", (1, "zzz"), (2,))], (0,), metrics)
    assert table == {(1,): (1, "a")}
    assert metrics["sink_retractions_without_row"] == 1


def test_table_minus_u_alone_removes_the_row():
    # one join key can carry two PKs: -U of id=1 and +U of id=2 in one batch
    table: dict = {(1,): (1, "a")}
    apply_to_table(table, [Change("-U", (1, "a"), (2,)), Change("+U", (2, "a"), (2,))], (0,))
    assert table == {(2,): (2, "a")}


def test_table_without_pk_keys_by_row():
    table: dict = {}
    apply_to_table(table, [Change("+I", (1, "a"), (1,)), Change("+I", (2, "b"), (1,))], ())
    apply_to_table(table, [Change("-D", (1, "a"), (2,))], ())
    assert table == {(2, "b"): (2, "b")}


AGG_DDL = """
CREATE TABLE a (k BIGINT, v BIGINT, w BIGINT, PRIMARY KEY (k) NOT ENFORCED) WITH ('format' = 'debezium-json');
CREATE TABLE b (k BIGINT, x STRING, PRIMARY KEY (k) NOT ENFORCED) WITH ('format' = 'debezium-json');
CREATE TABLE agg (v BIGINT, mn BIGINT, mx BIGINT, av BIGINT, lv BIGINT, dc BIGINT, PRIMARY KEY (v) NOT ENFORCED) WITH ('format' = 'upsert-json');
CREATE TABLE lj (k BIGINT, w BIGINT, x STRING, PRIMARY KEY (k) NOT ENFORCED) WITH ('format' = 'changelog-json');
"""


def test_all_aggregate_functions_and_having():
    p = compile_sql(
        AGG_DDL + "INSERT INTO agg SELECT v, MIN(w), MAX(w), AVG(w), LAST_VALUE(w), COUNT(DISTINCT w) "
        "FROM a GROUP BY v HAVING COUNT(*) > 1"
    )
    host = ReplayHost(p)
    host.run_batch({"a": [Change("+I", (1, 7, 10), (1,)), Change("+I", (2, 7, 5), (2,)), Change("+I", (3, 7, 5), (3,)), Change("+I", (4, 8, 1), (4,))]})
    assert host.table() == {(7,): (7, 5, 10, 6, 5, 2)}  # group 8 has one row: HAVING drops it
    host.run_batch({"a": [Change("-D", (1, 7, 10), (5,)), Change("-D", (2, 7, 5), (5,))]})
    assert host.table() == {}  # group 7 is down to one row


def test_left_join_with_residual_pads_rows_that_fail_it():
    p = compile_sql(AGG_DDL + "INSERT INTO lj SELECT a.k, a.w, b.x FROM a LEFT JOIN b ON a.v = b.k AND a.w > 5 ON CONFLICT DO DEDUPLICATE")
    host = ReplayHost(p)
    host.run_batch({"a": [Change("+I", (1, 7, 10), (1,)), Change("+I", (2, 7, 5), (2,))], "b": [Change("+I", (7, "seven"), (3,))]})
    assert host.table() == {(1,): (1, 10, "seven"), (2,): (2, 5, None)}
    host.run_batch({"b": [Change("-D", (7, "seven"), (4,))]})
    assert host.table() == {(1,): (1, 10, None), (2,): (2, 5, None)}


# --------------------------------------------------------------------- processing time

FULL_COMPACTION = """
CREATE TABLE src (k BIGINT, n BIGINT) WITH ('format' = 'json');
CREATE TABLE tot (k BIGINT, n BIGINT, PRIMARY KEY (k) NOT ENFORCED) WITH ('format' = 'changelog-json',
  'merge-engine' = 'aggregation', 'fields.n.aggregate-function' = 'sum',
  'changelog-producer' = 'full-compaction', 'changelog-producer.compaction-interval' = '10 s');
INSERT INTO tot SELECT k, n FROM src
"""


def test_full_compaction_barrier_reaches_keys_without_new_records():
    host = ReplayHost(compile_sql(FULL_COMPACTION))
    assert host.run_batch({"src": [Change("+I", (1, 5), (1,))]}, now_ms=1_000) == []
    assert host.run_batch({"src": [Change("+I", (2, 3), (2,))]}, now_ms=5_000) == []
    assert host.table() == {}  # nothing emitted before the barrier at 10 s
    out = host.run_batch({"src": []}, now_ms=10_000)  # no records at all: the timers fire
    assert sorted((c.kind, c.row) for c in out) == [("+I", (1, 5)), ("+I", (2, 3))]
    assert host.table() == {(1,): (1, 5), (2,): (2, 3)}
    assert host.run_batch({"src": [Change("+I", (1, 1), (3,)), Change("+I", (1, 2), (4,))]}, now_ms=12_000) == []
    assert host.run_batch({"src": []}, now_ms=19_999) == []
    out = host.run_batch({"src": []}, now_ms=20_000)
    assert [(c.kind, c.row) for c in out] == [("-U", (1, 5)), ("+U", (1, 8))]  # changes in between merged
    assert host.table() == {(1,): (1, 8), (2,): (2, 3)}
    assert host.run_batch({"src": []}, now_ms=40_000) == []  # nothing pending: no timer left
    assert host.timers[host.pipeline.merge_engine.id] == {}


def test_only_due_keys_without_records_are_woken_once_per_batch():
    pipeline = compile_sql(FULL_COMPACTION)
    node = pipeline.merge_engine
    inner = node.stage
    calls: list = []

    class Spy:
        name, n_inputs = inner.name, inner.n_inputs

        def key_of(self, change, i):
            return inner.key_of(change, i)

        def wakeup_ms(self, state):
            return inner.wakeup_ms(state)

        def process_key(self, key, inputs, state, ctx):
            calls.append((ctx.now_ms, key, len(inputs[0])))
            return inner.process_key(key, inputs, state, ctx)

    node.stage = Spy()
    host = ReplayHost(pipeline)
    host.run_batch({"src": [Change("+I", (1, 5), (1,))]}, now_ms=1_000)
    host.run_batch({"src": [Change("+I", (2, 5), (2,))]}, now_ms=12_000)  # key 1 due, key 2 not yet
    host.run_batch({"src": [Change("+I", (1, 1), (3,))]}, now_ms=20_000)  # key 2 due; key 1 has a record
    assert calls == [
        (1_000, (1,), 1),
        (12_000, (2,), 1), (12_000, (1,), 0),
        (20_000, (1,), 1), (20_000, (2,), 0),
    ]  # fmt: skip


def test_now_ms_comes_from_the_clock_unless_given():
    ticks = iter([1_000, 10_000])
    host = ReplayHost(compile_sql(FULL_COMPACTION), clock=lambda: next(ticks))
    host.run_batch({"src": [Change("+I", (1, 5), (1,))]})  # clock: 1 s
    assert host.run_batch({"src": []}, now_ms=9_000) == []  # given: the clock is not read
    assert [c.kind for c in host.run_batch({"src": []})] == ["+I"]  # clock: 10 s


def test_default_clock_is_the_wall_clock():
    import time

    from tidemark.engine.replay import wall_clock_ms

    host = ReplayHost(compile_sql(FULL_COMPACTION))
    assert host.clock is wall_clock_ms
    assert abs(wall_clock_ms() - time.time() * 1000) < 60_000


def test_stages_without_timers_have_no_timer_index():
    host = ReplayHost(compile_sql(SEED_JOIN + " ON CONFLICT DO DEDUPLICATE"))
    assert host.timers == {}
