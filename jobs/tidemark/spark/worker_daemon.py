"""pyspark's Python worker daemon, with the modules a Tidemark task needs imported before it
forks any worker (``spark.python.daemon.module``, set by ``tidemark.spark.session`` for a local
master; a cluster's executors keep pyspark's daemon, see there).

Spark starts a Python worker by forking its daemon, and a worker forked from pyspark's own
daemon imports pyarrow, pandas, polars, pyspark's worker and Tidemark's stages when it
unpickles its first task, on the task's clock (docs/benchmarks.md, "Worker start-up").
Imported once in the daemon, the modules reach every forked worker for free, and their
pages are shared between the workers until written.

pyspark's own daemon imports nothing before it forks because a library may start threads
when imported, and a forked child has none of its parent's threads. What is preloaded here
was checked for that: pyarrow's and polars' jemalloc background threads are restarted by
jemalloc in a forked child (it registers fork handlers), and polars starts its worker pool
at its first query, which never runs in the daemon. ``tests/integration`` runs every Spark
test through this daemon.
"""

from __future__ import annotations

import gc
import importlib
import pkgutil

#: modules and packages (every submodule) a task's unpickled plan, stages and codecs use
PRELOAD = (
    "pyarrow.compute",
    "pandas",
    "polars",
    "confluent_kafka",
    "pyspark.worker",
    "pyspark.sql.streaming.stateful_processor_api_client",
    "pyspark.sql.worker.plan_data_source_read",
    "tidemark.spark.query",
    "tidemark.engine.stages",
    "tidemark.engine.kernels",
    "tidemark.formats",
)


def preload(names: tuple[str, ...] = PRELOAD) -> None:
    """Import ``names``, and every submodule of those that are packages. A module that does
    not import is left to the worker, which then reports its error as any task would."""
    for name in names:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if name.startswith("tidemark.") and hasattr(module, "__path__"):
            for info in pkgutil.walk_packages(module.__path__, prefix=f"{name}."):
                try:
                    importlib.import_module(info.name)
                except ImportError:
                    continue


def prepare() -> None:
    """Preload, then move every object made so far out of the garbage collector's reach.

    pyspark's daemon runs ``gc.collect()`` in a reused worker after every task. Without the
    freeze, each of those collections walks every object the preload made (pandas, polars,
    pyarrow, pyspark): CPU on every task, and a write to every page the fork shares with the
    daemon (copy-on-write), so each worker's memory grows by the daemon's size."""
    preload()
    gc.freeze()


if __name__ == "__main__":
    prepare()
    from pyspark import daemon

    daemon.manager()
