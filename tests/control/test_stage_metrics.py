"""Stage counters in the status channel (``"metrics"`` of a batch event): summed per name
like the other per-batch figures, shown by the status API and exported to Prometheus (a
``*_size`` counter, reported as deltas, as a gauge of its current size)."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tidemark.control.metrics import PipelineCollector
from tidemark.control.status_channel import JobProgress


def batch(n: int, metrics) -> str:
    import json

    return json.dumps({"v": 1, "event": "batch", "batch_id": n, "rows_in": 1, "metrics": metrics})


def test_batch_metrics_are_summed_per_name_and_junk_is_ignored():
    p = JobProgress()
    p.apply_line(batch(0, {"join.delta_join.left.cache_hits": 3, "join.delta_join.left.cache_size": 5}))
    p.apply_line(batch(1, {"join.delta_join.left.cache_hits": 2, "join.delta_join.left.cache_size": -1,
                           "bad.bool": True, "bad.text": "7"}))
    p.apply_line(batch(2, "not a dict"))
    assert p.snapshot()["metrics"] == {"join.delta_join.left.cache_hits": 5, "join.delta_join.left.cache_size": 4}
    assert p.totals["rows_in"] == 3  # the batches themselves still counted
    assert JobProgress().snapshot()["metrics"] == {}


def test_stage_metrics_are_exported_per_pipeline():
    p = JobProgress()
    p.apply_line(batch(0, {"join.delta_join.right.lookup_requests": 4, "join.delta_join.right.cache_size": 9}))
    sup = SimpleNamespace(progress=p, state="running", restarts=0)
    controller = SimpleNamespace(supervisors={"enrich": sup},
                                 registry=SimpleNamespace(read=lambda f: [], loaded=True, rejected={}))
    registry = CollectorRegistry()
    registry.register(PipelineCollector(controller))
    samples = {(s.name, s.labels.get("counter")): s.value
               for fam in text_string_to_metric_families(generate_latest(registry).decode())
               for s in fam.samples if s.labels.get("pipeline") == "enrich"}
    assert samples[("tidemark_pipeline_stage_counter_total", "join.delta_join.right.lookup_requests")] == 4
    assert samples[("tidemark_pipeline_stage_size", "join.delta_join.right.cache_size")] == 9
    assert ("tidemark_pipeline_stage_counter_total", "join.delta_join.right.cache_size") not in samples
