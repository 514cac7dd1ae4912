"""The embedded index service: one ``tidemark index`` child process owned by a control
service that was given no ``--index-url``.

It listens on loopback on a free port, with a random token of its own (passed in its
environment as ``TIDEMARK_INDEX_TOKEN``, never on a command line), on the control service's brokers. It is started the
first time a delta-join pipeline needs it and reused for every later one. It dies with the
control service whatever way that ends: a clean shutdown stops it, and the child watches its
stdin (a pipe from the control service) and stops itself at EOF, so a SIGKILLed control
service leaves no index service behind.

``python -m tidemark.control.index_process ARGS`` is that child: ``tidemark index ARGS``
plus the stdin watch.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from tidemark.index_client import INDEX_TOKEN_ENV

log = logging.getLogger("tidemark.control.index_process")


class EmbeddedIndexError(Exception):
    """The embedded index service could not be started; the message says why."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EmbeddedIndex:
    """Starts lazily (``ensure()``), thread-safe, restarted if it died since last asked."""

    def __init__(self, bootstrap_servers: str, workdir: Path, start_timeout_s: float = 90.0):
        self.bootstrap_servers = bootstrap_servers
        self.workdir = workdir
        self.start_timeout_s = start_timeout_s
        self.token = secrets.token_urlsafe(24)
        self.url: str | None = None
        self.starts = 0  # how many processes were launched (tests: started once, then reused)
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    @property
    def log_path(self) -> Path:
        return self.workdir / "index.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def ensure(self) -> str:
        """The URL of a running embedded index service, starting one if needed."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is None and self.url:
                return self.url
            if self._proc is not None:
                log.warning("embedded index service exited with status %s; starting a new one "
                            "(it rebuilds its tables from their topics once registered again)", self._proc.returncode)
            last_error = ""
            for _attempt in range(3):  # a free port can be taken between probing and binding
                url, last_error = self._launch()
                if url:
                    self.url = url
                    return url
            raise EmbeddedIndexError(f"the embedded index service did not start: {last_error}")

    def _launch(self) -> tuple[str | None, str]:
        self.workdir.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        # its own token only: not the control service's API token, which it has no use for
        env = {**{k: v for k, v in os.environ.items() if k != "TIDEMARK_API_TOKEN"}, INDEX_TOKEN_ENV: self.token}
        argv = [sys.executable, "-m", "tidemark.control.index_process", "--host", "127.0.0.1", "--port", str(port),
                "--bootstrap-servers", self.bootstrap_servers]
        with open(self.log_path, "ab") as out:
            start = out.tell()
            self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out, stderr=out, env=env,
                                          start_new_session=True)
        self.starts += 1
        log.info("embedded index service: pid %d on %s (log %s)", self._proc.pid, url, self.log_path)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return None, f"exit status {self._proc.returncode}: {self._log_tail(start)}"
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    return url, ""
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self._terminate()
        return None, f"not healthy within {self.start_timeout_s:.0f}s: {self._log_tail(start)}"

    def _log_tail(self, start: int, n: int = 5) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(start)
                lines = [ln for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
        except OSError:
            return "(no log)"
        return " | ".join(lines[-n:]) or "(no output)"

    def close(self) -> None:
        with self._lock:
            self._terminate()
            self.url = None

    def _terminate(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(15)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        finally:
            if proc.stdin:
                proc.stdin.close()


def _exit_at_stdin_eof() -> None:
    """SIGTERM ourselves (uvicorn's clean shutdown) once the owner's pipe closes. Reads the
    raw descriptor: a daemon thread blocked in ``sys.stdin.buffer.read`` holds the buffer's
    lock, and the interpreter aborts (SIGABRT) when it cannot take it at shutdown."""
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGTERM)


def main(args: list[str]) -> None:
    from tidemark.cli.main import app

    threading.Thread(target=_exit_at_stdin_eof, name="stdin-eof", daemon=True).start()
    app(["index", *args], prog_name="tidemark")


if __name__ == "__main__":
    main(sys.argv[1:])
