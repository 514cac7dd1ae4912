"""``--kafka-config FILE`` for ``tidemark control`` and ``tidemark index``, and a pipeline's
``properties.*`` options at registration: confluent-kafka's complaint, naming the file or
the table, as one line (exit 2) or a 422; a good file reaches the registry's clients."""

from __future__ import annotations

import json
import os
import subprocess
import time

import httpx
from control_support import TIDEMARK, TOKEN, example_sql, free_port, register, wait_for


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TIDEMARK_KAFKA_CONFIG", "KAFKA_BOOTSTRAP_SERVERS")}
    return subprocess.run([TIDEMARK, *args], capture_output=True, text=True, timeout=60, env=env)


def test_a_bad_file_stops_control_and_index_with_one_line_naming_it(tmp_path):
    bad = tmp_path / "bad.properties"
    bad.write_text("sasl.mechanism=PLAIN\nno.such.key=1\n")
    expected = f'error: --kafka-config {bad}: No such configuration property: "no.such.key"'
    control = run_cli("control", "--insecure-dev", "--kafka-config", str(bad), "--bootstrap-servers", "127.0.0.1:1",
                      "--state-dir", str(tmp_path / "state"))
    index = run_cli("index", "--insecure-dev", "--kafka-config", str(bad), "--bootstrap-servers", "127.0.0.1:1")
    for proc in (control, index):
        assert proc.returncode == 2
        assert proc.stderr.strip().splitlines()[-1] == expected  # after the --insecure-dev warning


def test_a_table_property_confluent_kafka_refuses_is_422_naming_the_table(service):
    sql = example_sql("props").replace("'format' = 'upsert-json'", "'format' = 'upsert-json', 'properties.compression.type' = 'zip'")
    r = register(service, "bad-props", sql=sql)
    assert r.status_code == 422
    assert r.json()["detail"] == ("table 't1': 'properties.*' options: "
                                  'Invalid value "zip" for configuration property "compression.codec"')
    good = sql.replace("'zip'", "'zstd'")
    assert register(service, "good-props", sql=good).status_code == 201


def test_the_control_service_talks_to_the_broker_with_the_file_settings(broker, tmp_path):
    tls = tmp_path / "tls.properties"
    tls.write_text("security.protocol=SSL\n")  # the test broker speaks plaintext: the registry cannot load
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if k != "TIDEMARK_KAFKA_CONFIG"}, "TIDEMARK_API_TOKEN": TOKEN}
    with open(tmp_path / "control.log", "wb") as log:
        proc = subprocess.Popen([TIDEMARK, "control", "--port", str(port), "--bootstrap-servers", broker,
                                 "--kafka-config", str(tls), "--state-dir", str(tmp_path / "state")],
                                stdout=log, stderr=log, env=env)
    try:
        answers = []
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                answers.append(httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).json())
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        assert answers and all(a["status"] == "not ready" for a in answers)
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(30)


def test_the_jobs_get_the_control_services_file(make_service, tmp_path):
    conf = tmp_path / "client.properties"
    conf.write_text("client.id=tidemark-job\n")
    svc = make_service(kafka_config=str(conf))
    assert register(svc, "with-conf").status_code == 201
    assert svc.client.post("/v1/pipelines/with-conf/start").status_code == 202
    argv_file = svc.controller.pipeline_dir(svc.controller.get("with-conf")) / "argv.json"
    argv = wait_for(lambda: argv_file.exists() and json.loads(argv_file.read_text()), what="the job's argv")
    assert argv[argv.index("--kafka-config") + 1] == str(conf)
