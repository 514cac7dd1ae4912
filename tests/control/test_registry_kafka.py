"""The registry on a real broker: rebuilt on restart, and shared by two services safely."""

from __future__ import annotations

import json

import pytest
from control_support import assert_never_overlapped, job_intervals, register, wait_for
from confluent_kafka import Consumer, TopicPartition

pytestmark = pytest.mark.integration

NAMES = ("p-a", "p-b", "p-c")


def registry_records(broker: str, topic: str) -> list[tuple[str, dict | None]]:
    c = Consumer({"bootstrap.servers": broker, "group.id": "t", "enable.auto.commit": False})
    try:
        _, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        c.assign([TopicPartition(topic, 0, 0)])
        out, last = [], -1
        while last + 1 < high:
            m = c.poll(5)
            assert m is not None and not m.error()
            out.append((m.key().decode(), json.loads(m.value()) if m.value() is not None else None))
            last = m.offset()
        return out
    finally:
        c.close()


def test_registry_is_a_compacted_topic_keyed_by_name_with_tombstones(service, broker, registry_topic):
    register(service, "kept")
    register(service, "gone")
    service.client.delete("/v1/pipelines/gone")
    records = [(k, v) for k, v in registry_records(broker, registry_topic) if not k.startswith("lease/")]
    assert [k for k, _ in records] == ["kept", "gone", "gone"]
    assert records[0][1]["sql"] and records[0][1]["desired"] == "stopped"
    assert records[2][1] is None  # tombstone
    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = AdminClient({"bootstrap.servers": broker})  # kept alive until the future resolves
    [(_, fut)] = admin.describe_configs([ConfigResource("topic", registry_topic)]).items()
    assert fut.result(timeout=10)["cleanup.policy"].value == "compact"


def test_restarted_service_rebuilds_the_registry_and_resumes_running_pipelines(make_service, tmp_path):
    state = tmp_path / "svc"
    a = make_service(state)
    for name in ("idle", "busy", "deleted"):
        assert register(a, name).status_code == 201
    a.client.post("/v1/pipelines/busy/start")
    a.client.delete("/v1/pipelines/deleted")
    old_pid = wait_for(lambda: (s := a.status("busy"))["state"] == "running" and s["pid"], what="busy running")
    a.stop()

    b = make_service(state)  # same state dir: same service id, same files
    names = [p["name"] for p in b.client.get("/v1/pipelines").json()["pipelines"]]
    assert names == ["busy", "idle"]
    st = wait_for(lambda: (s := b.status("busy"))["state"] == "running" and s, what="busy resumed")
    assert st["pid"] != old_pid and st["owner"] == b.controller.service_id == a.controller.service_id
    assert b.status("idle")["state"] == "registered"


def test_second_service_does_not_run_a_claimed_pipeline_and_takes_over_when_the_owner_hangs(
        make_service, tmp_path, monkeypatch):
    log = tmp_path / "jobs.log"
    monkeypatch.setenv("FAKE_JOB_LOG", str(log))
    a = make_service(tmp_path / "a", lease_ttl_s=3.0)
    for name in NAMES:
        register(a, name)
        a.client.post(f"/v1/pipelines/{name}/start")
    for name in NAMES:
        wait_for(lambda n=name: a.status(n)["state"] == "running", what=f"{name} running on A")

    b = make_service(tmp_path / "b", lease_ttl_s=3.0)
    # B sees every pipeline as desired running, but A holds the leases and keeps renewing
    # them: across more than two lease lifetimes B must never start anything
    wait_for(lambda: b.controller.registry.loaded, what="B loaded")
    first_expiry = b.controller.registry.read(lambda st: st.leases[NAMES[0]].expires_at)

    def b_stays_idle() -> bool:
        b.controller.reconcile_once()
        assert not b.controller.supervisors
        assert {b.status(n)["owner"] for n in NAMES} == {a.controller.service_id}
        return b.controller.registry.read(lambda st: st.leases[NAMES[0]].expires_at) > first_expiry + 2 * 3.0

    wait_for(b_stays_idle, what="A renewing its leases across two lease lifetimes")
    # B reports A's job status, carried by A's lease renewals
    wait_for(lambda: {b.status(n)["state"] for n in NAMES} == {"running"}, what="B sees A's jobs running")
    assert b.status(NAMES[0])["rows_in"] > 0

    # A hangs (its reconcile loop stops: no renewals, like a long GC pause or a partition).
    # Its jobs stop themselves at the lease deadline; B claims after expiry + grace.
    a.controller._stop.set()
    for name in NAMES:
        wait_for(lambda n=name: b.status(n)["state"] == "running" and b.status(n)["owner"] == b.controller.service_id,
                 what=f"{name} taken over by B")
    assert not any(sup.alive for sup in a.controller.supervisors.values())
    intervals = job_intervals(log)
    assert sorted(intervals) == sorted(NAMES) and all(len(runs) == 2 for runs in intervals.values())
    assert_never_overlapped(intervals)


def test_clean_shutdown_hands_pipelines_over_without_waiting_for_expiry(make_service, tmp_path, monkeypatch):
    log = tmp_path / "jobs.log"
    monkeypatch.setenv("FAKE_JOB_LOG", str(log))
    a = make_service(tmp_path / "a", lease_ttl_s=600.0)  # expiry would take 10 minutes
    register(a, "handover")
    a.client.post("/v1/pipelines/handover/start")
    wait_for(lambda: a.status("handover")["state"] == "running", what="running on A")
    b = make_service(tmp_path / "b", lease_ttl_s=600.0)
    a.stop()  # releases the lease
    wait_for(lambda: b.status("handover")["owner"] == b.controller.service_id
             and b.status("handover")["state"] == "running", what="B runs it")
    assert_never_overlapped(job_intervals(log))


def test_stop_sent_to_the_other_service_stops_the_owners_job(make_service, tmp_path):
    a = make_service(tmp_path / "a")
    b = make_service(tmp_path / "b")
    register(a, "remote")
    a.client.post("/v1/pipelines/remote/start")  # both race for the lease; one wins
    owner_id = wait_for(lambda: (s := a.status("remote"))["state"] == "running" and s["owner"], what="running")
    owner, other = (a, b) if owner_id == a.controller.service_id else (b, a)
    assert not other.controller.supervisors
    assert other.client.post("/v1/pipelines/remote/stop").status_code == 202
    wait_for(lambda: owner.status("remote")["state"] == "stopped", what="the owner stopped it")
    assert not any(s.alive for s in owner.controller.supervisors.values())
    assert not other.controller.supervisors
