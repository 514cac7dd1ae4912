"""Jobs started, watched, failed, restarted and stopped through the API (stand-in job)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest
from control_support import example_sql, register, wait_for
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.integration


def job_dir(svc, name: str) -> Path:
    [d] = (svc.settings.state_dir / "pipelines").glob(f"{name}-*")
    return d


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


def test_started_pipeline_runs_reports_progress_and_stops(service):
    assert register(service, "join1").status_code == 201
    r = service.client.post("/v1/pipelines/join1/start")
    assert r.status_code == 202 and r.json()["desired"] == "running"
    st = wait_for(lambda: (s := service.status("join1"))["state"] == "running" and s["rows_in"] >= 30 and s,
                  what="job running with 3 batches")
    assert st["owner"] == service.controller.service_id
    assert st["rows_out"] * 10 == st["rows_in"] * 4  # sums of the per-batch deltas (10 in, 4 out each)
    assert st["dlq"] > 0 and st["conflicts"] == 2 * st["dlq"]
    assert st["lag"] == [{"topic": "s1", "partition": 0, "lag": 5}, {"topic": "s1", "partition": 1, "lag": 0}]
    assert st["last_batch_id"] >= 2 and st["state_size_bytes"] >= 1002 and st["last_batch_time"] > 0
    pid = st["pid"]
    assert pid_alive(pid)

    # the command line is an argv list; the SQL only travels in the file
    d = job_dir(service, "join1")
    argv = json.loads((d / "argv.json").read_text())
    assert argv[0] == str(d / "join1.sql") and (d / "join1.sql").read_text() == example_sql("join1")
    assert argv[1:3] == ["--bootstrap-servers", service.settings.bootstrap_servers]
    assert argv[3] == "--checkpoint" and argv[4].startswith(str(service.settings.state_dir / "checkpoints"))

    assert service.client.post("/v1/pipelines/join1/stop").status_code == 202
    wait_for(lambda: service.status("join1")["state"] == "stopped", what="stopped")
    wait_for(lambda: not pid_alive(pid), what="job process gone")
    assert service.status("join1")["desired"] == "stopped"


def test_dead_job_is_failed_with_its_stderr(service):
    register(service, "fail-once")
    service.client.post("/v1/pipelines/fail-once/start")
    st = wait_for(lambda: (s := service.status("fail-once"))["state"] == "failed" and s, what="failed")
    assert "exit status 3" in st["error"] and "ConflictError" in st["error"]
    assert st["restarts"] == 0 and st["desired"] == "running"
    # start again = try again: a new run, which fails the same way
    service.client.post("/v1/pipelines/fail-once/start")
    wait_for(lambda: service.status("fail-once")["rows_in"] == 20, what="second run counted")
    assert service.status("fail-once")["state"] == "failed"


def test_restart_true_restarts_with_backoff(service):
    register(service, "fail-loop", restart=True, restart_max_backoff_s=1)
    service.client.post("/v1/pipelines/fail-loop/start")
    st = wait_for(lambda: (s := service.status("fail-loop"))["restarts"] >= 3 and s, what="3 restarts")
    assert st["rows_in"] >= 30  # every run ran a batch before dying
    service.client.post("/v1/pipelines/fail-loop/stop")
    wait_for(lambda: service.status("fail-loop")["state"] == "stopped", what="stopped during backoff")


def test_job_that_finishes_is_stopped_and_not_resumed(service):
    register(service, "finish-backfill", until_idle=True)
    service.client.post("/v1/pipelines/finish-backfill/start")
    st = wait_for(lambda: (s := service.status("finish-backfill"))["desired"] == "stopped" and s,
                  what="desired stopped")
    assert st["state"] == "stopped" and st["rows_in"] == 20 and st["error"] is None
    argv = json.loads((job_dir(service, "finish-backfill") / "argv.json").read_text())
    assert argv[-1] == "--until-idle"


def test_delete_stops_the_job_first(service):
    register(service, "doomed")
    service.client.post("/v1/pipelines/doomed/start")
    pid = wait_for(lambda: service.status("doomed")["pid"], what="pid")
    d = job_dir(service, "doomed")
    assert service.client.delete("/v1/pipelines/doomed").status_code == 204
    assert not pid_alive(pid)
    assert not d.exists()
    assert service.client.get("/v1/pipelines/doomed").status_code == 404
    # the name is free again, with fresh files
    assert register(service, "doomed").status_code == 201


def test_metrics_carry_per_pipeline_series(service):
    register(service, "m-one")
    register(service, "m-two")
    service.client.post("/v1/pipelines/m-one/start")
    wait_for(lambda: service.status("m-one")["rows_in"] >= 20, what="batches")
    text = httpx.get(service.url + "/metrics").text
    samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            samples.setdefault(s.name, []).append(s)

    def value(name: str, **labels) -> float:
        [s] = [s for s in samples[name] if all(s.labels.get(k) == v for k, v in labels.items())]
        return s.value

    assert value("tidemark_pipeline_rows_in_total", pipeline="m-one") >= 20
    assert value("tidemark_pipeline_rows_out_total", pipeline="m-one") >= 8
    assert value("tidemark_pipeline_dlq_records_total", pipeline="m-one") >= 2
    assert value("tidemark_pipeline_conflicts_total", pipeline="m-one") >= 4
    assert value("tidemark_pipeline_retractions_without_state_total", pipeline="m-one") == 0
    assert value("tidemark_pipeline_state_size_bytes", pipeline="m-one") >= 1001
    assert value("tidemark_pipeline_consumer_lag", pipeline="m-one", topic="s1", partition="0") == 5
    assert value("tidemark_pipeline_state", pipeline="m-one", tidemark_pipeline_state="running") == 1
    assert value("tidemark_pipeline_state", pipeline="m-one", tidemark_pipeline_state="failed") == 0
    assert value("tidemark_registry_pipeline_desired_running", pipeline="m-one") == 1
    assert value("tidemark_registry_pipeline_desired_running", pipeline="m-two") == 0
    assert value("tidemark_registry_pipelines") == 2
    # m-two never ran here: no job series for it
    assert not [s for s in samples["tidemark_pipeline_rows_in_total"] if s.labels["pipeline"] == "m-two"]
    assert any(s.labels.get("route") == "/v1/pipelines/{name}/status"
               for s in samples["tidemark_control_http_request_duration_seconds_count"])


def test_a_slow_stop_does_not_hold_up_other_pipelines_leases(make_service):
    svc = make_service(lease_ttl_s=1.5)  # renewals every 0.5 s; the slow job takes 3 s to stop
    for name in ("slow-stop", "steady"):
        register(svc, name)
        svc.client.post(f"/v1/pipelines/{name}/start")
    pid = wait_for(lambda: (s := svc.status("steady"))["state"] == "running" and s["pid"], what="steady runs")
    wait_for(lambda: svc.status("slow-stop")["state"] == "running", what="slow-stop runs")
    svc.client.post("/v1/pipelines/slow-stop/stop")
    wait_for(lambda: svc.status("slow-stop")["state"] == "stopped", what="slow-stop stopped")
    st = svc.status("steady")
    assert st["state"] == "running" and st["pid"] == pid  # never fenced while the other one stopped
    assert not any(s.fenced for s in svc.controller.supervisors.values())
