"""Turn a compiled ``Pipeline`` into the one streaming DataFrame a Tidemark job runs.

Shape of the query (one source, one sink, so one checkpoint and one batch id for all):

    read_stream(all source topics) -> decode_stream -+-> good changes of table A -> ...
                                                     +-> good changes of table B -> ...
                                                     +-> bad records ----------------+
    ... keyed stages (transformWithState) ... -> sink changes ------------ union ----+-> foreachBatch

- One ``read_stream`` over every source topic: one offset per batch covers all sources,
  so a ``-U/+U`` pair and its join partners that are committed before a batch is planned
  land in the same batch, and the rate limit bounds the whole batch.
- Calc runs as Python over change rows, fused into the pass that keys rows for the next
  keyed stage (``keyed_input(before=...)``), so it costs no pass of its own; a calc after
  the last keyed stage gets one ``mapInArrow`` pass. The stage object is the very one
  ``ReplayHost`` runs. Spark SQL expressions (``Calc.to_spark_sql``) would need every row
  unpickled into typed columns and pickled again around them: two extra passes to save
  one Python call per row, and a second implementation of SQL semantics to keep equal.
- Keyed stages (normalize, join, aggregate, materializer, merge engine) are hosted by
  ``tidemark.spark.keyed``; a join unions both inputs.
- Bad records (undecodable, missing PK, wrong type, unknown op) are carried to the same
  ``foreachBatch`` as the sink changes, in a ``bad`` struct column (null on sink rows), so
  the dead-letter topic is written with the batch id of the batch that read them: a
  replayed batch rewrites neither. A second query for the DLQ would have needed its own
  checkpoint and would read every source record twice.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from tidemark.engine.changelog import Change
from tidemark.engine.errors import PlanError, TidemarkError
from tidemark.engine.pipeline import Pipeline
from tidemark.engine.stage import StatelessStage
from tidemark.spark.keyed import (
    CHANGE_COLUMNS,
    CHANGE_SCHEMA,
    StageCrash,
    StageFailure,
    StageMetrics,
    keyed_input,
    run_keyed_stage,
)
from tidemark.spark.sink import DEAD_LETTER_COLUMNS
from tidemark.spark.source import SourceTable, bad_records, decode_stream, good_changes, read_stream

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

BAD_COLUMN = "bad"


class GuardedStage:
    """A stateless stage whose errors cross the Python worker -> driver boundary as
    themselves (``StageFailure``), so a calc that cannot evaluate a row stops the job with
    the stage's own message and exit status instead of a Python worker stack trace."""

    def __init__(self, stage: StatelessStage):
        self.stage = stage
        self.name = stage.name

    def process(self, changes: list[Change]) -> list[Change]:
        try:
            return self.stage.process(changes)
        except TidemarkError as err:
            raise StageFailure(err) from None
        except Exception as err:
            raise StageFailure(
                StageCrash(f"stage '{self.name}' failed: {type(err).__name__}: {err}")
            ) from err


def source_tables(pipeline: Pipeline, registry_url: str | None = None) -> list[SourceTable]:
    """The pipeline's source tables in plan order; ``source_index`` (the second element
    of every source position) is that order. Two tables on one topic are refused: a
    record must decode into exactly one table."""
    out: list[SourceTable] = []
    seen: dict[str, str] = {}
    for node in pipeline.nodes:
        if node.kind != "source":
            continue
        table = pipeline.sources.get(node.table) or pipeline.tables[node.table]
        src = SourceTable(table, len(out), registry_url)
        if src.topic in seen:
            raise PlanError(
                f"tables '{seen[src.topic]}' and '{table.name}' both read topic '{src.topic}'; "
                "the Spark job decodes each topic as one table"
            )
        seen[src.topic] = table.name
        out.append(src)
    return out


def stateless_pass(df: DataFrame, stages: Sequence[StatelessStage]) -> DataFrame:
    """Run stateless stages over ``CHANGE_SCHEMA`` rows in one Arrow pass."""
    if not stages:
        return df
    import pyarrow as pa

    pre = list(stages)
    schema = pa.schema([("kind", pa.string()), ("row", pa.binary()), ("pos", pa.list_(pa.int64()))])

    def fn(batches: Iterator[Any]) -> Iterator[Any]:
        import pickle

        from tidemark.spark.keyed import encode_pos, encode_row

        for batch in batches:
            cs = [
                Change(k, pickle.loads(r), tuple(p) if p is not None else ())
                for k, r, p in zip(
                    batch.column("kind").to_pylist(),
                    batch.column("row").to_pylist(),
                    batch.column("pos").to_pylist(),
                )
            ]
            for st in pre:
                cs = st.process(cs)
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array([c.kind for c in cs], pa.string()),
                    pa.array([encode_row(c.row) for c in cs], pa.binary()),
                    pa.array([encode_pos(c.pos) for c in cs], pa.list_(pa.int64())),
                ],
                schema=schema,
            )

    return df.select(*CHANGE_COLUMNS).mapInArrow(fn, CHANGE_SCHEMA)


def _is_keyed(stage: Any) -> bool:
    return stage is not None and hasattr(stage, "process_key")


def sink_changes(
    pipeline: Pipeline, decoded: DataFrame, metrics: StageMetrics | None = None
) -> DataFrame:
    """The changes the sink receives (``CHANGE_SCHEMA``), built from the decoded source
    frame by walking the plan in topological order."""
    # node id -> (change frame, stateless stages still to apply to it)
    out: dict[int, tuple[DataFrame, list[StatelessStage]]] = {}
    for node in pipeline.nodes:
        if node.kind == "source":
            out[node.id] = (good_changes(decoded, node.table), [])
        elif node.kind == "sink":
            df, pending = out[node.inputs[0]]
            return stateless_pass(df, pending)
        elif _is_keyed(node.stage):
            stage = node.stage
            inputs = []
            for index, inp in enumerate(node.inputs):
                df, pending = out[inp]
                inputs.append(keyed_input(df, stage, index, before=pending))
            out[node.id] = (run_keyed_stage(inputs, stage, metrics), [])
        elif node.stage is not None:
            df, pending = out[node.inputs[0]]
            out[node.id] = (df, [*pending, GuardedStage(node.stage)])
        else:
            raise PlanError(f"stage [{node.id}] {node.kind} has nothing the Spark job can run")
    raise PlanError("the pipeline has no sink")


def shared(decoded: DataFrame) -> DataFrame:
    """The decoded frame behind a shuffle, so that the branches reading it (one per source
    table, one for the bad records) share ONE read and ONE decode of the batch.

    Spark plans each branch of a query separately; without an exchange to reuse, every
    branch scans the source again (measured: a join pipeline read each record three times,
    and ``numInputRows`` counted it three times). Identical exchanges are reused
    (``ReusedExchange``), so the batch is read and decoded once, then shuffled once. Good
    rows drop the raw key/value bytes (only dead letters need them) to keep the shuffle
    small. Hash-partitioned on the source coordinate: deterministic, so a retried task
    sees the same rows (a round-robin repartition would need a sort for that)."""
    from pyspark.sql import functions as F

    bad = F.col("error_kind").isNotNull()
    slim = decoded.withColumn("key", F.when(bad, F.col("key"))).withColumn("value", F.when(bad, F.col("value")))
    return slim.repartition("topic", "partition", "offset")


def _bad_struct_type() -> str:
    return (
        "struct<table:string, format:string, topic:string, partition:int, offset:bigint, "
        "timestamp:timestamp, key:binary, value:binary, error_kind:string, reason:string>"
    )


def build_query_frame(
    spark: SparkSession,
    pipeline: Pipeline,
    bootstrap: str,
    *,
    metrics: StageMetrics | None = None,
    max_records_per_trigger: int | None = None,
    registry_url: str | None = None,
    source_options: dict[str, str] | None = None,
) -> DataFrame:
    """The streaming frame handed to ``foreachBatch``: columns ``kind, row, pos`` (a sink
    change, ``bad`` null) or ``bad`` (a dead letter's columns, the others null)."""
    from pyspark.sql import functions as F

    tables = source_tables(pipeline, registry_url)
    raw = read_stream(
        spark, [t.topic for t in tables], bootstrap,
        max_records_per_trigger=max_records_per_trigger, **(source_options or {}),
    )
    decoded = shared(decode_stream(raw, tables))
    changes = sink_changes(pipeline, decoded, metrics)
    good = changes.select(*CHANGE_COLUMNS, F.lit(None).cast(_bad_struct_type()).alias(BAD_COLUMN))
    bad = bad_records(decoded).select(
        F.lit(None).cast("string").alias("kind"),
        F.lit(None).cast("binary").alias("row"),
        F.lit(None).cast("array<bigint>").alias("pos"),
        F.struct(*DEAD_LETTER_COLUMNS).alias(BAD_COLUMN),
    )
    return good.unionByName(bad)


def split_batch(df: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(sink changes, dead letters) of one ``foreachBatch`` frame."""
    from pyspark.sql import functions as F

    sink = df.where(F.col(BAD_COLUMN).isNull()).select(*CHANGE_COLUMNS)
    bad = df.where(F.col(BAD_COLUMN).isNotNull()).select(f"{BAD_COLUMN}.*")
    return sink, bad
