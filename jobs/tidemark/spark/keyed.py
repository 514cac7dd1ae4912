"""Host any ``KeyedStage`` as a keyed stateful operator of a Spark streaming query.

Stages know nothing of Spark; this module is the only place that translates. Between
stages, changes travel as rows of ``CHANGE_SCHEMA``: the kind, the row tuple pickled
(rows carry Decimal, datetime, None: pickle keeps them exact where JSON would not, and it
is the fastest codec Python has), and the source position as ``array<bigint>``. Before a
keyed stage, each change also gets ``key`` (the stage's ``key_of`` in a canonical byte
form Spark can group on) and ``input`` (which input of a 2-input stage it came from):
``KEYED_SCHEMA``. A 2-input stage (a join) unions both inputs and groups by key, so one
call sees both sides of a key.

State lives in buckets: Spark groups a keyed stage's rows by ``bucket = crc32(key) mod
buckets`` (``DEFAULT_STATE_BUCKETS``), not by key, and one binary value state per bucket
holds ``{key bytes: state}`` pickled. A batch makes a constant number of state
operations per *bucket* (one read, at most one write or remove), never one per key or
row: pyspark's ``transformWithState`` pays a blocking socket round trip to the JVM per
state call and per grouping key, plus an output batch per grouping key, and per-key
grouping made those the largest Python cost of a pipeline (docs/benchmarks.md,
"Performance work"). The price is that a touched bucket is unpickled and rewritten
whole, so a bucket should stay small next to a batch: keys / buckets states. The bucket
count is part of the checkpoint (a key must find its bucket again after a restart).
Stages run through the one driver loop (``tidemark.engine.driver``): per key behind its
per-key adapter, so ``process_key`` is still called once per key. The operator is
``transformWithStateInPandas`` (Spark 4.0+): the only kind that can be chained (Spark
rejects two ``applyInPandasWithState`` in one query, and a pipeline has several keyed
stages), in its pandas form because that one converts columns, not cells (see
``_tws_processor``). ``operator="applyInPandasWithState"`` stays available for a query
with a single keyed stage and for the benchmark. Stages with ``wakeup_ms`` get one
processing-time timer per bucket, at the earliest wakeup of its keys.

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
import itertools
import pickle
import re
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any, NamedTuple

from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change
from tidemark.engine import state_codec
from tidemark.engine.driver import PerKeyAdapter, batch_stage
from tidemark.engine.errors import TidemarkError
from tidemark.engine.stage import BatchContext, KeyedStage, StatelessStage, uses_timers

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

CHANGE_SCHEMA = "kind string, row binary, pos array<bigint>"
KEYED_SCHEMA = "key binary, input int, kind string, row binary, pos array<bigint>"
CHANGE_COLUMNS = ("kind", "row", "pos")
KEYED_COLUMNS = ("key", "input", "kind", "row", "pos")
STATE_SCHEMA = "state binary"
#: Spark sets this local property on every task of a micro-batch.
BATCH_ID_PROPERTY = "streaming.sql.batchId"
OPERATORS = ("applyInPandasWithState", "transformWithStateInPandas")
DEFAULT_OPERATOR = "transformWithStateInPandas"
#: state buckets per keyed stage (see the module docstring); fixed for a checkpoint's life
DEFAULT_STATE_BUCKETS = 256
#: the keyed stage's input columns
_GROUPED_COLUMNS = ("bucket", *KEYED_COLUMNS, "now_ms")

_PICKLE_PROTOCOL = pickle.HIGHEST_PROTOCOL


# ---------------------------------------------------------------------------- codecs


def encode_row(row: tuple) -> bytes:
    return pickle.dumps(row, _PICKLE_PROTOCOL)


def decode_row(data: bytes) -> tuple:
    return pickle.loads(data)


def _canonical(value: Any) -> Any:
    """Values Python considers equal map to one representation (1 == 1.0 == True ==
    Decimal('1.00')), so Spark groups exactly the keys a dict host would merge."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float):
        if value.is_integer():
            return int(value)
        return value
    if isinstance(value, Decimal):
        if value.is_finite() and value == value.to_integral_value():
            return int(value)
        return float(value) if value == float(value) else value.normalize()
    if isinstance(value, tuple | list):
        return tuple(_canonical(v) for v in value)
    return value


def encode_key(key: tuple) -> bytes:
    """Canonical bytes for a key: equal keys give equal bytes. ``pickle`` is not usable
    here: it memoizes repeated objects, so ``('a', 'a')`` pickles differently depending
    on whether both strings are the same object."""
    return repr(_canonical(key)).encode()


def encode_pos(pos: tuple) -> list[int]:
    return [int(p) for p in pos]


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

    @property
    def accumulator(self) -> Any:
        return self._acc

    def value(self) -> Counter:
        return Counter(self._acc.value)




def _batch_id() -> int:
    from pyspark import TaskContext

    tc = TaskContext.get()
    value = tc.getLocalProperty(BATCH_ID_PROPERTY) if tc is not None else None
    return int(value) if value is not None else -1


def bucket_of(key: bytes, buckets: int) -> int:
    """The state bucket of an encoded key: ``crc32(key) mod buckets``, the same function
    Spark's ``pmod(crc32(key), buckets)`` computes, so tests and tools can find a key's
    bucket without Spark."""
    return zlib.crc32(key) % buckets


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
            raise StageFailure(
                StageCrash(f"stage '{self.stage.name}' failed on key {key!r}: {type(err).__name__}: {err}")
            ) from err


class _BucketRunner:
    """One stage call for one state bucket: decode the bucket's changes, read its state
    once, run the stage through the one driver loop (``tidemark.engine.driver``), write the
    state at most once, encode what it emits. Shared by both Spark operators so they differ
    only in how state and rows reach Python.

    The stored value is written by ``tidemark.engine.state_codec``; for a stage still on the
    pickled format it holds a ``Bucket``'s ``states``, grouped by the encoded key Spark
    shuffled on (``{key bytes: (key, state)}`` for a stage with timers: a due key is called
    without changes, so its key tuple cannot come from ``key_of``).
    """

    def __init__(
        self,
        stage: KeyedStage,
        accumulator: Any | None,
        downstream: tuple[KeyedStage, int] | None,
        then: Sequence[StatelessStage] = (),
    ):
        self.stage = stage
        self.adapter = _SparkKeyAdapter(stage)
        # typed state is keyed by the stage's key, not Spark's group bytes: its kernel runs here
        kernel = batch_stage(stage) if state_codec.is_typed(stage) else self.adapter
        self.process = (self.adapter if isinstance(kernel, PerKeyAdapter) else kernel).process_batch
        self.accumulator = accumulator
        self.downstream = downstream
        self.then = list(then)

    def run(
        self,
        rows: Iterable[tuple[bytes, int, str, bytes, Any]],
        stored: bytes | None,
        now_ms: int,
    ) -> _Result:
        """``rows`` yields (key bytes, input, kind, row bytes, pos) — none for a timer call."""
        n_inputs = self.stage.n_inputs
        changes: list[list[Change]] = [[] for _ in range(n_inputs)]
        groups: list[list[bytes]] = [[] for _ in range(n_inputs)]
        for key_bytes, inp, kind, row, pos in rows:
            changes[inp].append(Change(kind, pickle.loads(row), tuple(pos)))
            groups[inp].append(key_bytes)
        ctx = BatchContext(batch_id=_batch_id(), now_ms=now_ms)
        inputs = [ChangeBatch(changes=cs, groups=gs) for cs, gs in zip(changes, groups)]
        try:  # a state in another format, a kernel's ConflictError: reported as themselves
            bucket = state_codec.decode_state(self.stage, stored)
            old_wakeup = bucket.next_wakeup()
            bucket, out = self.process(inputs, bucket, ctx)
        except TidemarkError as err:
            raise StageFailure(err) from None
        emitted = out.changes()
        if ctx.metrics and self.accumulator is not None:
            self.accumulator.add(Counter({f"{self.stage.name}.{k}": v for k, v in ctx.metrics.items()}))
        for after in self.then:  # stateless stages fused into this pass (see run_keyed_stage)
            if not emitted:
                break
            emitted = after.process(emitted)
        new_stored = state_codec.encode_state(self.stage, bucket)
        return _Result(new_stored, self._encode(emitted), old_wakeup, bucket.next_wakeup())

    def _encode(self, emitted: list[Change]) -> list[tuple]:
        if self.downstream is None:
            return [(c.kind, encode_row(c.row), encode_pos(c.pos)) for c in emitted]
        nxt, inp = self.downstream
        return [
            (encode_key(nxt.key_of(c, inp)), inp, c.kind, encode_row(c.row), encode_pos(c.pos))
            for c in emitted
        ]


class _Result(NamedTuple):
    stored: bytes | None  # None: remove the bucket's state
    rows: list[tuple]  # output rows, CHANGE or KEYED column order
    old_wakeup: int | None  # the bucket's timer for the state read (``Bucket.next_wakeup``)
    new_wakeup: int | None  # the timer the new state needs


def _output_schema(downstream: tuple[KeyedStage, int] | None) -> str:
    return KEYED_SCHEMA if downstream is not None else CHANGE_SCHEMA


def _output_columns(downstream: tuple[KeyedStage, int] | None) -> tuple[str, ...]:
    return KEYED_COLUMNS if downstream is not None else CHANGE_COLUMNS


def _frame_rows(pdf: pd.DataFrame) -> Iterator[tuple]:
    """A keyed frame's rows as ``_BucketRunner.run`` takes them, a column at a time. Its
    ``pos`` cells are numpy arrays: ``tolist()`` gives the ints the stages compare."""
    return zip(pdf["key"].tolist(), pdf["input"].tolist(), pdf["kind"].tolist(),
               pdf["row"].tolist(), [p.tolist() for p in pdf["pos"]])


def _pandas_state_fn(runner: _BucketRunner, columns: tuple[str, ...]):
    """The applyInPandasWithState function: state arrives with the group (no round trip)."""

    def fn(_bucket: tuple, pdfs: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        import pandas as pd

        old = state.get[0] if state.exists else None
        rows = (r for pdf in pdfs for r in _frame_rows(pdf))
        res = runner.run(rows, old, state.getCurrentProcessingTimeMs())
        if res.stored is None:
            if old is not None:
                state.remove()
        elif res.stored != old:
            state.update((res.stored,))
        if res.rows:
            yield pd.DataFrame.from_records(res.rows, columns=list(columns))

    return fn


def _tws_processor(runner: _BucketRunner, columns: tuple[str, ...], timers: bool):
    """A transformWithStateInPandas processor over state buckets: one value state per
    bucket, read once and written at most once per batch (each is a JVM round trip). With
    ``timers`` (stages that have ``wakeup_ms``) a bucket keeps one processing-time timer at
    its keys' earliest wakeup time, moved only when that time changes.

    Pandas rather than pyspark's row-based ``transformWithState``: that one converts every
    input cell with its own Arrow scalar (~6 us a cell here, 42 us a keyed row) and every
    output row through ``Row.asDict``; pandas converts whole columns, and its higher cost
    per group is paid per bucket, not per key."""
    import pandas as pd
    from pyspark.sql.streaming import StatefulProcessor

    class StageProcessor(StatefulProcessor):
        def init(self, handle):
            self.handle = handle
            self.state = handle.getValueState("stage", STATE_SCHEMA)

        def _apply(self, old: bytes | None, res: _Result, fired: int | None = None):
            if res.stored is None:
                if old is not None:
                    self.state.clear()
            elif res.stored != old:
                self.state.update((res.stored,))
            if timers and res.old_wakeup != res.new_wakeup:
                # a fired timer is deleted by Spark after handleExpiredTimer
                if res.old_wakeup is not None and res.old_wakeup != fired:
                    self.handle.deleteTimer(res.old_wakeup)
                if res.new_wakeup is not None:
                    self.handle.registerTimer(res.new_wakeup)
            if res.rows:
                yield pd.DataFrame.from_records(res.rows, columns=list(columns))

        def handleInputRows(self, key, rows, timerValues):
            got = self.state.get()
            old = bytes(got[0]) if got is not None else None
            first = next(rows)  # a group always has at least one frame
            now = int(first["now_ms"].iloc[0])

            changes = (r for pdf in itertools.chain([first], rows) for r in _frame_rows(pdf))
            yield from self._apply(old, runner.run(changes, old, now))

        def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
            got = self.state.get()
            if got is None:
                return
            old = bytes(got[0])
            res = runner.run((), old, timerValues.getCurrentProcessingTimeInMs())
            yield from self._apply(old, res, fired=expiredTimerInfo.getExpiryTimeInMs())

        def close(self):
            pass

    return StageProcessor()


# ---------------------------------------------------------------------------- public API


def keyed_input(
    changes: DataFrame,
    stage: KeyedStage,
    input_index: int = 0,
    before: Sequence[StatelessStage] = (),
) -> DataFrame:
    """Give change rows (``CHANGE_SCHEMA``) the ``key`` and ``input`` columns ``stage``
    groups on (-> ``KEYED_SCHEMA``), running the stateless stages ``before`` first in the
    same Python pass (calc between two keyed stages costs no extra pass)."""
    if not 0 <= input_index < stage.n_inputs:
        raise ValueError(
            f"stage '{stage.name}' has {stage.n_inputs} input(s); no input {input_index}"
        )
    import pyarrow as pa

    out_schema = pa.schema(
        [
            ("key", pa.binary()),
            ("input", pa.int32()),
            ("kind", pa.string()),
            ("row", pa.binary()),
            ("pos", pa.list_(pa.int64())),
        ]
    )
    pre = list(before)

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            kinds = batch.column("kind").to_pylist()
            rows = batch.column("row").to_pylist()
            poses = batch.column("pos").to_pylist()
            cs = [
                Change(k, pickle.loads(r), tuple(p) if p is not None else ())
                for k, r, p in zip(kinds, rows, poses)
            ]
            for st in pre:
                cs = st.process(cs)
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array([encode_key(stage.key_of(c, input_index)) for c in cs], pa.binary()),
                    pa.array([input_index] * len(cs), pa.int32()),
                    pa.array([c.kind for c in cs], pa.string()),
                    pa.array([encode_row(c.row) for c in cs], pa.binary()),
                    pa.array([encode_pos(c.pos) for c in cs], pa.list_(pa.int64())),
                ],
                schema=out_schema,
            )

    return changes.select(*CHANGE_COLUMNS).mapInArrow(fn, KEYED_SCHEMA)


def has_timers(stage: KeyedStage) -> bool:
    """Whether ``stage`` asks to be woken without records (``wakeup_ms``, ``uses_timers``)."""
    return uses_timers(stage)


def run_keyed_stage(
    inputs: Sequence[DataFrame],
    stage: KeyedStage,
    metrics: StageMetrics | None = None,
    downstream: tuple[KeyedStage, int] | None = None,
    operator: str = DEFAULT_OPERATOR,
    then: Sequence[StatelessStage] = (),
    buckets: int = DEFAULT_STATE_BUCKETS,
) -> DataFrame:
    """Apply ``stage`` to streaming inputs in ``KEYED_SCHEMA`` (one DataFrame per stage
    input, from ``keyed_input`` or a previous stage's ``downstream`` output) and return
    the changes it emits per batch, Append mode.

    Output is ``CHANGE_SCHEMA``; with ``downstream=(next_stage, input_index)`` it is
    ``KEYED_SCHEMA`` already keyed for ``next_stage`` (saves a Python pass).
    ``then``: stateless stages (calc) run on what the stage emits, in the same pass, before
    the output is encoded or keyed: a calc between two keyed stages (or before the sink)
    would otherwise cost a ``mapInArrow`` pass of its own, with every change crossing the
    JVM/Python boundary twice more (py-spy: ~11% of a join pipeline's Python samples).

    ``buckets``: the stage's state buckets (module docstring); a restart from a checkpoint
    must use the count it was created with.

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
    if timers and operator != "transformWithStateInPandas":
        raise ValueError(
            f"stage '{stage.name}' has timers (wakeup_ms): only transformWithStateInPandas hosts it"
        )
    if buckets < 1:
        raise ValueError(f"state buckets must be >= 1, got {buckets}")
    df = inputs[0].select(*KEYED_COLUMNS)
    for other in inputs[1:]:
        df = df.unionByName(other.select(*KEYED_COLUMNS))
    # the same function as bucket_of; an int column keeps the grouping key small
    df = df.withColumn("bucket", F.pmod(F.crc32("key"), F.lit(buckets)).cast("int"))
    runner = _BucketRunner(stage, metrics.accumulator if metrics else None, downstream, then)
    columns = _output_columns(downstream)
    if operator == "applyInPandasWithState":
        from pyspark.sql.streaming.state import GroupStateTimeout

        return df.groupBy("bucket").applyInPandasWithState(
            _pandas_state_fn(runner, columns),
            outputStructType=_output_schema(downstream),
            stateStructType=STATE_SCHEMA,
            outputMode="append",
            timeoutConf=GroupStateTimeout.NoTimeout,
        )
    # current_timestamp() is the batch's timestamp in a streaming query, recorded in the
    # offset log: a replayed batch sees the same now_ms.
    df = df.withColumn("now_ms", F.unix_millis(F.current_timestamp()))
    grouped = df.select(*_GROUPED_COLUMNS).groupBy("bucket")
    return grouped.transformWithStateInPandas(
        _tws_processor(runner, columns, timers),
        outputStructType=_output_schema(downstream),
        outputMode="Append",
        # "ProcessingTime" makes Spark run a no-data batch at every trigger forever (so
        # timers can fire): only stages with timers pay for it. Without it the batch time
        # comes from the now_ms column.
        timeMode="ProcessingTime" if timers else "None",
    )


def changes_from_rows(rows: Iterable[Any]) -> list[Change]:
    """Decode collected ``CHANGE_SCHEMA`` rows (pyspark Rows or tuples) into Changes."""
    out = []
    for r in rows:
        kind, row, pos = r["kind"], r["row"], r["pos"]
        out.append(Change(kind, decode_row(bytes(row)), tuple(pos or ())))
    return out


def changes_to_records(changes: Iterable[Change]) -> list[tuple[str, bytes, list[int]]]:
    """Encode Changes as ``CHANGE_SCHEMA`` tuples (for createDataFrame or test files)."""
    return [(c.kind, encode_row(c.row), encode_pos(c.pos)) for c in changes]


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
    (``bucket_of`` says which bucket a key is in)."""
    ops = state_operators(query.lastProgress)
    if operator_index is not None:
        if not 0 <= operator_index < len(ops):
            raise IndexError(
                f"query has {len(ops)} stateful operator(s); no operator {operator_index}"
            )
        return int(ops[operator_index]["numRowsTotal"])
    return sum(int(op["numRowsTotal"]) for op in ops)
