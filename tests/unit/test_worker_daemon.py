"""The Python worker daemon of a Tidemark job (``tidemark.spark.worker_daemon``): it imports
the stages before it forks, and a forked worker still runs polars and pyarrow (whose
threads a fork does not copy). Every Spark test runs its workers through this daemon."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tidemark.spark.session import session_conf

CHILD = textwrap.dedent(
    """
    import os, sys
    import gc
    from tidemark.spark.worker_daemon import prepare
    prepare()
    # what the preload made is frozen: a collection in a forked worker does not walk it
    assert gc.get_freeze_count() > 50_000, gc.get_freeze_count()
    assert len(gc.get_objects()) < 1_000, len(gc.get_objects())
    assert "tidemark.spark.query" in sys.modules and "tidemark.engine.kernels.upsert" in sys.modules
    for _ in range(3):
        pid = os.fork()
        if pid == 0:
            import polars as pl, pyarrow as pa, pyarrow.compute as pc
            df = pl.DataFrame({"k": [i % 7 for i in range(100_000)], "v": list(range(100_000))})
            groups = df.group_by("k").agg(pl.col("v").sum()).height
            total = pc.sum(pa.array(range(100_000))).as_py()
            os._exit(0 if (groups, total) == (7, 4_999_950_000) else 3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
    print("ok")
    """
)


def test_spark_forks_its_python_workers_from_the_preloading_daemon():
    assert session_conf("local[2]", 2)["spark.python.daemon.module"] == "tidemark.spark.worker_daemon"


def test_a_cluster_keeps_pysparks_daemon_since_its_executors_get_tidemark_as_an_archive():
    """The job's archive reaches a worker's path only after the daemon forked it, so a
    daemon that imports Tidemark cannot start where Tidemark is not installed."""
    assert "spark.python.daemon.module" not in session_conf("spark://127.0.0.1:7077", 2)


def test_a_worker_forked_after_the_preload_runs_polars_and_pyarrow():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
