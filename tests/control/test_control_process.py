"""The real ``tidemark control`` process: token refusal, SIGKILL + restart, SIGTERM shutdown."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from control_support import TIDEMARK, Proc, alive, free_port, register, wait_for

pytestmark = pytest.mark.integration


def test_refuses_to_start_without_a_token(broker):
    env = {k: v for k, v in os.environ.items() if k != "TIDEMARK_API_TOKEN"}
    r = subprocess.run([TIDEMARK, "control", "--bootstrap-servers", broker, "--port", str(free_port())],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "TIDEMARK_API_TOKEN" in r.stderr and "Traceback" not in r.stderr


def test_killed_service_comes_back_with_its_registry_and_running_pipeline(broker, registry_topic, tmp_path, procs):
    state, log = tmp_path / "state", tmp_path / "control.log"
    a = Proc(broker, registry_topic, state, log)
    procs.append(a)
    assert register(a, "survivor").status_code == 201
    assert register(a, "bystander").status_code == 201
    a.client.post("/v1/pipelines/survivor/start")
    old = wait_for(lambda: (s := a.status("survivor"))["state"] == "running" and s, what="running")
    a.p.send_signal(signal.SIGKILL)
    a.p.wait()
    assert alive(old["pid"])  # SIGKILL gave the service no chance to stop its job

    b = Proc(broker, registry_topic, state, log, port=a.port)
    procs.append(b)
    names = [p["name"] for p in b.client.get("/v1/pipelines").json()["pipelines"]]
    assert names == ["bystander", "survivor"]
    new = wait_for(lambda: (s := b.status("survivor"))["state"] == "running" and s["pid"] != old["pid"] and s,
                   what="resumed with a new job")
    assert not alive(old["pid"])  # the orphan was stopped before the new job started
    assert new["owner"] == old["owner"]  # same state dir, same service id: no lease wait
    assert b.status("bystander")["state"] == "registered"
    text = log.read_text()
    assert "left behind by a previous control service" in text
    assert " POST /v1/pipelines/survivor/start 202 " in text  # one access line per request, with timing
    assert "ms" in [ln for ln in text.splitlines() if "/v1/pipelines/survivor/start" in ln][0]

    # SIGTERM: clean shutdown (uvicorn finishes the lifespan, then re-raises the signal, so
    # the exit status says "terminated by SIGTERM"); the job is stopped with it
    b.p.send_signal(signal.SIGTERM)
    assert b.p.wait(timeout=60) in (0, -signal.SIGTERM)
    assert not alive(new["pid"])
    assert "Application shutdown complete" in log.read_text()


def test_limit_flags_are_checked(broker):
    r = subprocess.run([TIDEMARK, "control", "--bootstrap-servers", broker, "--port", str(free_port()),
                        "--max-pipelines", "0"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "TIDEMARK_API_TOKEN": "t"})
    assert r.returncode == 2 and "--max-pipelines" in r.stderr and "Traceback" not in r.stderr
