"""Imported at start-up by every Python process Spark starts for a Tidemark job (its
directory is put on those processes' PYTHONPATH by ``tidemark.spark.session``).

Spark puts ``pyspark.zip`` and the py4j zip at the front of a worker's ``sys.path``. The
interpreter cannot cache bytecode for modules imported from a zip, so every Python worker,
daemon and data-source planner process compiled pyspark from source at start, and every
task's ``importlib.invalidate_caches()`` re-read the zip's directory: measured with py-spy
on a join pipeline, ~20% of all Python CPU of a run. The very same pyspark is installed in
site-packages (the zip is what ships in that install), with compiled bytecode, so the
zips are dropped from the path and pyspark is imported from there. pyspark's own
``spark-core`` jar (also on the path, with no Python in it) goes too: it is a zip of
thousands of entries that ``invalidate_caches`` re-read at every task.
"""

import sys


def _drop_spark_zips() -> None:
    import os

    from importlib.util import find_spec

    def spark_archive(p: str) -> bool:
        name = os.path.basename(p)
        if p.endswith(".zip"):
            return name.startswith(("pyspark", "py4j"))
        return p.endswith(".jar") and os.path.basename(os.path.dirname(p)) == "jars" and "pyspark" in p

    zips = [p for p in sys.path if spark_archive(p)]
    if not zips:
        return
    kept = [p for p in sys.path if p not in zips]
    saved = sys.path[:]
    sys.path[:] = kept
    # only if pyspark and py4j are importable without the zips (same interpreter/venv)
    if find_spec("pyspark") is None or find_spec("py4j") is None:
        sys.path[:] = saved
        return
    for p in zips:
        sys.path_importer_cache.pop(p, None)


_drop_spark_zips()
