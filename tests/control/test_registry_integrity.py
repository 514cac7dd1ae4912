"""The registry applies only records a control service wrote, on a real broker: a pipeline
cannot write the registry topic, and records written straight to it by anyone without the
registry key are skipped without touching the state dir."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest
from confluent_kafka import Producer
from control_support import EXAMPLE_SQL, TOKEN, register

from tidemark.control.registry_signing import headers, signing_key

pytestmark = pytest.mark.integration


def test_a_pipeline_writing_or_reading_the_registry_topic_is_refused(service, registry_topic):
    as_sink = EXAMPLE_SQL.replace("'topic' = 't1'", f"'topic' = '{registry_topic}'")
    r = register(service, "hijack", sql=as_sink)
    assert r.status_code == 422, r.text
    assert "table 't1'" in r.json()["detail"] and "registry topic" in r.json()["detail"]
    as_source = EXAMPLE_SQL.replace("'topic' = 's2'", f"'topic' = '{registry_topic}'")
    r = register(service, "snoop", sql=as_source)
    assert r.status_code == 422 and "table 's2'" in r.json()["detail"]
    assert service.client.get("/v1/pipelines").json()["pipelines"] == []


def forged(name: str, uid: str) -> bytes:
    return json.dumps({"kind": "pipeline", "name": name, "sql": EXAMPLE_SQL, "options": {}, "desired": "running",
                       "version": 1, "uid": uid, "request_id": "forged", "created_at": 0.0,
                       "updated_at": 0.0}).encode()


def skipped(svc, reason: str) -> float:
    for line in httpx.get(svc.url + "/metrics").text.splitlines():
        if line.startswith(f'tidemark_registry_records_skipped_total{{reason="{reason}"}}'):
            return float(line.split()[-1])
    return 0.0


def test_records_written_straight_to_the_topic_are_ignored(make_service, broker, registry_topic, tmp_path):
    service = make_service(tmp_path / "a")
    assert register(service, "legit").status_code == 201
    p = Producer({"bootstrap.servers": broker})
    p.produce(registry_topic, key=b"evil", value=forged("evil", "/../../../x"))  # the record
    p.produce(registry_topic, key=b"legit", value=None)  # an unsigned tombstone for a real pipeline
    wrong_key = signing_key("not-the-service-key", None)
    p.produce(registry_topic, key=b"evil2", value=forged("evil2", uuid.uuid4().hex),
              headers=headers(wrong_key, b"evil2", forged("evil2", uuid.uuid4().hex)))
    # signed with the service's own key (derived from its token) but not a record the API
    # writes: its uid would leave the state dir
    own_key = signing_key(None, TOKEN)
    p.produce(registry_topic, key=b"evil3", value=forged("evil3", "/../../../x"),
              headers=headers(own_key, b"evil3", forged("evil3", "/../../../x")))
    p.flush(10)

    # a registration returns once its own record, after the forged ones, has been read back
    assert register(service, "marker").status_code == 201
    for _ in range(3):  # reconcile passes that would have started the forged pipelines
        service.controller.reconcile_once()
    assert [p["name"] for p in service.client.get("/v1/pipelines").json()["pipelines"]] == ["legit", "marker"]
    assert service.client.get("/v1/pipelines/evil").status_code == 404
    assert not service.controller.supervisors
    assert skipped(service, "signature") == 3 and skipped(service, "invalid") == 1
    # a service loading the topic from the start skips them too, and loads the rest
    loader = make_service(tmp_path / "b")
    assert [p["name"] for p in loader.client.get("/v1/pipelines").json()["pipelines"]] == ["legit", "marker"]
    assert skipped(loader, "signature") == 3 and skipped(loader, "invalid") == 1
    loader.controller.reconcile_once()
    assert not loader.controller.supervisors
    state_dirs = [svc.settings.state_dir.resolve() for svc in (service, loader)]
    outside = [f for f in tmp_path.rglob("*") if not any(f.resolve().is_relative_to(d) for d in state_dirs)]
    assert outside == []
    assert service.client.delete("/v1/pipelines/legit").status_code == 204
    assert [p["name"] for p in service.client.get("/v1/pipelines").json()["pipelines"]] == ["marker"]


def test_a_path_that_would_leave_the_state_dir_is_refused(service):
    """The backstop behind validation: a record that got past it still cannot place the
    job's files outside the state dir."""
    from tidemark.control.controller import UnsafePath
    from tidemark.control.registry_log import PipelineRecord

    rec = PipelineRecord(name="evil", sql="x", options={}, desired="running", version=1, uid="/../../../x",
                         request_id="", created_at=0.0, updated_at=0.0)
    with pytest.raises(UnsafePath, match="not inside the state dir"):
        service.controller.pipeline_dir(rec)
    ok = PipelineRecord(name="ok", sql="x", options={}, desired="running", version=1, uid=uuid.uuid4().hex,
                        request_id="", created_at=0.0, updated_at=0.0)
    assert service.controller.pipeline_dir(ok).resolve().is_relative_to(service.settings.state_dir.resolve())
