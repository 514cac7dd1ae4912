"""Which sinks receive their changes already keyed by their PK (``query.keyed_by_sink_pk``):
the upsert sink then produces each partition as it stands, without a shuffle of its own."""

from __future__ import annotations

import pytest

from tidemark.engine.pipeline import compile_sql
from tidemark.spark.query import keyed_by_sink_pk

EVENTS = """
CREATE TABLE events (id BIGINT, category STRING, v BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('topic' = 'events', 'format' = 'debezium-json');
"""
TOTALS = """
CREATE TABLE totals (category STRING, total BIGINT, PRIMARY KEY (category) NOT ENFORCED)
  WITH ('topic' = 'totals', 'format' = 'upsert-json'{extra});
"""
BY_ID = """
CREATE TABLE by_id (id BIGINT, category STRING, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('topic' = 'by_id', 'format' = 'upsert-json');
"""
CASES = {
    # a materializer stands before the sink, keyed by the sink PK
    "materializer": (EVENTS + TOTALS.format(extra="") + "INSERT INTO totals SELECT category, v FROM events "
                     "ON CONFLICT DO DEDUPLICATE;", "materializer", True),
    # a merge engine resolves conflicts at the sink, keyed by its PK
    "merge-engine": (EVENTS + TOTALS.format(extra=", 'merge-engine' = 'aggregation', "
                                            "'fields.total.aggregate-function' = 'sum'")
                     + "INSERT INTO totals SELECT category, v FROM events;", "merge_engine", True),
    # the aggregate's group key is the sink PK, so no materializer: the aggregate feeds the sink
    "aggregate": (EVENTS + TOTALS.format(extra="") + "INSERT INTO totals SELECT category, SUM(v) FROM events "
                  "GROUP BY category;", "aggregate", True),
    # the source's own key is the sink PK: only a calc before the sink, nothing keyed
    "calc": (EVENTS + BY_ID + "INSERT INTO by_id SELECT id, category FROM events;", "calc", False),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_sink_is_keyed_by_its_pk_when_a_keyed_stage_on_it_feeds_the_sink(name):
    sql, feeding, keyed = CASES[name]
    pipeline = compile_sql(sql)
    target = pipeline.sinks[0]
    assert pipeline.node(pipeline.node(target.node_id).inputs[0]).kind == feeding
    assert keyed_by_sink_pk(pipeline, target.node_id) is keyed
