"""Full lifecycle with the real job: register -> start -> data flows on Kafka -> status figures
move -> the sink topic materializes to the seed's answer -> stop -> delete.

Runs the real ``tidemark run`` (Spark, local[*]) under the control service. Skipped until the
runtime registers its ``run`` command; nothing else needs to change to switch it on.
"""

from __future__ import annotations

import uuid

import pytest
from control_support import EXAMPLE_SQL, register, wait_for
from kafka_support import dbz, materialize, produce, replay_table

from tidemark.cli.main import app
from tidemark.control.settings import default_job_command

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif("run" not in {c.name for c in app.registered_commands},
                       reason="tidemark run (issue 3) is not registered yet"),
]


def test_s1_s2_join_runs_end_to_end_under_the_control_service(make_service, broker):
    sfx = uuid.uuid4().hex[:6]
    sql = (EXAMPLE_SQL.replace("'topic' = 's1'", f"'topic' = 's1-{sfx}'")
           .replace("'topic' = 's2'", f"'topic' = 's2-{sfx}'").replace("'topic' = 't1'", f"'topic' = 't1-{sfx}'"))
    svc = make_service(job_command=default_job_command())
    assert register(svc, "join-e2e", sql=sql).status_code == 201
    # the seed's ordering: s2 rows first, then s1 inserts level 10 and updates it to 20
    s2 = [dbz("c", None, {"id": 10, "attr": "a1"}, 1), dbz("c", None, {"id": 20, "attr": "b1"}, 2)]
    s1 = [dbz("c", None, {"id": 1, "level": 10}, 3), dbz("u", {"id": 1, "level": 10}, {"id": 1, "level": 20}, 4)]
    produce(broker, f"s2-{sfx}", s2)
    produce(broker, f"s1-{sfx}", s1[:1])
    assert svc.client.post("/v1/pipelines/join-e2e/start").status_code == 202
    first = wait_for(lambda: (s := svc.status("join-e2e"))["rows_in"] >= 3 and s, timeout=300,
                     what="the job read the first three source records")
    assert first["state"] == "running" and first["last_batch_id"] is not None
    assert first["rows_out"] >= 1  # (1, 10, 'a1') written
    assert wait_for(lambda: materialize(broker, f"t1-{sfx}") == {(("id", 1),): {"id": 1, "level": 10, "attr": "a1"}},
                    timeout=120, what="sink topic materialized to {(1, 10, 'a1')}")

    # more data: the figures move (rows in and out, batch id, batch time)
    produce(broker, f"s1-{sfx}", s1[1:])
    later = wait_for(lambda: (s := svc.status("join-e2e"))["rows_in"] >= 4 and s, timeout=120,
                     what="the job read the update")
    assert later["last_batch_id"] > first["last_batch_id"]
    assert later["last_batch_time"] > first["last_batch_time"]
    expected = replay_table(sql, [{"s2": s2, "s1": s1}])
    assert expected == {(("id", 1),): {"id": 1, "level": 20, "attr": "b1"}}
    assert wait_for(lambda: materialize(broker, f"t1-{sfx}") == expected,
                    timeout=120, what="sink topic materialized to {(1, 20, 'b1')}")
    done = wait_for(lambda: (s := svc.status("join-e2e"))["rows_out"] > first["rows_out"] and s, timeout=60,
                    what="rows_out counted the update")
    assert done["lag"] and all(entry["lag"] == 0 for entry in done["lag"])
    assert {e["topic"] for e in done["lag"]} == {f"s1-{sfx}", f"s2-{sfx}"}
    metrics = svc.client.get("/metrics").text
    assert 'tidemark_pipeline_rows_in_total{pipeline="join-e2e"} 4.0' in metrics

    assert svc.client.post("/v1/pipelines/join-e2e/stop").status_code == 202
    wait_for(lambda: svc.status("join-e2e")["state"] == "stopped", timeout=120, what="stopped")
    assert svc.client.delete("/v1/pipelines/join-e2e").status_code == 204
