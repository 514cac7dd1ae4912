"""A delta join runs on a Spark standalone cluster: the executors (separate processes started
by the worker) get the batch's offset fences through the task's local properties and look
rows up in the embedded index service the driver started on loopback (master, worker and
driver share this host). The sink equals the regular join's table for the workload."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tidemark.engine.pipeline import compile_sql
from tidemark.engine.replay import ReplayHost
from tidemark.kafka.admin import ensure_topics

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from run_support import encode_source, produce, sink_table, topic_of, unique_topics  # noqa: E402

from tests.unit.delta_workload import sql as delta_sql  # noqa: E402
from tests.unit.delta_workload import workload  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_delta_join_on_the_cluster(standalone_cluster, cluster_kafka, tmp_path):
    text, _ = unique_topics(delta_sql("FORCE", "strong"), f"cl{uuid.uuid4().hex[:4]}")
    pipeline = compile_sql(text)
    batches = workload(5, batches=6, keys=6)
    changes = {n: [c for b in batches for c in b[n]] for n in ("a", "b")}
    for name, table in pipeline.sources.items():
        records = [{"kind": c.kind, "row": dict(zip(table.column_names, c.row))} for c in changes[name]]
        ensure_topics(cluster_kafka, {topic_of(table): 2})
        produce(cluster_kafka, topic_of(table), encode_source(table, records), partitions=2)
    sql_file = tmp_path / "dj.sql"
    sql_file.write_text(text, encoding="utf-8")
    checkpoint = tmp_path / "checkpoint"
    args = [str(Path(sys.executable).parent / "tidemark"), "run", str(sql_file),
            "--master", standalone_cluster.master_url, "--bootstrap-servers", cluster_kafka,
            "--checkpoint", str(checkpoint), "--name", f"cluster-dj-{uuid.uuid4().hex[:6]}", "--until-idle",
            "--max-records-per-trigger", "15"]
    proc = subprocess.run(args, env=standalone_cluster.driver_env(), capture_output=True, text=True, timeout=900,
                          stdin=subprocess.DEVNULL)
    log = checkpoint / "driver.log"
    assert proc.returncode == 0, (
        f"tidemark run exited {proc.returncode}\n{proc.stderr[-4000:]}\n"
        f"driver log:\n{log.read_text(errors='replace')[-6000:] if log.exists() else '(none)'}"
    )
    assert "delta join index service embedded at http://127.0.0.1:" in proc.stderr
    regular = compile_sql(text.replace("strategy' = 'FORCE'", "strategy' = 'NONE'"))
    host = ReplayHost(regular, clock=lambda: 0)
    host.run_batch(changes)
    assert sink_table(cluster_kafka, pipeline) == host.table()
