"""WHERE conjuncts moved below a join (``tidemark.engine.planner.pushdown``): which move and
where, that the moved plan emits exactly the changelog of the plan that filters after the
join, and that the fused operator runs the moved filter between its members."""

from __future__ import annotations

import json
import random

import pytest

from tidemark.engine import batch_ipc
from tidemark.engine.changelog import DELETE, INSERT, UPDATE_AFTER, UPDATE_BEFORE, Change
from tidemark.engine.fingerprint import fingerprint, incompatibilities
from tidemark.engine.fusion import FusedStage, filters_between, fused_pairs
from tidemark.engine.pipeline import compile_sql
from tidemark.engine.replay import ReplayHost
from tidemark.spark.keyed import _BucketRunner, blob_rows, changes_of_blobs

TABLES = """
CREATE TABLE orders (product_id BIGINT, quantity BIGINT) WITH ('topic' = 'orders', 'format' = 'json');
CREATE TABLE products (id BIGINT, name STRING, price DECIMAL(10, 2), PRIMARY KEY (id) NOT ENFORCED)
  WITH ('topic' = 'products', 'format' = 'debezium-json');
CREATE TABLE reviews (product_id BIGINT, stars INT) WITH ('topic' = 'reviews', 'format' = 'json');
CREATE TABLE inventory (name STRING, quantity BIGINT, PRIMARY KEY (name) NOT ENFORCED)
  WITH ('topic' = 'inventory', 'format' = 'upsert-json');
CREATE TABLE wide (a BIGINT, b STRING, c BIGINT, PRIMARY KEY (a) NOT ENFORCED) WITH ('topic' = 'wide', 'format' = 'upsert-json');
"""
SUMS = "(SELECT product_id, SUM(quantity) AS quantity FROM orders GROUP BY product_id) o"


def _plan(select: str, sink: str = "inventory"):
    return compile_sql(TABLES + f"INSERT INTO {sink} {select} ON CONFLICT DO DEDUPLICATE;")


def _filters(pipeline) -> dict[str, str]:
    """The join's moved filters by side, as explain names them."""
    (join,) = [n for n in pipeline.nodes if n.kind == "join"]
    return join.detail.get("filtered_inputs", {})


def _filters_after_join(pipeline) -> bool:
    """Whether the stage right after the join is a calc with a predicate."""
    (join,) = [n for n in pipeline.nodes if n.kind == "join"]
    (after,) = [n for n in pipeline.nodes if join.id in n.inputs]
    return after.kind == "calc" and after.stage.predicate is not None


# ---------------------------------------------------------------------------- which conjuncts move


@pytest.mark.parametrize(
    ("select", "moved"),
    [
        # W1's shape: the aggregate's output is filtered before the join
        (f"SELECT name, quantity FROM {SUMS} JOIN products p ON o.product_id = p.id WHERE quantity < 10",
         {"left": "`quantity` < 10"}),
        (f"SELECT name, quantity FROM {SUMS} JOIN products p ON o.product_id = p.id "
         "WHERE quantity < 10 AND p.name <> 'x' AND p.price BETWEEN 1 AND 2.5",
         {"left": "`quantity` < 10", "right": "`name` <> 'x' AND `price` BETWEEN 1 AND 2.5"}),
        # a LEFT JOIN keeps its left rows: the left side's conjunct moves, the right side's stays
        (f"SELECT name, quantity FROM {SUMS} LEFT JOIN products p ON o.product_id = p.id "
         "WHERE quantity IN (1, 2) AND p.name IS NULL", {"left": "`quantity` IN (1, 2)"}),
        (f"SELECT name, quantity FROM {SUMS} RIGHT JOIN products p ON o.product_id = p.id "
         "WHERE quantity > 1 AND p.name IS NOT NULL", {"right": "NOT `name` IS NULL"}),
        (f"SELECT name, quantity FROM {SUMS} FULL JOIN products p ON o.product_id = p.id WHERE quantity > 1", {}),
        # conjuncts that may fail, or that read both sides, stay after the join
        (f"SELECT name, quantity FROM {SUMS} JOIN products p ON o.product_id = p.id "
         "WHERE 100 / quantity > 1 AND CAST(p.name AS INT) > 1 AND (quantity > 1 OR p.id > 2) AND p.name > 5", {}),
    ],
    ids=["w1", "both-sides", "left-join", "right-join", "full-join", "may-fail-or-both"],
)
def test_conjuncts_that_read_one_kept_side_and_cannot_fail_move_below_the_join(select, moved):
    pipeline = _plan(select)
    assert _filters(pipeline) == moved
    for side, predicate in moved.items():
        assert f"{side} input filtered by: {predicate} (from the WHERE, moved below the join)" in pipeline.explain_text()


def test_a_later_right_join_keeps_the_first_joins_filter_after_it():
    """``(o JOIN p) RIGHT JOIN r``: the right join pads o's columns with NULLs, which the
    WHERE rejects; below the first join the filter would let the padded rows through."""
    pipeline = _plan(
        f"SELECT p.name, o.quantity FROM {SUMS} JOIN products p ON o.product_id = p.id "
        "RIGHT JOIN reviews r ON r.product_id = p.id WHERE quantity < 10"
    )
    joins = [n for n in pipeline.nodes if n.kind == "join"]
    assert [j.detail.get("filtered_inputs") for j in joins] == [None, None]
    assert "`quantity` < 10" in pipeline.explain_text().split("join right")[1]


def test_a_later_left_join_lets_the_first_joins_filter_move():
    pipeline = _plan(
        f"SELECT p.name, o.quantity FROM {SUMS} JOIN products p ON o.product_id = p.id "
        "LEFT JOIN reviews r ON r.product_id = p.id WHERE quantity < 10 AND r.stars > 3"
    )
    first, second = [n for n in pipeline.nodes if n.kind == "join"]
    assert first.detail.get("filtered_inputs") == {"left": "`quantity` < 10"}
    assert second.detail.get("filtered_inputs") is None  # r.stars: the padded side of the LEFT JOIN


def test_the_join_records_its_filters_so_a_checkpoint_without_them_is_refused():
    """The join stores only the rows that pass: state written by the plan that filtered
    after the join holds others."""
    new = fingerprint(_plan(f"SELECT name, quantity FROM {SUMS} JOIN products p ON o.product_id = p.id WHERE quantity < 10"))
    old = json.loads(json.dumps(new))
    for stage in old["stateful"]:
        stage["config"].pop("filtered_inputs", None)
    assert any("filtered_inputs" in reason for reason in incompatibilities(old, new))


# ---------------------------------------------------------------------------- the same changelog

MOVED = f"SELECT name, quantity FROM {SUMS} JOIN products p ON o.product_id = p.id WHERE quantity < 7 AND p.price > 1"
# the same query with conjuncts that cannot move (arithmetic may fail): filtered after the join
KEPT = f"SELECT name, quantity FROM {SUMS} JOIN products p ON o.product_id = p.id WHERE quantity + 0 < 7 AND p.price + 0 > 1"


def _batches(rng: random.Random, n: int) -> list[dict[str, list[Change]]]:
    """Orders (inserts) and product inserts, renames, price changes and deletes."""
    from decimal import Decimal

    products: dict[int, tuple] = {}
    out = []
    pos = 0
    for _ in range(n):
        batch: dict[str, list[Change]] = {"orders": [], "products": []}
        for _ in range(rng.randint(0, 12)):
            pos += 1
            batch["orders"].append(Change(INSERT, (rng.randint(1, 6), rng.randint(1, 4)), (pos,)))
        for _ in range(rng.randint(0, 4)):
            pos += 1
            pid = rng.randint(1, 6)
            new = (pid, rng.choice(["ball", "bat", "net"]), Decimal(rng.choice(["0.50", "1.00", "2.25"])))
            if pid not in products:
                batch["products"].append(Change(INSERT, new, (pos,)))
                products[pid] = new
            elif rng.random() < 0.3:
                batch["products"].append(Change(DELETE, products.pop(pid), (pos,)))
            else:
                batch["products"] += [Change(UPDATE_BEFORE, products[pid], (pos,)), Change(UPDATE_AFTER, new, (pos,))]
                products[pid] = new
        out.append(batch)
    return out


@pytest.mark.parametrize("seed", range(25))
def test_the_moved_plan_emits_the_changelog_of_the_plan_that_filters_after_the_join(seed):
    moved, kept = _plan(MOVED), _plan(KEPT)
    assert _filters(moved) and not _filters(kept) and _filters_after_join(kept) and not _filters_after_join(moved)
    a, b = ReplayHost(moved), ReplayHost(kept)
    for batch in _batches(random.Random(seed), 6):
        assert a.run_batch(batch) == b.run_batch(batch)
    assert a.table() == b.table()


# ---------------------------------------------------------------------------- inside the fused operator

ORDERS = [Change(INSERT, (1, 3), (0, 0, 0, 0)), Change(INSERT, (2, 5), (0, 0, 0, 1)), Change(INSERT, (1, 4), (0, 0, 0, 2))]
PRODUCTS = [Change(INSERT, (1, "ball"), (0, 1, 0, 0)), Change(INSERT, (2, "bat"), (0, 1, 0, 1))]
LATER_ORDERS = [Change(DELETE, (1, 3), (1, 0, 0, 3)), Change(INSERT, (2, 1), (1, 0, 0, 4))]
FUSED = compile_sql("""
CREATE TABLE orders (product_id BIGINT, quantity BIGINT) WITH ('topic' = 'orders', 'format' = 'debezium-json');
CREATE TABLE products (id BIGINT, name STRING, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 'products', 'format' = 'debezium-json');
CREATE TABLE inventory (name STRING, quantity BIGINT, PRIMARY KEY (name) NOT ENFORCED) WITH ('topic' = 'inventory', 'format' = 'upsert-json');
""" + f"INSERT INTO inventory SELECT name, quantity FROM {SUMS} JOIN products p ON o.product_id = p.id WHERE quantity < 7 "
      "ON CONFLICT DO DEDUPLICATE;")


def _blobs(changes: list[Change], schema) -> list[bytes]:
    return [blob for _, _, blob in blob_rows(changes, schema, None, 1)]


def test_the_fused_operator_filters_between_its_members_as_two_operators_would():
    """The aggregate's runner with the filter in its pass, feeding the join's runner through
    blobs, against the fused runner: same output, same stored states; then literally."""
    pipeline = FUSED
    (a, (b, fed)), = fused_pairs(pipeline).items()
    (between,) = filters_between(pipeline, a, b, fed)
    agg_node, join_node, calc = pipeline.node(a), pipeline.node(b), pipeline.node(between).stage
    schema_of = lambda n: batch_ipc.schema_of(n.columns, n.types)  # noqa: E731
    orders_schema, products_schema = (schema_of(pipeline.node(i)) for i in (agg_node.inputs[0], join_node.inputs[1]))
    fused = _BucketRunner(FusedStage(agg_node.stage, join_node.stage, fed, (calc,)), None, None,
                          schema=schema_of(join_node), buckets=1, fed_schema=schema_of(agg_node))
    agg = _BucketRunner(agg_node.stage, None, (join_node.stage, 0), then=[calc], schema=schema_of(agg_node), buckets=1)
    join = _BucketRunner(join_node.stage, None, None, schema=schema_of(join_node), buckets=1)

    fused_state, agg_state, join_state = [None, None], [None], [None]
    outputs = []
    for orders, products in ((ORDERS, PRODUCTS), (LATER_ORDERS, [])):
        got = fused.run([_blobs(orders, orders_schema), _blobs(products, products_schema)], fused_state, 0)
        first = agg.run([_blobs(orders, orders_schema)], agg_state, 0)
        second = join.run([[blob for _, _, blob in first.rows], _blobs(products, products_schema)], join_state, 0)
        assert changes_of_blobs([r[2] for r in got.rows]) == changes_of_blobs([r[2] for r in second.rows])
        assert got.stored == [first.stored[0], second.stored[0]]
        fused_state, agg_state, join_state = got.stored, first.stored, second.stored
        outputs.append(sorted((c.kind, c.row) for c in changes_of_blobs([r[2] for r in got.rows])))
    # product 1's sum 7 does not pass, then 4 does; product 2's 5 passes, then 6
    assert outputs == [
        [(INSERT, (2, 5, 2, "bat"))],
        sorted([(INSERT, (1, 4, 1, "ball")), (UPDATE_BEFORE, (2, 5, 2, "bat")), (UPDATE_AFTER, (2, 6, 2, "bat"))]),
    ]
