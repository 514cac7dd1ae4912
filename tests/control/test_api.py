"""The REST contract through HTTP against a running service and a real broker."""

from __future__ import annotations

import httpx
import pytest

from control_support import EXAMPLE_SQL, TOKEN, example_sql, register

pytestmark = pytest.mark.integration

NO_ON_CONFLICT = EXAMPLE_SQL.replace("ON CONFLICT DO DEDUPLICATE", "")


def test_register_returns_the_plan_and_the_pipeline_is_listed(service):
    r = register(service, "join1")
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["name"] == "join1" and body["desired"] == "stopped"
    assert body["plan"]["sink"] == "t1"
    assert body["plan"]["materializer"]["strategy"] == "DEDUPLICATE"
    assert [p["name"] for p in service.client.get("/v1/pipelines").json()["pipelines"]] == ["join1"]
    got = service.client.get("/v1/pipelines/join1").json()
    assert got["sql"] == example_sql("join1") and got["options"]["restart"] is False
    assert service.status("join1")["state"] == "registered"


def test_missing_on_conflict_is_422_with_the_planners_message(service):
    r = register(service, "noclause", sql=NO_ON_CONFLICT)
    assert r.status_code == 422
    detail = r.json()["detail"]
    for clause in ("ON CONFLICT DO NOTHING", "ON CONFLICT DO ERROR", "ON CONFLICT DO DEDUPLICATE"):
        assert clause in detail
    assert r.json()["kind"] == "PlanError"
    assert service.client.get("/v1/pipelines/noclause").status_code == 404  # nothing registered


def test_explain_plans_without_registering(service):
    r = service.client.post("/v1/explain", json={"sql": EXAMPLE_SQL})
    assert r.status_code == 200
    assert r.json()["on_conflict"] == "DEDUPLICATE"
    bad = service.client.post("/v1/explain", json={"sql": "SELECT FROM WHERE"})
    assert bad.status_code == 422 and bad.json()["detail"]
    assert service.client.get("/v1/pipelines").json() == {"pipelines": []}


def test_duplicate_name_is_409(service):
    assert register(service, "dup").status_code == 201
    r = register(service, "dup")
    assert r.status_code == 409
    assert "already exists" in r.json()["detail"]


@pytest.mark.parametrize("method,path,body", [
    ("POST", "/v1/pipelines", {"name": "x", "sql": EXAMPLE_SQL}),
    ("POST", "/v1/explain", {"sql": EXAMPLE_SQL}),
    ("POST", "/v1/pipelines/x/start", None),
    ("POST", "/v1/pipelines/x/stop", None),
    ("DELETE", "/v1/pipelines/x", None),
    ("GET", "/v1/pipelines", None),
])
def test_v1_needs_the_bearer_token(service, method, path, body):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
        r = httpx.request(method, service.url + path, json=body, headers=headers)
        assert r.status_code == 401, (headers, r.text)
        assert r.headers["www-authenticate"] == "Bearer"
    assert service.client.get("/v1/pipelines/x").status_code == 404  # nothing was created


def test_ops_endpoints_need_no_token(service):
    assert httpx.get(service.url + "/healthz").json()["status"] == "ok"
    ready = httpx.get(service.url + "/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    assert httpx.get(service.url + "/metrics").status_code == 200
    assert "/v1/pipelines" in httpx.get(service.url + "/openapi.json").json()["paths"]


def test_bad_requests_are_4xx_with_a_message(service):
    cases = [
        ({"name": "Bad Name!", "sql": EXAMPLE_SQL}, "name"),
        ({"name": "ok", "sql": EXAMPLE_SQL, "options": {"restrat": True}}, "restrat"),
        ({"name": "ok"}, "sql"),
    ]
    for body, mentioned in cases:
        r = service.client.post("/v1/pipelines", json=body)
        assert r.status_code == 422, r.text
        assert mentioned in r.json()["detail"]
    r = service.client.post("/v1/pipelines", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and "JSON" in r.json()["detail"]
    assert service.client.get("/v1/pipelines/UPPER").status_code == 422
    assert service.client.post("/v1/pipelines/nope/start").status_code == 404


def test_oversized_body_is_413(service):
    big = {"name": "big", "sql": "-- " + "x" * (1024 * 1024)}
    r = service.client.post("/v1/pipelines", json=big)
    assert r.status_code == 413 and "larger than" in r.json()["detail"]

    def chunks():  # no Content-Length: the cap applies while streaming
        yield b'{"name": "big", "sql": "'
        for _ in range(300):
            yield b"y" * 4096
        yield b'"}'

    r = service.client.post("/v1/pipelines", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_insecure_dev_service_accepts_requests_without_token(make_service):
    svc = make_service(token=None)
    r = httpx.post(svc.url + "/v1/explain", json={"sql": EXAMPLE_SQL})
    assert r.status_code == 200
