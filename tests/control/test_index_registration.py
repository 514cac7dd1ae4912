"""The control service and the index service: registering a delta-join pipeline registers
its tables in a real ``tidemark index`` process (checked with the index service's own
``GET /v1/tables``); a pipeline without a delta join registers nothing; an unusable index
service is a 502/409 with a message and nothing is registered; without ``--index-url`` one
embedded index service is started, reused, handed to the jobs (URL on the command line,
token only in the environment) and stopped with the control service."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from control_support import FAKE_JOB, alive, free_port, register, wait_for

from tests.index.index_support import PROCESS_TOKEN as INDEX_TOKEN
from tests.index.index_support import IndexProcess
from tidemark.kafka.admin import ensure_topics

pytestmark = pytest.mark.integration

DELTA_SQL = """
SET 'table.optimizer.delta-join.strategy' = 'FORCE';
SET 'table.exec.delta-join.consistency' = '{consistency}';
-- orders are a Debezium stream (they may move between customers), customers append-only
CREATE TABLE {orders} (id BIGINT, customer BIGINT, amount BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('topic' = '{run}-orders', 'format' = 'debezium-json', 'index.by_customer.columns' = 'customer');
CREATE TABLE {customers} (id BIGINT, name STRING, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('topic' = '{run}-customers', 'format' = 'json');
CREATE TABLE enriched (order_id BIGINT, customer_id BIGINT, name STRING, amount BIGINT,
  PRIMARY KEY (order_id, customer_id) NOT ENFORCED) WITH ('topic' = '{run}-enriched', 'format' = 'upsert-json');
INSERT INTO enriched SELECT o.id, c.id, c.name, o.amount
  FROM {orders} o JOIN {customers} c ON o.customer = c.id ON CONFLICT DO DEDUPLICATE;
"""


def delta_sql(broker: str, consistency: str = "eventual", orders: str = "orders", customers: str = "customers") -> str:
    run = f"ix-{uuid.uuid4().hex[:8]}"
    ensure_topics(broker, {f"{run}-orders": 1, f"{run}-customers": 1, f"{run}-enriched": 1})
    return DELTA_SQL.format(consistency=consistency, orders=orders, customers=customers, run=run)


class IndexProc(IndexProcess):
    """A real ``tidemark index`` process with the token ``INDEX_TOKEN``."""

    def tables(self) -> dict[str, dict]:
        return {t["table"]: t for t in self.client.get("/v1/tables").json()["tables"]}


@pytest.fixture
def index_proc(broker: str, tmp_path: Path) -> Iterator[IndexProc]:
    proc = IndexProc(broker, tmp_path / "index.log")
    yield proc
    proc.stop()


@pytest.fixture
def recording_job(tmp_path: Path) -> list[str]:
    """The stand-in job, first recording its environment's index token next to its argv."""
    script = tmp_path / "record_env_job.py"
    script.write_text(
        "import json, os, runpy, sys\n"
        "from pathlib import Path\n"
        "Path(sys.argv[1]).with_name('env.json').write_text(json.dumps(\n"
        "    {'TIDEMARK_INDEX_TOKEN': os.environ.get('TIDEMARK_INDEX_TOKEN')}))\n"
        f"sys.argv = [{FAKE_JOB[1]!r}, *sys.argv[1:]]\n"
        f"runpy.run_path({FAKE_JOB[1]!r}, run_name='__main__')\n")
    return [sys.executable, str(script)]


def job_files(svc, name: str) -> tuple[list[str], dict]:
    [workdir] = (svc.settings.state_dir / "pipelines").glob(f"{name}-*")
    return json.loads((workdir / "argv.json").read_text()), json.loads((workdir / "env.json").read_text())


def test_delta_join_pipeline_registers_its_tables_in_the_index_service(make_service, index_proc, broker):
    svc = make_service(index_url=index_proc.url, index_token=INDEX_TOKEN)
    r = register(svc, "enrich", sql=delta_sql(broker))
    assert r.status_code == 201, r.text
    assert r.json()["indexes"] == {"url": index_proc.url, "tables": ["orders", "customers"], "embedded": False}
    tables = index_proc.tables()
    assert set(tables) == {"orders", "customers"}
    assert tables["orders"]["topic"].endswith("-orders") and tables["customers"]["topic"].endswith("-customers")
    assert tables["orders"]["indexes"] == {"PRIMARY": ["id"], "by_customer": ["customer"]}
    # eventual consistency asks only for current rows: no version history kept
    assert tables["orders"]["history"] is False and tables["customers"]["history"] is False

    # a strong delta join needs as-of lookups: its tables keep history
    r = register(svc, "enrich-strong", sql=delta_sql(broker, "strong", orders="s_orders", customers="s_customers"))
    assert r.status_code == 201, r.text
    tables = index_proc.tables()
    assert tables["s_orders"]["history"] is True and tables["s_customers"]["history"] is True
    assert svc.controller.indexes.embedded is None  # --index-url given: nothing embedded


def test_a_pipeline_without_delta_join_registers_nothing(make_service, index_proc):
    svc = make_service(index_url=index_proc.url, index_token=INDEX_TOKEN)
    r = register(svc, "plain")  # the s1/s2 example: a regular join
    assert r.status_code == 201, r.text
    assert r.json()["indexes"] is None
    assert index_proc.tables() == {}


def test_unreachable_index_service_is_502_with_a_message_and_nothing_is_registered(make_service, broker):
    url = f"http://127.0.0.1:{free_port()}"  # nobody listens there
    svc = make_service(index_url=url, index_token=INDEX_TOKEN)
    r = register(svc, "enrich", sql=delta_sql(broker))
    assert r.status_code == 502, r.text
    detail = r.json()["detail"]
    assert f"index service at {url} is unreachable" in detail
    assert "pipeline 'enrich' needs table 'orders'" in detail and "Traceback" not in detail
    assert svc.client.get("/v1/pipelines/enrich").status_code == 404


def test_wrong_index_token_is_502_naming_the_variable(make_service, index_proc, broker):
    svc = make_service(index_url=index_proc.url, index_token="not-the-token")
    r = register(svc, "enrich", sql=delta_sql(broker))
    assert r.status_code == 502, r.text
    assert "(401)" in r.json()["detail"] and "TIDEMARK_INDEX_TOKEN" in r.json()["detail"]
    assert index_proc.tables() == {}


def test_a_table_registered_with_another_definition_is_409(make_service, index_proc, broker):
    svc = make_service(index_url=index_proc.url, index_token=INDEX_TOKEN)
    assert register(svc, "first", sql=delta_sql(broker)).status_code == 201
    # same table names, other topics: the index service follows one table per name
    r = register(svc, "second", sql=delta_sql(broker))
    assert r.status_code == 409, r.text
    assert "table 'orders'" in r.json()["detail"] and "another definition" in r.json()["detail"]
    assert svc.client.get("/v1/pipelines/second").status_code == 404


def test_job_start_registers_again_and_fails_clearly_when_the_index_service_is_gone(
        make_service, index_proc, broker, recording_job):
    svc = make_service(index_url=index_proc.url, index_token=INDEX_TOKEN, job_command=recording_job)
    assert register(svc, "enrich", sql=delta_sql(broker)).status_code == 201
    svc.client.post("/v1/pipelines/enrich/start")
    wait_for(lambda: svc.status("enrich")["state"] == "running", what="running")
    argv, env = job_files(svc, "enrich")
    assert argv[argv.index("--index-url") + 1] == index_proc.url
    assert INDEX_TOKEN not in argv and env["TIDEMARK_INDEX_TOKEN"] == INDEX_TOKEN
    svc.client.post("/v1/pipelines/enrich/stop")
    wait_for(lambda: svc.status("enrich")["state"] == "stopped", what="stopped")

    index_proc.stop()
    svc.client.post("/v1/pipelines/enrich/start")
    st = wait_for(lambda: (s := svc.status("enrich"))["state"] == "failed" and s, what="failed")
    assert st["error"].startswith("not started: pipeline 'enrich' needs table 'orders'")
    assert "unreachable" in st["error"]


def test_embedded_index_service_is_started_once_reused_and_stopped(make_service, broker, recording_job):
    svc = make_service(job_command=recording_job)  # no index_url
    assert register(svc, "plain").json()["indexes"] is None
    assert svc.controller.indexes.embedded is None  # nothing started for a regular join

    one = register(svc, "enrich-one", sql=delta_sql(broker))
    assert one.status_code == 201, one.text
    two = register(svc, "enrich-two", sql=delta_sql(broker, orders="o2", customers="c2"))
    assert two.status_code == 201, two.text
    url = one.json()["indexes"]["url"]
    assert one.json()["indexes"]["embedded"] is True and two.json()["indexes"]["url"] == url
    assert url.startswith("http://127.0.0.1:")
    embedded = svc.controller.indexes.embedded
    assert embedded.starts == 1
    tables = {t["table"] for t in httpx.get(url + "/v1/tables", headers={"Authorization": f"Bearer {embedded.token}"}).json()["tables"]}
    assert tables == {"orders", "customers", "o2", "c2"}
    # every /v1 endpoint needs its own token, which only the control service and its jobs know
    assert httpx.post(url + "/v1/tables", json={"ddl": "x"}).status_code == 401
    assert httpx.get(url + "/v1/tables").status_code == 401
    assert httpx.post(url + "/v1/lookup", json={"table": "orders", "keys": [[1]]}).status_code == 401
    # ... which it reads from TIDEMARK_INDEX_TOKEN in its environment, never from its command line
    environ = Path(f"/proc/{embedded.pid}/environ").read_bytes().split(b"\0")
    assert f"TIDEMARK_INDEX_TOKEN={embedded.token}".encode() in environ
    assert not any(e.startswith(b"TIDEMARK_API_TOKEN=") for e in environ)  # not the control service's token
    assert embedded.token.encode() not in Path(f"/proc/{embedded.pid}/cmdline").read_bytes()

    svc.client.post("/v1/pipelines/enrich-one/start")
    wait_for(lambda: svc.status("enrich-one")["state"] == "running", what="running")
    argv, env = job_files(svc, "enrich-one")
    assert argv[argv.index("--index-url") + 1] == url
    assert env["TIDEMARK_INDEX_TOKEN"] == embedded.token and embedded.token not in argv
    assert embedded.starts == 1  # the job's start reused it too

    pid = embedded.pid
    assert pid is not None and alive(pid)
    svc.stop()
    wait_for(lambda: not alive(pid), timeout=20, what="embedded index service stopped")


def test_embedded_index_service_exits_when_its_control_service_dies(tmp_path, broker):
    """The child watches its stdin (a pipe from the owner): EOF, whatever killed the owner,
    shuts it down."""
    owner = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path\n"
        "from tidemark.control.index_process import EmbeddedIndex\n"
        f"e = EmbeddedIndex({broker!r}, Path({str(tmp_path)!r}))\n"
        "e.ensure(); print(e.pid, flush=True); time.sleep(600)\n")], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(owner.stdout.readline())
        assert alive(pid)
        owner.kill()  # SIGKILL: no clean shutdown
        owner.wait()
        wait_for(lambda: not alive(pid), timeout=30, what="orphaned index service exits")
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
