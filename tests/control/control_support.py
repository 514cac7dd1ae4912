"""Helpers shared by the control service tests: a service on a free loopback port, polling."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import uvicorn

from tidemark.control.app import create_app
from tidemark.control.controller import Controller
from tidemark.control.settings import ControlSettings

HERE = Path(__file__).parent
FAKE_JOB = [sys.executable, str(HERE / "fake_job.py")]
TOKEN = "test-token-" + uuid.uuid4().hex
EXAMPLE_SQL = (HERE.parent.parent / "examples" / "s1_s2_join.sql").read_text()


class Service:
    """One control service on a free loopback port; ``client`` carries the token."""

    def __init__(self, settings: ControlSettings, token: str | None):
        self.settings = settings
        self.controller = Controller(settings)
        self.app = create_app(self.controller, token, max_body_bytes=settings.max_body_bytes)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_config=None, access_log=False,
                                                    timeout_graceful_shutdown=5))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        self.client = httpx.Client(base_url=self.url, timeout=30,
                                   headers={"Authorization": f"Bearer {token}"} if token else {})
        wait_for(lambda: self._get_ready(), what=f"service on {self.url} ready")

    def _get_ready(self) -> bool:
        try:
            return httpx.get(self.url + "/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        """Clean shutdown: lifespan stops the jobs and releases their leases."""
        self.server.should_exit = True
        self.thread.join(30)
        self.client.close()

    def status(self, name: str) -> dict:
        r = self.client.get(f"/v1/pipelines/{name}/status")
        assert r.status_code == 200, r.text
        return r.json()


def wait_for(cond: Callable[[], object], timeout: float = 30.0, what: str = "condition") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def example_sql(name: str) -> str:
    """The example with a sink topic of its own: two pipelines may not write one topic."""
    return EXAMPLE_SQL.replace("'topic' = 't1'", f"'topic' = 't1-{name}'")


def register(svc: Service, name: str, sql: str | None = None, **options) -> httpx.Response:
    """Register ``sql``; by default the example, writing to a sink topic named after ``name``."""
    body = {"name": name, "sql": example_sql(name) if sql is None else sql, "options": options}
    return svc.client.post("/v1/pipelines", json=body)


def job_intervals(log_path: Path) -> dict[str, list[tuple[float, float]]]:
    """Per pipeline, the (start, end) of every stand-in job run; a run still going ends at +inf."""
    import json

    runs: dict[int, dict] = {}
    for line in log_path.read_text().splitlines():
        e = json.loads(line)
        run = runs.setdefault(e["pid"], {"name": e["name"], "start": None, "end": float("inf")})
        run[e["event"]] = e["t"]
    out: dict[str, list[tuple[float, float]]] = {}
    for run in runs.values():
        out.setdefault(run["name"], []).append((run["start"], run["end"]))
    return {name: sorted(v) for name, v in out.items()}


def assert_never_overlapped(intervals: dict[str, list[tuple[float, float]]]) -> None:
    for name, runs in intervals.items():
        for (s1, e1), (s2, e2) in zip(runs, runs[1:]):
            assert e1 <= s2, f"pipeline {name}: a run [{s1}, {e1}] overlapped the next [{s2}, {e2}]"


TIDEMARK = str(Path(sys.executable).parent / "tidemark")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """``tidemark control`` as a child process with its stderr in a file."""

    def __init__(self, broker: str | None, topic: str, state_dir: Path, log: Path, port: int | None = None,
                 job_command: list[str] | None = FAKE_JOB):
        """``job_command=None``: the default job, the real ``tidemark run``; ``broker=None``:
        the service starts its own embedded broker."""
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k not in ("TIDEMARK_JOB_COMMAND", "KAFKA_BOOTSTRAP_SERVERS")}
        env["TIDEMARK_API_TOKEN"] = TOKEN
        if job_command is not None:
            env["TIDEMARK_JOB_COMMAND"] = shlex.join(job_command)
        self.log = log
        with open(log, "ab") as err:
            self.p = subprocess.Popen(
                [TIDEMARK, "control", "--port", str(self.port), *(["--bootstrap-servers", broker] if broker else []),
                 "--registry-topic", topic, "--state-dir", str(state_dir)],
                stdout=err, stderr=err, env=env)
        self.client = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
        wait_for(self._ready, timeout=60, what="tidemark control ready")

    def _ready(self) -> bool:
        assert self.p.poll() is None, self.log.read_text()[-2000:]
        try:
            return httpx.get(self.url + "/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def status(self, name: str) -> dict:
        return self.client.get(f"/v1/pipelines/{name}/status").json()


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.split(") ", 1)[1][0] != "Z"
