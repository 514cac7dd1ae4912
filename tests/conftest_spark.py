"""Spark test harness: ONE SparkSession per test session, and a feeder that drives a
streaming query batch by batch, like Flink's operator harness (feed records, assert what
the operator emitted) but through real Spark micro-batches.

Use from ``tests/conftest.py`` with ``from conftest_spark import spark, spark_stream  # noqa: F401``.

Batches come from a parquet directory: one file = one micro-batch
(``maxFilesPerTrigger=1``), written atomically (hidden temp name, then rename), and the
test calls ``run_batch`` which writes the file and waits with ``processAllAvailable``.
Each file holds ``BLOB_SCHEMA`` rows (``tidemark.spark.keyed``), one change batch per
input of the stage under test, so a 2-input stage gets both sides of a batch in the same
micro-batch. The
file source keeps its offsets in the checkpoint, so ``restart()`` resumes exactly where the
stopped query was, state included.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tidemark.engine.changelog import Change

SOURCE_SCHEMA = "bucket int, input int, batch binary"


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The one SparkSession of the test run (local[*], RocksDB state, 2 shuffle partitions)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # Spark's Python workers import a pipeline's UDF modules from PYTHONPATH, as a job's
    # workers do; the random workloads' module (conformance/conformance_udfs.py) is there
    udfs = str(Path(__file__).parent / "conformance")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [udfs, os.environ.get("PYTHONPATH")]))
    from tidemark.spark.session import build_session

    session = build_session(app_name="tidemark-tests", shuffle_partitions=2)
    yield session
    session.stop()


class SparkStream:
    """A streaming query under test, fed one micro-batch per ``run_batch`` call.

    ``build(source_df) -> DataFrame`` makes the query's output (``BLOB_SCHEMA`` rows)
    from the source (``SOURCE_SCHEMA``: filter on ``input`` to split inputs).
    """

    def __init__(self, spark: Any, workdir: str, build: Callable[[Any], Any]):
        self.spark = spark
        self.source_dir = os.path.join(workdir, "source")
        self.checkpoint = os.path.join(workdir, "checkpoint")
        os.makedirs(self.source_dir, exist_ok=True)
        self.build = build
        self.outputs: dict[int, list[Change]] = {}
        self.query: Any = None
        self._files = 0

    # -- query lifecycle -------------------------------------------------------------------
    def start(self) -> SparkStream:
        from tidemark.spark.keyed import changes_from_rows

        source = (
            self.spark.readStream.schema(SOURCE_SCHEMA)
            .option("maxFilesPerTrigger", 1)
            .parquet(self.source_dir)
        )
        outputs = self.outputs

        def collect(df: Any, batch_id: int) -> None:
            outputs[batch_id] = changes_from_rows(df.collect())

        self.query = (
            self.build(source)
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", self.checkpoint)
            .start()
        )
        return self

    def stop(self) -> None:
        if self.query is not None:
            self.query.stop()
            self.query = None

    def restart(self) -> SparkStream:
        """Stop and start a new query on the same checkpoint (a job restart)."""
        self.stop()
        return self.start()

    # -- feeding ---------------------------------------------------------------------------
    def write_batch(self, inputs: list[list[Change]]) -> None:
        """Make one micro-batch available: ``inputs[i]`` are the changes for input ``i``."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        from tidemark.spark.keyed import encode_changes

        blobs = [(index, encode_changes(changes)) for index, changes in enumerate(inputs) if changes]
        cols = {"bucket": [0] * len(blobs), "input": [i for i, _ in blobs], "batch": [b for _, b in blobs]}
        schema = pa.schema([("bucket", pa.int32()), ("input", pa.int32()), ("batch", pa.binary())])
        tmp = os.path.join(self.source_dir, f".batch-{self._files:05d}.tmp")
        pq.write_table(pa.table(cols, schema=schema), tmp)
        os.rename(tmp, os.path.join(self.source_dir, f"batch-{self._files:05d}.parquet"))
        self._files += 1

    def wait_for(self, done: Callable[[dict[int, list[Change]]], bool], timeout_s: float = 300) -> None:
        """Wait until ``done(outputs)`` holds, for queries that never go idle (stages with
        timers make Spark run a batch at every trigger). Fails on a query error."""
        import time

        from tidemark.spark.keyed import stage_error_from

        deadline = time.monotonic() + timeout_s
        while not done(self.outputs):
            error = self.query.exception()
            if error is not None:
                raise stage_error_from(error) or error
            assert time.monotonic() < deadline, f"timed out; batches so far: {sorted(self.outputs)}"
            time.sleep(0.2)

    def run_batch(self, inputs: list[list[Change]]) -> list[Change]:
        """Feed one micro-batch, wait for it, return what the query emitted for it.
        A stage error is re-raised as itself (e.g. ConflictError)."""
        from tidemark.spark.keyed import process_all_available

        before = set(self.outputs)
        self.write_batch(inputs)
        process_all_available(self.query)
        new = sorted(set(self.outputs) - before)
        assert len(new) == 1, f"expected one micro-batch per file, got batches {new}"
        return self.outputs[new[0]]


@pytest.fixture
def spark_stream(spark: Any) -> Iterator[Callable[[Callable[[Any], Any]], SparkStream]]:
    """``spark_stream(build) -> SparkStream`` (started); every stream is stopped and its
    files removed after the test."""
    made: list[tuple[SparkStream, str]] = []

    def make(build: Callable[[Any], Any]) -> SparkStream:
        workdir = tempfile.mkdtemp(prefix="tm-spark-")
        stream = SparkStream(spark, workdir, build)
        made.append((stream, workdir))
        return stream.start()

    yield make
    for stream, workdir in made:
        stream.stop()
        shutil.rmtree(workdir, ignore_errors=True)
