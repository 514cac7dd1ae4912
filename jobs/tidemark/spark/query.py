"""Turn a compiled ``Pipeline`` into the one streaming DataFrame a Tidemark job runs.

Shape of the query (one query: one checkpoint, one batch id for everything):

    read_stream(topic of A) -> decode A + calc + key for its stage --+
    read_stream(topic of B) -> decode B + calc + key for its stage --+-> keyed stages ... -> sink changes
                                  |  bad records                      (transformWithState)       |
                                  +--> dead-letter accumulator --------------------------> foreachBatch

Why this shape (each point measured or forced by Spark):

- **One source per table, one Python pass per record before the first shuffle.** Spark
  plans every branch of a query separately and does not share a scan between branches;
  one stream over all topics, split by table, read and decoded every record once per
  branch (a join with a dead-letter branch read everything three times, and the progress
  counted it three times). With one stream per source table each branch reads only its
  topic, and decoding, the calc stages up to the first keyed stage and computing that
  stage's key happen in ONE ``mapInArrow`` pass.
- **Dead letters leave through an accumulator, not a branch.** A bad record is found by
  decoding; a second branch to find them would decode every record again. The decode
  pass adds each bad record, under its batch id and source coordinate, to an accumulator
  the driver reads after the batch has run; ``foreachBatch`` writes them to the
  dead-letter topic with the batch's id (transactional: a replay writes nothing twice).
  Keying by coordinate makes a task retried by Spark harmless.
- **Calc runs as Python over change rows**, fused into a pass that exists anyway (the
  decode pass or the pass that keys rows for the next keyed stage); only a calc after the
  last keyed stage gets a pass of its own. The stage object is the very one ``ReplayHost``
  runs. Spark SQL expressions (``Calc.to_spark_sql``) would need every row unpickled into
  typed columns and pickled again around them: two extra passes to save one Python call
  per row, and a second implementation of SQL semantics to keep equal.
- Keyed stages (normalize, join, aggregate, materializer, merge engine) are hosted by
  ``tidemark.spark.keyed``; a keyed stage directly followed by another emits rows already
  keyed for it (``downstream=``), saving a pass. A join unions both inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from functools import reduce
from typing import TYPE_CHECKING, Any

from tidemark.engine.changelog import Change
from tidemark.engine.errors import PlanError, TidemarkError
from tidemark.engine.pipeline import Pipeline
from tidemark.engine.stage import StatelessStage
from tidemark.spark.keyed import (
    CHANGE_COLUMNS,
    CHANGE_SCHEMA,
    DEFAULT_STATE_BUCKETS,
    KEYED_SCHEMA,
    StageCrash,
    StageFailure,
    StageMetrics,
    run_keyed_stage,
)
from tidemark.spark.delta import is_delta_join, run_delta_join
from tidemark.spark.source import SourceTable, client_options, read_stream, startup_options
from tidemark.spark.watermark import check_supported as check_event_time

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: (stage, input index) a frame is keyed for; None = plain change rows
Target = tuple[Any, int] | None


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


# ---------------------------------------------------------------------------- dead letters


class DeadLetterAccumulator:
    """Bad records found by the decode passes, per batch id and source coordinate.

    Workers add ``{batch_id: {(topic, partition, offset): letter row}}``; Spark merges
    the updates of successful tasks into the driver's value, and a retried task adds the
    same coordinates again, which the dict absorbs. ``take(batch_id)`` returns and forgets
    one batch's records, in source order."""

    def __init__(self, spark: SparkSession):
        from pyspark.accumulators import AccumulatorParam

        class _Param(AccumulatorParam):
            def zero(self, value: dict) -> dict:
                return {}

            def addInPlace(self, value1: dict, value2: dict) -> dict:
                for batch, letters in value2.items():
                    value1.setdefault(batch, {}).update(letters)
                return value1

        self._acc = spark.sparkContext.accumulator({}, _Param())

    @property
    def accumulator(self) -> Any:
        return self._acc

    def take(self, batch_id: int) -> list[dict[str, Any]]:
        value = self._acc.value
        letters = value.pop(batch_id, {})
        self._acc.value = value
        return [letters[c] for c in sorted(letters)]


# ---------------------------------------------------------------------------- the passes

def _arrow_schemas() -> tuple[Any, Any]:
    import pyarrow as pa

    fields = [("kind", pa.string()), ("row", pa.binary()), ("pos", pa.list_(pa.int64()))]
    change = pa.schema(fields)
    keyed = pa.schema([("key", pa.binary()), ("input", pa.int32()), *fields])
    return change, keyed


def _emit(cs: list[Change], target: Target) -> Any:
    """Changes as one Arrow batch: ``KEYED_SCHEMA`` for ``target``, else ``CHANGE_SCHEMA``."""
    import pyarrow as pa

    from tidemark.spark.keyed import encode_key, encode_pos, encode_row

    change, keyed = _arrow_schemas()
    cols = [
        pa.array([c.kind for c in cs], pa.string()),
        pa.array([encode_row(c.row) for c in cs], pa.binary()),
        pa.array([encode_pos(c.pos) for c in cs], pa.list_(pa.int64())),
    ]
    if target is None:
        return pa.RecordBatch.from_arrays(cols, schema=change)
    stage, index = target
    key = pa.array([encode_key(stage.key_of(c, index)) for c in cs], pa.binary())
    return pa.RecordBatch.from_arrays([key, pa.array([index] * len(cs), pa.int32()), *cols], schema=keyed)


def _batch_id() -> int:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    value = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
    return int(value) if value is not None else -1


def decode_batch(
    records: list[dict[str, Any]], src: SourceTable, decoder: Any, batch_id: int
) -> tuple[list[Change], dict[tuple, dict[str, Any]]]:
    """Decode raw records of one source table: (changes, bad records by coordinate).
    Spark-free, so the routing is testable without a session. A change's position is
    ``(batch id, source index, partition, offset)``."""
    from tidemark.formats import DecodeError

    changes: list[Change] = []
    bad: dict[tuple, dict[str, Any]] = {}
    table = src.table.name
    for r in records:
        pos = (batch_id, src.source_index, r["partition"], r["offset"])
        try:
            changes.extend(decoder.decode(r["key"], r["value"], pos, r["topic"]))
        except DecodeError as err:
            coord = (r["topic"], r["partition"], r["offset"])
            bad[coord] = {
                "table": table, "format": decoder.spec.name, "topic": r["topic"],
                "partition": r["partition"], "offset": r["offset"], "timestamp": r.get("timestamp"),
                "key": r["key"], "value": r["value"], "error_kind": err.kind,
                "reason": f"{table} @ {r['topic']}/{r['partition']}/{r['offset']}: {err.reason}",
            }
    return changes, bad


def _fill_timestamps(bad: dict[tuple, dict[str, Any]], records: list[dict[str, Any]], timestamps: Any) -> None:
    """Give each bad record the source timestamp of its raw record (``timestamps``: the
    batch's Arrow column, in ``records`` order)."""
    for i, r in enumerate(records):
        letter = bad.get((r["topic"], r["partition"], r["offset"]))
        if letter is not None:
            letter["timestamp"] = timestamps[i].as_py()


def decode_pass(
    raw: DataFrame, src: SourceTable, stages: Sequence[StatelessStage], target: Target,
    dead_letters: DeadLetterAccumulator,
) -> DataFrame:
    """Raw records of one table -> its changes, through ``stages``, keyed for ``target``;
    bad records to ``dead_letters``. One Python pass."""
    pre = list(stages)
    acc = dead_letters.accumulator

    def fn(batches: Iterator[Any]) -> Iterator[Any]:
        from tidemark.formats import decoder_for

        decoder = decoder_for(src.table, src.registry_url)
        batch_id = _batch_id()
        bad: dict[tuple, dict[str, Any]] = {}
        for batch in batches:
            # without the timestamp column: a tz-aware datetime per record cost more than
            # the JSON decode; only a dead letter needs it (filled in below)
            records = batch.drop_columns(["timestamp"]).to_pylist()
            cs, b = decode_batch(records, src, decoder, batch_id)
            if b:
                _fill_timestamps(b, records, batch.column("timestamp"))
            bad.update(b)
            for st in pre:
                cs = st.process(cs)
            yield _emit(cs, target)
        if bad:
            acc.add({batch_id: bad})

    return raw.mapInArrow(fn, KEYED_SCHEMA if target is not None else CHANGE_SCHEMA)


def stateless_pass(df: DataFrame, stages: Sequence[StatelessStage]) -> DataFrame:
    """Run stateless stages over ``CHANGE_SCHEMA`` rows in one Arrow pass."""
    if not stages:
        return df
    pre = list(stages)

    def fn(batches: Iterator[Any]) -> Iterator[Any]:
        import pickle

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
            yield _emit(cs, None)

    return df.select(*CHANGE_COLUMNS).mapInArrow(fn, CHANGE_SCHEMA)


# ---------------------------------------------------------------------------- the plan walk


class _Output:
    """A node's output, not built yet: ``build(target, pending)`` makes the frame once the
    consumer is known, so each producer can fuse the consumer's calc and keying into a
    pass it runs anyway."""

    def __init__(self, build: Callable[[Target, list[StatelessStage]], DataFrame], pending: list[StatelessStage]):
        self._build = build
        self.pending = pending

    def then(self, stage: StatelessStage) -> _Output:
        return _Output(self._build, [*self.pending, stage])

    def keyed_for(self, stage: Any, index: int) -> DataFrame:
        return self._build((stage, index), self.pending)

    def changes(self) -> DataFrame:
        return self._build(None, self.pending)


def union_output(upstream: list[_Output]) -> _Output:
    """A union stage (``UNION ALL``): no pass of its own. Each branch builds its frame for
    the union's consumer, running the calcs after the union in its own pass (they are row
    by row, so a calc over the union is the calc over each branch), and the frames are
    unioned by name."""

    def build(target: Target, pending: list[StatelessStage]) -> DataFrame:
        frames = []
        for out in upstream:
            for stage in pending:
                out = out.then(stage)
            frames.append(out.changes() if target is None else out.keyed_for(*target))
        return reduce(lambda a, b: a.unionByName(b), frames)

    return _Output(build, [])


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


def _is_keyed(stage: Any) -> bool:
    return stage is not None and hasattr(stage, "process_key")


def build_query_frame(
    spark: SparkSession,
    pipeline: Pipeline,
    bootstrap: str,
    *,
    dead_letters: DeadLetterAccumulator,
    metrics: StageMetrics | None = None,
    max_records_per_trigger: int | None = None,
    registry_url: str | None = None,
    source_options: dict[str, str] | None = None,
    index: Any = None,
    state_buckets: int = DEFAULT_STATE_BUCKETS,
) -> DataFrame:
    """The streaming frame of the changes the sink receives (``CHANGE_SCHEMA``); bad
    records go to ``dead_letters``. ``max_records_per_trigger`` caps each source table's
    records per micro-batch. ``index`` (``tidemark.spark.delta.IndexTarget``): delta joins
    run stateless against that index service (``tidemark.spark.delta``)."""
    check_event_time(pipeline)
    tables = {t.table.name: t for t in source_tables(pipeline, registry_url)}
    outputs: dict[int, _Output] = {}
    for node in pipeline.nodes:
        if node.kind == "source":
            src = tables[node.table]
            raw = read_stream(
                spark, [src.topic], bootstrap, max_records_per_trigger=max_records_per_trigger,
                **{**client_options(src.table), **startup_options(src.table), **(source_options or {})},
            )

            def build_source(target: Target, pending: list, raw: Any = raw, src: SourceTable = src) -> DataFrame:
                return decode_pass(raw, src, pending, target, dead_letters)

            outputs[node.id] = _Output(build_source, [])
        elif node.kind == "sink":
            return outputs[node.inputs[0]].changes()
        elif _is_keyed(node.stage):
            stage = node.stage
            upstream = [outputs[i] for i in node.inputs]

            def build_keyed(target: Target, pending: list, stage: Any = stage, upstream: list = upstream) -> DataFrame:
                inputs = [out.keyed_for(stage, i) for i, out in enumerate(upstream)]
                if index is not None and is_delta_join(stage):
                    return run_delta_join(inputs, stage, index, metrics, downstream=target, after=pending)
                # a calc after the stage runs in the stage's own pass (``then``)
                return run_keyed_stage(inputs, stage, metrics, downstream=target, then=pending, buckets=state_buckets)

            outputs[node.id] = _Output(build_keyed, [])
        elif hasattr(node.stage, "process_inputs"):
            outputs[node.id] = union_output([outputs[i] for i in node.inputs])
        elif node.stage is not None:
            outputs[node.id] = outputs[node.inputs[0]].then(GuardedStage(node.stage))
        else:
            raise PlanError(f"stage [{node.id}] {node.kind} has nothing the Spark job can run")
    raise PlanError("the pipeline has no sink")
