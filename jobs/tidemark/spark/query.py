"""Turn a compiled ``Pipeline`` into the one streaming DataFrame a Tidemark job runs.

Shape of the query (one query: one checkpoint, one batch id for everything):

    scan of A's topic, decoding A + calc + key for its stage --+
    scan of B's topic, decoding B + calc + key for its stage --+-> keyed stages ... -> sink changes
                       |  bad records, records read             (transformWithState)       |
                       +--> per-batch accumulators --------------------------------> foreachBatch

Why this shape (each point measured or forced by Spark):

- **One source per table, one Python pass per record before the first shuffle, inside
  the scan.** Spark plans every branch of a query separately and does not share a scan
  between branches; one stream over all topics, split by table, read and decoded every
  record once per branch (a join with a dead-letter branch read everything three times,
  and the progress counted it three times). With one stream per source table each branch
  reads only its topic, and decoding, the calc stages up to the first keyed stage and
  computing that stage's key and bucket happen in ONE function that the Kafka source's
  reader runs on the record batches it has just fetched (``source.decoded_stream``): no
  raw record becomes a Spark row, and no second Python worker receives them again (a
  ``mapInArrow`` after the scan cost a JVM conversion of every record both ways).
- **Dead letters leave through an accumulator, not a branch.** A bad record is found by
  decoding; a second branch to find them would decode every record again. The decode
  pass adds each bad record, under its batch id and source coordinate, to an accumulator
  the driver reads after the batch has run; ``foreachBatch`` writes them to the
  dead-letter topic with the batch's id (transactional: a replay writes nothing twice).
  Keying by coordinate makes a task retried by Spark harmless. The records read go the
  same way, per topic partition: the scan emits blobs, so Spark's row count is not theirs.
- **Changes cross every boundary as Arrow IPC blobs** (``tidemark.spark.keyed``,
  ``BLOB_SCHEMA``): a pass emits one row per destination bucket of the next keyed stage
  (one row in all before the sink), typed by the node's columns, so Spark moves a few
  large rows per batch instead of one row per change.
- **Calc runs in Python on the changes of a pass that exists anyway** (the decode pass,
  or the keyed stage it follows, ``then=``). The stage object is the very one
  ``ReplayHost`` runs: one implementation of SQL semantics.
- Keyed stages (normalize, join, aggregate, materializer, merge engine) are hosted by
  ``tidemark.spark.keyed``; a keyed stage directly followed by another emits rows already
  split for it (``downstream=``), saving a pass. A join unions both inputs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from functools import reduce
from typing import TYPE_CHECKING, Any

from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change
from tidemark.engine.errors import PlanError, TidemarkError
from tidemark.engine.event_time import END_OF_INPUT
from tidemark.engine.fusion import FusedStage, filters_between, fused_pairs, output_key_columns
from tidemark.engine.pipeline import Pipeline
from tidemark.engine.stage import StatelessStage
from tidemark.engine.stages.materializer import SinkMaterializer
from tidemark.engine import batch_ipc
from tidemark.spark.keyed import (
    BLOB_SCHEMA,
    DEFAULT_STATE_BUCKETS,
    PerBatchAccumulator,
    SinkWriter,
    StageCrash,
    StageFailure,
    StageMetrics,
    Target,
    batch_id_of_task,
    blob_batch,
    blob_rows,
    joined,
    run_keyed_stage,
)
from tidemark.spark.delta import is_delta_join, run_delta_join
from tidemark.spark.source import (
    RAW_COLUMNS,
    SourceTable,
    client_options,
    DecodeFunction,
    decode_columnar,
    decode_records,
    decoded_stream,
    startup_options,
    without_end_rows,
)
from tidemark.spark.sink import DEAD_LETTER_COLUMNS as LETTER_COLUMNS
from tidemark.spark.watermark import check_supported as check_event_time
from tidemark.spark.watermark import observed, probe_of, tick_rows

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: a statement set's frame: which sink (its index in ``Pipeline.sinks``) a blob is for
SINK_COLUMN = "sink"

class GuardedStage:
    """A stateless stage whose errors cross the Python worker -> driver boundary as
    themselves (``StageFailure``), so a calc that cannot evaluate a row stops the job with
    the stage's own message and exit status instead of a Python worker stack trace."""

    def __init__(self, stage: StatelessStage):
        self.stage = stage
        self.name = stage.name

    def process(self, changes: list[Change]) -> list[Change]:
        return self._guarded(self.stage.process, changes)

    def process_batch(self, batch: ChangeBatch) -> ChangeBatch:
        """Whole columns when the stage has a columnar path, its changes otherwise."""
        if hasattr(self.stage, "process_batch"):
            return self._guarded(self.stage.process_batch, batch)
        return ChangeBatch.from_changes(self.process(batch.changes()))

    def _guarded(self, call: Callable[[Any], Any], arg: Any) -> Any:
        try:
            return call(arg)
        except TidemarkError as err:
            raise StageFailure(err) from None
        except Exception as err:
            raise StageFailure(
                StageCrash(f"stage '{self.name}' failed: {type(err).__name__}: {err}")
            ) from err


# ---------------------------------------------------------------------------- the passes

def decode_batch(
    records: list[dict[str, Any]], src: SourceTable, decoder: Any, batch_id: int
) -> tuple[list[Change], dict[tuple, dict[str, Any]]]:
    """Decode raw records of one source table with ``decoder`` (a per-record or a batch
    decoder): (changes, bad records by coordinate). Spark-free, so the routing is testable
    without a session. A change's position is ``(batch id, source index, partition,
    offset)``."""
    columns = {name: [r.get(name) for r in records] for name in RAW_COLUMNS}
    return split_decoded(decode_records(columns, {src.topic: src}, batch_id, {src.topic: decoder}))


def split_decoded(out: dict[str, list[Any]]) -> tuple[list[Change], dict[tuple, dict[str, Any]]]:
    """``decode_records`` output as (changes, dead letters by source coordinate)."""
    changes: list[Change] = []
    bad: dict[tuple, dict[str, Any]] = {}
    for i, error in enumerate(out["error_kind"]):
        if error is None:
            changes.append(Change(out["kind"][i], out["row"][i], tuple(out["pos"][i])))
        else:
            bad[(out["topic"][i], out["partition"][i], out["offset"][i])] = {name: out[name][i] for name in LETTER_COLUMNS}
    return changes, bad


def _fill_timestamps(bad: dict[tuple, dict[str, Any]], columns: dict[str, list[Any]], timestamps: Any) -> None:
    """Give each bad record the source timestamp of its raw record (``timestamps``: the
    batch's Arrow column, in ``columns`` order)."""
    for i, coord in enumerate(zip(columns["topic"], columns["partition"], columns["offset"])):
        letter = bad.get(coord)
        if letter is not None:
            letter["timestamp"] = timestamps[i].as_py()


def decode_function(
    src: SourceTable, stages: Sequence[StatelessStage], target: Target, dead_letters: PerBatchAccumulator,
    records_read: PerBatchAccumulator, schema: Any, buckets: int,
) -> DecodeFunction:
    """What the scan of one table runs on its raw records (``source.decoded_stream``): its
    changes (decoded a batch at a time where the format allows, bad records still one by
    one: ``decode_records``), through ``stages``, as ``BLOB_SCHEMA`` batches split by
    ``target``'s buckets (``schema``: the Arrow schema of what ``stages`` emit). Bad
    records go to ``dead_letters`` and the records of each topic partition are counted in
    ``records_read`` (the scan's own row count is of blobs). One row per bucket a task
    touched, and a watermark tick per bucket when ``target`` is an event-time stage
    (``tidemark.spark.watermark``)."""
    import pyarrow.compute as pc

    pre = list(stages)
    letters_acc, read_acc = dead_letters.accumulator, records_read.accumulator

    def fn(batches: Iterator[Any]) -> Iterator[Any]:
        batch_id = batch_id_of_task()
        decoders: dict[str, Any] = {}  # a batch decoder where the format has one
        bad: dict[tuple, dict[str, Any]] = {}
        read: Counter = Counter()
        parts: list[ChangeBatch] = []
        marks: dict[str, int] = {}  # the watermarks of this task's records (``watermark.observed``)
        for batch in batches:
            batch, ended = without_end_rows(batch)
            if ended:  # a bounded source's end (``tidemark.spark.source``)
                marks[src.table.name] = END_OF_INPUT
            for counted in pc.value_counts(batch.column("partition")).to_pylist():
                read[(src.topic, counted["values"])] += counted["counts"]
            decoded = decode_columnar(batch, src, batch_id, decoders)
            if decoded is None:  # a format decoded record by record
                # without the timestamp column: a tz-aware datetime per record cost more
                # than the decode; only a dead letter needs it (filled in below)
                columns = batch.drop_columns(["timestamp"]).to_pydict()
                columns["timestamp"] = [None] * batch.num_rows
                cs, b = split_decoded(decode_records(columns, {src.topic: src}, batch_id, decoders))
                part = ChangeBatch.from_changes(cs)
                if b:
                    _fill_timestamps(b, columns, batch.column("timestamp"))
            else:
                part, letters = decoded
                b = split_decoded(letters)[1]
            bad.update(b)
            parts.append(observed(pre, part, marks))
        if bad:
            letters_acc.add({batch_id: bad})
        if read:
            read_acc.add({batch_id: dict(read)})
        rows = blob_rows(joined(parts), schema, target, buckets) + tick_rows(marks, target, buckets)
        if rows:
            yield blob_batch(rows)

    return fn


# ---------------------------------------------------------------------------- the plan walk


class _Output:
    """A node's output, not built yet: ``build(target, pending, schema)`` makes the frame
    once the consumer is known, so each producer can fuse the consumer's calc and keying
    into a pass it runs anyway. ``schema``: the Arrow schema of the last node's columns
    (``batch_ipc.schema_of``), what the frame's blobs carry."""

    def __init__(self, build: Callable[..., DataFrame], pending: list[StatelessStage], schema: Any):
        self._build = build
        self.pending = pending
        self.schema = schema

    def then(self, stage: StatelessStage, schema: Any) -> _Output:
        return _Output(self._build, [*self.pending, stage], schema)

    def keyed_for(self, stage: Any, index: int) -> DataFrame:
        return self._build((stage, index), self.pending, self.schema)

    def changes(self) -> DataFrame:
        return self._build(None, self.pending, self.schema)

    def written(self, sink: SinkWriter) -> DataFrame:
        """The frame of the records ``sink`` wrote, the node's keyed stage writing its
        changes itself (``run_keyed_stage``'s ``sink``); only a keyed node's output takes it."""
        return self._build(None, self.pending, self.schema, sink=sink)


def union_output(upstream: list[_Output], schema: Any) -> _Output:
    """A union stage (``UNION ALL``): no pass of its own. Each branch builds its frame for
    the union's consumer, running the calcs after the union in its own pass (they are row
    by row, so a calc over the union is the calc over each branch), with the blobs typed
    and named as the union's output, and the frames are unioned by name."""

    def build(target: Target, pending: list[StatelessStage], out_schema: Any) -> DataFrame:
        frames = []
        for out in upstream:
            branch = _Output(out._build, [*out.pending, *pending], out_schema)
            frames.append(branch.changes() if target is None else branch.keyed_for(*target))
        return reduce(lambda a, b: a.unionByName(b), frames)

    return _Output(build, [], schema)


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
    """A keyed stage (``KeyedStage``: it says which key a change belongs to)."""
    return stage is not None and hasattr(stage, "key_of")


def _fused_output(pipeline: Pipeline, node: Any, fed_by: tuple[int, int], firsts: dict[int, list[_Output]],
                  outputs: dict[int, _Output], metrics: StageMetrics | None, buckets: int, schema: Any) -> _Output:
    """The output of keyed ``node`` run in one operator with the keyed stage that feeds it
    (``fed_by``: that stage's node id and the input it feeds, ``tidemark.engine.fusion``):
    the operator reads that stage's inputs, then ``node``'s other inputs, each keyed for
    the member it goes to."""
    first_id, fed = fed_by
    first = pipeline.node(first_id)
    between = tuple(GuardedStage(pipeline.node(i).stage) for i in filters_between(pipeline, first_id, node.id, fed))
    stage = FusedStage(first.stage, node.stage, fed, between)
    upstream = [*firsts[first.id], *(outputs[i] for k, i in enumerate(node.inputs) if k != fed)]
    fed_schema = batch_ipc.schema_of(first.columns, first.types)

    def build(target: Target, pending: list, out_schema: Any, sink: SinkWriter | None = None) -> DataFrame:
        inputs = [out.keyed_for(stage, i) for i, out in enumerate(upstream)]
        return run_keyed_stage(inputs, stage, metrics, downstream=target, then=pending, buckets=buckets,
                               schema=out_schema, fed_schema=fed_schema, sink=sink)

    return _Output(build, [], schema)


def keyed_by_sink_pk(pipeline: Pipeline, sink_node_id: int) -> bool:
    """Whether the query frame's rows for this sink hold every change of one sink PK in one
    Spark partition: the sink reads a keyed stage directly, run by its own operator, whose
    key is the sink's PK where the stage emits it (a materializer, a merge engine, an
    aggregate grouped by the PK). Each partition of that operator emits only the buckets
    it owns, and a bucket holds all changes of its keys, so the sink needs no shuffle of
    its own (``UpsertSink.write_batch``'s ``keyed``)."""
    sink = pipeline.nodes[sink_node_id]
    up = pipeline.nodes[sink.inputs[0]]
    if not _is_keyed(up.stage) or is_delta_join(up.stage):
        return False
    table = pipeline.tables[sink.table]
    return output_key_columns(up.stage) == tuple(table.pk_indexes)


def refuses_conflicts(pipeline: Pipeline, sink_node_id: int) -> bool:
    """Whether a stage feeding this sink fails the batch on a conflict (``ON CONFLICT DO
    ERROR``). Such a sink is produced only after every task of the batch's keyed stages has
    passed: a sink produced inside the keyed stage would keep what one task wrote while
    another task's conflict stops the job at that batch."""
    stages = (pipeline.nodes[n].stage for n in pipeline.upstream(sink_node_id))
    return any(isinstance(s, SinkMaterializer) and s.strategy == "ERROR" for s in stages)


def build_query_frame(
    spark: SparkSession,
    pipeline: Pipeline,
    bootstrap: str,
    *,
    dead_letters: PerBatchAccumulator,
    records_read: PerBatchAccumulator,
    metrics: StageMetrics | None = None,
    max_records_per_trigger: int | None = None,
    registry_url: str | None = None,
    source_options: dict[str, str] | None = None,
    index: Any = None,
    state_buckets: int = DEFAULT_STATE_BUCKETS,
    writers: dict[str, SinkWriter] | None = None,
) -> DataFrame:
    """The streaming frame of the changes the sink receives (``BLOB_SCHEMA``; a statement
    set's sinks' frames in one, each blob tagged with its sink in ``SINK_COLUMN``); bad
    records go to ``dead_letters`` and each batch's records read, per topic partition, to
    ``records_read`` (Spark's ``numInputRows`` counts the scans' blobs, and a source with
    several consumers is scanned once per consumer). ``max_records_per_trigger`` caps each
    source table's records per micro-batch. ``index``
    (``tidemark.spark.delta.IndexTarget``): delta joins run stateless against that index
    service (``tidemark.spark.delta``). ``writers``: per sink table, what writes its changes
    inside the keyed stage that feeds it (only for a sink ``keyed_by_sink_pk``, outside a
    statement set); that sink's frame is then of ``WRITTEN_SCHEMA`` rows."""
    check_event_time(pipeline)
    if writers and pipeline.statement_set:
        raise ValueError("a statement set's sinks share one frame of blobs: none is written inside its stage")
    tables = {t.table.name: t for t in source_tables(pipeline, registry_url)}
    fused = fused_pairs(pipeline)
    fed_by = {second: (first, index) for first, (second, index) in fused.items()}
    # the filters inside a fused operator (between its members): no pass of their own
    inside = {i for first, (second, index) in fused.items() for i in filters_between(pipeline, first, second, index)}
    # a fused pair's first stage: its upstream outputs, taken by its consumer's operator
    firsts: dict[int, list[_Output]] = {}
    outputs: dict[int, _Output] = {}
    sinks: dict[str, DataFrame] = {}
    for node in pipeline.nodes:
        schema = batch_ipc.schema_of(node.columns, node.types)
        if node.kind == "source":
            src = tables[node.table]
            options = {**client_options(src.table), **startup_options(src.table), **(source_options or {})}

            def build_source(target: Target, pending: list, out_schema: Any, src: SourceTable = src,
                             options: dict[str, str] = options) -> DataFrame:
                decode = decode_function(src, pending, target, dead_letters, records_read, out_schema, state_buckets)
                return decoded_stream(spark, [src.topic], bootstrap, decode, BLOB_SCHEMA,
                                      max_records_per_trigger=max_records_per_trigger, **options)

            outputs[node.id] = _Output(build_source, [], schema)
        elif node.kind == "sink":
            upstream_output, writer = outputs[node.inputs[0]], (writers or {}).get(node.table)
            sinks[node.table] = upstream_output.written(writer) if writer else upstream_output.changes()
        elif node.id in fused:
            firsts[node.id] = [outputs[i] for i in node.inputs]
        elif node.id in inside:
            continue
        elif node.id in fed_by:
            outputs[node.id] = _fused_output(pipeline, node, fed_by[node.id], firsts, outputs, metrics, state_buckets,
                                             schema)
        elif _is_keyed(node.stage):
            stage = node.stage
            upstream = [outputs[i] for i in node.inputs]

            def build_keyed(target: Target, pending: list, out_schema: Any, sink: SinkWriter | None = None,
                            stage: Any = stage, upstream: list = upstream) -> DataFrame:
                inputs = [out.keyed_for(stage, i) for i, out in enumerate(upstream)]
                if index is not None and is_delta_join(stage):
                    return run_delta_join(inputs, stage, index, metrics, downstream=target, after=pending,
                                          schema=out_schema, buckets=state_buckets)
                # a calc after the stage runs in the stage's own pass (``then``)
                return run_keyed_stage(inputs, stage, metrics, downstream=target, then=pending,
                                       buckets=state_buckets, schema=out_schema, sink=sink)

            outputs[node.id] = _Output(build_keyed, [], schema)
        elif hasattr(node.stage, "process_inputs"):
            outputs[node.id] = union_output([outputs[i] for i in node.inputs], schema)
        elif node.stage is not None:
            outputs[node.id] = outputs[node.inputs[0]].then(GuardedStage(node.stage), schema)
        else:
            raise PlanError(f"stage [{node.id}] {node.kind} has nothing the Spark job can run")
        if "event_time" in node.detail:  # its rows move the source's watermark
            outputs[node.id] = outputs[node.id].then(probe_of(pipeline, node), schema)
    if not pipeline.statement_set:
        return sinks[pipeline.sink.name]
    from pyspark.sql import functions as F

    tagged = [sinks[t.table.name].withColumn(SINK_COLUMN, F.lit(i)) for i, t in enumerate(pipeline.sinks)]
    return reduce(lambda a, b: a.unionByName(b), tagged)
