"""Fixtures for the index service: the session's broker (tests/conftest.py) and
real ``tidemark index`` processes on free loopback ports."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from index_support import IndexProcess



@pytest.fixture
def index_process(kafka_bootstrap: str, tmp_path: Path) -> Iterator[Callable[..., IndexProcess]]:  # noqa: F811
    """``index_process(*extra_args)``: a started ``tidemark index`` with ``PROCESS_TOKEN``."""
    started: list[IndexProcess] = []

    def start(*args: str) -> IndexProcess:
        proc = IndexProcess(kafka_bootstrap, tmp_path / f"index{len(started)}.log", *args)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()
