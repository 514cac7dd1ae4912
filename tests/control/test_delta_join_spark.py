"""A delta-join pipeline under the control service with the real job: the control service
registers its tables in its embedded index service, the ``tidemark run`` job it starts
looks rows up there (not in an index service of its own), and the sink ends at the answer.
The same pipeline and data as ``make demo``'s delta-join part (``demo_delta``)."""

from __future__ import annotations

import uuid

import pytest
from control_support import wait_for

from tidemark.control import demo_delta
from tidemark.control.settings import default_job_command
from tidemark.kafka.admin import ensure_topics

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,  # one Spark start-up: over a minute on a shared 2-core machine
    pytest.mark.skipif(not demo_delta.supported(), reason="tidemark run has no --index-url yet"),
]


def test_delta_join_pipeline_runs_against_the_control_services_index_service(make_service, broker):
    topics = demo_delta.topics(f"dj-{uuid.uuid4().hex[:6]}")
    ensure_topics(broker, dict.fromkeys(topics.values(), 1))
    svc = make_service(job_command=default_job_command())
    r = svc.client.post("/v1/pipelines", json={"name": "enrich", "sql": demo_delta.SQL.format(**topics)})
    assert r.status_code == 201, r.text
    index_url = r.json()["indexes"]["url"]
    demo_delta.produce(broker, topics, lambda _text: None)
    assert svc.client.post("/v1/pipelines/enrich/start").status_code == 202

    def finished() -> dict | None:
        st = svc.status("enrich")
        assert st["state"] != "failed", st["error"]
        return st if st["rows_in"] >= len(demo_delta.records(topics)) else None

    st = wait_for(finished, timeout=600, what="the job to read every record")
    assert wait_for(lambda: demo_delta.sink_table(broker, topics["enriched"]) == demo_delta.EXPECTED, timeout=60,
                    what=f"the sink table {demo_delta.EXPECTED}")
    assert st["state"] == "running"
    # the job's delta-join counters reach the status (summed over its batch events)
    m = st["metrics"]
    assert m.get("delta_join.left.lookup_requests", 0) + m.get("delta_join.right.lookup_requests", 0) > 0
    figures = demo_delta.index_figures(index_url)
    # the job looked rows up in the control service's index service, which follows both tables
    assert figures.get("orders lookup requests", 0) + figures.get("customers lookup requests", 0) > 0
    assert figures["customers rows indexed"] == 2 and figures["orders rows indexed"] == 2
    assert svc.controller.indexes.embedded.starts == 1
    svc.client.post("/v1/pipelines/enrich/stop")
    wait_for(lambda: svc.status("enrich")["state"] == "stopped", timeout=120, what="stopped")
