"""How the supervisor stops a job's process group: the job first and alone (so Spark's JVM,
in the same group, keeps running while the job commits its last batch), the rest after."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

from tidemark.control.supervisor import terminate_group

# a member of the job's group standing in for the JVM: logs the SIGTERM it gets
MEMBER = textwrap.dedent("""
    import signal, sys, time
    log = sys.argv[1]
    def on_term(*_):
        open(log, "a").write("member got SIGTERM\\n")
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term if sys.argv[2] == "obeys" else signal.SIG_IGN)
    open(log, "a").write("member up\\n")
    while True:
        time.sleep(1)
""")

# the job: starts the member, and on SIGTERM takes a while to finish (a batch committing)
JOB = textwrap.dedent("""
    import signal, subprocess, sys, time
    log, member, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    subprocess.Popen([sys.executable, "-c", member, log, mode])
    def on_term(*_):
        time.sleep(0.5)
        open(log, "a").write("job done\\n")
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term if mode == "obeys" else signal.SIG_IGN)
    while True:
        time.sleep(1)
""")


def start_job(log: Path, mode: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", JOB, str(log), MEMBER, mode], start_new_session=True)
    deadline = time.monotonic() + 30
    while "member up" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, "the job's group did not start"
        time.sleep(0.05)
    return proc


def group_alive(pgid: int) -> bool:
    """Whether a live (not zombie) process is left in the group."""
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):  # gone meanwhile
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                return True
    return False


def test_the_job_finishes_before_the_rest_of_its_group_is_signalled(tmp_path):
    log = tmp_path / "log"
    proc = start_job(log, "obeys")
    terminate_group(proc, timeout_s=20)
    assert proc.returncode == 0
    deadline = time.monotonic() + 10
    while group_alive(proc.pid):
        assert time.monotonic() < deadline, "a member of the group outlived the stop"
        time.sleep(0.05)
    assert log.read_text().splitlines() == ["member up", "job done", "member got SIGTERM"]


def test_a_job_that_does_not_stop_in_time_is_killed_with_its_group(tmp_path):
    log = tmp_path / "log"
    proc = start_job(log, "ignores")
    started = time.monotonic()
    terminate_group(proc, timeout_s=1)
    assert proc.returncode == -9 and time.monotonic() - started < 10
    deadline = time.monotonic() + 10
    while group_alive(proc.pid):
        assert time.monotonic() < deadline, "a member of the group outlived SIGKILL"
        time.sleep(0.05)
    assert "member got SIGTERM" not in log.read_text()
