"""Helpers for the cluster tests: run a driver program as a subprocess against a local
standalone cluster (a Python process holds one SparkContext, and the test process may
already hold the shared local one) and read its result."""

from __future__ import annotations

import json
import subprocess
import sys

from tidemark.spark.cluster import LocalStandaloneCluster

DRIVER_TIMEOUT_S = 600
PYTHON = sys.executable


def run_driver(cluster: LocalStandaloneCluster, args: list[str], **kw) -> subprocess.CompletedProcess:
    """Run a driver program against ``cluster``; fail with its output when it fails."""
    proc = subprocess.run(
        args, env=cluster.driver_env(), capture_output=True, text=True,
        timeout=DRIVER_TIMEOUT_S, stdin=subprocess.DEVNULL, **kw,
    )
    assert proc.returncode == 0, (
        f"driver {args[:3]} exited {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\n"
        f"stderr:\n{proc.stderr[-6000:]}\nworker log:\n{cluster.log_tail('worker')}"
    )
    return proc


def result_line(stdout: str) -> dict:
    """The JSON a driver printed on its ``RESULT`` line."""
    [line] = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(line[len("RESULT "):])
