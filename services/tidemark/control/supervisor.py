"""Runs one pipeline's job as a child process and keeps it honest.

The job is an argv list (the SQL travels in a file, never through a shell), started in
its own process group so that nothing it spawned (the Spark JVM, Python workers) outlives
it. Its stdout and stderr go to log files in the pipeline's directory (a pipe nobody
drains would stall the job); its progress comes through the status file
(``status_channel``). A job that exits non-zero is failed with its error; with ``restart``
it is started again after an exponential, capped backoff (tenacity), and the sleep is cut
short by ``stop()``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import tenacity

from tidemark.control.status_channel import FileTail, JobProgress

log = logging.getLogger("tidemark.control.supervisor")

STDERR_TAIL_LINES = 12


class JobDied(Exception):
    """The job exited with a non-zero status; the message is what the user sees."""


@dataclass
class JobSpec:
    name: str
    argv: list[str]
    workdir: Path
    env: dict[str, str] = field(default_factory=dict)
    restart: bool = False
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0
    stop_timeout_s: float = 20.0
    # run before each launch (in the supervisor's thread, off the reconcile loop): returns
    # extra arguments and environment, e.g. where the index service is; raising fails the run
    prepare: Callable[[], tuple[list[str], dict[str, str]]] | None = None

    @property
    def status_file(self) -> Path:
        return self.workdir / "status.jsonl"

    @property
    def pid_file(self) -> Path:
        return self.workdir / "job.pid"


class JobSupervisor:
    """``state``: starting -> running -> (stopped | failed); ``failed`` keeps ``error``."""

    def __init__(self, spec: JobSpec, progress: JobProgress | None = None,
                 on_finished: Callable[[str], None] | None = None,
                 lease_deadline: Callable[[], float] | None = None):
        """``lease_deadline()`` is when this service's right to run the job ends unless
        renewed; the job is stopped at that instant by this loop itself, so fencing works
        even if whatever renews the lease hangs."""
        self.spec = spec
        self.progress = progress or JobProgress()
        self.state = "starting"
        self.error: str | None = None
        self.restarts = 0
        self.pid: int | None = None
        self.finished_cleanly = False
        self._on_finished = on_finished
        self._lease_deadline = lease_deadline
        self.fenced = False
        self._stop = threading.Event()
        self._proc: subprocess.Popen | None = None
        self._thread = threading.Thread(target=self._main, name=f"job-{spec.name}", daemon=True)

    # -- public -------------------------------------------------------------------------

    def start(self) -> None:
        self.spec.workdir.mkdir(parents=True, exist_ok=True)
        self._thread.start()

    def stop(self, wait: bool = True) -> None:
        self._stop.set()
        if wait and self._thread.is_alive():
            self._thread.join(self.spec.stop_timeout_s + 10)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def snapshot(self) -> dict:
        return {"state": self.state, "error": self.error, "restarts": self.restarts, "pid": self.pid,
                **self.progress.snapshot()}

    # -- the supervision loop -----------------------------------------------------------

    def _main(self) -> None:
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(
                lambda exc: isinstance(exc, JobDied) and self.spec.restart and not self._stop.is_set()),
            wait=tenacity.wait_exponential(multiplier=self.spec.backoff_base_s, min=self.spec.backoff_base_s,
                                           max=self.spec.backoff_max_s),
            sleep=self._stop.wait,  # interruptible: stop() ends a backoff at once
            before_sleep=self._before_restart,
            reraise=True,
        )
        try:
            retrying(self._run_once)
            self.state = "stopped"
        except JobDied as died:
            self.state, self.error = "failed", str(died)
            log.warning("pipeline %s failed: %s", self.spec.name, died)
        except Exception as exc:  # a launch problem (missing binary...) is a failure, not a crash
            self.state, self.error = "failed", f"could not run the job: {exc}"
            log.exception("pipeline %s: supervisor error", self.spec.name)
        finally:
            self.pid = None
        if self.finished_cleanly and self._on_finished is not None:
            self._on_finished(self.spec.name)

    def _before_restart(self, retry_state: tenacity.RetryCallState) -> None:
        self.restarts += 1
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        self.state, self.error = "failed", str(exc)
        delay = retry_state.next_action.sleep if retry_state.next_action else 0.0
        log.warning("pipeline %s: job died (%s); restart %d in %.1fs", self.spec.name, exc, self.restarts, delay)

    def _run_once(self) -> None:
        if self._stop.is_set():
            return
        if self._lease_deadline is not None and time.time() >= self._lease_deadline():
            self.fenced = True
            return
        spec = self.spec
        kill_stale_job(spec.pid_file)
        spec.status_file.unlink(missing_ok=True)
        tail = FileTail(str(spec.status_file))
        self.progress.error = None
        self.progress.ready = False
        self.state = "starting"
        extra_argv, extra_env = self._prepare()
        if self._stop.is_set():
            return
        argv = [*spec.argv, *extra_argv]
        env = {**os.environ, **spec.env, **extra_env, "TIDEMARK_STATUS_FILE": str(spec.status_file),
               "TIDEMARK_PIPELINE": spec.name, "TIDEMARK_EXIT_ON_STDIN_EOF": "1"}
        with open(spec.workdir / "stdout.log", "ab") as out, open(spec.workdir / "stderr.log", "ab") as err:
            err_start = err.tell()
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out, stderr=err, env=env,
                                    cwd=spec.workdir, start_new_session=True)
        self._proc, self.pid = proc, proc.pid
        spec.pid_file.write_text(json.dumps({"pid": proc.pid, "argv": argv}))
        log.info("pipeline %s: job started, pid %d: %s", spec.name, proc.pid, " ".join(argv))
        try:
            while proc.poll() is None:
                self._read_status(tail)
                if self._lease_deadline is not None and time.time() >= self._lease_deadline():
                    log.warning("pipeline %s: lease expired before renewal; stopping the job", spec.name)
                    self.fenced = True
                    self._stop.set()
                if self._stop.wait(0.2):
                    terminate_group(proc, spec.stop_timeout_s)
            self._read_status(tail)
        finally:
            if proc.stdin:
                proc.stdin.close()
            spec.pid_file.unlink(missing_ok=True)
        rc = proc.returncode
        log.info("pipeline %s: job exited with status %s", spec.name, rc)
        if self._stop.is_set():
            return
        if rc == 0:
            self.finished_cleanly = True
            return
        raise JobDied(self._failure_message(rc, err_start))

    def _prepare(self) -> tuple[list[str], dict[str, str]]:
        if self.spec.prepare is None:
            return [], {}
        try:
            return self.spec.prepare()
        except Exception as exc:  # shown as the failure, like a job's own error
            log.warning("pipeline %s: could not prepare the job: %s", self.spec.name, exc)
            raise JobDied(f"not started: {exc}") from exc

    def _read_status(self, tail: FileTail) -> None:
        for line in tail.read_lines():
            self.progress.apply_line(line)
        if self.progress.ready and self.state == "starting":
            self.state, self.error = "running", None

    def _failure_message(self, rc: int, err_start: int) -> str:
        how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}"
        if self.progress.error:
            return f"{how}: {self.progress.error}"
        lines = stderr_tail(self.spec.workdir / "stderr.log", err_start)
        return f"{how}: " + ("\n".join(lines) if lines else "(no output on stderr)")


def stderr_tail(path: Path, start: int, n: int = STDERR_TAIL_LINES, max_bytes: int = 16384) -> list[str]:
    """The last ``n`` non-empty lines this run wrote to stderr."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            end = f.tell()
            f.seek(max(start, end - max_bytes))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    return [ln for ln in text.splitlines() if ln.strip()][-n:]


def terminate_group(proc: subprocess.Popen, timeout_s: float) -> None:
    """Stop the job, then whatever of its process group outlived it.

    SIGTERM goes to the job alone, never to the group: the job stops its query, letting a
    batch in flight commit and report, and then Spark. The JVM is in the same group, and a
    group-wide SIGTERM runs its shutdown hooks at once: the SparkContext stops under that
    batch, whose commit then fails, and the job exits with an error having lost the
    batch's report. The group gets SIGKILL after the grace, SIGTERM after a clean exit
    (a member still shutting down)."""
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout_s)
        leftover = signal.SIGTERM
    except subprocess.TimeoutExpired:
        leftover = signal.SIGKILL
    _signal_group(proc.pid, leftover)
    proc.wait()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):  # the group is gone (or its pid reused)
        pass


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while Path(f"/proc/{pid}").exists():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def kill_stale_job(pid_file: Path, timeout_s: float = 10.0) -> None:
    """A control service killed with SIGKILL leaves its job running; the next service on the
    same state dir stops that job before starting a new one on the same checkpoint. Only a
    process whose command line is the recorded one is touched (pids get reused)."""
    try:
        recorded = json.loads(pid_file.read_text())
        pid, argv = int(recorded["pid"]), list(recorded["argv"])
    except (OSError, ValueError, KeyError, TypeError):
        return
    try:
        cmdline = [c.decode(errors="replace") for c in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if c]
    except OSError:
        cmdline = []
    # argv[0] may be a script run through its interpreter; the arguments (which hold the
    # pipeline's own SQL path) must match exactly
    if not argv or cmdline[len(cmdline) - len(argv) + 1:] != argv[1:] or len(cmdline) < len(argv):
        pid_file.unlink(missing_ok=True)
        return
    log.warning("stopping a job left behind by a previous control service: pid %d", pid)
    try:  # like terminate_group, for a job that is not our child
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    _signal_group(pid, signal.SIGTERM if _wait_gone(pid, timeout_s) else signal.SIGKILL)
    pid_file.unlink(missing_ok=True)
