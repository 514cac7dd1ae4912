"""The control service SIGKILLed while the real job runs: restarted on the same state dir and
registry topic, it finds its registry again, resumes the pipeline (the new job starts from the
old job's checkpoint), and the sink table ends equal to the ReplayHost's over all the data."""

from __future__ import annotations

import signal
import uuid

import pytest
from control_support import EXAMPLE_SQL, Proc, alive, register, wait_for
from kafka_support import dbz, materialize, produce, replay_table

from tidemark.cli.main import app

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif("run" not in {c.name for c in app.registered_commands},
                       reason="tidemark run (issue 3) is not registered yet"),
]


def phase_one() -> dict:
    s2 = [dbz("c", None, {"id": 10 + i, "attr": f"a{i}"}, i) for i in range(4)]
    s1 = [dbz("c", None, {"id": i, "level": 10 + i % 4}, 10 + i) for i in range(1, 9)]
    s1 += [dbz("u", {"id": 1, "level": 11}, {"id": 1, "level": 13}, 30),
           dbz("d", {"id": 2, "level": 12}, None, 31)]
    return {"s2": s2, "s1": s1}


def phase_two() -> dict:
    # after the restart: an attribute changes (every joined row follows), a dimension row
    # goes (its rows leave the sink), levels move, new ids arrive, an id comes back
    s2 = [dbz("u", {"id": 11, "attr": "a1"}, {"id": 11, "attr": "a1-new"}, 40),
          dbz("d", {"id": 13, "attr": "a3"}, None, 41),
          dbz("c", None, {"id": 14, "attr": "a4"}, 42)]
    s1 = [dbz("u", {"id": 3, "level": 13}, {"id": 3, "level": 14}, 50),
          dbz("c", None, {"id": 2, "level": 10}, 51),
          dbz("c", None, {"id": 20, "level": 11}, 52),
          dbz("u", {"id": 5, "level": 11}, {"id": 5, "level": 12}, 53)]
    return {"s2": s2, "s1": s1}


def test_sigkilled_service_resumes_the_real_job_and_the_sink_ends_correct(broker, registry_topic, tmp_path, procs):
    sfx = uuid.uuid4().hex[:6]
    topics = {"s1": f"s1-{sfx}", "s2": f"s2-{sfx}", "t1": f"t1-{sfx}"}
    sql = EXAMPLE_SQL
    for table, topic in topics.items():
        sql = sql.replace(f"'topic' = '{table}'", f"'topic' = '{topic}'")
    one, two = phase_one(), phase_two()
    state, log = tmp_path / "state", tmp_path / "control.log"

    a = Proc(broker, registry_topic, state, log, job_command=None)
    procs.append(a)
    assert register(a, "join-restart", sql=sql).status_code == 201
    for table in ("s2", "s1"):
        produce(broker, topics[table], one[table])
    assert a.client.post("/v1/pipelines/join-restart/start").status_code == 202
    n_one = sum(map(len, one.values()))
    old = wait_for(lambda: (s := a.status("join-restart"))["rows_in"] >= n_one and s, timeout=300,
                   what="the first job read phase one")
    assert old["state"] == "running"
    after_one = replay_table(sql, [one])
    wait_for(lambda: materialize(broker, topics["t1"]) == after_one, timeout=120, what="phase one in the sink")

    a.p.send_signal(signal.SIGKILL)
    a.p.wait()

    b = Proc(broker, registry_topic, state, log, port=a.port, job_command=None)
    procs.append(b)
    assert [p["name"] for p in b.client.get("/v1/pipelines").json()["pipelines"]] == ["join-restart"]
    assert b.client.get("/v1/pipelines/join-restart").json()["desired"] == "running"
    new = wait_for(lambda: (s := b.status("join-restart"))["state"] == "running" and s["pid"] != old["pid"] and s,
                   timeout=120, what="resumed with a new job")
    assert not alive(old["pid"])  # the old job is gone before (or as) the new one runs
    assert new["owner"] == old["owner"]

    for table in ("s2", "s1"):
        produce(broker, topics[table], two[table])
    expected = replay_table(sql, [one, two])
    assert expected != after_one
    wait_for(lambda: materialize(broker, topics["t1"]) == expected, timeout=300,
             what="the sink table equal to the ReplayHost's over both phases")
    final = wait_for(lambda: (s := b.status("join-restart"))["lag"] and all(e["lag"] == 0 for e in s["lag"]) and s,
                     timeout=60, what="no lag")
    assert final["last_batch_id"] is not None
    assert b.client.post("/v1/pipelines/join-restart/stop").status_code == 202
    wait_for(lambda: b.status("join-restart")["state"] == "stopped", timeout=120, what="stopped")
