"""A compatible change of a running real pipeline through the control service: ``PUT`` with
another ``HAVING`` (a filter after the aggregate) restarts the job on the same checkpoint,
which keeps the aggregate's state and the source offsets (the new job reads only the new
records)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from control_support import Proc, register, wait_for
from kafka_support import dbz, materialize, produce

pytestmark = pytest.mark.integration

EXAMPLE = (Path(__file__).resolve().parents[2] / "examples" / "orders_by_customer.sql").read_text()


def order(id_: int, customer: int, product: str, amount: str) -> tuple[dict, dict]:
    return dbz("c", None, {"id": id_, "customer_id": customer, "product": product, "amount": amount,
                           "status": "new"}, id_)


def orders_and_revenue(broker: str, topic: str) -> dict[int, tuple[int, float]]:
    return {v["customer_id"]: (v["orders"], float(v["revenue"])) for v in materialize(broker, topic).values()}


def test_a_compatible_put_restarts_the_real_job_keeping_its_state(broker, registry_topic, tmp_path, procs):
    sfx = uuid.uuid4().hex[:6]
    source, sink = f"orders-{sfx}", f"revenue-{sfx}"
    v1 = EXAMPLE.replace("'topic' = 'orders'", f"'topic' = '{source}'").replace(
        "'topic' = 'revenue_by_customer'", f"'topic' = '{sink}'")
    v2 = v1.replace("HAVING SUM(amount) > 0", "HAVING SUM(amount) > 2")
    svc = Proc(broker, registry_topic, tmp_path / "state", tmp_path / "control.log", job_command=None)
    procs.append(svc)
    assert register(svc, "revenue", sql=v1).status_code == 201
    produce(broker, source, [order(1, 1, "p1", "10.00"), order(2, 1, "p2", "5.00"), order(3, 2, "p1", "1.00")])
    assert svc.client.post("/v1/pipelines/revenue/start").status_code == 202
    wait_for(lambda: orders_and_revenue(broker, sink) == {1: (2, 15.0), 2: (1, 1.0)}, timeout=300,
             what="the first version's figures")
    old_pid = svc.status("revenue")["pid"]

    r = svc.client.put("/v1/pipelines/revenue", json={"sql": v2})
    assert r.status_code == 200, r.text
    wait_for(lambda: (s := svc.status("revenue"))["state"] == "running" and s["pid"] not in (None, old_pid),
             timeout=120, what="the job restarted with the new version")
    produce(broker, source, [order(4, 1, "p1", "3.00"), order(5, 3, "p1", "1.00")])

    # customer 1 counted on the kept state (2 + 1 orders); customer 3 (1.00) is below the new HAVING
    wait_for(lambda: orders_and_revenue(broker, sink) == {1: (3, 18.0), 2: (1, 1.0)}, timeout=300,
             what="the figures over both phases")
    final = wait_for(lambda: (s := svc.status("revenue"))["rows_in"] >= 5 and s, timeout=60, what="the records read")
    assert final["rows_in"] == 5  # 3 + 2: the new job read only the new records (a fresh one would read all 5)
    [checkpoint] = (tmp_path / "state" / "checkpoints").iterdir()
    assert json.loads((checkpoint / "tidemark-plan.json").read_text())["sql"] == v2
    assert svc.client.post("/v1/pipelines/revenue/stop").status_code == 202
