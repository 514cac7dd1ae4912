"""Fixtures for integration tests; the broker (``kafka_bootstrap``, ``make_topic``) and the
Spark session (``spark``) are the session's, from ``tests/conftest.py``."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def checkpoint_dir(tmp_path: Path) -> str:
    return str(tmp_path / "checkpoint")
