"""Prometheus series: per-pipeline figures read from the supervisors at scrape time.

A custom collector (not module-level Gauges) so a deleted pipeline's series disappear
instead of lingering, and each app instance has its own registry (tests run several).
Only pipelines whose job runs on *this* service are exported, so summing over all
control services never counts a pipeline twice; ``tidemark_registry_*`` series describe
the shared registry and are the same on every service (aggregate them with ``max``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, StateSetMetricFamily
from prometheus_client.registry import Collector

from tidemark.control.controller import Controller

STATES = ("registered", "starting", "running", "failed", "stopped")


class PipelineCollector(Collector):
    def __init__(self, controller: Controller):
        self.controller = controller

    def collect(self):
        c = self.controller
        label = ["pipeline"]
        state = StateSetMetricFamily("tidemark_pipeline_state", "Job state of pipelines run by this service",
                                     labels=label)
        counters = {
            "rows_in": CounterMetricFamily("tidemark_pipeline_rows_in", "Source rows read", labels=label),
            "rows_out": CounterMetricFamily("tidemark_pipeline_rows_out", "Changes written to the sink",
                                            labels=label),
            "dlq": CounterMetricFamily("tidemark_pipeline_dlq_records", "Records sent to the dead-letter topic",
                                       labels=label),
            "conflicts": CounterMetricFamily("tidemark_pipeline_conflicts",
                                             "Rows dropped by ON CONFLICT DO NOTHING", labels=label),
            "retractions_without_state": CounterMetricFamily(
                "tidemark_pipeline_retractions_without_state", "Retractions that found no state (TTL)",
                labels=label),
        }
        restarts = CounterMetricFamily("tidemark_pipeline_restarts", "Job restarts after a failure", labels=label)
        state_size = GaugeMetricFamily("tidemark_pipeline_state_size_bytes", "Size of the job's keyed state",
                                       labels=label)
        batch_id = GaugeMetricFamily("tidemark_pipeline_last_batch_id", "Id of the last finished batch",
                                     labels=label)
        batch_time = GaugeMetricFamily("tidemark_pipeline_last_batch_timestamp_seconds",
                                       "When the last batch finished", labels=label)
        lag = GaugeMetricFamily("tidemark_pipeline_consumer_lag", "Records behind the end of a source partition",
                                labels=["pipeline", "topic", "partition"])
        # stage counters the job reports per batch (e.g. the delta join's cache hits and
        # lookups), summed; a "*_size" one is reported as deltas, so its sum is a current size
        stage = CounterMetricFamily("tidemark_pipeline_stage_counter", "Stage counters reported by the job",
                                    labels=["pipeline", "counter"])
        stage_size = GaugeMetricFamily("tidemark_pipeline_stage_size", "Stage sizes reported by the job "
                                       "(e.g. delta join cache entries)", labels=["pipeline", "counter"])
        for name, sup in sorted(c.supervisors.items()):
            p = sup.progress
            state.add_metric([name], {s: s == sup.state for s in STATES})
            for field, fam in counters.items():
                fam.add_metric([name], p.totals.get(field, 0))
            restarts.add_metric([name], sup.restarts)
            if p.state_size_bytes is not None:
                state_size.add_metric([name], p.state_size_bytes)
            if p.last_batch_id is not None:
                batch_id.add_metric([name], p.last_batch_id)
            if p.last_batch_time is not None:
                batch_time.add_metric([name], p.last_batch_time)
            for (topic, part), n in sorted(p.lag.items()):
                lag.add_metric([name, topic, str(part)], n)
            for counter, n in sorted(p.metrics.items()):
                (stage_size if counter.endswith("_size") else stage).add_metric([name, counter], n)
        yield state
        yield from counters.values()
        yield from (restarts, state_size, batch_id, batch_time, lag, stage, stage_size)

        records = c.registry.read(lambda s: list(s.pipelines.values()))
        desired = GaugeMetricFamily("tidemark_registry_pipeline_desired_running",
                                    "1 when the registry says the pipeline should run", labels=label)
        for rec in sorted(records, key=lambda r: r.name):
            desired.add_metric([rec.name], 1 if rec.desired == "running" else 0)
        yield desired
        yield GaugeMetricFamily("tidemark_registry_pipelines", "Pipelines in the registry", value=len(records))
        yield GaugeMetricFamily("tidemark_registry_loaded", "1 once the registry topic has been read",
                                value=1 if c.registry.loaded else 0)
        skipped = CounterMetricFamily("tidemark_registry_records_skipped",
                                      "Registry records not applied: missing or bad signature, or invalid",
                                      labels=["reason"])
        for reason, n in sorted(c.registry.rejected.items()):
            skipped.add_metric([reason], n)
        yield skipped


def build_registry(controller: Controller) -> tuple[CollectorRegistry, Histogram]:
    registry = CollectorRegistry()
    registry.register(PipelineCollector(controller))
    requests = Histogram("tidemark_control_http_request_duration_seconds", "HTTP requests by route and status",
                         ["method", "route", "status"], registry=registry)
    return registry, requests
