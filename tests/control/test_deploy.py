"""The dashboard and scrape config are built on series the service really exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
import yaml
from control_support import register, wait_for
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.integration

DEPLOY = Path(__file__).parent.parent.parent / "deploy"


def test_every_dashboard_query_uses_an_exported_series(service):
    register(service, "dash")
    service.client.post("/v1/pipelines/dash/start")
    wait_for(lambda: service.status("dash")["rows_in"] > 0, what="a batch")
    exported = set()
    for fam in text_string_to_metric_families(httpx.get(service.url + "/metrics").text):
        exported |= {s.name for s in fam.samples}
    dashboard = json.loads((DEPLOY / "grafana" / "tidemark-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs.append(dashboard["templating"]["list"][0]["query"]["query"])
    used = {m for e in exprs for m in re.findall(r"\btidemark_[a-z_]+", e)}
    assert len(used) >= 10
    missing = {m for m in used if m not in exported}
    assert not missing, f"dashboard queries series the service does not export: {missing}"
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in ("lag", "rows per second", "dead-letter", "conflict", "state size"):
        assert topic in titles


def test_prometheus_scrapes_the_control_metrics_path():
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    [job] = [j for j in config["scrape_configs"] if j["job_name"] == "tidemark-control"]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == ["control:8080"]
