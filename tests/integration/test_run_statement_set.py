"""A statement set on Spark: one query reads the CDC topic once per batch and writes three
sinks (an upsert sink, a changelog sink of an aggregate and an upsert sink behind its own
ON CONFLICT DO DEDUPLICATE materializer), each equal to the in-process reference on the
job's own batches (one source: the batches' offset ranges tile the topic once); a record that does not decode goes to the pipeline's dead-letter topic
once, not once per sink."""

from __future__ import annotations

import pytest
from run_support import encode_source, produce, replay_reference, sink_table, unique_topics

from tidemark.engine.pipeline import compile_sql
from tidemark.formats import dead_letter
from tidemark.kafka.transactional import read_exactly_once
from tidemark.spark.job import run_pipeline

pytestmark = pytest.mark.integration

SQL = """
CREATE TABLE orders (id BIGINT, customer BIGINT, amount BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('topic' = 'orders', 'format' = 'debezium-json');
CREATE TABLE big_orders (id BIGINT, customer BIGINT, amount BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('topic' = 'big_orders', 'format' = 'upsert-json');
CREATE TABLE totals (customer BIGINT, total BIGINT, n BIGINT, PRIMARY KEY (customer) NOT ENFORCED)
  WITH ('topic' = 'totals', 'format' = 'changelog-json');
CREATE TABLE by_amount (amount BIGINT, id BIGINT, PRIMARY KEY (amount) NOT ENFORCED)
  WITH ('topic' = 'by_amount', 'format' = 'upsert-json');
CREATE VIEW large AS SELECT id, customer, amount FROM orders WHERE amount >= 100;
EXECUTE STATEMENT SET BEGIN
  INSERT INTO big_orders SELECT * FROM large;
  INSERT INTO totals SELECT customer, SUM(amount), COUNT(*) FROM large GROUP BY customer;
  INSERT INTO by_amount SELECT amount, id FROM orders ON CONFLICT DO DEDUPLICATE;
END;
"""


def cdc() -> list[dict]:
    """Inserts, updates moving rows across the view's filter and between customers, and
    deletes: every sink sees retractions."""
    out: list[dict] = []
    for i in range(1, 31):
        out.append({"kind": "+I", "row": {"id": i, "customer": i % 4, "amount": 40 * (i % 6)}})
    for i in range(1, 31, 3):
        before = {"id": i, "customer": i % 4, "amount": 40 * (i % 6)}
        after = {"id": i, "customer": (i + 1) % 4, "amount": 40 * ((i + 3) % 6)}
        out += [{"kind": "-U", "row": before}, {"kind": "+U", "row": after}]
    for i in range(2, 31, 7):
        out.append({"kind": "-D", "row": {"id": i, "customer": i % 4, "amount": 40 * (i % 6)}})
    return out


def test_statement_set_writes_three_sinks_from_one_query_as_replay_does(spark, kafka_bootstrap, tmp_path):
    sql, topics = unique_topics(SQL, "stmtset")
    pipeline = compile_sql(sql)
    orders = pipeline.sources["orders"]
    records = encode_source(orders, cdc())
    records.insert(10, (b'{"id": 99}', b"not json"))  # one bad record
    produce(kafka_bootstrap, topics["orders"], records)
    name = f"stmtset-{topics['orders'][-8:]}"
    result = run_pipeline(spark, pipeline, kafka_bootstrap, str(tmp_path / "ckpt"), name=name,
                          max_records_per_trigger=9, trigger_interval=None)
    assert len(result.reports) >= 4  # rate-limited: batches mix inserts, updates and deletes
    reference = replay_reference(kafka_bootstrap, pipeline, result.reports)
    for target in pipeline.sinks:
        got = sink_table(kafka_bootstrap, pipeline, result.sink_writer_ids[target.table.name], sink=target.table)
        assert got == reference.table(target.table.name), target.table.name
        assert got, f"{target.table.name} is empty: the test would prove nothing"
    assert result.sink_writer_ids["big_orders"] is None and result.sink_writer_ids["totals"] is not None
    letters = read_exactly_once(kafka_bootstrap, f"{name}.dlq", result.dlq_writer_id)
    assert [dead_letter.decode(r.value).source_offset for r in letters] == [10]
    assert result.dlq == 1
    # one Kafka source for the three sinks: the batches' offset ranges tile the topic once
    offsets = [(r.start_offsets.get(topics["orders"], {}).get("0", 0), r.end_offsets[topics["orders"]]["0"])
               for r in result.reports]
    assert offsets[0][0] == 0 and offsets[-1][1] == len(records)
    assert all(a[1] == b[0] for a, b in zip(offsets, offsets[1:]))
