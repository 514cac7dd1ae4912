"""Run a compiled pipeline as one Spark Structured Streaming query, Kafka to Kafka.

``PipelineJob`` owns the query's lifecycle: it makes sure the topics exist, builds the
query frame (``tidemark.spark.query``), writes each micro-batch in ``foreachBatch`` (the
dead letters, then the sink changes), and turns Spark's progress into one ``BatchReport``
per batch. ``run_pipeline`` is the blocking call tests and ``tidemark run`` use.

A statement set is still one query: its frame carries every sink's changes tagged with the
sink (``tidemark.spark.query.SINK_COLUMN``); ``foreachBatch`` persists the batch once and
writes each sink's share with that sink's writer, so the shared stages run once per batch
and every sink commits the same batch id.

Delivery: the upsert sink is idempotent per batch, the changelog and dead-letter writers
are transactional per batch id (``tidemark.spark.sink``), so replaying the batch a crash
interrupted changes nothing downstream. The transactional writers are identified by
``<pipeline>.<sink table>.<run id>`` / ``<pipeline>.dlq.<run id>``, where the run id is
created with the checkpoint (``tidemark-run.json`` in it): a restart from the checkpoint
continues the same writers, while a fresh checkpoint (batch ids from 0 again) gets fresh
writers instead of having its first batches skipped as "already committed".
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tidemark.engine.checkpoint_path import local_dir
from tidemark.engine.errors import TidemarkError
from tidemark.engine.pipeline import Pipeline
from tidemark.spark.keyed import DEFAULT_STATE_BUCKETS, PerBatchAccumulator, StageMetrics, has_timers, stage_error_from
from tidemark.spark.progress import BatchReport, SinkBatch, parse_offset, ran_a_batch, report_from
from tidemark.spark.session import use_checkpoint_file_manager
from tidemark.spark.source import open_bounded_sources
from tidemark.spark.state_bytes import StateBytes
from tidemark.spark.query import (
    SINK_COLUMN,
    build_query_frame,
    keyed_by_sink_pk,
    refuses_conflicts,
    source_tables,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

RUN_FILE = "tidemark-run.json"
#: how changes travel between the query's stages, which bucket a key's state is in
#: (``tidemark.engine.bucketing``) and which grouping value carries the bucket
#: (``tidemark.spark.partitioning``), recorded with the checkpoint: state written under
#: another data path is not where this one looks for it
DATA_PATH = "arrow-ipc-blobs/3"
DEFAULT_TRIGGER_INTERVAL = "500 milliseconds"
#: Spark failures that say nothing about the pipeline: a Python worker started by the JVM
#: did not connect back within Spark's fixed 10 s (seen on an overloaded machine). The
#: query is restarted from its checkpoint, which is exactly-once by construction.
TRANSIENT_FAILURES = (
    "Timed out while waiting for the Python worker to connect back",
    "Python worker failed to connect back",
)
TRANSIENT_RESTARTS = 3


class JobError(TidemarkError):
    """The streaming query failed for a reason that is not a stage's own error."""

    exit_status = 1


def default_checkpoint(name: str) -> str:
    return os.path.join("checkpoints", name)


@dataclass(frozen=True)
class RunInfo:
    """What a checkpoint fixes for its whole life, recorded in ``tidemark-run.json`` when it
    is created: the transactional writers' run id, and the state bucket count of the keyed
    stages (``tidemark.spark.keyed``: a key found in bucket ``hash(key) mod N`` must be
    looked up with the same N after a restart). The file also names the data path
    (``DATA_PATH``) whose state the checkpoint holds."""

    run_id: str
    state_buckets: int


def run_info_of(checkpoint: str, state_buckets: int | None = None) -> RunInfo:
    """The checkpoint's ``RunInfo``, created with it. ``state_buckets`` (None: the recorded
    count, or ``DEFAULT_STATE_BUCKETS`` for a new checkpoint) must match what the checkpoint
    records. Checkpoints on a non-local file system (``scheme://``) keep no file: their run
    id comes from the path, and the bucket count must be given the same on every run."""
    directory = local_dir(checkpoint)
    if directory is None:
        return RunInfo(uuid.uuid5(uuid.NAMESPACE_URL, checkpoint).hex[:12], state_buckets or DEFAULT_STATE_BUCKETS)
    path = directory / RUN_FILE
    recorded: dict[str, Any] = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    if "state_buckets" in recorded and recorded.get("data_path") != DATA_PATH and (path.parent / "state").exists():
        raise JobError(
            f"checkpoint {checkpoint} holds keyed state of the data path {recorded.get('data_path', 'pickled-rows/1')}; "
            f"this version runs {DATA_PATH} and keys state differently: start a new checkpoint"
        )
    if "state_buckets" in recorded and "data_path" in recorded:
        if state_buckets is not None and state_buckets != recorded["state_buckets"]:
            raise JobError(
                f"checkpoint {checkpoint} keeps keyed state in {recorded['state_buckets']} buckets; "
                f"--state-buckets {state_buckets} would not find it (drop the option, or start a new checkpoint)"
            )
        return RunInfo(str(recorded["run_id"]), int(recorded["state_buckets"]))
    if recorded and (path.parent / "state").exists():
        raise JobError(
            f"checkpoint {checkpoint} was written by an older Tidemark that kept one state value "
            "per key; this version keeps state in buckets and cannot read it: start a new checkpoint"
        )
    buckets = state_buckets or recorded.get("state_buckets") or DEFAULT_STATE_BUCKETS
    info = RunInfo(str(recorded.get("run_id") or uuid.uuid4().hex[:12]), int(buckets))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    record = {"run_id": info.run_id, "state_buckets": info.state_buckets, "data_path": DATA_PATH}
    tmp.write_text(json.dumps(record), encoding="utf-8")
    os.replace(tmp, path)
    return info


def _has_commits(spark: SparkSession, checkpoint: str) -> bool:
    """Whether Spark committed a batch in this checkpoint (its commit log names batch ids)."""
    directory = local_dir(checkpoint)
    if directory is not None:
        commits = directory / "commits"
        return commits.is_dir() and any(f.name.isdigit() for f in commits.iterdir())
    jvm = spark._jvm
    path = jvm.org.apache.hadoop.fs.Path(checkpoint.rstrip("/") + "/commits")
    fs = path.getFileSystem(spark._jsc.hadoopConfiguration())
    return bool(fs.exists(path)) and any(str(f.getPath().getName()).isdigit() for f in fs.listStatus(path))


def run_id_of(checkpoint: str) -> str:
    """The id of the run a checkpoint belongs to (see ``run_info_of``)."""
    return run_info_of(checkpoint).run_id


@dataclass
class RunResult:
    """What ``run_pipeline`` returns: every batch's report, in batch order."""

    name: str
    reports: list[BatchReport] = field(default_factory=list)
    sink_writer_id: str | None = None
    dlq_writer_id: str | None = None
    #: sink table -> its transactional writer id (None: an upsert sink), for statement sets
    sink_writer_ids: dict[str, str | None] = field(default_factory=dict)

    @property
    def rows_in(self) -> int:
        return sum(r.rows_in for r in self.reports)

    @property
    def rows_out(self) -> int:
        return sum(r.rows_out for r in self.reports)

    @property
    def dlq(self) -> int:
        return sum(r.dlq for r in self.reports)


class PipelineJob:
    """One pipeline on one SparkSession. ``start()`` then ``wait()`` (or
    ``process_all_available()`` in tests), ``stop()``; ``reports`` fills as batches commit.

    ``on_batch`` is called (on the thread that polls progress) with each new report.
    """

    def __init__(
        self,
        spark: SparkSession,
        pipeline: Pipeline,
        bootstrap: str,
        checkpoint: str,
        *,
        name: str | None = None,
        max_records_per_trigger: int | None = None,
        registry_url: str | None = None,
        trigger_interval: str | None = DEFAULT_TRIGGER_INTERVAL,
        on_batch: Callable[[BatchReport], None] | None = None,
        dlq_encoding: str = "json",
        source_options: dict[str, str] | None = None,
        index_url: str | None = None,
        index_token: str | None = None,
        state_buckets: int | None = None,
    ):
        from tidemark.spark.delta import delta_joins
        from tidemark.spark.index_service import JobIndex
        from tidemark.spark.sink import DeadLetterSink, UpsertSink, sink_writer

        self.spark = spark
        self.pipeline = pipeline
        self.bootstrap = bootstrap
        self.checkpoint = checkpoint
        self.name = name or pipeline.sink.name
        self.max_records_per_trigger = max_records_per_trigger
        self.registry_url = registry_url
        self.trigger_interval = trigger_interval
        self.on_batch = on_batch
        self.source_options = source_options
        self.tables = source_tables(pipeline, registry_url)  # refuses two tables on one topic
        #: ``state_buckets`` None: what the checkpoint records (see ``run_info_of``)
        info = run_info_of(checkpoint, state_buckets)
        self.run_id, self.state_buckets = info.run_id, info.state_buckets
        #: one writer per sink table, in the pipeline's INSERT order
        self.sinks: dict[str, Any] = {
            t.table.name: sink_writer(bootstrap, t.table, self._writer_id(t.table.name), registry_url)
            for t in pipeline.sinks
        }
        self.sink: Any = self.sinks[pipeline.sink.name]
        #: the upsert sinks whose changes arrive keyed by their PK (no shuffle of their own);
        #: outside a statement set, the keyed stage that feeds one writes it itself. Not a
        #: sink fed by a stage that can fail the batch (``refuses_conflicts``), unless the
        #: batch runs to its end before any sink is written (a statement set's)
        self.keyed_sinks = {t.table.name for t in pipeline.sinks
                            if isinstance(self.sinks[t.table.name], UpsertSink) and keyed_by_sink_pk(pipeline, t.node_id)
                            and (pipeline.statement_set or not refuses_conflicts(pipeline, t.node_id))}
        self.sinks_written_in_stage = set() if pipeline.statement_set else self.keyed_sinks
        self.sink_topic = self.sink.topic
        self.sink_writer_id = self._writer_id(pipeline.sink.name)
        self.dlq_writer_id = f"{self.name}.dlq.{self.run_id}"
        self.dlq = DeadLetterSink(bootstrap, self.name, encoding=dlq_encoding, writer_id=self.dlq_writer_id)
        self.metrics = StageMetrics(spark)
        self.state_bytes = StateBytes(local_dir(checkpoint), resumed=_has_commits(spark, checkpoint))
        #: per batch: dead letters by source coordinate, records read by topic partition
        self.dead_letters = PerBatchAccumulator(spark)
        self.records_read = PerBatchAccumulator(spark)
        self.query: StreamingQuery | None = None
        #: the index service of the pipeline's delta joins (embedded unless ``index_url``)
        self.index = JobIndex(pipeline, bootstrap, index_url, index_token) if delta_joins(pipeline) else None
        self.reports: list[BatchReport] = []
        self._sink_batches: dict[int, SinkBatch] = {}
        self._counters_seen: Counter = Counter()
        self._last_reported = -1
        self._lock = threading.Lock()
        self._until_idle = False
        self.restarts = 0
        #: a keyed stage with timers makes Spark run a batch at every trigger, data or not,
        #: so Trigger.AvailableNow never ends by itself (see ``_idle``)
        self.has_timers = any(
            n.stage is not None and (hasattr(n.stage, "process_key") or hasattr(n.stage, "batch_kernel"))
            and has_timers(n.stage)
            for n in pipeline.nodes
        )

    def _writer_id(self, sink: str) -> str:
        return f"{self.name}.{sink}.{self.run_id}"

    # ------------------------------------------------------------------ topics

    @property
    def dlq_topic(self) -> str:
        return self.dlq.topic

    def ensure_topics(self) -> list[str]:
        """Create missing topics: sources (1 partition, so the job can start before the
        first record is produced), the sink (compacted for upsert formats) and the
        dead-letter topic. Returns the names created by this call."""
        from tidemark.kafka.admin import admin_client, ensure_topics

        existing = set(admin_client(self.bootstrap).list_topics(timeout=30).topics)
        created = []
        sources = [t.topic for t in self.tables if t.topic not in existing]
        if sources:
            ensure_topics(self.bootstrap, {t: 1 for t in sources})
            created += sources
        for target in self.pipeline.sinks:
            topic = self.sinks[target.table.name].topic
            if topic not in existing:
                ensure_topics(self.bootstrap, {topic: 1}, compacted=target.table.changelog_mode == "upsert")
                created.append(topic)
        if self.dlq_topic not in existing:
            ensure_topics(self.bootstrap, {self.dlq_topic: 1})
            created.append(self.dlq_topic)
        return created

    # ------------------------------------------------------------------ the query

    def _write_batch(self, df: DataFrame, batch_id: int) -> None:
        """foreachBatch: the sink changes, then the dead letters the batch's decode passes
        found. Writing the sink runs the whole batch (every decode pass and keyed stage)
        in one Spark job; only when a changelog sink already committed this batch (a
        replay after a crash) is the batch run without writing, so that its dead letters
        are known again and the state stores advance. A crash between the two writes
        replays the batch: the sink skips or rewrites it idempotently, the dead letters
        are written then, so none is lost or duplicated. Delta joins get the batch's
        offset fences first (``tidemark.spark.delta``)."""
        if self.index is not None:
            from tidemark.spark.delta import batch_fences, set_batch_fences

            set_batch_fences(self.spark, batch_fences(self.checkpoint, batch_id, self.index.topics(), self.spark))
        rows_out = self._write_sinks(df, batch_id)
        found = self.dead_letters.take(batch_id)
        letters = [found[c] for c in sorted(found)]  # in source order
        rows_in = sum(self.records_read.take(batch_id).values())
        dlq = 0
        if letters:
            result = self.dlq.write_letters(self.dlq.letters(letters, batch_id), batch_id)
            dlq = 0 if result.skipped else len(letters)
        state_bytes = self.state_bytes.record(batch_id, self.metrics.sizes.take(batch_id))
        total = self.metrics.value()
        with self._lock:
            delta = total - self._counters_seen
            self._counters_seen = total
            self._sink_batches[batch_id] = SinkBatch(rows_in, rows_out, dlq, dict(delta), state_bytes)

    def _write_sinks(self, df: DataFrame, batch_id: int) -> int:
        """Write the batch to every sink that has not committed it; returns the records
        written. A statement set's batch is persisted so that its sinks' shares are cut
        from one run of the query's stages (``df`` is read once per sink)."""
        pending = [name for name, sink in self.sinks.items() if not _already_committed(sink, batch_id)]
        if not pending:
            df.count()
            return 0
        if not self.pipeline.statement_set:
            return _written(self._write_sink(self.pipeline.sink.name, df, batch_id))
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        index = {t.table.name: i for i, t in enumerate(self.pipeline.sinks)}
        df = df.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            df.count()  # runs the stages once, whichever sinks still write
            return sum(
                _written(self._write_sink(name, df.where(F.col(SINK_COLUMN) == index[name]).drop(SINK_COLUMN), batch_id))
                for name in pending
            )
        finally:
            df.unpersist()

    def _write_sink(self, name: str, df: DataFrame, batch_id: int) -> Any:
        if name in self.sinks_written_in_stage:
            return self.sinks[name].count_written(df)
        if name in self.keyed_sinks:
            return self.sinks[name].write_batch(df, batch_id, keyed=True)
        return self.sinks[name].write_batch(df, batch_id)

    def start(self, until_idle: bool = False) -> StreamingQuery:
        """Start the query. ``until_idle``: read what is in the topics now (in
        rate-limited batches), write it, and stop (``Trigger.AvailableNow``)."""
        self._until_idle = until_idle
        self.ensure_topics()
        use_checkpoint_file_manager(self.spark, self.checkpoint)
        target = self.index.start() if self.index is not None else None
        frame = build_query_frame(
            self.spark, self.pipeline, self.bootstrap, metrics=self.metrics, dead_letters=self.dead_letters,
            records_read=self.records_read,
            max_records_per_trigger=self.max_records_per_trigger, registry_url=self.registry_url,
            source_options=self.source_options, index=target, state_buckets=self.state_buckets,
            writers={name: self.sinks[name].producer() for name in self.sinks_written_in_stage},
        )
        writer = (
            frame.writeStream.queryName(_query_name(self.name))
            .option("checkpointLocation", self.checkpoint)
            .foreachBatch(self._write_batch)
        )
        if until_idle:
            writer = writer.trigger(availableNow=True)
        elif self.trigger_interval:
            writer = writer.trigger(processingTime=self.trigger_interval)
        self.query = writer.start()
        return self.query

    # ------------------------------------------------------------------ progress

    def poll(self) -> list[BatchReport]:
        """Reports of the batches committed since the last poll (also appended to
        ``reports`` and passed to ``on_batch``)."""
        if self.query is None:
            return []
        new: list[BatchReport] = []
        for progress in self.query.recentProgress:
            if not ran_a_batch(progress):
                continue
            batch_id = int(progress["batchId"])
            with self._lock:
                if batch_id <= self._last_reported or batch_id not in self._sink_batches:
                    continue
                sink = self._sink_batches.pop(batch_id)
                self._last_reported = batch_id
            report = report_from(progress, sink)
            if self.index is not None:  # committed: its fences will not be asked for again
                self.index.release(report.end_offsets)
            self.reports.append(report)
            new.append(report)
            if self.on_batch is not None:
                self.on_batch(report)
        return new

    def _raise_failure(self, exc: BaseException) -> None:
        error = stage_error_from(exc)
        if error is not None:
            raise error from None
        raise JobError(f"pipeline '{self.name}' failed: {_first_line(exc)}") from exc

    def _idle(self) -> bool:
        """``until_idle`` for a query that never ends by itself (timers): idle once a
        committed batch left nothing to read in any source partition, and every bounded
        source has run the batch that ends it."""
        if not (self._until_idle and self.has_timers and self.reports and self.reports[-1].total_lag == 0):
            return False
        progress = self.query.lastProgress if self.query is not None else None
        ends = [parse_offset(s.get("endOffset")) for s in (progress or {}).get("sources", [])]
        return open_bounded_sources(ends) == 0

    def _transient(self, exc: BaseException) -> bool:
        text = f"{exc} {getattr(exc, 'desc', '')}"
        return stage_error_from(exc) is None and any(t in text for t in TRANSIENT_FAILURES)

    def wait(self, stop: threading.Event | None = None, poll_s: float = 0.5) -> None:
        """Block until the query ends by itself (``until_idle``) or ``stop`` is set (then
        stop it), polling progress meanwhile. A failed query raises its stage's error
        (e.g. ConflictError) or ``JobError``; a transient Spark failure (see
        ``TRANSIENT_FAILURES``) restarts the query from its checkpoint instead."""
        assert self.query is not None, "start() first"
        while True:
            try:
                self._wait_once(stop, poll_s)
                return
            except JobError as err:
                cause = err.__cause__
                if cause is None or not self._transient(cause) or self.restarts >= TRANSIENT_RESTARTS:
                    raise
                self.restarts += 1
                self.start(self._until_idle)

    def _wait_once(self, stop: threading.Event | None, poll_s: float) -> None:
        assert self.query is not None
        try:
            while True:
                if stop is not None and stop.is_set():
                    self.query.stop()
                    break
                try:
                    done = self.query.awaitTermination(poll_s)
                except Exception as exc:
                    self.poll()
                    self._raise_failure(exc)
                self.poll()
                if done:
                    break
                if self._idle():
                    self.query.stop()
                    break
        finally:
            self.poll()
        error = self.query.exception()
        if error is not None:
            self._raise_failure(error)

    def process_all_available(self) -> list[BatchReport]:
        """Wait until everything currently in the topics is written (tests of a running
        job); returns the reports of the batches it took."""
        assert self.query is not None, "start() first"
        before = len(self.reports)
        try:
            self.query.processAllAvailable()
        except Exception as exc:
            self.poll()
            self._raise_failure(exc)
        self.poll()
        return self.reports[before:]

    def stop(self) -> None:
        if self.query is not None and self.query.isActive:
            self.query.stop()
        self.poll()

    def close(self) -> None:
        self.stop()
        for sink in (*self.sinks.values(), self.dlq):
            close = getattr(sink, "close", None)
            if close is not None:
                close()
        if self.index is not None:
            self.index.close()

    def result(self) -> RunResult:
        writer_ids = {
            t.table.name: self._writer_id(t.table.name) if t.table.changelog_mode != "upsert" else None
            for t in self.pipeline.sinks
        }
        return RunResult(
            name=self.name, reports=list(self.reports),
            sink_writer_id=writer_ids[self.pipeline.sink.name],
            dlq_writer_id=self.dlq_writer_id, sink_writer_ids=writer_ids,
        )


def _already_committed(sink: Any, batch_id: int) -> bool:
    writer = getattr(sink, "writer", None)  # changelog sinks are transactional
    if writer is None:
        return False
    writer.start()
    return batch_id <= writer.last_committed


def _written(result: Any) -> int:
    return result if isinstance(result, int) else result.written


def _query_name(name: str) -> str:
    return "tidemark_" + "".join(ch if ch.isalnum() else "_" for ch in name)


def _first_line(exc: BaseException) -> str:
    text = getattr(exc, "desc", None) or str(exc)
    for line in str(text).splitlines():
        line = line.strip()
        if line:
            return line[:500]
    return type(exc).__name__


def run_pipeline(
    spark: SparkSession,
    pipeline: Pipeline,
    bootstrap: str,
    checkpoint: str,
    *,
    until_idle: bool = True,
    name: str | None = None,
    max_records_per_trigger: int | None = None,
    registry_url: str | None = None,
    trigger_interval: str | None = DEFAULT_TRIGGER_INTERVAL,
    on_batch: Callable[[BatchReport], None] | None = None,
    stop: threading.Event | None = None,
    source_options: dict[str, str] | None = None,
    index_url: str | None = None,
    index_token: str | None = None,
) -> RunResult:
    """Run ``pipeline`` from its source topics to its sink topic on ``spark``.

    With ``until_idle`` (default) it returns once everything in the topics at start is
    written; otherwise it runs until ``stop`` is set. Restarting with the same
    ``checkpoint`` continues where the last run committed. Raises the stage's own error
    (``ConflictError`` for ``ON CONFLICT DO ERROR``) or ``JobError``. A pipeline with a
    delta join looks rows up in the index service at ``index_url`` (bearer
    ``index_token``), or in one it starts for the run when no URL is given."""
    job = PipelineJob(
        spark, pipeline, bootstrap, checkpoint, name=name,
        max_records_per_trigger=max_records_per_trigger, registry_url=registry_url,
        trigger_interval=trigger_interval, on_batch=on_batch, source_options=source_options,
        index_url=index_url, index_token=index_token,
    )
    try:
        job.start(until_idle=until_idle)
        job.wait(stop)
    finally:
        job.close()
    return job.result()
