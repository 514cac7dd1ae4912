"""A Spark standalone cluster (master + one worker from the pyspark distribution, on
loopback) shared by the cluster tests of a module, and a broker for their pipelines.

The broker is the session's (``tests/conftest.py``)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tidemark.spark.cluster import LocalStandaloneCluster


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.fixture(scope="module")
def standalone_cluster() -> Iterator[LocalStandaloneCluster]:
    cluster = LocalStandaloneCluster(cores=2, worker_memory_mb=1024).start()
    groups = cluster.process_groups
    assert len(groups) == 2
    try:
        yield cluster
    finally:
        cluster.stop()
    # the worker's group held the executors and their Python workers: all gone
    leftover = [g for g in groups if _group_alive(g)]
    assert not leftover, f"cluster processes left behind in process groups {leftover}"


@pytest.fixture(scope="module")
def cluster_kafka(kafka_bootstrap: str) -> str:
    """The session's broker (tests/conftest.py)."""
    return kafka_bootstrap
