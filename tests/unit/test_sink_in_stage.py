"""A keyed stage on the sink's PK writes the sink itself (``run_keyed_stage``'s ``sink``):
the writer is handed exactly the batch the stage would otherwise have sent to the sink as a
blob, typed as that node's columns, and the stage's stored state does not change."""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa

from tidemark.engine import batch_ipc
from tidemark.engine.batch import KIND, WEIGHT, ChangeBatch
from tidemark.engine.changelog import DELETE, INSERT, Change
from tidemark.engine.pipeline import compile_sql
from tidemark.spark.keyed import _BucketRunner, blob_rows

SQL = """
CREATE TABLE src (id BIGINT, name STRING, score DECIMAL(10, 2), PRIMARY KEY (id) NOT ENFORCED)
  WITH ('topic' = 'src', 'format' = 'debezium-json');
CREATE TABLE dst (name STRING, id BIGINT, score DECIMAL(10, 2), PRIMARY KEY (name) NOT ENFORCED)
  WITH ('topic' = 'dst', 'format' = 'upsert-json');
INSERT INTO dst SELECT name, id, score FROM src ON CONFLICT DO DEDUPLICATE;
"""
#: the materializer's input: the calc's (name, id, score)
BATCHES = [
    [Change(INSERT, ("a", 1, Decimal("1.50")), (0, 0, 0, 0)), Change(INSERT, ("b", 2, Decimal("2.00")), (0, 0, 0, 1)),
     Change(INSERT, ("a", 3, Decimal("3.25")), (0, 0, 0, 2))],
    [Change(DELETE, ("a", 3, Decimal("3.25")), (1, 0, 0, 3)), Change(INSERT, ("c", 4, None), (1, 0, 0, 4))],
]


class Recorder:
    """A sink writer that keeps what it is handed."""

    def __init__(self) -> None:
        self.batches: list[ChangeBatch] = []

    def write(self, batch: ChangeBatch) -> int:
        self.batches.append(batch)
        return 10 + len(batch)


def test_the_writer_gets_what_the_blob_to_the_sink_would_have_carried():
    pipeline = compile_sql(SQL)
    feeding = pipeline.node(pipeline.sink_node.inputs[0])
    calc = pipeline.node(feeding.inputs[0])
    schema = batch_ipc.schema_of(feeding.columns, feeding.types)
    recorder = Recorder()
    writes = _BucketRunner(feeding.stage, None, None, schema=schema, buckets=1, sink=recorder)
    sends = _BucketRunner(feeding.stage, None, None, schema=schema, buckets=1)
    in_schema = batch_ipc.schema_of(calc.columns, calc.types)

    stored_w, stored_s = [None], [None]
    for i, changes in enumerate(BATCHES):
        blobs = [[blob for _, _, blob in blob_rows(changes, in_schema, (feeding.stage, 0), 1)]]
        written, sent = writes.run(blobs, stored_w, 0), sends.run(blobs, stored_s, 0)
        assert written.stored == sent.stored
        stored_w, stored_s = written.stored, sent.stored

        (got,) = recorder.batches[i:]
        assert len(got) > 0
        (blob,) = [r[2] for r in sent.rows]
        assert got.table().equals(batch_ipc.decode(blob))
        rows = pa.schema([f for f in got.table().schema if not f.name.startswith("$")])
        assert rows.equals(schema)
        assert [n for n in got.table().column_names if n.startswith("$")] == [KIND, WEIGHT, "$pos0", "$pos1", "$pos2", "$pos3"]
        assert written.rows == [(10 + len(got),)]
