"""Run one benchmark workload through the real Tidemark system and measure it.

The workload's files (one Kafka record value per line, per source table) are produced into
fresh topics of the broker (2 partitions, keyed by the table's primary key) *before*
anything is timed. Then the pipeline runs as ``tidemark run FILE.sql --until-idle`` runs
it: read everything in the source topics, write it to the sink topic, stop. Two ways:

- ``run_workload(..., session=None)``: the real CLI in its own process, cold (JVM and
  Spark session start per run; ``startup_s`` = spawn -> query started);
- ``run_workload(..., session=TidemarkSession(...))``: a child process that keeps one
  Spark session and runs each workload with ``PipelineJob`` exactly as the CLI does
  (``ensure_topics``, ``start(until_idle=True)``, ``wait``, ``close``), so start-up is paid
  once per session (what the suite uses; see ``TidemarkSession``).

Either way the measured processes are apart from the harness: peak memory is the summed
RSS of the job's whole process tree (the Python driver, the Spark JVM it starts, the
Python workers that JVM forks), sampled every 100 ms with psutil.

Times come from the job's own status channel (``TIDEMARK_STATUS_FILE`` format: JSON Lines
with wall-clock ``ts``): run = ``started`` (the query is started) -> the last batch that
read input is committed (its ``batch`` event is written after the sink's write and
Spark's commit, so the sink holds that batch's output). Throughput = the workload's input
records / run. In the sustained mode (a per-batch cap, several batches) the steady-state
clock (``sustained.tidemark_steady``: from the first batch's commit to the last's) is
reported as ``steady``.

State size at the end: the bytes on disk under ``CHECKPOINT/state`` (every retained
version of every state store: what a restart reads) and, from the last data batch's report,
the keyed stages' stored bytes (``tidemark.spark.state_bytes``), in total and per stage.

Latency (one workload is enough, as the issue asks) reuses ``bench_e2e.py``'s method and
code: a warm job, rows produced at a fixed rate, sink visibility - produce time.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
from confluent_kafka import Producer

from tidemark.control.supervisor import terminate_group
from tidemark.engine.catalog import TableDef
from tidemark.engine.pipeline import Pipeline, compile_sql
from tidemark.kafka.admin import ensure_topics

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from run_support import sink_table, topic_of, unique_topics  # noqa: E402  (the run tests' helpers)
sys.path.insert(0, str(Path(__file__).resolve().parent))
import process_memory  # noqa: E402
import sustained  # noqa: E402

TIDEMARK = str(Path(sys.executable).parent / "tidemark")
SOURCE_PARTITIONS = 2  # like Flink's parallelism 2 in the measurements

#: the environment variable that sets the measured jobs' state bucket count
STATE_BUCKETS_ENV = "TIDEMARK_BENCH_STATE_BUCKETS"


class TidemarkRunError(RuntimeError):
    """The pipeline did not finish (exit status, timeout); the message names the log."""


@dataclass
class TidemarkRun:
    """One run's figures (all JSON-serialisable) and its final sink table."""

    workload: str
    variant: str
    input_rows: int
    startup_s: float | None  # None in a warm session (its start-up is the session's)
    run_s: float  # 'started' -> the sink holds the last output
    #: input records / (run_s - planning_s): the clock starts where Flink's does (see
    #: ``_start_planning_s``); None planning (the CLI) counts as 0
    rows_per_s: float
    peak_rss_bytes: int
    state_bytes: int
    state_current_version_bytes: int
    batches: int
    rows_out: int
    exit_status: int
    workdir: str
    #: sink PK -> row (typed as the sink's columns), not part of ``figures()``
    table: dict[tuple, tuple] = field(default_factory=dict, repr=False)
    columns: list[str] = field(default_factory=list)
    #: stored bytes per keyed stage after the last batch (``tidemark.spark.state_bytes``)
    state_by_stage: dict[str, int] = field(default_factory=dict)
    materializer_state_bytes: int | None = None
    #: the query's first-batch planning, seconds (session runs only)
    planning_s: float | None = None
    rows_per_s_with_planning: float | None = None
    #: where the run's wall time went (seconds): produce, job (the session's round trip, and
    #: inside it compile/start/wait/close), read (the sink table), state_scan
    phases: dict[str, float] = field(default_factory=dict)
    #: the per-batch cap the run had (None: one batch takes everything)
    max_records_per_trigger: int | None = None
    #: the steady-state clock (``sustained.Steady.as_dict``); None with fewer than 2 batches
    steady: dict[str, Any] | None = None
    #: (commit time, records read) per data batch
    batch_times: list[tuple[float, int]] = field(default_factory=list)

    def figures(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("table")
        return out


# ---------------------------------------------------------------------------- topics


def _key_of(table: TableDef, record: Mapping[str, Any]) -> bytes | None:
    """The Kafka key of a source record: its primary key as JSON, from ``after`` (or
    ``before`` for a delete) of a Debezium record, or the row itself for plain JSON."""
    if not table.primary_key:
        return None
    row = (record.get("after") or record.get("before")) if "op" in record else record
    if not isinstance(row, Mapping):
        raise TidemarkRunError(f"table {table.name}: record without a row to take the key from: {record}")
    return json.dumps({k: row.get(k) for k in table.primary_key}).encode()


def _lines(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        for line in f:
            line = line.strip()
            if line:
                yield line


def produce_files(bootstrap: str, pipeline: Pipeline, files: Mapping[str, Path | str],
                  partitions: int = SOURCE_PARTITIONS) -> int:
    """Produce each source table's file into its topic (created with ``partitions``
    partitions, a key always in the same one, file order kept per key). Returns the
    number of records produced."""
    missing = set(pipeline.sources) - set(files)
    if missing:
        raise TidemarkRunError(f"no input file for source table(s) {sorted(missing)}")
    ensure_topics(bootstrap, {topic_of(pipeline.sources[t]): partitions for t in files})
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10_000,
                         "queue.buffering.max.messages": 1_000_000, "enable.idempotence": True,
                         "compression.type": "none", "log_level": 3})
    n = 0
    for name, path in files.items():
        table = pipeline.sources[name]
        topic = topic_of(table)
        for line in _lines(Path(path)):
            key = _key_of(table, json.loads(line))
            part = (zlib.crc32(key) % partitions) if key is not None else n % partitions
            while True:
                try:
                    producer.produce(topic, line, key, partition=part)
                    break
                except BufferError:
                    producer.poll(0.05)
            n += 1
    if producer.flush(300) != 0:
        raise TidemarkRunError("producing the workload's records did not finish in 300 s")
    return n


# ---------------------------------------------------------------------------- measuring


class RssSampler(threading.Thread):
    """Peak of the summed RSS of a process and all its descendants, each address space once
    (``process_memory``), sampled periodically (a process that lives shorter than the period
    can be missed: Spark's workers live for the whole job)."""

    def __init__(self, pid: int, period_s: float = 0.1):
        super().__init__(name="rss-sampler", daemon=True)
        self.root = psutil.Process(pid)
        self.period_s = period_s
        self.peak = 0
        self.done = threading.Event()

    def sample(self) -> int:
        return process_memory.tree_rss(self.root)

    def run(self) -> None:
        while not self.done.is_set():
            self.peak = max(self.peak, self.sample())
            self.done.wait(self.period_s)

    def stop(self) -> int:
        self.done.set()
        self.join(timeout=5)
        return self.peak


def dir_bytes(path: Path) -> int:
    total = 0
    if path.exists():
        for p in path.rglob("*"):
            with contextlib.suppress(OSError):
                if p.is_file():
                    total += p.stat().st_size
    return total


def events(status: Path) -> list[dict[str, Any]]:
    if not status.exists():
        return []
    out = []
    for line in status.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        terminate_group(proc, timeout_s=60)


# ---------------------------------------------------------------------------- one run


def run_workload(
    *,
    name: str,
    variant: str,
    sql: str,
    files: Mapping[str, Path | str],
    input_rows: int,
    bootstrap: str,
    workdir: Path,
    max_records_per_trigger: int | None = None,
    timeout_s: float = 1800.0,
    progress: Any = None,
    session: TidemarkSession | None = None,
    partitions: int = SOURCE_PARTITIONS,
) -> TidemarkRun:
    """Produce ``files`` into fresh topics, run ``sql`` with ``tidemark run --until-idle``
    (or in ``session``, warm) and measure it (see the module docstring). ``progress(text)``
    gets a line per batch; ``partitions``: of each source topic."""
    tag = re.sub(r"[^a-z0-9]+", "-", f"{name}-{variant}".lower()).strip("-")
    workdir.mkdir(parents=True, exist_ok=True)
    sql, _ = unique_topics(sql, tag)  # runs share one broker, never a topic
    pipeline = compile_sql(sql)
    sql_file = workdir / "pipeline.sql"
    sql_file.write_text(sql, encoding="utf-8")
    phases: dict[str, float] = {}
    t = time.monotonic()
    produce_files(bootstrap, pipeline, files, partitions)
    phases["produce_s"] = time.monotonic() - t
    t = time.monotonic()

    checkpoint = workdir / "checkpoint"
    status = workdir / "status.jsonl"
    log = workdir / "run.out"
    job_name = f"bench-{tag}-{uuid.uuid4().hex[:6]}"
    if session is not None:
        t_spawn = None
        reply, peak = session.run({"sql_file": str(sql_file), "bootstrap": bootstrap, "checkpoint": str(checkpoint),
                                   "name": job_name, "status": str(status),
                                   "max_records_per_trigger": max_records_per_trigger}, timeout_s)
        exit_status = int(reply["exit_status"])
        failure = reply.get("error", "")
        planning_s = reply.get("planning_s")
        phases.update(reply.get("phases") or {})
        log = session.workdir / "driver.log"
    else:
        t_spawn, peak, exit_status = _run_cli(sql_file, bootstrap, checkpoint, job_name, status, log, workdir,
                                              max_records_per_trigger, timeout_s, f"{name}/{variant}")
        failure = " | ".join(log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-3:])
        planning_s = None  # the CLI's status file does not carry it
    phases["job_s"] = time.monotonic() - t
    if progress is not None:
        for e in events(status):
            if e.get("event") == "batch":
                progress(f"batch {e['batch_id']}: in {e['rows_in']} out {e['rows_out']} {e['duration_ms'] / 1000:.1f}s")
    evs = events(status)
    if exit_status != 0:
        raise TidemarkRunError(f"{name}/{variant}: the pipeline failed with exit status {exit_status}: {failure} "
                               f"(log {log}, Spark log {workdir / 'driver.log'})")
    started = next((e["ts"] for e in evs if e.get("event") == "started"), None)
    batches = [e for e in evs if e.get("event") == "batch"]
    data = [e for e in batches if e.get("rows_in") or e.get("rows_out")]
    if started is None or not data:
        raise TidemarkRunError(f"{name}/{variant}: no 'started' or data batch in {status}")
    steady = sustained.tidemark_steady(data, input_rows)
    t_end = max(e["ts"] for e in data)
    run_s = t_end - started
    measured_s = run_s - (planning_s or 0.0)  # see _start_planning_s
    rows_in = sum(e["rows_in"] for e in batches)
    if rows_in != input_rows:
        raise TidemarkRunError(f"{name}/{variant}: the job read {rows_in} records, the workload has {input_rows}")
    run_id = json.loads((checkpoint / "tidemark-run.json").read_text(encoding="utf-8"))["run_id"]
    writer_id = f"{job_name}.{pipeline.sink.name}.{run_id}"
    t = time.monotonic()
    table = sink_table(bootstrap, pipeline, None if pipeline.sink.changelog_mode == "upsert" else writer_id,
                       timeout_s=300)
    phases["read_s"] = time.monotonic() - t
    by_stage = data[-1].get("state_bytes_by_stage") or {}
    t = time.monotonic()
    state_bytes = dir_bytes(checkpoint / "state")
    phases["state_scan_s"] = time.monotonic() - t
    return TidemarkRun(
        materializer_state_bytes=(sum(b for n, b in by_stage.items() if n.startswith("materializer"))
                                  if by_stage else None),
        state_by_stage=by_stage,
        workload=name, variant=variant, input_rows=input_rows,
        startup_s=(started - t_spawn) if t_spawn is not None else None, run_s=run_s, planning_s=planning_s,
        rows_per_s=input_rows / measured_s if measured_s > 0 else float("inf"),
        rows_per_s_with_planning=input_rows / run_s if run_s > 0 else float("inf"),
        peak_rss_bytes=peak, state_bytes=state_bytes, phases={k: round(v, 2) for k, v in phases.items()},
        state_current_version_bytes=int(data[-1].get("state_size_bytes") or 0),
        batches=len(data), rows_out=sum(e["rows_out"] for e in batches), exit_status=exit_status,
        workdir=str(workdir), table=table, columns=list(pipeline.sink.column_names),
        max_records_per_trigger=max_records_per_trigger, steady=steady.as_dict() if steady else None,
        batch_times=[(e["ts"], int(e["rows_in"])) for e in data],
    )


def _run_cli(sql_file: Path, bootstrap: str, checkpoint: Path, job_name: str, status: Path, log: Path, workdir: Path,
             max_records_per_trigger: int | None, timeout_s: float, what: str) -> tuple[float, int, int]:
    """``tidemark run --until-idle`` as a subprocess; returns (spawn time, peak RSS of its
    process tree, exit status)."""
    cmd = [TIDEMARK, "run", str(sql_file), "--bootstrap-servers", bootstrap, "--checkpoint", str(checkpoint),
           "--name", job_name, "--until-idle", "--trigger-interval", "100 milliseconds",
           "--log-file", str(workdir / "driver.log")]
    if max_records_per_trigger:
        cmd += ["--max-records-per-trigger", str(max_records_per_trigger)]
    env = dict(os.environ, TIDEMARK_STATUS_FILE=str(status), PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable))
    t_spawn = time.time()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)
    sampler = RssSampler(proc.pid)
    sampler.start()
    try:
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None:
            if time.monotonic() > deadline:
                raise TidemarkRunError(f"{what}: not idle after {timeout_s:.0f} s; see {log}")
            time.sleep(0.2)
    finally:
        peak = sampler.stop()
        _stop(proc)
    return t_spawn, peak, proc.returncode


# ---------------------------------------------------------------------------- a warm session


class TidemarkSession:
    """One Spark session in a child process (``tidemark_runner.py serve``) that runs
    workloads, each as ``tidemark run --until-idle`` runs it (``PipelineJob``: start until
    idle, wait, close; status events to a status file).

    Why: on this 2-core machine a fresh ``tidemark run`` spends 20-70 s starting its JVM
    and Spark session, so a suite of ~20 runs would spend most of its time there. Start-up
    is excluded from throughput either way; the session's is measured once
    (``startup_s``). What a warm session does change: the JVM's heap and the Python
    workers stay from the previous run, so the peak RSS of a run is at least the session's
    resident size from earlier runs (one session per workload keeps that within a
    workload).

    ``run`` may be called from several threads at once: each run is then a concurrent
    streaming query of the one Spark session (``suite.py --quick`` does that to be a
    one-minute smoke run; its timings and memory figures are then not measurements). The
    measured suite calls it from one thread, one run at a time."""

    def __init__(self, workdir: Path, java_options: str | None = None):
        """``java_options``: extra JVM flags for the session's JVM (``JAVA_TOOL_OPTIONS``;
        the quick smoke run's short-run flags), none by default."""
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        env = dict(os.environ, PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable))
        if java_options:
            env["JAVA_TOOL_OPTIONS"] = f"{env.get('JAVA_TOOL_OPTIONS', '')} {java_options}".strip()
        t = time.time()
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "serve", "--log-file", str(workdir / "driver.log")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
            start_new_session=True, text=True, bufsize=1,
        )
        self._lock = threading.Lock()
        self._next_id = 0
        #: run id -> (set when its reply arrived, [reply]); a reply of None: the session ended
        self._waiting: dict[int, tuple[threading.Event, list[dict[str, Any] | None]]] = {}
        self._ready = threading.Event()
        self._ready_line: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read_replies, name="tidemark-session-replies", daemon=True)
        self._reader.start()
        if not self._ready.wait(600) or not self._ready_line:
            self.close()
            raise TidemarkRunError(f"the Tidemark session did not start (see {self.workdir / 'driver.log'})")
        self.startup_s = self._ready_line[0]["ts"] - t

    def _read_replies(self) -> None:
        """The one reader of the child's stdout: the ready line, then one reply per run,
        handed to the run that waits for its id (runs may finish in any order)."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if not line.strip():
                continue
            msg = json.loads(line)
            if msg.get("event") == "ready":
                self._ready_line.append(msg)
                self._ready.set()
                continue
            with self._lock:
                waiter = self._waiting.pop(int(msg.get("id", -1)), None)
            if waiter is not None:
                waiter[1].append(msg)
                waiter[0].set()
        self._ready.set()  # ended: nobody waits in vain
        with self._lock:
            waiting, self._waiting = self._waiting, {}
        for event, box in waiting.values():
            box.append(None)
            event.set()

    def run(self, cmd: dict[str, Any], timeout_s: float) -> tuple[dict[str, Any], int]:
        """Send one run, wait for its reply; returns (reply, peak RSS of the session's
        process tree during the run)."""
        assert self.proc.stdin is not None
        event, box = threading.Event(), []
        with self._lock:
            run_id = self._next_id
            self._next_id += 1
            self._waiting[run_id] = (event, box)
        sampler = RssSampler(self.proc.pid)
        sampler.start()
        try:
            with self._lock:
                self.proc.stdin.write(json.dumps({**cmd, "id": run_id}) + "\n")
                self.proc.stdin.flush()
            if not event.wait(timeout_s) or not box or box[0] is None:
                raise TidemarkRunError(f"the Tidemark session did not answer run {cmd.get('name')} "
                                       f"(see {self.workdir / 'driver.log'})")
        finally:
            peak = sampler.stop()
        return box[0], peak

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        _stop(self.proc)

    def __enter__(self) -> TidemarkSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _head_and_tail(text: str, keep: int = 1500) -> str:
    """A long error's start (what failed) and end (the Python traceback's last frames)."""
    return text if len(text) <= 2 * keep else f"{text[:keep]} [...] {text[-keep:]}"


def _get(obj: Any, name: str) -> Any:
    """A field of a Spark progress entry (a dict, or an object in newer pyspark)."""
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def _start_planning_s(job: Any) -> float | None:
    """Spark's planning of the query's first batch (``durationMs.queryPlanning``): analysis,
    optimization, physical planning, the state schema checks and each keyed stage's Python
    processor pre-init, done once per query start. Flink does the same work (planning,
    job graph) before its job is RUNNING, where its throughput clock starts; taking this
    out of Tidemark's clock puts both at the same boundary."""
    for p in job.query.recentProgress if job.query is not None else []:
        durations = _get(p, "durationMs")
        if durations and durations.get("queryPlanning") is not None:
            return int(durations["queryPlanning"]) / 1000
    return None


def serve(log_file: Path) -> None:
    """The child side of ``TidemarkSession``: JSON lines in on stdin, one JSON line out on
    the original stdout per run (carrying the run's ``id``); the JVM's and Spark's output go
    to ``log_file``. Each run has its own thread, so runs sent before the previous one's
    reply are concurrent queries of the one Spark session."""
    proto = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    from tidemark.spark.session import build_session

    spark = build_session(app_name="tidemark-bench", log_level="ERROR")
    proto.write(json.dumps({"event": "ready", "ts": time.time()}) + "\n")
    lock = threading.Lock()

    def handle(cmd: dict[str, Any]) -> None:
        reply = _serve_one(spark, cmd)
        with lock:
            proto.write(json.dumps({**reply, "id": cmd.get("id")}) + "\n")

    threads = []
    for line in sys.stdin:
        if line.strip():
            threads.append(threading.Thread(target=handle, args=(json.loads(line),), daemon=True))
            threads[-1].start()
    for th in threads:
        th.join()


def _bench_state_buckets() -> int | None:
    """``TIDEMARK_BENCH_STATE_BUCKETS``: the state bucket count the session's jobs use (unset:
    the job's default), so bucket counts are compared on the same workload and load."""
    value = os.environ.get(STATE_BUCKETS_ENV)
    return int(value) if value else None


def _serve_one(spark: Any, cmd: dict[str, Any]) -> dict[str, Any]:
    """One run in the session, as ``tidemark run --until-idle`` runs it; its reply."""
    from tidemark.spark.job import PipelineJob
    from tidemark.spark.progress import StatusFile

    status = StatusFile(cmd["status"])
    phases: dict[str, float] = {}
    t = time.monotonic()

    def lap(name: str) -> None:
        nonlocal t
        now = time.monotonic()
        phases[name] = round(now - t, 2)
        t = now

    try:
        pipeline = compile_sql(Path(cmd["sql_file"]).read_text(encoding="utf-8"))
        job = PipelineJob(spark, pipeline, cmd["bootstrap"], cmd["checkpoint"], name=cmd["name"],
                          max_records_per_trigger=cmd.get("max_records_per_trigger"),
                          trigger_interval="100 milliseconds", on_batch=status.batch,
                          state_buckets=_bench_state_buckets())
        lap("compile_s")
        try:
            job.ensure_topics()
            job.start(until_idle=True)
            status.emit("started")
            lap("start_s")
            job.wait(poll_s=0.1)  # the batch event (our clock) lags the commit by <= one poll
            lap("wait_s")
        finally:
            job.close()
        lap("close_s")
        status.emit("idle")
        return {"ok": True, "exit_status": 0, "phases": phases,
                "planning_s": _start_planning_s(job)}
    except Exception as err:  # reported to the harness, which fails the run loudly
        import traceback

        traceback.print_exc()
        return {"ok": False, "exit_status": getattr(err, "exit_status", 1),
                "error": f"{type(err).__name__}: {_head_and_tail(str(err).strip())}"}


# ---------------------------------------------------------------------------- latency


def latency(bootstrap: str, workdir: Path, *, rate: float, seconds: float, backlog: int,
            warmup_s: float) -> dict[str, Any]:
    """End-to-end latency of the seed's s1/s2 join (the W2 DEDUPLICATE pipeline's shape)
    at a fixed input rate, by ``bench_e2e.py``'s method and code: a warm job (``warmup_s`` of
    inserts at the rate first, unmeasured), s1 inserts at ``rate`` rows/s for ``seconds``, latency = first visibility in the sink - produce
    time, reported only if the job kept up (``sustained.keep_up``); then a ``backlog`` of
    inserts drained as fast as the job goes. No per-batch cap: a micro-batch takes what
    arrived meanwhile, as a deployed job would (a cap would make it fall behind by design)."""
    sys.path.insert(0, str(Path(__file__).parent))
    import bench_e2e

    workdir.mkdir(parents=True, exist_ok=True)
    return bench_e2e.one_run(bootstrap, workdir, f"lat-{uuid.uuid4().hex[:6]}", rate, seconds, backlog,
                             max_records_per_trigger=None, warmup_s=warmup_s)


def main() -> None:
    """Run one workload by hand: ``tidemark_runner.py NAME [--scale S]``."""
    import argparse
    import tempfile

    from tidemark.kafka.broker import EmbeddedBroker, configured_bootstrap

    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        sp = argparse.ArgumentParser()
        sp.add_argument("serve")
        sp.add_argument("--log-file", type=Path, required=True)
        serve(sp.parse_args().log_file)
        return
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("workload")
    ap.add_argument("--session", action="store_true", help="run in a warm session (twice: cold, then warm)")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--variant", default="")
    ap.add_argument("--max-records-per-trigger", type=int, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the work directory (inputs, checkpoints, logs)")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    import workloads

    work = Path(tempfile.mkdtemp(prefix="tidemark-bench-run-"))
    w = workloads.generate(args.workload, args.scale, args.seed, work / "input")
    variant = args.variant or next(iter(w.tidemark_variants))
    with contextlib.ExitStack() as stack:
        if not args.keep:
            stack.callback(shutil.rmtree, work, True)
        bootstrap = configured_bootstrap()
        if bootstrap is None:
            bootstrap = stack.enter_context(EmbeddedBroker()).bootstrap_servers
        session = stack.enter_context(TidemarkSession(work / "session")) if args.session else None
        for i in range(2 if session else 1):
            res = run_workload(name=w.name, variant=variant, sql=w.tidemark_variants[variant], files=w.tables,
                               input_rows=w.input_rows, bootstrap=bootstrap, workdir=work / f"run{i}",
                               max_records_per_trigger=args.max_records_per_trigger, session=session,
                               progress=lambda t: print(t, file=sys.stderr, flush=True))
            print(json.dumps(res.figures()), file=sys.stderr)
        if session:
            print(f"session start-up {session.startup_s:.1f} s", file=sys.stderr)
    print(json.dumps(res.figures(), indent=1))
    print(f"{len(res.table)} sink rows; equal to the workload's expected table: {res.table == w.expected}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
