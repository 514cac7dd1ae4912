"""A compatible change of a running real pipeline through the control service: ``PUT`` with
a filter after the aggregate restarts the job on the same checkpoint, which keeps the
aggregate's state and the source offsets (the new job reads only the new records)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from control_support import Proc, register, wait_for
from kafka_support import materialize, produce

pytestmark = pytest.mark.integration

COUNTS = """
CREATE TABLE clicks (k STRING) WITH ('topic' = 'clicks', 'format' = 'json');
CREATE TABLE counts (k STRING, n BIGINT, PRIMARY KEY (k) NOT ENFORCED)
  WITH ('topic' = 'counts', 'format' = 'upsert-json');
INSERT INTO counts SELECT k, COUNT(*) AS n FROM clicks GROUP BY k;
"""
ABOVE_ONE = COUNTS.replace("SELECT k, COUNT(*) AS n FROM clicks GROUP BY k",
                           "SELECT k, n FROM (SELECT k, COUNT(*) AS n FROM clicks GROUP BY k) WHERE n > 1")


def clicks(keys: str) -> list[tuple[dict, dict]]:
    return [({"k": k}, {"k": k}) for k in keys]


def table(broker: str, topic: str) -> dict[str, int]:
    return {v["k"]: v["n"] for v in materialize(broker, topic).values()}


def test_a_compatible_put_restarts_the_real_job_keeping_its_state(broker, registry_topic, tmp_path, procs):
    sfx = uuid.uuid4().hex[:6]
    topics = {"clicks": f"clicks-{sfx}", "counts": f"counts-{sfx}"}
    v1, v2 = COUNTS, ABOVE_ONE
    for name, topic in topics.items():
        v1 = v1.replace(f"'topic' = '{name}'", f"'topic' = '{topic}'")
        v2 = v2.replace(f"'topic' = '{name}'", f"'topic' = '{topic}'")
    svc = Proc(broker, registry_topic, tmp_path / "state", tmp_path / "control.log", job_command=None)
    procs.append(svc)
    assert register(svc, "counts", sql=v1).status_code == 201
    produce(broker, topics["clicks"], clicks("aab"))
    assert svc.client.post("/v1/pipelines/counts/start").status_code == 202
    wait_for(lambda: table(broker, topics["counts"]) == {"a": 2, "b": 1}, timeout=300, what="the first version's counts")
    old_pid = svc.status("counts")["pid"]

    r = svc.client.put("/v1/pipelines/counts", json={"sql": v2})
    assert r.status_code == 200, r.text
    wait_for(lambda: (s := svc.status("counts"))["state"] == "running" and s["pid"] not in (None, old_pid),
             timeout=120, what="the job restarted with the new version")
    produce(broker, topics["clicks"], clicks("abc"))

    # a: 2 + 1 and b: 1 + 1 counted on the kept state; c (1) filtered out by the new version
    wait_for(lambda: table(broker, topics["counts"]) == {"a": 3, "b": 2}, timeout=300, what="the counts over both")
    final = wait_for(lambda: (s := svc.status("counts"))["rows_in"] >= 6 and s, timeout=60, what="the records read")
    assert final["rows_in"] == 6  # 3 + 3: the new job read only the new records (a fresh one would read 6 again)
    [checkpoint] = (tmp_path / "state" / "checkpoints").iterdir()
    assert json.loads((Path(checkpoint) / "tidemark-plan.json").read_text())["sql"] == v2
    assert svc.client.post("/v1/pipelines/counts/stop").status_code == 202
