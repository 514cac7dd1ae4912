"""Fixtures for the control service: a real broker, and services on free loopback ports.

Services run in-process (uvicorn in a thread, a socket bound to port 0) so several can share
one test; the restart test runs the real ``tidemark control`` as a process instead. Jobs are
the stand-in ``fake_job.py`` (same argv and status channel as ``tidemark run``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from control_support import FAKE_JOB, TOKEN, Proc, Service

from tidemark.control.settings import ControlSettings


@pytest.fixture(scope="session")
def broker(kafka_bootstrap: str) -> str:
    """The session's broker (tests/conftest.py)."""
    return kafka_bootstrap


@pytest.fixture
def registry_topic() -> str:
    return f"tidemark.registry.test-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def make_service(broker: str, registry_topic: str, tmp_path: Path) -> Iterator[Callable[..., Service]]:
    started: list[Service] = []

    def make(state_dir: Path | None = None, *, token: str | None = TOKEN, job_command: list[str] | None = None,
             lease_ttl_s: float = 15.0, topic: str | None = None, **kw) -> Service:
        settings = ControlSettings(
            bootstrap_servers=broker, state_dir=state_dir or tmp_path / f"svc{len(started)}", api_token=token,
            registry_topic=topic or registry_topic, job_command=job_command or list(FAKE_JOB),
            lease_ttl_s=lease_ttl_s, lease_grace_s=0.5, restart_backoff_base_s=0.05, job_stop_timeout_s=5.0, **kw)
        svc = Service(settings, token)
        started.append(svc)
        return svc

    yield make
    for svc in started:
        if svc.thread.is_alive():
            svc.stop()


@pytest.fixture
def service(make_service) -> Service:
    return make_service()




@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    """``tidemark control`` processes a test starts; killed at the end if still running."""
    started: list[Proc] = []
    yield started
    for proc in started:
        if proc.p.poll() is None:
            proc.p.kill()
            proc.p.wait()
