"""An aggregate joined on its group key runs on Spark as one keyed operator
(``tidemark.engine.fusion``) and gives the replay host's table on the job's own batches,
across a restart: each member keeps its own state in the one operator's store."""

from __future__ import annotations

import random

import pytest
from run_support import PartRunner, replay_reference, sink_table, unique_topics

from tidemark.engine.fusion import fused_pairs
from tidemark.engine.pipeline import compile_sql

pytestmark = pytest.mark.integration

SQL = """
CREATE TABLE orders (product_id BIGINT, quantity BIGINT) WITH ('topic' = 'orders', 'format' = 'json');
CREATE TABLE products (id BIGINT, name STRING, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('topic' = 'products', 'format' = 'debezium-json');
CREATE TABLE inventory (name STRING, quantity BIGINT, PRIMARY KEY (name) NOT ENFORCED)
  WITH ('topic' = 'inventory', 'format' = 'upsert-json');
INSERT INTO inventory SELECT name, quantity
FROM (SELECT product_id, SUM(quantity) AS quantity FROM orders GROUP BY product_id) o
JOIN products p ON o.product_id = p.id WHERE quantity < 40 ON CONFLICT DO DEDUPLICATE;
"""


def _part(rng: random.Random, names: dict[int, str], orders: int) -> dict[str, list[dict]]:
    """Orders for 30 products, and products renamed (a -U/+U pair), created or deleted."""
    products = []
    for pid in rng.sample(range(30), 12):
        name = f"n{rng.randrange(8)}"
        if pid not in names:
            products.append({"kind": "+I", "row": {"id": pid, "name": name}})
            names[pid] = name
        elif rng.random() < 0.3:
            products.append({"kind": "-D", "row": {"id": pid, "name": names.pop(pid)}})
        else:
            products += [{"kind": "-U", "row": {"id": pid, "name": names[pid]}},
                         {"kind": "+U", "row": {"id": pid, "name": name}}]
            names[pid] = name
    return {"orders": [{"kind": "+I", "row": {"product_id": rng.randrange(30), "quantity": rng.randrange(1, 6)}}
                       for _ in range(orders)],
            "products": products}


def test_the_fused_aggregate_and_join_give_replays_table_across_a_restart(spark, kafka_bootstrap, tmp_path):
    sql, _ = unique_topics(SQL, "fused")
    pipeline = compile_sql(sql)
    assert [(pipeline.node(a).kind, pipeline.node(b).kind) for a, (b, _) in fused_pairs(pipeline).items()] \
        == [("aggregate", "join")]
    rng, names = random.Random(7), {}
    checkpoint = tmp_path / "checkpoint"
    parts = PartRunner(spark, kafka_bootstrap, pipeline, str(checkpoint), "fused")
    first = parts.run(_part(rng, names, 120))
    second = parts.run(_part(rng, names, 120))
    reports = first.reports + second.reports
    assert len(first.reports) >= 2 and len(second.reports) >= 2, "several micro-batches on each side of the restart"

    expected = replay_reference(kafka_bootstrap, pipeline, reports).table()
    assert expected, "rows below the filter"
    assert sink_table(kafka_bootstrap, pipeline, second.sink_writer_id) == expected
    # one state store for the fused aggregate and join, one for the materializer
    assert len([d for d in (checkpoint / "state").iterdir() if d.is_dir()]) == 2
