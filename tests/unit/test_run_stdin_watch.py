"""`tidemark run` under the control service watches stdin for EOF (the service died). The
watching thread must not turn a normal exit into SIGABRT: it once blocked in
``sys.stdin.buffer.read``, whose lock interpreter shutdown then could not take."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import threading, time
    from tidemark.cli.run import _watch_stop
    stop = threading.Event()
    _watch_stop(stop)
    time.sleep(0.2)  # the watcher is now blocked reading stdin
    print("stopped" if stop.is_set() else "running", flush=True)
    """
)


def _run(close_stdin: bool) -> subprocess.CompletedProcess:
    env = {**os.environ, "TIDEMARK_EXIT_ON_STDIN_EOF": "1"}
    read_end, write_end = os.pipe()
    if close_stdin:
        os.close(write_end)
    try:
        return subprocess.run(
            [sys.executable, "-c", SCRIPT], stdin=read_end, capture_output=True, env=env, text=True, timeout=60
        )
    finally:
        os.close(read_end)
        if not close_stdin:
            os.close(write_end)  # held open until the child has exited


def test_exit_with_stdin_still_open_is_clean() -> None:
    done = _run(close_stdin=False)
    assert done.stdout.strip() == "running"
    assert done.returncode == 0, f"exit status {done.returncode} (SIGABRT is -6)"


def test_stdin_eof_asks_the_job_to_stop() -> None:
    done = _run(close_stdin=True)
    assert done.stdout.strip() == "stopped"
    assert done.returncode == 0
