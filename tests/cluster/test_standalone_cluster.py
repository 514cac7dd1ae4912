"""The job runs unchanged on a Spark standalone cluster: separate master, worker and
executor processes started from the pyspark distribution, the tidemark package shipped to
the executors as a ``--py-files`` archive."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from cluster_support import PYTHON, result_line, run_driver

from tidemark.spark.cluster import package_archive

pytestmark = pytest.mark.integration

HERE = Path(__file__).parent


def test_package_archive_is_importable_on_its_own(tmp_path):
    archive = package_archive(tmp_path / "tidemark-py.zip")
    names = zipfile.ZipFile(archive).namelist()
    # a namespace package: directory entries, no tidemark/__init__.py
    assert "tidemark/" in names and "tidemark/__init__.py" not in names
    assert "tidemark/spark/keyed.py" in names and "tidemark/control/app.py" in names
    assert not [n for n in names if "__pycache__" in n]
    # -S: no site-packages, so no editable install; only the archive is on the path
    proc = subprocess.run(
        [sys.executable, "-S", "-c",
         "import sys; sys.path.insert(0, sys.argv[1]); "
         "import tidemark.engine.changelog as m, tidemark.engine.stages.join; print(m.__file__)",
         archive],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"{archive}/tidemark/engine/changelog.py"


def test_keyed_stage_runs_on_the_cluster(standalone_cluster, tmp_path):
    proc = run_driver(standalone_cluster, [PYTHON, str(HERE / "keyed_driver.py"), str(tmp_path)])
    result = result_line(proc.stdout)
    assert result["master"] == standalone_cluster.master_url
    # COUNT(*), SUM per group after two batches: a: +1 +3 | -1 +7, b: +2 | -2, c: | +5
    assert result["table"] == {"a": ["a", 2, 10], "c": ["c", 1, 5]}
    assert result["batches"] == 2
    # executors imported tidemark from the shipped archive, in the worker's work dir
    assert result["executor_origins"], "no task ran"
    for origin in result["executor_origins"]:
        assert "tidemark-py.zip" in origin, origin
    apps = standalone_cluster.state()["completedapps"]
    assert any(app["name"] == "tidemark-cluster-keyed" for app in apps), apps
    work = Path(standalone_cluster.workdir) / "work"
    assert any(work.glob("app-*/*/tidemark-py.zip")), "archive not in an executor work dir"
