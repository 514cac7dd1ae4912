"""``PUT /v1/pipelines/{name}``: a compatible change keeps the pipeline's checkpoint and
restarts its running job with the new version; an incompatible one is a 409 naming the
stage, unless the request asks for a fresh start (a new checkpoint)."""

from __future__ import annotations

import json

from control_support import example_sql, register, wait_for


def filtered(name: str) -> str:
    """A filter on the joined rows that stays after the join (a function call does not move
    below it: docs/sql.md, "Joins"): the join's inputs and stored rows are as they were."""
    return example_sql(name).replace("ON s1.level = s2.id", "ON s1.level = s2.id WHERE UPPER(s2.attr) <> 'X'")


def do_nothing(name: str) -> str:
    """Another conflict strategy: the materializer's state means something else."""
    return example_sql(name).replace("DO DEDUPLICATE", "DO NOTHING")


def job_argv(service, name: str) -> list[str]:
    return json.loads((service.controller.pipeline_dir(service.controller.get(name)) / "argv.json").read_text())


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def running_pid(service, name: str, other_than: int | None = None) -> int:
    return wait_for(lambda: (s := service.status(name))["state"] == "running" and s["pid"] not in (None, other_than)
                    and s["pid"], what=f"{name} running")


def test_a_compatible_change_restarts_the_running_job_on_the_same_checkpoint(service):
    assert register(service, "upg").status_code == 201
    assert service.client.post("/v1/pipelines/upg/start").status_code == 202
    old_pid = running_pid(service, "upg")
    old_argv = job_argv(service, "upg")

    new = filtered("upg")
    r = service.client.put("/v1/pipelines/upg", json={"sql": new, "options": {"max_records_per_trigger": 5}})

    assert r.status_code == 200, r.text
    body = r.json()
    assert body["sql"] == new and body["version"] == 3 and body["desired"] == "running"
    assert body["options"]["max_records_per_trigger"] == 5 and body["plan"]["sink"] == "t1"
    running_pid(service, "upg", other_than=old_pid)
    argv = wait_for(lambda: (a := job_argv(service, "upg")) != old_argv and a, what="the job restarted")
    assert flag(argv, "--checkpoint") == flag(old_argv, "--checkpoint")  # the state is kept
    assert flag(argv, "--max-records-per-trigger") == "5"
    assert open(argv[0]).read() == new
    assert service.client.get("/v1/pipelines/upg").json()["sql"] == new


def test_an_incompatible_change_is_409_naming_the_stage_and_fresh_start_gets_a_new_checkpoint(service):
    assert register(service, "upg2").status_code == 201
    assert service.client.post("/v1/pipelines/upg2/start").status_code == 202
    old_pid = running_pid(service, "upg2")
    old_checkpoint = flag(job_argv(service, "upg2"), "--checkpoint")

    new = do_nothing("upg2")
    r = service.client.put("/v1/pipelines/upg2", json={"sql": new})

    assert r.status_code == 409, r.text
    detail = r.json()["detail"]
    assert "pipeline 'upg2': the new plan cannot read the state of the old one" in detail
    assert 'materializer: config changed: strategy: "DEDUPLICATE" -> "NOTHING"' in detail
    assert '"fresh_start": true' in detail
    assert service.client.get("/v1/pipelines/upg2").json()["sql"] == example_sql("upg2")
    assert service.status("upg2")["pid"] == old_pid  # untouched

    r = service.client.put("/v1/pipelines/upg2", json={"sql": new, "fresh_start": True})

    assert r.status_code == 200, r.text
    assert r.json()["sql"] == new
    running_pid(service, "upg2", other_than=old_pid)
    argv = wait_for(lambda: (a := job_argv(service, "upg2")) and a, what="the new job's argv")
    assert flag(argv, "--checkpoint") != old_checkpoint
    assert open(argv[0]).read() == new


def test_a_pipeline_that_never_ran_takes_any_change_and_bad_requests_are_4xx(service):
    assert register(service, "upg3").status_code == 201
    assert service.client.put("/v1/pipelines/upg3", json={"sql": do_nothing("upg3")}).status_code == 200
    assert service.client.put("/v1/pipelines/nope", json={"sql": do_nothing("nope")}).status_code == 404
    bad = service.client.put("/v1/pipelines/upg3", json={"sql": "SELECT"})
    assert bad.status_code == 422 and bad.json()["detail"]
    assert service.client.put("/v1/pipelines/upg3", json={"sql": example_sql("upg3"), "fresh": True}).status_code == 422
    # the topic rules hold for a change as for a registration
    own_source = example_sql("upg3").replace("'topic' = 't1-upg3'", "'topic' = 's1'")
    refused = service.client.put("/v1/pipelines/upg3", json={"sql": own_source})
    assert refused.status_code == 422 and refused.json()["kind"] == "TopicRuleViolation"
