"""Full lifecycle with the real job: register -> start -> data flows on Kafka -> status figures
move -> the sink topic materializes to the seed's answer -> stop -> delete.

Runs the real ``tidemark run`` (Spark, local[*]) under the control service. Skipped until the
runtime registers its ``run`` command; nothing else needs to change to switch it on.
"""

from __future__ import annotations

import json
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from control_support import EXAMPLE_SQL, register, wait_for

from tidemark.cli.main import app
from tidemark.control.settings import default_job_command

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif("run" not in {c.name for c in app.registered_commands},
                       reason="tidemark run (issue 3) is not registered yet"),
]


def produce(broker: str, topic: str, records: list[tuple[dict, dict]]) -> None:
    p = Producer({"bootstrap.servers": broker})
    for key, value in records:
        p.produce(topic, key=json.dumps(key).encode(), value=json.dumps(value).encode())
        p.flush(10)  # one record per batch: every record its own offset, in order


def materialize(broker: str, topic: str) -> dict:
    """Read an upsert topic from the start to its end: key -> last value (tombstone deletes)."""
    c = Consumer({"bootstrap.servers": broker, "group.id": "t", "enable.auto.commit": False})
    try:
        table: dict = {}
        md = c.list_topics(topic, timeout=10).topics.get(topic)
        if md is None or md.error is not None:
            return table
        for part in md.partitions:
            _, high = c.get_watermark_offsets(TopicPartition(topic, part), timeout=10)
            c.assign([TopicPartition(topic, part, 0)])
            pos = 0
            while pos < high:
                m = c.poll(2)
                if m is None:
                    break
                if m.error():
                    continue
                pos = m.offset() + 1
                key = json.loads(m.key())
                k = tuple(sorted(key.items())) if isinstance(key, dict) else key
                if m.value() is None:
                    table.pop(k, None)
                else:
                    table[k] = json.loads(m.value())
        return table
    finally:
        c.close()


def test_s1_s2_join_runs_end_to_end_under_the_control_service(make_service, broker):
    sfx = uuid.uuid4().hex[:6]
    sql = (EXAMPLE_SQL.replace("'topic' = 's1'", f"'topic' = 's1-{sfx}'")
           .replace("'topic' = 's2'", f"'topic' = 's2-{sfx}'").replace("'topic' = 't1'", f"'topic' = 't1-{sfx}'"))
    svc = make_service(job_command=default_job_command())
    assert register(svc, "join-e2e", sql=sql).status_code == 201
    # the seed's ordering: s2 rows first, then s1 inserts level 10 and updates it to 20
    produce(broker, f"s2-{sfx}", [
        ({"id": 10}, {"before": None, "after": {"id": 10, "attr": "a1"}, "op": "c", "ts_ms": 1}),
        ({"id": 20}, {"before": None, "after": {"id": 20, "attr": "b1"}, "op": "c", "ts_ms": 2}),
    ])
    produce(broker, f"s1-{sfx}", [
        ({"id": 1}, {"before": None, "after": {"id": 1, "level": 10}, "op": "c", "ts_ms": 3}),
        ({"id": 1}, {"before": {"id": 1, "level": 10}, "after": {"id": 1, "level": 20}, "op": "u", "ts_ms": 4}),
    ])
    assert svc.client.post("/v1/pipelines/join-e2e/start").status_code == 202
    st = wait_for(lambda: (s := svc.status("join-e2e"))["rows_in"] >= 4 and s, timeout=300,
                  what="the job read the four source records")
    assert st["state"] == "running" and st["last_batch_id"] is not None
    assert wait_for(lambda: materialize(broker, f"t1-{sfx}") == {(("id", 1),): {"id": 1, "level": 20, "attr": "b1"}},
                    timeout=120, what="sink topic materialized to {(1, 20, 'b1')}")
    assert all(entry["lag"] == 0 for entry in svc.status("join-e2e")["lag"])
    assert svc.client.post("/v1/pipelines/join-e2e/stop").status_code == 202
    wait_for(lambda: svc.status("join-e2e")["state"] == "stopped", timeout=120, what="stopped")
    assert svc.client.delete("/v1/pipelines/join-e2e").status_code == 204
