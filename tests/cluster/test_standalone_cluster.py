"""The job runs unchanged on a Spark standalone cluster: separate master, worker and
executor processes started from the pyspark distribution, the tidemark package shipped to
the executors as a ``--py-files`` archive."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import pytest
from cluster_support import PYTHON, result_line, run_driver

from tidemark.cli.demo import DEMO_SQL, EXPECTED_ROW, ORDERINGS, s1_case_records, s2_records
from tidemark.cli.demo import produce_in_transactions, sink_history
from tidemark.kafka.admin import ensure_topics
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


@pytest.mark.slow  # the tidemark run test below covers the cluster path in make test
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


def test_tidemark_run_on_the_cluster(standalone_cluster, cluster_kafka, tmp_path):
    """The seed's s1/s2 join in its three orderings (each change its own transaction, the
    three changelog rows of a case in three partitions), run by the real CLI with
    ``--master spark://127.0.0.1:PORT``: every id materializes to (id, 20, 'b1'). One
    batch (no rate limit) keeps it short; the disorder across batches is covered on the
    local master by the integration tests."""
    run = uuid.uuid4().hex[:6]
    topics = {"s1": f"cl-{run}-1-s1", "s2": f"cl-{run}-0-s2", "t1": f"cl-{run}-t1"}
    ensure_topics(cluster_kafka, {topics["s1"]: 3, topics["s2"]: 1})
    records = s2_records(topics["s2"])
    for case in ORDERINGS:
        records += s1_case_records(topics["s1"], case, id_=case)
    produce_in_transactions(cluster_kafka, records)
    sql = tmp_path / "join.sql"
    sql.write_text(DEMO_SQL.format(**topics), encoding="utf-8")
    checkpoint = tmp_path / "checkpoint"
    status_file = tmp_path / "status.jsonl"
    name = f"cluster-{run}"
    args = [str(Path(sys.executable).parent / "tidemark"), "run", str(sql),
            "--master", standalone_cluster.master_url, "--bootstrap-servers", cluster_kafka,
            "--checkpoint", str(checkpoint), "--name", name, "--until-idle"]
    env = standalone_cluster.driver_env()
    env["TIDEMARK_STATUS_FILE"] = str(status_file)
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    log = checkpoint / "driver.log"
    assert proc.returncode == 0, (
        f"tidemark run exited {proc.returncode}\n{proc.stderr[-4000:]}\n"
        f"driver log:\n{log.read_text(errors='replace')[-6000:] if log.exists() else '(none)'}"
    )

    table: dict[int, tuple] = {}
    for key, value in sink_history(cluster_kafka, topics["t1"]):
        if value is None:
            table.pop(key, None)
        else:
            table[key] = value
    assert table == {case: EXPECTED_ROW for case in ORDERINGS}

    events = [json.loads(line) for line in status_file.read_text().splitlines() if line.strip()]
    batches = [e for e in events if e["event"] == "batch"]
    assert batches and sum(b["rows_in"] for b in batches) >= len(records)
    assert events[-1]["event"] == "idle"
    # it ran on the cluster: the master lists the application, and the package archive
    # reached the executor's work directory on the worker
    apps = standalone_cluster.state()["completedapps"]
    assert any(app["name"] == f"tidemark-{name}" for app in apps), [a["name"] for a in apps]
    work = Path(standalone_cluster.workdir) / "work"
    assert any(work.glob("app-*/*/tidemark-py.zip")), "archive not in an executor work dir"
