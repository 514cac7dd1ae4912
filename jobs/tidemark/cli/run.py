"""``tidemark run [--init FILE]... FILE.sql``: run a pipeline on Spark, from its Kafka source topics to its
sink topic, until stopped (SIGTERM / Ctrl-C) or, with ``--until-idle``, until everything
in the source topics has been written.

The terminal gets what a user needs and nothing else: which broker and checkpoint are
used, one line per micro-batch (rows in/out, dead letters, lag, duration), and on failure
one line saying what went wrong. Spark's and the JVM's own output (log4j, Python worker
chatter, stack traces) goes to a log file (``--log-file``, by default ``driver.log`` next
to the checkpoint; ``--verbose`` leaves it on the terminal).

Exit status: 0 finished (``--until-idle``, or stopped by SIGTERM/SIGINT/stdin EOF);
2 bad SQL, plan or arguments; 3 ``ON CONFLICT DO ERROR`` found a conflict; 4 no Java 17+;
5 Kafka unreachable / no embedded broker; 1 anything else (see the log file).

Under the control service (``docs/control.md``): ``TIDEMARK_STATUS_FILE`` gets JSON Lines
status events, ``TIDEMARK_PIPELINE`` is the default name, ``TIDEMARK_EXIT_ON_STDIN_EOF=1``
stops the job when its stdin closes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, TextIO

import typer

from tidemark.cli.script import InitOption, compile_script, read_init
from tidemark.engine.errors import TidemarkError


class RunUsageError(TidemarkError):
    exit_status = 2


def _terminal() -> TextIO:
    """A stream to the real terminal (stderr), still valid after ``_quiet_fds``."""
    return os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")


def _quiet_fds(log_file: Path | None) -> None:
    """With ``log_file``, point file descriptors 1 and 2 at it, so the JVM (started later,
    inheriting them), its Python workers and any stray library output land in the log,
    not on the terminal."""
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)


def _watch_stop(stop: threading.Event) -> None:
    """SIGTERM and SIGINT ask the job to stop; so does EOF on stdin when the control
    service asks for it (it died without stopping us)."""

    def on_signal(_signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if os.environ.get("TIDEMARK_EXIT_ON_STDIN_EOF") == "1":

        def read_until_eof() -> None:
            # the raw fd: a daemon thread blocked in sys.stdin.buffer.read holds the buffer's
            # lock, and interpreter shutdown then aborts (SIGABRT) a job that ended normally
            with contextlib.suppress(OSError):
                while os.read(0, 4096):
                    pass
            stop.set()

        threading.Thread(target=read_until_eof, name="stdin-eof", daemon=True).start()


def run(
    file: Annotated[Path, typer.Argument(help="Pipeline SQL file (CREATE TABLE ...; INSERT INTO ... SELECT ...).")],
    bootstrap_servers: Annotated[
        str | None,
        typer.Option("--bootstrap-servers", help="Kafka brokers. Default: $KAFKA_BOOTSTRAP_SERVERS, else an embedded broker is started."),
    ] = None,
    checkpoint: Annotated[
        str | None, typer.Option("--checkpoint", help="Checkpoint directory (offsets and state). Default: ./checkpoints/NAME.")
    ] = None,
    master: Annotated[
        str | None, typer.Option("--master", help="Spark master URL. Default: $TIDEMARK_SPARK_MASTER or local[*].")
    ] = None,
    until_idle: Annotated[
        bool, typer.Option("--until-idle", metavar="", help="A flag (takes no value): stop once everything in the source topics has been written to the sink.")
    ] = False,
    max_records_per_trigger: Annotated[
        int | None, typer.Option("--max-records-per-trigger", min=1, help="Rate limit: at most N source records per micro-batch.")
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="Pipeline name (dead letters go to NAME.dlq). Default: $TIDEMARK_PIPELINE or the file's stem.")
    ] = None,
    trigger_interval: Annotated[
        str, typer.Option("--trigger-interval", help="How often a running job looks for new records (Spark processing-time trigger).")
    ] = "500 milliseconds",
    registry_url: Annotated[
        str | None, typer.Option("--schema-registry", help="Schema registry URL for Avro formats (Confluent wire format).")
    ] = None,
    log_file: Annotated[
        Path | None, typer.Option("--log-file", help="Where Spark's own output goes. Default: CHECKPOINT/driver.log.")
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", metavar="", help="Leave Spark's output (WARN and above) on the terminal.")] = False,
    index_url: Annotated[
        str | None,
        typer.Option("--index-url", help="Index service for delta joins (registers the tables it needs). Default: an embedded one on loopback for the job's lifetime."),
    ] = None,
    index_token: Annotated[
        str | None,
        typer.Option("--index-token", envvar="TIDEMARK_INDEX_TOKEN", show_envvar=True,
                     help="Bearer token of the --index-url service (every request: registering tables, lookups, releasing fences)."),
    ] = None,
    kafka_config: Annotated[
        Path | None,
        typer.Option("--kafka-config", help="librdkafka settings (key=value lines, e.g. security.protocol=SASL_SSL) for every Kafka client (source, sink, admin, dead letters, index feed)."),
    ] = None,
    state_buckets: Annotated[
        int | None,
        typer.Option("--state-buckets", min=1,
                     help="State buckets per keyed stage, fixed when the checkpoint is created (default 2, one per shuffle partition). "
                          "Fewer: fewer state calls per batch; more: less state rewritten per touched bucket."),
    ] = None,
    init: InitOption = [],  # noqa: B006 - typer reads the default, never mutates it
) -> None:
    """Run a pipeline on Spark from Kafka to Kafka.

    --init files run first (e.g. --init sources.sql holding the CREATE TABLEs several pipelines share).
    """
    from tidemark.spark.progress import StatusFile

    status = StatusFile.from_env()
    term = _terminal()
    try:
        code = _run(
            file, bootstrap_servers, checkpoint, master, until_idle, max_records_per_trigger, name,
            trigger_interval, registry_url, log_file, verbose, status, term, index_url, index_token,
            state_buckets=state_buckets, kafka_config=kafka_config, init=init,
        )
    except TidemarkError as err:
        status.emit("error", message=str(err))
        term.write(f"error: {err}\n")
        term.flush()
        raise typer.Exit(err.exit_status) from None
    except Exception as err:  # a bug or an environment failure: one line here, the rest in the log
        import traceback

        traceback.print_exc()  # to stderr, which is the log file once Spark is set up
        message = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
        status.emit("error", message=message)
        term.write(f"error: {message}\n")
        term.flush()
        raise typer.Exit(1) from None
    raise typer.Exit(code)


def _run(
    file: Path, bootstrap_servers: str | None, checkpoint: str | None, master: str | None,
    until_idle: bool, max_records_per_trigger: int | None, name: str | None, trigger_interval: str,
    registry_url: str | None, log_file: Path | None, verbose: bool, status: Any, term: TextIO,
    index_url: str | None = None, index_token: str | None = None, state_buckets: int | None = None,
    kafka_config: Path | None = None, init: Sequence[Path] = (),
) -> int:
    from tidemark.engine.fingerprint import take_over
    from tidemark.kafka.broker import configured_bootstrap
    from tidemark.kafka.config import check_tables, use_config_file
    from tidemark.spark.watermark import check_supported as check_event_time
    from tidemark.spark.session import check_java

    try:
        sql = file.read_text(encoding="utf-8")
    except OSError as e:
        raise RunUsageError(f"{file}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise RunUsageError(f"{file}: not UTF-8 text ({e.reason})") from None
    init_files = read_init(init)
    use_config_file(str(kafka_config) if kafka_config else None)  # before any client, inherited by Spark
    try:
        pipeline = compile_script(sql, init_files)
        check_tables(pipeline.tables)
        check_event_time(pipeline)  # before Spark starts: what the Spark host cannot run yet
    except TidemarkError as e:
        raise _prefixed(e, str(file)) from None
    name = name or os.environ.get("TIDEMARK_PIPELINE") or file.stem
    checkpoint = checkpoint or os.path.join("checkpoints", name)
    take_over(checkpoint, pipeline)  # refuses a plan that cannot read the checkpoint's state
    check_java()

    stop = threading.Event()
    _watch_stop(stop)
    bootstrap = configured_bootstrap(bootstrap_servers)
    with contextlib.ExitStack() as stack:
        if bootstrap is None:
            from tidemark.kafka.broker import EmbeddedBroker

            broker = stack.enter_context(EmbeddedBroker())
            bootstrap = broker.bootstrap_servers
            assert bootstrap is not None
            note = "memory only: its topics vanish when this command exits" if broker.kind == "tansu" else "a Kafka container"
            term.write(
                f"no --bootstrap-servers and no KAFKA_BOOTSTRAP_SERVERS: started an embedded broker "
                f"({broker.kind}, {note}) at {bootstrap}\n"
            )
        log_path = None if verbose else (log_file or Path(checkpoint) / "driver.log")
        _quiet_fds(log_path)
        return _run_job(pipeline, name, bootstrap, checkpoint, master, until_idle, max_records_per_trigger,
                        trigger_interval, registry_url, log_path, status, stop, term, index_url, index_token,
                        state_buckets=state_buckets)


class QuietBatches:
    """Decides which batches are worth a terminal line and a status event. A pipeline
    with timer stages (full-compaction merge engines) makes Spark run an empty batch at
    every trigger; reporting each would print two lines a second forever. An empty batch
    (nothing read, written or dead-lettered, lag unchanged) is shown only once a minute,
    as a heartbeat."""

    HEARTBEAT_S = 60.0

    def __init__(self, clock: Any = None) -> None:
        import time

        self.clock = clock or time.monotonic
        self._last_lag: Any = None
        self._last_shown = float("-inf")

    def show(self, report: Any) -> bool:
        now = self.clock()
        empty = not (report.rows_in or report.rows_out or report.dlq or report.conflicts)
        if empty and report.lag == self._last_lag and now - self._last_shown < self.HEARTBEAT_S:
            return False
        self._last_lag = report.lag
        self._last_shown = now
        return True


def _prefixed(err: TidemarkError, where: str) -> TidemarkError:
    """The same error (class and exit status) with the file name in front."""
    err.args = (f"{where}: {err}",)
    return err


def _run_job(
    pipeline: Any, name: str, bootstrap: str, checkpoint: str, master: str | None, until_idle: bool,
    max_records_per_trigger: int | None, trigger_interval: str, registry_url: str | None,
    log_path: Path | None, status: Any, stop: threading.Event, term: TextIO,
    index_url: str | None = None, index_token: str | None = None, state_buckets: int | None = None,
) -> int:
    from tidemark.spark.job import JobError, PipelineJob
    from tidemark.spark.progress import TerminalProgress
    from tidemark.spark.session import build_session

    progress = TerminalProgress(term)
    progress.say(
        f"tidemark run {name}: sink {', '.join(t.table.name for t in pipeline.sinks)}, brokers {bootstrap}, checkpoint {checkpoint}"
        + (f", Spark log {log_path}" if log_path else "")
    )
    from tidemark.kafka.admin import KafkaAdminError
    from tidemark.kafka.broker import broker_answers

    if not broker_answers(bootstrap, timeout_s=15.0):
        raise KafkaAdminError(f"no Kafka broker answers at {bootstrap} (check --bootstrap-servers)")
    spark = build_session(app_name=f"tidemark-{name}", master=master, log_level="ERROR" if log_path else "WARN")
    quiet = QuietBatches()

    def on_batch(report: Any) -> None:
        if not quiet.show(report):
            return
        progress.batch(report)
        status.batch(report)
        if report.total_lag == 0 and not until_idle:
            status.emit("idle")

    job = PipelineJob(
        spark, pipeline, bootstrap, checkpoint, name=name, max_records_per_trigger=max_records_per_trigger,
        registry_url=registry_url, trigger_interval=trigger_interval, on_batch=on_batch,
        index_url=index_url, index_token=index_token, state_buckets=state_buckets,
    )
    try:
        created = job.ensure_topics()
        if created:
            progress.say(f"created topics: {', '.join(created)}")
        job.start(until_idle=until_idle)
        if job.index is not None:
            where = f"embedded at {job.index.url}" if job.index.embedded is not None else job.index.url
            progress.say(f"delta join index service {where}: {', '.join(t.name for t in job.index.tables)}")
        status.emit("started")
        try:
            job.wait(stop)
        except JobError as err:
            if log_path:
                err.args = (f"{err} (details in {log_path})",)
            raise
    finally:
        job.close()
    total_in, total_out, dlq = (sum(getattr(r, f) for r in job.reports) for f in ("rows_in", "rows_out", "dlq"))
    if until_idle:
        status.emit("idle")
    how = "stopped" if stop.is_set() else "idle: every source record is written"
    progress.say(
        f"{how}. {len(job.reports)} batch(es), {total_in} records in, {total_out} changes out, "
        f"{dlq} dead letter(s) in {job.dlq_topic}"
    )
    return 0
