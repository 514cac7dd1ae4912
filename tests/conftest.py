"""Fixtures shared by every suite: ONE Spark session and ONE Kafka-protocol broker per test
session (each costs seconds to start; suites that need them share them). Both are lazy: a
test that uses neither starts neither.

The broker is ``$KAFKA_BOOTSTRAP_SERVERS`` if set, else the embedded one (Kafka in Docker
when an engine is reachable, else Tansu). Tests share the broker, never a topic.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator

import pytest
from conftest_spark import spark, spark_stream  # noqa: F401

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
    whose name is unique to this test."""
    base = re.sub(r"[^A-Za-z0-9]+", "-", request.node.name)[:60].strip("-")

    def make(suffix: str = "", partitions: int = 1, compacted: bool = False) -> str:
        name = f"{base}-{suffix + '-' if suffix else ''}{uuid.uuid4().hex[:8]}"
        ensure_topics(kafka_bootstrap, {name: partitions}, compacted=compacted)
        return name

    return make
