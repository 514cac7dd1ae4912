"""The control API's defences, through HTTP against a running service and a real broker:
topic rules, one plan per request, strict JSON and option types, limits, the paged list."""

from __future__ import annotations

import uuid

import pytest
from control_support import EXAMPLE_SQL, example_sql, register, wait_for

pytestmark = pytest.mark.integration


def test_topic_rules_at_registration_name_the_table_and_the_rule(service):
    assert register(service, "first").status_code == 201
    r = register(service, "second", sql=example_sql("first"))  # first's sink topic
    assert r.status_code == 422 and r.json()["kind"] == "TopicRuleViolation"
    assert r.json()["detail"] == ("table 't1' (sink): topic 't1-first' is already the sink of pipeline 'first'; "
                                  "two pipelines must not write one topic")
    r = register(service, "third", sql=EXAMPLE_SQL.replace("'topic' = 's1'", "'topic' = '__consumer_offsets'"))
    assert r.status_code == 422 and "table 's1' (source)" in r.json()["detail"]
    assert "internal topic" in r.json()["detail"]
    assert [p["name"] for p in service.client.get("/v1/pipelines").json()["pipelines"]] == ["first"]


def test_a_registration_plans_its_sql_once(service, monkeypatch):
    import tidemark.engine.pipeline as engine

    calls: list[str] = []
    real = engine.compile_sql
    monkeypatch.setattr(engine, "compile_sql", lambda sql: calls.append(sql) or real(sql))
    sql = f"-- {uuid.uuid4().hex}\n" + example_sql("once")  # not in the plan cache yet
    assert register(service, "once", sql=sql).status_code == 201
    assert len(calls) == 1  # the plan shown, the checks and the registry's read-back share it


@pytest.mark.parametrize("body", [
    b'{"sql": NaN}', b'{"sql": Infinity}', b'{"sql": "\\ud800"}', b'{"sql": "SELECT \\udfff"}', b'{"sql": 1e999}',
    b'{"name": "a", "sql": "x", "options": {"restart_max_backoff_s": NaN}}',
    b'{"name": "\\ud800", "sql": "x"}',
])
@pytest.mark.parametrize("path", ["/v1/explain", "/v1/pipelines"])
def test_bodies_json_cannot_hold_are_422_with_a_message(service, path, body):
    r = service.client.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert "request body is not valid JSON" in r.json()["detail"]


def test_a_body_without_a_json_content_type_is_415_saying_what_to_send(service):
    for headers in ({}, {"content-type": "application/x-www-form-urlencoded"}, {"content-type": "text/plain"}):
        r = service.client.post("/v1/explain", content=b'{"sql": "x"}', headers=headers)
        assert r.status_code == 415, (headers, r.text)
        assert "send Content-Type: application/json" in r.json()["detail"]
    r = service.client.post("/v1/explain", content=b'{"sql": "x"}', headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["kind"]  # through to the planner


@pytest.mark.parametrize(("options", "field"), [
    ({"max_records_per_trigger": True}, "options.max_records_per_trigger"),
    ({"max_records_per_trigger": 5.0}, "options.max_records_per_trigger"),
    ({"restart": 1}, "options.restart"),
    ({"until_idle": "yes"}, "options.until_idle"),
])
def test_options_have_strict_types(service, options, field):
    r = register(service, "strict", **options)
    assert r.status_code == 422 and field in r.json()["detail"], r.text
    assert service.client.get("/v1/pipelines/strict").status_code == 404


def test_registrations_past_the_limits_are_409_naming_the_limit(make_service):
    svc = make_service(max_pipelines=2, max_registry_sql_bytes=3 * len(EXAMPLE_SQL))
    assert register(svc, "a").status_code == 201 and register(svc, "b").status_code == 201
    r = register(svc, "c")
    assert r.status_code == 409 and "at most 2 pipelines (--max-pipelines)" in r.json()["detail"]
    assert svc.client.delete("/v1/pipelines/b").status_code == 204
    r = register(svc, "big", sql="-- " + "x" * 2 * len(EXAMPLE_SQL) + "\n" + example_sql("big"))
    assert r.status_code == 409 and "--max-registry-sql-bytes" in r.json()["detail"]
    assert register(svc, "c").status_code == 201


def test_the_list_is_paged_by_name_and_carries_each_state(service):
    names = [f"p{i}" for i in range(5)]
    for name in names:
        assert register(service, name).status_code == 201
    service.client.post("/v1/pipelines/p3/start")
    wait_for(lambda: service.status("p3")["state"] == "running", what="p3 running")
    seen, token, pages = [], None, 0
    while True:
        params = {"limit": 2, **({"page_token": token} if token else {})}
        body = service.client.get("/v1/pipelines", params=params).json()
        pages += 1
        seen += body["pipelines"]
        token = body.get("next_page_token")
        if token is None:
            break
    assert pages == 3 and [p["name"] for p in seen] == names
    states = {p["name"]: p["state"] for p in seen}
    assert states == {"p0": "registered", "p1": "registered", "p2": "registered", "p3": "running", "p4": "registered"}
    assert [p["owner"] for p in seen if p["name"] == "p3"] == [service.controller.service_id]
    assert len(service.client.get("/v1/pipelines").json()["pipelines"]) == 5  # default page: 100
    for params in ({"limit": 0}, {"limit": 1001}, {"page_token": "../x"}):
        r = service.client.get("/v1/pipelines", params=params)
        assert r.status_code == 422, (params, r.text)
