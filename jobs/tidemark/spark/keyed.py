"""Host any ``KeyedStage`` as a keyed stateful operator of a Spark streaming query.

Stages know nothing of Spark; this module is the only place that translates. Between
passes and stages, changes travel as rows of ``BLOB_SCHEMA``: ``bucket``, ``input`` and
``batch``, one Arrow IPC stream of a ``ChangeBatch`` (``tidemark.engine.batch_ipc``: the
node's typed columns, kind, weight and source position) per task and destination state
bucket. A Spark row per change made Spark's per-row and per-group costs (the pandas bridge
rebuilding each group row by row, a pickled tuple per change unpickled and pickled again
at every stage) the largest cost of a pipeline; a row per bucket pays them once per
bucket, and the receiver gets typed columns it can hand to a batch kernel as they are.

The pass that produces changes for a keyed stage (the decode pass, a previous keyed stage
with ``downstream=``, ``keyed_input``) computes the bucket of every change over the key
columns of the whole batch (``tidemark.engine.bucketing``: equal keys to one bucket whatever
types carry them) and emits one blob per bucket it touched. A 2-input stage (a join) unions both inputs and groups by
bucket, so one call sees both sides of every key of the bucket.

State lives in buckets: one binary value state per bucket (``tidemark.engine.state_codec``
writes it), so a batch makes a constant number of state operations per *bucket* (one
read, at most one write or remove), never one per key or row: pyspark's
``transformWithState`` pays a blocking socket round trip to the JVM per state call and per
grouping key. The price is that a touched bucket is read and rewritten whole, so a bucket
should stay small next to a batch: keys / buckets states. The bucket count is part of the
checkpoint (a key must find its bucket again after a restart), and every keyed stage of a
query uses the same count. Stages run through the one driver loop
(``tidemark.engine.driver.batch_stage``): a batch kernel as it is, any other stage per key
behind its per-key adapter. The operator is ``transformWithStateInPandas`` (Spark 4.0+):
the only kind that can be chained (Spark rejects two ``applyInPandasWithState`` in one
query, and a pipeline has several keyed stages); its processor is
``tidemark.spark.tws_processor``. ``operator="applyInPandasWithState"``
stays available for a query with a single keyed stage and for the benchmark. Stages with
``wakeup_ms`` get one processing-time timer per bucket, at the earliest wakeup of its keys.
Event-time stages (a window aggregate) keep the watermark in each bucket and get a tick
per batch to every bucket (``tidemark.spark.watermark``, ``tidemark.spark.event_clock``).

Errors: a ``TidemarkError`` raised by a stage (e.g. ``ConflictError``) crosses the Python
worker -> JVM -> driver boundary only as text. ``StageFailure`` wraps it with a marker
holding the pickled error, and ``stage_error_from`` / ``await_stage_query`` turn the
driver-side ``StreamingQueryException`` back into the original error (same class, same
message, same exit status). Any other exception is reported as a ``StageCrash`` naming the
stage and key.

Metrics: ``ctx.metrics`` counters of every key and batch are summed into a Spark
accumulator (``StageMetrics``) that the driver reads; only tasks that succeed count.
"""

from __future__ import annotations

import base64
import pickle
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from tidemark.engine import batch_columns, batch_ipc, bucketing, state_codec
from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change
from tidemark.engine.driver import PerKeyAdapter, batch_stage
from tidemark.engine.errors import TidemarkError
from tidemark.engine.fusion import FusedStage
from tidemark.engine.stage import BatchContext, KeyedStage, StatelessStage, uses_timers
from tidemark.spark.event_clock import Watermarks, watermark_sources
from tidemark.spark.partitioning import grouping_values
from tidemark.spark.tws_processor import STATE_SCHEMA, stage_processor

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

#: one row per task, destination bucket and stage input: an Arrow IPC ``ChangeBatch``
BLOB_SCHEMA = "bucket int, input int, batch binary"
BLOB_COLUMNS = ("bucket", "input", "batch")
#: Spark sets this local property on every task of a micro-batch.
BATCH_ID_PROPERTY = "streaming.sql.batchId"
OPERATORS = ("applyInPandasWithState", "transformWithStateInPandas")
DEFAULT_OPERATOR = "transformWithStateInPandas"
#: state buckets per keyed stage (see the module docstring); fixed for a checkpoint's life.
#: Each bucket costs JVM round trips and a kernel call's fixed cost every batch that touches
#: it, whatever its size, so a few large buckets beat many small ones on the batches a
#: sustained job takes: one per shuffle partition of the embedded session (docs/benchmarks.md,
#: "Fewer, larger state buckets" and "One state bucket per shuffle partition")
DEFAULT_STATE_BUCKETS = 2
#: the keyed stage's input columns
_GROUPED_COLUMNS = (*BLOB_COLUMNS, "now_ms")

_PICKLE_PROTOCOL = pickle.HIGHEST_PROTOCOL

#: (stage, input index) changes are keyed for; None: no keyed stage follows (the sink)
Target = tuple[Any, int] | None
#: the one column of a keyed stage that writes its sink itself: records written per call
WRITTEN_COLUMN = "n"
WRITTEN_SCHEMA = f"{WRITTEN_COLUMN} bigint"


class SinkWriter(Protocol):
    """Writes a batch of a sink's changes from inside the keyed stage that emits them
    (``tidemark.spark.sink.UpsertProducer``); returns the records written."""

    def write(self, batch: ChangeBatch) -> int: ...


# ---------------------------------------------------------------------------- transport


def blob_rows(
    changes: ChangeBatch | list[Change], schema: Any, target: Target, buckets: int
) -> list[tuple[int, int, bytes]]:
    """``changes`` as ``BLOB_SCHEMA`` rows: one per bucket of ``target`` they touch, under
    the bucket's grouping value (``tidemark.spark.partitioning``); one row, bucket 0,
    without a target. ``schema``: the node's Arrow schema, or None.

    A columnar batch is encoded as its table stands (typed by ``schema`` when its values
    fit), never through ``Change`` tuples, and split by the buckets its key columns give
    (``tidemark.engine.bucketing``); only a stage whose key is computed has ``key_of``
    called per change."""
    batch = changes if isinstance(changes, ChangeBatch) else ChangeBatch.from_changes(changes)
    if len(batch) == 0:
        return []
    table = batch_ipc.typed_table(batch, schema)
    if target is None:
        return [(0, 0, batch_ipc.encode(table))]
    stage, index = target
    columns = bucketing.key_columns(stage, index)
    if columns is not None:
        ids = bucketing.buckets_of_table(table, columns, buckets)
    else:
        ids = bucketing.buckets_of_rows(batch_columns.rows_of(table), stage, index, buckets)
    values = grouping_values(buckets)
    return [(int(values[b]), index, batch_ipc.encode(t)) for b, t in batch_ipc.split(table, ids).items()]


def run_stateless(stages: Sequence[Any], batch: ChangeBatch) -> ChangeBatch:
    """``batch`` through the stateless ``stages`` fused into a pass, in order: whole
    columns through ``process_batch`` while the batch is columnar and the stage has it,
    else ``Change`` tuples through ``process`` (a batch built from changes stays on the
    row path: its columns would only be inferred from the values)."""
    for st in stages:
        if batch.is_columnar:
            if batch.table().num_rows == 0:
                break
            if hasattr(st, "process_batch"):
                batch = st.process_batch(batch)
                continue
        cs = batch.changes()
        if not cs:
            break
        batch = ChangeBatch.from_changes(st.process(cs))
    return batch


def joined(parts: Sequence[ChangeBatch]) -> ChangeBatch:
    """Batches of one node as one, in order: columns concatenated when every part is
    columnar, else their changes."""
    if parts and all(p.is_columnar for p in parts):
        import pyarrow as pa

        tables = [p.table() for p in parts if p.table().num_rows]
        if not tables:
            return parts[0]
        return ChangeBatch.from_table(pa.concat_tables(tables, promote_options="permissive"))
    return ChangeBatch.from_changes([c for p in parts for c in p.changes()])


def blob_batch(rows: Sequence[tuple[int, int, bytes]]) -> Any:
    """``BLOB_SCHEMA`` rows as the Arrow record batch a ``mapInArrow`` function yields."""
    import pyarrow as pa

    bucket, inp, batch = (list(c) for c in zip(*rows)) if rows else ([], [], [])
    return pa.RecordBatch.from_arrays(
        [pa.array(bucket, pa.int32()), pa.array(inp, pa.int32()), pa.array(batch, pa.binary())],
        names=list(BLOB_COLUMNS),
    )


def blobs_by_input(pairs: Iterable[tuple[int, bytes]], n_inputs: int) -> list[list[bytes]]:
    """``(input, blob)`` pairs of ``BLOB_SCHEMA`` rows as each input's blobs, in order."""
    out: list[list[bytes]] = [[] for _ in range(n_inputs)]
    for inp, blob in pairs:
        out[inp].append(bytes(blob))
    return out


def arrow_pairs(batches: Iterable[Any]) -> Iterator[tuple[int, bytes]]:
    """The ``(input, blob)`` pairs of Arrow batches of ``BLOB_SCHEMA`` rows."""
    for b in batches:
        yield from zip(b.column("input").to_pylist(), b.column("batch").to_pylist())


def pandas_pairs(frames: Iterable[pd.DataFrame]) -> Iterator[tuple[int, bytes]]:
    for pdf in frames:
        yield from zip(pdf["input"].tolist(), pdf["batch"].tolist())


def changes_of_blobs(blobs: Sequence[bytes]) -> list[Change]:
    """The changes of one node's blobs, in order."""
    return batch_ipc.decode_batch(blobs).changes() if blobs else []

# ---------------------------------------------------------------------------- errors

_MARKER = re.compile(r"\[tidemark-stage-error ([A-Za-z0-9+/=]+)\]")


class StageCrash(TidemarkError):
    """A stage raised something that is not a TidemarkError: a bug, reported with where."""

    exit_status = 1


class StageFailure(Exception):
    """Raised inside the Python worker; its text carries the original error pickled so the
    driver can rebuild it from a StreamingQueryException's message."""

    def __init__(self, error: TidemarkError):
        payload = pickle.dumps((type(error), str(error), dict(vars(error))), _PICKLE_PROTOCOL)
        marker = base64.b64encode(payload).decode()
        super().__init__(f"{type(error).__name__}: {error} [tidemark-stage-error {marker}]")


def _rebuild(payload: str) -> TidemarkError | None:
    try:
        cls, message, attrs = pickle.loads(base64.b64decode(payload))
    except Exception:  # a truncated or foreign marker: fall back to the raw message
        return None
    if not (isinstance(cls, type) and issubclass(cls, TidemarkError)):
        return None
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(attrs)
    return error


def stage_error_from(exc: BaseException) -> TidemarkError | None:
    """The stage error hidden in a Spark exception (StreamingQueryException,
    PythonException, Py4JJavaError...), or None when the failure was not a stage's."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        texts = [str(current)]
        for attr in ("desc", "_desc", "stackTrace", "_stackTrace"):
            value = getattr(current, attr, None)
            if isinstance(value, str):
                texts.append(value)
        for text in texts:
            match = _MARKER.search(text)
            if match:
                rebuilt = _rebuild(match.group(1))
                if rebuilt is not None:
                    return rebuilt
        todo.extend([current.__cause__, current.__context__])
    return None


def await_stage_query(query: StreamingQuery, timeout_s: float | None = None) -> bool:
    """``query.awaitTermination`` that re-raises a stage's own error (with its message and
    exit status) instead of Spark's wrapper. Returns what awaitTermination returns."""
    try:
        if timeout_s is None:
            query.awaitTermination()
            return True
        return bool(query.awaitTermination(timeout_s))
    except Exception as exc:
        error = stage_error_from(exc)
        if error is not None:
            raise error from None
        raise


def process_all_available(query: StreamingQuery) -> None:
    """``query.processAllAvailable`` with stage errors re-raised as themselves."""
    try:
        query.processAllAvailable()
    except Exception as exc:
        error = stage_error_from(exc)
        if error is not None:
            raise error from None
        raise


# ---------------------------------------------------------------------------- metrics


class StageMetrics:
    """Sums ``ctx.metrics`` of every key and batch of the stages that share it.

    Backed by a Spark accumulator: workers add the counters of a task, the driver reads the
    running total. Counters are prefixed with the stage name (``materializer.conflicts``)
    so one instance can serve a whole job. Counts are process-lifetime: a restarted job
    starts from zero (as Prometheus counters do), and a replayed batch counts again.
    ``sizes`` holds what a batch's tasks stored per bucket instead, which a replay does not
    count twice.
    """

    def __init__(self, spark: SparkSession):
        from pyspark.accumulators import AccumulatorParam

        class _CounterParam(AccumulatorParam):
            def zero(self, value: Counter) -> Counter:
                return Counter()

            def addInPlace(self, value1: Counter, value2: Counter) -> Counter:
                value1.update(value2)
                return value1

        self._acc = spark.sparkContext.accumulator(Counter(), _CounterParam())
        #: per batch, (stage, bucket) -> the bucket's stored bytes (``tidemark.spark.state_bytes``)
        self.sizes = PerBatchAccumulator(spark)

    @property
    def accumulator(self) -> Any:
        return self._acc

    def value(self) -> Counter:
        return Counter(self._acc.value)


class PerBatchAccumulator:
    """Values per batch id and key: a dead letter per source coordinate, the records read
    per topic partition, the stored bytes per state bucket.

    Workers add ``{batch_id: {key: value}}``; Spark merges the updates of successful tasks
    into the driver's value. A task that runs again (Spark's retry, or a frame read twice)
    adds the same keys with the same values, which the dict absorbs, so nothing counts
    twice. ``take(batch_id)`` returns and forgets one batch's values by key."""

    def __init__(self, spark: SparkSession):
        from pyspark.accumulators import AccumulatorParam

        class _Param(AccumulatorParam):
            def zero(self, value: dict) -> dict:
                return {}

            def addInPlace(self, value1: dict, value2: dict) -> dict:
                for batch, found in value2.items():
                    value1.setdefault(batch, {}).update(found)
                return value1

        self._acc = spark.sparkContext.accumulator({}, _Param())

    @property
    def accumulator(self) -> Any:
        return self._acc

    def take(self, batch_id: int) -> dict[Any, Any]:
        value = self._acc.value
        found = value.pop(batch_id, {})
        self._acc.value = value
        return found


def batch_id_of_task() -> int:
    """The micro-batch a task runs for (-1 outside a streaming query)."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    value = tc.getLocalProperty(BATCH_ID_PROPERTY) if tc is not None else None
    return int(value) if value is not None else -1


def _crash(stage_name: str, where: str, err: Exception) -> StageFailure:
    return StageFailure(StageCrash(f"stage '{stage_name}' failed on {where}: {type(err).__name__}: {err}"))


class _SparkKeyAdapter(PerKeyAdapter):
    """The driver's per-key adapter, with a failing key reported across the worker -> JVM
    -> driver boundary (``StageFailure``): a stage's own error as itself, anything else as
    a ``StageCrash`` naming the stage and the key."""

    def call_key(self, key: tuple, inputs: list[list[Change]], state: Any, ctx: BatchContext) -> tuple[Any, list[Change]]:
        try:
            return self.stage.process_key(key, inputs, state, ctx)
        except TidemarkError as err:
            raise StageFailure(err) from None
        except Exception as err:
            raise _crash(self.stage.name, f"key {key!r}", err) from err


class _SparkKernel:
    """A batch kernel (``driver.batch_stage``) with its errors reported as the per-key
    adapter reports them, naming the bucket instead of a key."""

    def __init__(self, kernel: Any, name: str):
        self.kernel = kernel
        self.name = name

    def process_batch(self, inputs: Sequence[ChangeBatch], state: Any, ctx: BatchContext) -> tuple[Any, ChangeBatch]:
        try:
            return self.kernel.process_batch(inputs, state, ctx)
        except StageFailure:
            raise
        except TidemarkError as err:
            raise StageFailure(err) from None
        except Exception as err:
            raise _crash(self.name, f"a bucket of batch {ctx.batch_id}", err) from err


def _driven(stage: KeyedStage) -> Any:
    target = batch_stage(stage)
    if isinstance(target, PerKeyAdapter):
        return _SparkKeyAdapter(stage)
    return _SparkKernel(target, stage.name)


class _BucketRunner:
    """One stage call for one state bucket: decode the bucket's blobs into one
    ``ChangeBatch`` per input, read its state once, run the stage through the one driver
    loop (``tidemark.engine.driver``), write the state at most once, and split what it
    emits by the downstream stage's bucket. Shared by both Spark operators so they differ
    only in how state and rows reach Python.

    A ``FusedStage`` (``tidemark.engine.fusion``) runs its members one after the other,
    each with its own stored state, the first one's output typed as its node's columns
    (``fed_schema``) exactly as the blobs between two operators would carry it, then
    through the filters between the two.

    The stored values are written by ``tidemark.engine.state_codec``.
    """

    def __init__(
        self,
        stage: KeyedStage | FusedStage,
        metrics: StageMetrics | None,
        downstream: Target,
        then: Sequence[StatelessStage] = (),
        schema: Any = None,
        buckets: int = DEFAULT_STATE_BUCKETS,
        fed_schema: Any = None,
        sink: SinkWriter | None = None,
    ):
        self.stage = stage
        self.members: tuple[KeyedStage, ...] = stage.members if isinstance(stage, FusedStage) else (stage,)
        self.driven = [_driven(m) for m in self.members]
        self.accumulator = metrics.accumulator if metrics is not None else None
        self.sizes = metrics.sizes.accumulator if metrics is not None else None
        self.downstream = downstream
        self.then = list(then)
        self.schema = schema
        self.buckets = buckets
        self.fed_schema = fed_schema
        self.sink = sink
        self.columns = (WRITTEN_COLUMN,) if sink is not None else BLOB_COLUMNS

    def run(self, blobs: list[list[bytes]], stored: Sequence[bytes | None], now_ms: int,
            watermarks: Watermarks | None = None) -> _Result:
        """``blobs``: the bucket's blobs per stage input (none for a timer call);
        ``stored``: each member's stored state; ``watermarks``: the batch's before and
        after its records (event-time stages)."""
        inputs = [batch_ipc.decode_batch(bs) if bs else ChangeBatch.from_changes([]) for bs in blobs]
        try:  # a state in another format is reported as itself (StateFormatError)
            states = [state_codec.decode_state(m, s) for m, s in zip(self.members, stored)]
        except TidemarkError as err:
            raise StageFailure(err) from None
        old_wakeup = _next_wakeup(self.driven[0], states[0])
        batch_id = batch_id_of_task()
        out: ChangeBatch | None = None
        for k, (member, driven) in enumerate(zip(self.members, self.driven)):
            ctx = BatchContext(batch_id=batch_id, now_ms=now_ms)
            if watermarks is not None:
                ctx.previous_watermarks, ctx.watermarks = watermarks
            if k:  # what the member before emitted, through the filters between the two
                out = run_stateless(self.stage.between, out)
            own = inputs if len(self.members) == 1 else self.stage.member_inputs(k, inputs, out)
            states[k], out = driven.process_batch(own, states[k], ctx)
            if ctx.metrics and self.accumulator is not None:
                self.accumulator.add(Counter({f"{member.name}.{n}": v for n, v in ctx.metrics.items()}))
            if k < len(self.members) - 1 and len(out):
                out = ChangeBatch.from_table(batch_ipc.typed_table(out, self.fed_schema))
        emitted = run_stateless(self.then, out)  # stateless stages fused into this pass (see run_keyed_stage)
        new_stored = [state_codec.encode_state(m, st) for m, st in zip(self.members, states)]
        if self.sink is not None:  # typed as the blobs to a sink of its own would carry them
            typed = ChangeBatch.from_table(batch_ipc.typed_table(emitted, self.schema)) if len(emitted) else emitted
            rows: list[tuple] = [(self.sink.write(typed),)]
        else:
            rows = blob_rows(emitted, self.schema, self.downstream, self.buckets)
        return _Result(new_stored, rows, old_wakeup, _next_wakeup(self.driven[0], states[0]))

    def report_stored(self, bucket: tuple, stored: Sequence[bytes | None]) -> None:
        """Each member's stored bytes in ``bucket`` after this call (``tidemark.spark.state_bytes``)."""
        if self.sizes is not None:
            self.sizes.add({batch_id_of_task(): {(m.name, int(bucket[0])): len(s) if s is not None else 0
                                          for m, s in zip(self.members, stored)}})


def _next_wakeup(driven: Any, state: Any) -> int | None:
    """The bucket's timer: ``Bucket.next_wakeup``, or a batch kernel's ``next_wakeup(state)``
    for a typed state (none when the kernel has no timers)."""
    of_kernel = getattr(getattr(driven, "kernel", None), "next_wakeup", None)
    if of_kernel is not None:
        return of_kernel(state)
    wakeup = getattr(state, "next_wakeup", None)
    return wakeup() if wakeup is not None else None


class _Result(NamedTuple):
    stored: list[bytes | None]  # per member stage; None: remove the bucket's state
    rows: list[tuple]  # output rows: BLOB_SCHEMA's columns, or the records a sink wrote
    old_wakeup: int | None  # the bucket's timer for the state read (``Bucket.next_wakeup``)
    new_wakeup: int | None  # the timer the new state needs


def frame(rows: list[tuple], columns: Sequence[str] = BLOB_COLUMNS) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame.from_records(rows, columns=list(columns))


def _pandas_state_fn(runner: _BucketRunner):
    """The applyInPandasWithState function: state arrives with the group (no round trip)."""

    def fn(_bucket: tuple, pdfs: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        old = state.get[0] if state.exists else None
        res = runner.run(blobs_by_input(pandas_pairs(pdfs), runner.stage.n_inputs), [old], state.getCurrentProcessingTimeMs())
        stored = res.stored[0]
        if stored is None:
            if old is not None:
                state.remove()
        elif stored != old:
            state.update((stored,))
        runner.report_stored(_bucket, res.stored)
        if res.rows:
            yield frame(res.rows, runner.columns)

    return fn


# ---------------------------------------------------------------------------- public API


def keyed_input(
    blobs: DataFrame,
    stage: KeyedStage,
    input_index: int = 0,
    before: Sequence[StatelessStage] = (),
    buckets: int = DEFAULT_STATE_BUCKETS,
    schema: Any = None,
) -> DataFrame:
    """Split ``BLOB_SCHEMA`` rows by ``stage``'s buckets (``buckets``: the count
    ``run_keyed_stage`` gets), running the stateless stages ``before`` first in the same
    Python pass; ``schema``: the Arrow schema of what ``before`` emits."""
    if not 0 <= input_index < stage.n_inputs:
        raise ValueError(
            f"stage '{stage.name}' has {stage.n_inputs} input(s); no input {input_index}"
        )
    pre = list(before)
    target = (stage, input_index)

    def fn(batches: Iterator[Any]) -> Iterator[Any]:
        blobs = [blob for _, blob in arrow_pairs(batches)]
        batch = batch_ipc.decode_batch(blobs) if blobs else ChangeBatch.from_changes([])
        rows = blob_rows(run_stateless(pre, batch), schema, target, buckets)
        if rows:
            yield blob_batch(rows)

    return blobs.select(*BLOB_COLUMNS).mapInArrow(fn, BLOB_SCHEMA)


def has_timers(stage: KeyedStage) -> bool:
    """Whether ``stage`` asks to be woken without records (``wakeup_ms``, ``uses_timers``)."""
    return uses_timers(stage)


def run_keyed_stage(
    inputs: Sequence[DataFrame],
    stage: KeyedStage | FusedStage,
    metrics: StageMetrics | None = None,
    downstream: Target = None,
    operator: str = DEFAULT_OPERATOR,
    then: Sequence[StatelessStage] = (),
    buckets: int = DEFAULT_STATE_BUCKETS,
    schema: Any = None,
    fed_schema: Any = None,
    sink: SinkWriter | None = None,
) -> DataFrame:
    """Apply ``stage`` to streaming inputs of ``BLOB_SCHEMA`` rows split by its buckets
    (one DataFrame per stage input, from ``keyed_input`` or a previous stage's
    ``downstream`` output) and return the changes it emits per batch, Append mode, as
    ``BLOB_SCHEMA`` rows: with ``downstream=(next_stage, input_index)`` split by
    ``next_stage``'s buckets (saves a Python pass), else one row per bucket that emitted.
    ``schema``: the Arrow schema of what is emitted (after ``then``), None to infer it.

    ``then``: stateless stages (calc) run on what the stage emits, in the same pass, before
    the output is encoded or split: a calc between two keyed stages (or before the sink)
    would otherwise cost a ``mapInArrow`` pass of its own.

    ``buckets``: the state buckets of this stage and of ``downstream`` (module docstring);
    a restart from a checkpoint must use the count it was created with.

    A ``FusedStage`` (two keyed stages on one key, ``tidemark.engine.fusion``) runs as one
    operator; ``fed_schema`` is the Arrow schema of its first member's output.

    ``sink``: the stage feeds a sink keyed as it is (``tidemark.spark.query.keyed_by_sink_pk``)
    and writes it in its own pass: the frame's rows are then ``WRITTEN_SCHEMA`` (records
    written per bucket call), and no Python operator follows the stage's in its Spark
    stage, so a task holds one Python worker instead of two.

    A stage with ``wakeup_ms`` gets processing-time timers. Spark then runs a (no-data)
    micro-batch at every trigger so timers can fire: such a query never looks idle to
    ``processAllAvailable``; watch source offsets instead.
    """
    from pyspark.sql import functions as F

    if len(inputs) != stage.n_inputs:
        raise ValueError(
            f"stage '{stage.name}' takes {stage.n_inputs} input(s), got {len(inputs)}"
        )
    if operator not in OPERATORS:
        raise ValueError(f"unknown operator {operator!r}; choose one of {', '.join(OPERATORS)}")
    timers = has_timers(stage)
    if (timers or watermark_sources(stage)) and operator != "transformWithStateInPandas":
        raise ValueError(
            f"stage '{stage.name}' has timers (wakeup_ms) or event time: only transformWithStateInPandas hosts it"
        )
    if buckets < 1:
        raise ValueError(f"state buckets must be >= 1, got {buckets}")
    if sink is not None and downstream is not None:
        raise ValueError(f"stage '{stage.name}' writes its sink itself: it has no downstream stage")
    df = inputs[0].select(*BLOB_COLUMNS)
    for other in inputs[1:]:
        df = df.unionByName(other.select(*BLOB_COLUMNS))
    runner = _BucketRunner(stage, metrics, downstream, then, schema, buckets,
                           fed_schema, sink)
    output = WRITTEN_SCHEMA if sink is not None else BLOB_SCHEMA
    if operator == "applyInPandasWithState":
        if len(runner.members) > 1:
            raise ValueError(f"stage '{stage.name}' is fused: only transformWithStateInPandas hosts it")
        from pyspark.sql.streaming.state import GroupStateTimeout

        return df.groupBy("bucket").applyInPandasWithState(
            _pandas_state_fn(runner),
            outputStructType=output,
            stateStructType=STATE_SCHEMA,
            outputMode="append",
            timeoutConf=GroupStateTimeout.NoTimeout,
        )
    # current_timestamp() is the batch's timestamp in a streaming query, recorded in the
    # offset log: a replayed batch sees the same now_ms.
    df = df.withColumn("now_ms", F.unix_millis(F.current_timestamp()))
    grouped = df.select(*_GROUPED_COLUMNS).groupBy("bucket")
    return grouped.transformWithStateInPandas(
        stage_processor(runner, timers),
        outputStructType=output,
        outputMode="Append",
        # "ProcessingTime" makes Spark run a no-data batch at every trigger forever (so
        # timers can fire): only stages with timers pay for it. Without it the batch time
        # comes from the now_ms column.
        timeMode="ProcessingTime" if timers else "None",
    )


def changes_from_rows(rows: Iterable[Any]) -> list[Change]:
    """The changes of collected ``BLOB_SCHEMA`` rows (pyspark Rows or tuples), row by row."""
    return [c for r in rows for c in changes_of_blobs([bytes(r["batch"])])]


def encode_changes(changes: list[Change], schema: Any = None) -> bytes | None:
    """Changes as one blob (a ``BLOB_SCHEMA`` row's ``batch``; for test sources), None
    for no changes."""
    rows = blob_rows(changes, schema, None, 1)
    return rows[0][2] if rows else None

# ---------------------------------------------------------------------------- state size


def state_operators(progress: dict | None) -> list[dict]:
    """The ``stateOperators`` entries of a ``query.lastProgress`` (plan order: the
    operator nearest the sink first), each with ``operatorName``, ``numRowsTotal``,
    ``numRowsUpdated``, ``numRowsRemoved`` and ``customMetrics``."""
    if not progress:
        return []
    return list(progress.get("stateOperators") or [])


def state_rows_total(query: StreamingQuery, operator_index: int | None = None) -> int:
    """Rows in the state store after the last batch: of one stateful operator (index in
    ``state_operators`` order) or summed over all. One row is one state bucket's value
    (``bucketing.bucket_of_key`` says which bucket a key is in)."""
    ops = state_operators(query.lastProgress)
    if operator_index is not None:
        if not 0 <= operator_index < len(ops):
            raise IndexError(
                f"query has {len(ops)} stateful operator(s); no operator {operator_index}"
            )
        return int(ops[operator_index]["numRowsTotal"])
    return sum(int(op["numRowsTotal"]) for op in ops)
