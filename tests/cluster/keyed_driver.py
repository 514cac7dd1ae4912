"""Driver program for the cluster test: a keyed stage (GroupAggregate) hosted by
``run_keyed_stage`` on whatever master ``TIDEMARK_SPARK_MASTER`` names, fed from a parquet
directory in two micro-batches (``Trigger.AvailableNow``). Prints one JSON line: the sink
table the emitted changes materialize to, and where executors imported tidemark from.

It runs as its own process because a Python process holds one SparkContext, and the test
process may already hold the shared local one.
"""

from __future__ import annotations

import json
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from tidemark.engine.changelog import Change
from tidemark.engine.stages.aggregate import AggCall, GroupAggregate
from tidemark.spark.keyed import BLOB_SCHEMA, changes_from_rows, encode_changes, keyed_input, run_keyed_stage
from tidemark.spark.session import build_session

BATCHES = [
    [Change("+I", ("a", 1), (1,)), Change("+I", ("b", 2), (2,)), Change("+I", ("a", 3), (3,))],
    [Change("-D", ("a", 1), (4,)), Change("+I", ("c", 5), (5,)),
     Change("-D", ("b", 2), (6,)), Change("+I", ("a", 7), (7,))],
]


def executor_origins(spark) -> list[str]:
    """Where executors' Python workers import tidemark from (and that they can)."""

    def origin(_: int) -> str:
        import tidemark.engine.changelog as mod

        return mod.__file__

    return spark.sparkContext.parallelize(range(4), 4).map(origin).distinct().collect()


def main(workdir: str) -> None:
    source_dir = os.path.join(workdir, "source")
    os.makedirs(source_dir, exist_ok=True)
    schema = pa.schema([("bucket", pa.int32()), ("input", pa.int32()), ("batch", pa.binary())])
    for i, batch in enumerate(BATCHES):
        cols = {"bucket": [0], "input": [0], "batch": [encode_changes(batch)]}
        pq.write_table(pa.table(cols, schema=schema), os.path.join(source_dir, f"b{i}.parquet"))

    spark = build_session(app_name="tidemark-cluster-keyed")
    stage = GroupAggregate((0,), [AggCall("COUNT_STAR"), AggCall("SUM", 1)])
    source = (
        spark.readStream.schema(BLOB_SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .parquet(source_dir)
    )
    emitted: list[Change] = []
    query = (
        run_keyed_stage([keyed_input(source, stage)], stage)
        .writeStream.foreachBatch(lambda df, _id: emitted.extend(changes_from_rows(df.collect())))
        .option("checkpointLocation", os.path.join(workdir, "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    table: dict[str, list] = {}
    for change in emitted:
        if change.kind in ("+I", "+U"):
            table[change.row[0]] = list(change.row)
        elif change.kind == "-D":
            table.pop(change.row[0], None)
    result = {
        "master": spark.sparkContext.master,
        "table": table,
        "batches": len(query.recentProgress),
        "executor_origins": executor_origins(spark),
    }
    spark.stop()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
