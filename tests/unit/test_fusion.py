"""Two keyed stages on one key in one operator (``tidemark.engine.fusion``): which pairs fuse,
how the fused stage routes its inputs, and that one bucket call of the fused pair emits and
stores exactly what the two stages' own calls do with a shuffle between them. Spark-free:
the bucket runner is the Spark host's, called as a worker calls it."""

from __future__ import annotations

import json

import pytest

from tidemark.engine import batch_ipc
from tidemark.engine.changelog import Change, INSERT, DELETE, UPDATE_AFTER, UPDATE_BEFORE
from tidemark.engine.fingerprint import fingerprint, incompatibilities
from tidemark.engine.fusion import FusedStage, filters_between, fused_pairs
from tidemark.engine.pipeline import compile_sql
from tidemark.spark.keyed import _BucketRunner, blob_rows, changes_of_blobs

TABLES = """
CREATE TABLE orders (product_id BIGINT, quantity BIGINT) WITH ('topic' = 'orders', 'format' = 'json');
CREATE TABLE products (id BIGINT, name STRING, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('topic' = 'products', 'format' = 'debezium-json');
CREATE TABLE inventory (name STRING, quantity BIGINT, PRIMARY KEY (name) NOT ENFORCED)
  WITH ('topic' = 'inventory', 'format' = 'upsert-json');
"""
SUMS = "(SELECT product_id, SUM(quantity) AS quantity FROM orders GROUP BY product_id) o"
INVENTORY = TABLES + f"INSERT INTO inventory SELECT name, quantity FROM {SUMS} JOIN products p ON o.product_id = p.id ON CONFLICT DO DEDUPLICATE;"
# the products on the left: the aggregate feeds the join's second input
PRODUCTS_FIRST = TABLES + f"INSERT INTO inventory SELECT name, quantity FROM products p JOIN {SUMS} ON p.id = o.product_id ON CONFLICT DO DEDUPLICATE;"
# joined on the sum, not on the aggregate's key
ON_THE_SUM = TABLES + f"INSERT INTO inventory SELECT name, quantity FROM {SUMS} JOIN products p ON o.quantity = p.id ON CONFLICT DO DEDUPLICATE;"
# a filter between the two stages: fused, the filter inside the operator
FILTERED = TABLES + (f"INSERT INTO inventory SELECT name, quantity FROM (SELECT * FROM {SUMS} WHERE quantity > 1) o2 "
                     "JOIN products p ON o2.product_id = p.id ON CONFLICT DO DEDUPLICATE;")
# a calc that computes between the two stages: not fused (its columns would need tracing)
COMPUTED = TABLES + (f"INSERT INTO inventory SELECT name, quantity FROM (SELECT product_id, quantity * 2 AS quantity "
                     f"FROM {SUMS}) o2 JOIN products p ON o2.product_id = p.id ON CONFLICT DO DEDUPLICATE;")
UPSERT_JOIN = """
CREATE TABLE prices (id BIGINT, price BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 'prices', 'format' = 'upsert-json');
CREATE TABLE names (id BIGINT, name STRING, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 'names', 'format' = 'debezium-json');
CREATE TABLE priced (name STRING, price BIGINT, PRIMARY KEY (name) NOT ENFORCED) WITH ('topic' = 'priced', 'format' = 'upsert-json');
INSERT INTO priced SELECT n.name, p.price FROM prices p JOIN names n ON p.id = n.id ON CONFLICT DO DEDUPLICATE;
"""


def kinds(sql: str) -> dict[str, tuple[str, int]]:
    pipeline = compile_sql(sql)
    return {pipeline.node(a).kind: (pipeline.node(b).kind, i) for a, (b, i) in fused_pairs(pipeline).items()}


def test_an_aggregate_joined_on_its_group_key_fuses_with_the_join():
    assert kinds(INVENTORY) == {"aggregate": ("join", 0)}
    assert kinds(PRODUCTS_FIRST) == {"aggregate": ("join", 1)}
    assert "Fused: [1] aggregate and [3] join share their key" in compile_sql(INVENTORY).explain_text()


def test_an_upsert_source_joined_on_its_primary_key_fuses_normalize_with_the_join():
    assert kinds(UPSERT_JOIN) == {"normalize": ("join", 0)}


@pytest.mark.parametrize("sql", [ON_THE_SUM, COMPUTED], ids=["another-key", "calc-between"])
def test_stages_on_other_keys_or_with_a_calc_between_stay_apart(sql):
    assert kinds(sql) == {}


def test_a_filter_between_the_two_stages_runs_inside_the_fused_operator():
    pipeline = compile_sql(FILTERED)
    (first, (second, fed)), = fused_pairs(pipeline).items()
    assert (pipeline.node(first).kind, pipeline.node(second).kind) == ("aggregate", "join")
    between = filters_between(pipeline, first, second, fed)
    assert [pipeline.node(i).kind for i in between] == ["calc"] and pipeline.node(second).inputs[fed] == between[-1]


def test_the_fused_stage_routes_each_input_to_its_member():
    pipeline = compile_sql(PRODUCTS_FIRST)
    (first, (second, fed)), = fused_pairs(pipeline).items()
    agg, join = pipeline.node(first).stage, pipeline.node(second).stage
    fused = FusedStage(agg, join, fed)
    assert fused.n_inputs == 2 and fused.name == f"{agg.name}+{join.name}"
    # input 0: the aggregate's orders; input 1: the join's products (its input 0)
    assert fused.key_columns(0) == agg.key_columns(0)
    assert fused.key_columns(1) == join.key_columns(0)
    orders, products, sums = object(), object(), object()
    assert fused.member_inputs(0, [orders, products]) == [orders]
    assert fused.member_inputs(1, [orders, products], sums) == [products, sums]
    with pytest.raises(IndexError, match="no input 2"):
        fused.key_columns(2)


ORDERS = [Change(INSERT, (1, 3), (0, 0, 0, 0)), Change(INSERT, (2, 5), (0, 0, 0, 1)),
          Change(INSERT, (1, 4), (0, 0, 0, 2))]
PRODUCTS = [Change(INSERT, (1, "ball"), (0, 1, 0, 0)), Change(INSERT, (2, "bat"), (0, 1, 0, 1))]
LATER_ORDERS = [Change(DELETE, (1, 3), (1, 0, 0, 3)), Change(INSERT, (2, 1), (1, 0, 0, 4))]


def _blobs(changes: list[Change], schema) -> list[bytes]:
    return [blob for _, _, blob in blob_rows(changes, schema, None, 1)]


def test_one_fused_bucket_call_equals_the_two_stages_with_a_shuffle_between():
    """Two batches in one bucket: the fused runner against the aggregate's runner feeding the
    join's runner through blobs, as two operators would. Same output, same stored states."""
    pipeline = compile_sql(INVENTORY)
    (a, (b, fed)), = fused_pairs(pipeline).items()
    agg_node, join_node = pipeline.node(a), pipeline.node(b)
    schema_of = lambda n: batch_ipc.schema_of(n.columns, n.types)  # noqa: E731
    orders_schema, products_schema = (schema_of(pipeline.node(i)) for i in (agg_node.inputs[0], join_node.inputs[1]))
    fused = _BucketRunner(FusedStage(agg_node.stage, join_node.stage, fed), None, None, schema=schema_of(join_node),
                          buckets=1, fed_schema=schema_of(agg_node))
    agg = _BucketRunner(agg_node.stage, None, (join_node.stage, 0), schema=schema_of(agg_node), buckets=1)
    join = _BucketRunner(join_node.stage, None, None, schema=schema_of(join_node), buckets=1)

    fused_state, agg_state, join_state = [None, None], [None], [None]
    expected_out = []
    for orders, products in ((ORDERS, PRODUCTS), (LATER_ORDERS, [])):
        got = fused.run([_blobs(orders, orders_schema), _blobs(products, products_schema)], fused_state, 0)
        first = agg.run([_blobs(orders, orders_schema)], agg_state, 0)
        sums = [blob for _, _, blob in first.rows]
        second = join.run([sums, _blobs(products, products_schema)], join_state, 0)
        assert changes_of_blobs([r[2] for r in got.rows]) == changes_of_blobs([r[2] for r in second.rows])
        assert got.stored == [first.stored[0], second.stored[0]]
        fused_state, agg_state, join_state = got.stored, first.stored, second.stored
        expected_out.append(changes_of_blobs([r[2] for r in got.rows]))
    # and what that is, literally: SUM per product joined to its name, then the update
    rows = [[(c.kind, c.row) for c in out] for out in expected_out]
    assert sorted(rows[0]) == [(INSERT, (1, 7, 1, "ball")), (INSERT, (2, 5, 2, "bat"))]
    assert sorted(rows[1]) == sorted([(UPDATE_BEFORE, (1, 7, 1, "ball")), (UPDATE_AFTER, (1, 4, 1, "ball")),
                                      (UPDATE_BEFORE, (2, 5, 2, "bat")), (UPDATE_AFTER, (2, 6, 2, "bat"))])


def test_a_checkpoint_of_the_unfused_plan_is_refused_naming_the_operators():
    new = fingerprint(compile_sql(INVENTORY))
    old = json.loads(json.dumps(new))
    for stage in old["stateful"]:
        stage.pop("fused_with", None)
    reasons = incompatibilities(old, new)
    assert reasons == [
        "stage [1] aggregate: the checkpoint ran it in an operator of its own, this version runs it in one "
        "operator with [3] join (state is kept per operator)",
        "stage [3] join: the checkpoint ran it in an operator of its own, this version runs it in one "
        "operator with [1] aggregate (state is kept per operator)",
    ]
    assert incompatibilities(new, new) == []


def test_a_checkpoint_that_kept_a_value_state_per_member_is_refused_naming_both_layouts():
    """An operator's state store cannot be read in another layout: refused before Spark reads it."""
    new = fingerprint(compile_sql(INVENTORY))
    old = json.loads(json.dumps(new))
    for stage in old["stateful"]:
        stage.pop("fused_state_layout", None)  # recorded before layouts were: a value state per member
    assert incompatibilities(old, new) == [
        f"stage {name}: the checkpoint keeps its operator's state as a value state per member (layout 1), "
        "this version as one value state with a field per member (layout 2)"
        for name in ("[1] aggregate", "[3] join")
    ]
