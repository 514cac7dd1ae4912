"""The embedded broker keeps its topics in memory; the control service keeps a copy of its
registry in its state dir and restores it on start, so a restart lists the same pipelines
and they resume from their checkpoints. Checkpoints of no pipeline are reported, not deleted."""

from __future__ import annotations

import json
import signal

from control_support import Proc, example_sql, register, wait_for


def checkpoint_of(state, name: str) -> str:
    """The --checkpoint the stand-in job was started with."""
    [path] = (state / "pipelines").glob(f"{name}-*/argv.json")
    argv = json.loads(path.read_text())
    return argv[argv.index("--checkpoint") + 1]


def registered(proc: Proc) -> list[dict]:
    """The list as registered (the job's state and owner are not part of it)."""
    keep = ("name", "sql", "options", "desired", "version", "created_at", "updated_at")
    return [{k: p[k] for k in keep} for p in proc.client.get("/v1/pipelines").json()["pipelines"]]


def running_pid(proc: Proc, name: str) -> int:
    return wait_for(lambda: (s := proc.status(name))["state"] == "running" and s["pid"], timeout=60,
                    what=f"{name} running")


def stop(proc: Proc) -> None:
    proc.p.send_signal(signal.SIGTERM)
    assert proc.p.wait(60) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after a clean shutdown


def test_a_restart_on_the_embedded_broker_lists_the_same_pipelines_and_resumes_them(tmp_path, procs):
    state, log = tmp_path / "state", tmp_path / "control.log"
    a = Proc(None, "tidemark.registry", state, log)
    procs.append(a)
    assert register(a, "kept-running", restart=True).status_code == 201
    assert register(a, "kept-stopped", sql=example_sql("kept-stopped").replace("DO DEDUPLICATE", "DO NOTHING")).status_code == 201
    assert a.client.post("/v1/pipelines/kept-running/start").status_code == 202
    old_pid = running_pid(a, "kept-running")
    before = registered(a)
    checkpoint = checkpoint_of(state, "kept-running")
    stray = state / "checkpoints" / "gone-0123456789ab"
    stray.mkdir(parents=True)
    stop(a)

    b = Proc(None, "tidemark.registry", state, log, port=a.port)
    procs.append(b)

    assert registered(b) == before
    assert running_pid(b, "kept-running") != old_pid
    assert checkpoint_of(state, "kept-running") == checkpoint  # resumed from its checkpoint
    assert b.status("kept-stopped")["state"] == "registered"
    text = log.read_text()
    assert text.count("restored 0 pipeline(s) from ") == 1 and "restored 2 pipeline(s) from " in text
    warning = wait_for(lambda: [ln for ln in log.read_text().splitlines() if "belong to no registered pipeline" in ln],
                       what="the orphan warning")
    assert len(warning) == 1 and f"gone-0123456789ab ({stray})" in warning[0]
    assert "kept-running" not in warning[0] and stray.exists()
    stop(b)


def test_an_unreadable_registry_copy_stops_the_service_with_one_line(tmp_path):
    import subprocess

    from control_support import TIDEMARK

    state = tmp_path / "state"
    state.mkdir()
    (state / "registry.json").write_text("[{\"name\": ")
    proc = subprocess.run([TIDEMARK, "control", "--insecure-dev", "--state-dir", str(state)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: registry copy {state / 'registry.json'} is not readable")
