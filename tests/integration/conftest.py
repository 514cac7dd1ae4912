"""Shared fixtures for integration tests: ONE Kafka-protocol broker per test session
(``$KAFKA_BOOTSTRAP_SERVERS`` if set, else the embedded one: Kafka in Docker when an
engine is reachable, else Tansu), uniquely named topics per test, and one Spark session.

Fixtures are lazy: a test that uses neither starts neither.
"""

from __future__ import annotations

import os
import re
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tidemark.kafka.admin import ensure_topics
from tidemark.kafka.broker import configured_bootstrap, embedded_broker


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """Bootstrap servers of the session's broker."""
    explicit = configured_bootstrap()
    if explicit:
        yield explicit
        return
    with embedded_broker() as bootstrap:
        yield bootstrap


@pytest.fixture
def make_topic(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Callable[..., str]:
    """``make_topic(suffix="", partitions=1, compacted=False) -> name``: creates a topic
    whose name is unique to this test (tests share the broker, never a topic)."""
    base = re.sub(r"[^A-Za-z0-9]+", "-", request.node.name)[:60].strip("-")

    def make(suffix: str = "", partitions: int = 1, compacted: bool = False) -> str:
        name = f"{base}-{suffix + '-' if suffix else ''}{uuid.uuid4().hex[:8]}"
        ensure_topics(kafka_bootstrap, {name: partitions}, compacted=compacted)
        return name

    return make


@pytest.fixture(scope="session")
def spark():
    """The session's SparkSession (``tidemark.spark.session.build_session``: local[*],
    RocksDB state store, 2 shuffle partitions). Minimal stand-in until a shared
    ``tests/conftest_spark.py`` exists; the session is a singleton either way."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from tidemark.spark.session import build_session

    session = build_session(app_name="tidemark-integration-tests")
    yield session
    session.stop()


@pytest.fixture
def checkpoint_dir(tmp_path: Path) -> str:
    return str(tmp_path / "checkpoint")
