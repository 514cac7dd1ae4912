"""``tidemark run`` as a user (and the control service) runs it: a subprocess with the
pipeline file, against the test broker. What the terminal shows, the exit status, the
status channel and the sink topic."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from run_support import produce, sink_table, unique_topics

from tidemark.cli.demo import s2_records
from tidemark.engine.pipeline import compile_sql
from tidemark.kafka.admin import ensure_topics

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SEED_SQL = (ROOT / "examples" / "s1_s2_join.sql").read_text()
TIDEMARK = [str(Path(sys.executable).parent / "tidemark")] if (Path(sys.executable).parent / "tidemark").exists() \
    else [sys.executable, "-c", "from tidemark.cli.main import app; app()"]


def tidemark_run(args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYSPARK_PYTHON": sys.executable, **(env or {})}
    full_env.pop("KAFKA_BOOTSTRAP_SERVERS", None)
    return subprocess.run([*TIDEMARK, "run", *args], cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def s1_records(topic: str) -> list[tuple[bytes, bytes]]:
    key = json.dumps({"id": 1}).encode()
    return [
        (key, json.dumps({"before": None, "after": {"id": 1, "level": 10}, "op": "c", "ts_ms": 3}).encode()),
        (key, json.dumps({"before": {"id": 1, "level": 10}, "after": {"id": 1, "level": 20}, "op": "u", "ts_ms": 4}).encode()),
    ]


def test_run_until_idle_prints_progress_writes_status_and_the_sink(kafka_bootstrap, tmp_path):
    sql, topics = unique_topics(SEED_SQL, "cli")
    (tmp_path / "join.sql").write_text(sql)
    ensure_topics(kafka_bootstrap, {topics["s1"]: 2, topics["s2"]: 1})
    produce(kafka_bootstrap, topics["s2"], [(k, v) for _, _, k, v in s2_records(topics["s2"])])
    produce(kafka_bootstrap, topics["s1"], s1_records(topics["s1"]), partitions=2)
    status = tmp_path / "status.jsonl"
    name = f"cli-{topics['s1'][-8:]}"

    proc = tidemark_run(["join.sql", "--bootstrap-servers", kafka_bootstrap, "--until-idle", "--name", name],
                        cwd=tmp_path, env={"TIDEMARK_STATUS_FILE": str(status)})

    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""  # the terminal output is progress, on stderr; stdout stays clean
    lines = proc.stderr.splitlines()
    assert lines[0].startswith(f"tidemark run {name}: sink t1, brokers {kafka_bootstrap}, checkpoint checkpoints/{name}")
    batch_lines = [ln for ln in lines if ln.startswith("batch ")]
    assert batch_lines and all(" in " in ln and " out " in ln and " dlq " in ln and " lag " in ln for ln in batch_lines)
    assert lines[-1].startswith("idle: every source record is written.") and "4 records in" in lines[-1]
    for noise in ("Exception", "WARN", "at org.apache", "Traceback", "TransformWithState"):
        assert noise not in proc.stderr
    # Spark's own output went to the log next to the checkpoint
    assert (tmp_path / "checkpoints" / name / "driver.log").exists()

    events = [json.loads(ln) for ln in status.read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "started" and kinds[-1] == "idle" and "batch" in kinds
    batches = [e for e in events if e["event"] == "batch"]
    assert sum(e["rows_in"] for e in batches) == 4 and all(e["v"] == 1 for e in events)
    assert batches[-1]["lag"] == {topics["s1"]: {"0": 0, "1": 0}, topics["s2"]: {"0": 0}}
    assert sink_table(kafka_bootstrap, compile_sql(sql)) == {(1,): (1, 20, "b1")}



def test_bad_sql_exits_2_with_the_message_and_no_spark(tmp_path):
    (tmp_path / "bad.sql").write_text(
        "CREATE TABLE s (id BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 's', 'format' = 'debezium-json');\n"
        "CREATE TABLE t (id BIGINT, n BIGINT, PRIMARY KEY (n) NOT ENFORCED) WITH ('topic' = 't', 'format' = 'upsert-json');\n"
        "INSERT INTO t SELECT id, id + 1 FROM s;\n"
    )
    proc = tidemark_run(["bad.sql", "--bootstrap-servers", "127.0.0.1:1"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: bad.sql: ") and "ON CONFLICT" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "checkpoints").exists()


def test_missing_java_exits_4_saying_what_to_install(tmp_path):
    sql, _ = unique_topics(SEED_SQL)
    (tmp_path / "join.sql").write_text(sql)
    bin_dir = tmp_path / "bin"  # a PATH with the tools but no java
    bin_dir.mkdir()
    proc = tidemark_run(["join.sql", "--bootstrap-servers", "127.0.0.1:1"], cwd=tmp_path,
                        env={"PATH": str(bin_dir), "JAVA_HOME": str(tmp_path / "nojava")}, timeout=120)
    assert proc.returncode == 4
    assert "Java 17" in proc.stderr and "java" in proc.stderr.lower()
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_do_error_conflict_exits_3_with_the_table_and_key(kafka_bootstrap, tmp_path):
    sql, topics = unique_topics(SEED_SQL.replace("DO DEDUPLICATE", "DO ERROR").replace(
        "SELECT s1.id, s1.level, s2.attr", "SELECT s2.id, s1.level, s2.attr"), "conflict")
    (tmp_path / "conflict.sql").write_text(sql)
    ensure_topics(kafka_bootstrap, {topics["s1"]: 1, topics["s2"]: 1})
    produce(kafka_bootstrap, topics["s2"], [(k, v) for _, _, k, v in s2_records(topics["s2"])])
    two_rows = [(json.dumps({"id": i}).encode(),
                 json.dumps({"before": None, "after": {"id": i, "level": 10}, "op": "c"}).encode()) for i in (1, 2)]
    produce(kafka_bootstrap, topics["s1"], two_rows)  # s1 rows 1 and 2 both join s2 row 10 -> sink id 10
    status = tmp_path / "status.jsonl"
    proc = tidemark_run(["conflict.sql", "--bootstrap-servers", kafka_bootstrap, "--until-idle"],
                        cwd=tmp_path, env={"TIDEMARK_STATUS_FILE": str(status)})
    assert proc.returncode == 3, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ON CONFLICT DO ERROR: table 't1'") and "id=10" in last
    assert "at org.apache" not in proc.stderr and "Traceback" not in proc.stderr
    assert json.loads(status.read_text().splitlines()[-1])["event"] == "error"



def test_unreachable_brokers_exit_5_naming_them(tmp_path):
    sql, _ = unique_topics(SEED_SQL)
    (tmp_path / "join.sql").write_text(sql)
    proc = tidemark_run(["join.sql", "--bootstrap-servers", "127.0.0.1:1"], cwd=tmp_path, timeout=300)
    assert proc.returncode == 5
    assert proc.stderr.strip().splitlines()[-1] == "error: no Kafka broker answers at 127.0.0.1:1 (check --bootstrap-servers)"
