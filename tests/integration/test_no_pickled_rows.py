"""No pickled row crosses a Spark stage boundary (issue 13): changes travel between the
passes and stages of a job's query as Arrow IPC blobs of typed change batches.

For representative pipelines (a join, an aggregate and a sink materializer over an upsert
source with its normalize; a merge-engine sink; a delta join), the job runs a few batches
on the session broker, then:

- every column of every node of the query's analyzed plan and of the physical plan of its
  last micro-batch is walked: a binary column must be a declared blob column (``batch``,
  ``tidemark.spark.keyed.BLOB_COLUMNS``) or a raw Kafka record's key or value at the scan;
- every blob the sink received parses as a change batch whose row columns carry the
  names and Arrow types of the node feeding the sink, with kind, weight and the source
  position (batch, source, partition, offset); a sink fed by a keyed stage on its PK
  receives no blob at all (the stage writes it), only the count of what was written.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from run_support import encode_source, produce, topic_of, unique_topics

from tests.unit.delta_workload import sql as delta_join_sql
from tidemark.engine import batch_ipc
from tidemark.engine.batch import KIND, WEIGHT
from tidemark.engine.pipeline import Pipeline, compile_sql
from tidemark.kafka.admin import ensure_topics
from tidemark.spark.job import PipelineJob
from tidemark.spark.keyed import BLOB_COLUMNS, WRITTEN_COLUMN
from tidemark.spark.source import SCHEMA as RAW_SCHEMA

pytestmark = pytest.mark.integration

RAW_COLUMNS = {part.split()[0] for part in RAW_SCHEMA.split(",")}

JOIN_AGGREGATE_MATERIALIZER = """
CREATE TABLE orders (id BIGINT, customer BIGINT, amount DECIMAL(10, 2), PRIMARY KEY (id) NOT ENFORCED)
  WITH ('topic' = 'orders', 'format' = 'debezium-json');
CREATE TABLE customers (id BIGINT, region STRING, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('topic' = 'customers', 'format' = 'upsert-json');
CREATE TABLE totals (region STRING, customer BIGINT, n BIGINT, total DECIMAL(38, 2),
  PRIMARY KEY (region) NOT ENFORCED) WITH ('topic' = 'totals', 'format' = 'upsert-json');
INSERT INTO totals SELECT c.region, o.customer, COUNT(*) AS n, SUM(o.amount) AS total
  FROM orders o JOIN customers c ON o.customer = c.id GROUP BY c.region, o.customer
  ON CONFLICT DO DEDUPLICATE;
"""

MERGE_ENGINE = """
CREATE TABLE events (id BIGINT, category STRING, v BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('topic' = 'events', 'format' = 'debezium-json');
CREATE TABLE totals (category STRING, total BIGINT, PRIMARY KEY (category) NOT ENFORCED)
  WITH ('topic' = 'totals', 'format' = 'upsert-json', 'merge-engine' = 'aggregation',
        'fields.total.aggregate-function' = 'sum');
INSERT INTO totals SELECT category, v FROM events;
"""


def ins(**row) -> dict:
    return {"kind": "+I", "row": row}


RECORDS = {
    "join-aggregate-materializer": {
        "orders": [ins(id=i, customer=i % 3, amount=f"{i}.25") for i in range(12)]
        + [{"kind": "-D", "row": {"id": 4, "customer": 1, "amount": "4.25"}}],
        "customers": [ins(id=c, region=f"r{c % 2}") for c in range(3)] + [ins(id=1, region="r0")],
    },
    "merge-engine": {"events": [ins(id=i, category=f"c{i % 4}", v=i) for i in range(20)]},
    "delta-join": {
        "a": [ins(id=i, k=i % 3, v=i) for i in range(9)],
        "b": [ins(id=10 + i, k=i % 3, w=i) for i in range(6)],
    },
}
#: the cases whose sink is fed by a keyed stage on its PK (``query.keyed_by_sink_pk``)
WRITTEN_IN_STAGE = {"join-aggregate-materializer", "merge-engine"}
SQL = {
    "join-aggregate-materializer": JOIN_AGGREGATE_MATERIALIZER,
    "merge-engine": MERGE_ENGINE,
    "delta-join": delta_join_sql("FORCE", "eventual", b_format="json"),
}


def _seq(scala_seq) -> list:
    return [scala_seq.apply(i) for i in range(scala_seq.size())]


def pickled_columns(plan) -> list[str]:
    """Binary columns of ``plan``'s nodes that are neither a blob column nor a raw Kafka
    record's bytes, as ``node: column``."""
    found = []
    todo = [plan]
    while todo:
        node = todo.pop()
        output = _seq(node.output())
        names = {a.name() for a in output}
        for a in output:
            if a.dataType().typeName() != "binary" or a.name() in BLOB_COLUMNS:
                continue
            if a.name() in ("key", "value") and RAW_COLUMNS <= names:
                continue
            found.append(f"{node.nodeName()}: {a.name()} ({', '.join(sorted(names))})")
        todo.extend(_seq(node.children()))
    return found


def feeding_node(pipeline: Pipeline):
    """The node whose changes the sink receives."""
    return pipeline.node(pipeline.sink_node.inputs[0])


def run(spark, bootstrap: str, tmp_path, case: str) -> tuple[Pipeline, PipelineJob, list[bytes]]:
    text, _ = unique_topics(SQL[case], f"np-{case}")
    pipeline = compile_sql(text)
    for name, table in pipeline.sources.items():
        ensure_topics(bootstrap, {topic_of(table): 2})
        produce(bootstrap, topic_of(table), encode_source(table, RECORDS[case][name]), partitions=2)
    job = PipelineJob(spark, pipeline, bootstrap, str(tmp_path / case), name=f"np-{case}-{tmp_path.name}",
                      max_records_per_trigger=8)
    blobs: list[bytes] = []
    write = job._write_batch

    def inspect(df, batch_id: int) -> None:
        df.persist()
        try:
            if job.sinks_written_in_stage:  # nothing crosses to the sink: only what was written
                assert df.columns == [WRITTEN_COLUMN], df.columns
            else:
                blobs.extend(bytes(r["batch"]) for r in df.select("batch").collect())
            write(df, batch_id)
        finally:
            df.unpersist()

    job._write_batch = inspect
    try:
        job.start(until_idle=True)
        job.wait()
    finally:
        job.close()
    return pipeline, job, blobs


@pytest.mark.parametrize("case", sorted(SQL))
def test_no_pickled_row_crosses_a_stage_boundary(spark, kafka_bootstrap, tmp_path, case):
    pipeline, job, blobs = run(spark, kafka_bootstrap, tmp_path, case)
    assert len(job.reports) >= 2, "the rate limit should make several batches"

    execution = job.query._jsq.streamingQuery()
    analyzed = pickled_columns(execution.logicalPlan())
    physical = pickled_columns(execution.lastExecution().executedPlan())
    assert analyzed == [], f"{case}: binary columns that are not change-batch blobs: {analyzed}"
    assert physical == [], f"{case}: binary columns that are not change-batch blobs: {physical}"

    if case in WRITTEN_IN_STAGE:
        # the keyed stage feeding the sink writes it itself: no blob crosses to the sink,
        # and what its writer is handed is typed as the blobs were (tests/unit/test_sink_in_stage.py)
        assert job.sinks_written_in_stage == {pipeline.sink.name} and not blobs
        return
    assert not job.sinks_written_in_stage
    node = feeding_node(pipeline)
    expected = batch_ipc.schema_of(node.columns, node.types)
    assert expected is not None
    assert blobs, f"{case}: the sink received no change batch"
    for blob in blobs:
        table = batch_ipc.decode(blob)
        rows = pa.schema([f for f in table.schema if not f.name.startswith("$")])
        assert rows.equals(expected), f"{case}: blob columns {rows} are not node {node.name}'s {expected}"
        own = [n for n in table.column_names if n.startswith("$")]
        assert own == [KIND, WEIGHT, "$pos0", "$pos1", "$pos2", "$pos3"], own
        assert table.num_rows > 0
