"""``tidemark run`` of a delta-join pipeline, end to end through Kafka and Spark.

- On random CDC workloads (inserts, updates that move rows between join keys, deletes on
  the inputs allowed to delete), the sink topic of the delta join materializes to the
  same table as the same pipeline with ``strategy = NONE`` (the regular join), for
  ``eventual`` and ``strong`` consistency. The delta-join jobs start their own embedded
  index service (no ``index_url``), as ``tidemark run`` does.
- The delta join keeps no state in Spark: its query has no state store operator for the
  join (eventual: none at all, the upsert sink needs no materializer), while the regular
  join's state rows grow with the input.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from run_support import encode_source, produce, sink_table, topic_of, unique_topics

from tests.unit.delta_workload import sql, workload
from tidemark.engine.changelog import Change
from tidemark.engine.pipeline import Pipeline, compile_sql
from tidemark.engine.replay import ReplayHost
from tidemark.engine.stages.delta_join import DeltaJoin
from tidemark.kafka.admin import ensure_topics
from tidemark.spark.index_service import EmbeddedIndexService
from tidemark.spark.job import PipelineJob, run_pipeline
from tidemark.spark.keyed import state_operators

pytestmark = pytest.mark.integration

PARTITIONS = 2
BATCHES = 3  # aim: the workload read in about this many rate-limited micro-batches
#: make test: one seed per consistency (each case is two Spark jobs); -m slow: 8 seeds each
FAST_CASES = [(1, "eventual"), (2, "strong")]
SLOW_CASES = [(seed, c) for seed in range(10, 18) for c in ("eventual", "strong")]
CONSISTENCY = {"eventual": dict(b_format="json"), "strong": dict(b_format="debezium-json")}


def pipelines(seed: int, consistency: str, join: str = "JOIN") -> tuple[Pipeline, Pipeline]:
    """(delta join, regular join) on the same source topics, different sink topics."""
    text, _ = unique_topics(sql("FORCE", consistency, join=join, **CONSISTENCY[consistency]), f"dj{seed}")
    delta = compile_sql(text)
    sink = topic_of(delta.sink)
    regular_text = text.replace("strategy' = 'FORCE'", "strategy' = 'NONE'").replace(f"'topic' = '{sink}'", f"'topic' = '{sink}-regular'")
    regular = compile_sql(regular_text)
    assert any(isinstance(n.stage, DeltaJoin) for n in delta.nodes)
    assert not any(isinstance(n.stage, DeltaJoin) for n in regular.nodes)
    return delta, regular


def changes_of(seed: int, consistency: str, keys: int = 4) -> dict[str, list[Change]]:
    batches = workload(seed, batches=8, keys=keys, b_append=consistency == "eventual")
    return {name: [c for b in batches for c in b[name]] for name in ("a", "b")}


def produce_changes(bootstrap: str, pipeline: Pipeline, changes: dict[str, list[Change]]) -> int:
    """Produce the changes in the tables' formats; returns the largest topic's record count."""
    largest = 1
    for name, table in pipeline.sources.items():
        records = [{"kind": c.kind, "row": dict(zip(table.column_names, c.row))} for c in changes[name]]
        kvs = encode_source(table, records)
        ensure_topics(bootstrap, {topic_of(table): PARTITIONS})
        produce(bootstrap, topic_of(table), kvs, partitions=PARTITIONS)
        largest = max(largest, len(kvs))
    return largest


def expected_table(pipeline: Pipeline, changes: dict[str, list[Change]]) -> dict:
    host = ReplayHost(pipeline, clock=lambda: 0)
    host.run_batch(changes)  # the workload's positions are global
    return host.table()


def run_seed(spark, bootstrap: str, tmp: Path, seed: int, consistency: str, join: str = "JOIN") -> None:
    delta, regular = pipelines(seed, consistency, join)
    changes = changes_of(seed, consistency)
    largest = produce_changes(bootstrap, delta, changes)
    per_batch = math.ceil(largest / BATCHES)

    def run(p: Pipeline, tag: str):
        return run_pipeline(spark, p, bootstrap, str(tmp / f"{seed}-{consistency}-{tag}"),
                            name=f"dj-{seed}-{consistency}-{tag}", max_records_per_trigger=per_batch)

    with ThreadPoolExecutor(2) as pool:
        got_result, _ = pool.map(run, (delta, regular), ("delta", "regular"))
    assert len(got_result.reports) > 1, "the workload should take several micro-batches"
    want = sink_table(bootstrap, regular)
    got = sink_table(bootstrap, delta)
    assert got == want, f"seed {seed} {consistency}: delta {len(got)} rows, regular {len(want)} rows"
    assert want == expected_table(regular, changes)


def _run_cases(spark, bootstrap: str, tmp: Path, cases: list[tuple[int, str]]) -> None:
    for seed, consistency in cases:  # one case at a time: its two jobs already run side by side
        run_seed(spark, bootstrap, tmp, seed, consistency)


def test_delta_join_sink_equals_regular_join_sink(spark, kafka_bootstrap: str, tmp_path: Path) -> None:
    _run_cases(spark, kafka_bootstrap, tmp_path, FAST_CASES)


@pytest.mark.slow
def test_delta_join_sink_equals_regular_join_sink_many_seeds(spark, kafka_bootstrap: str, tmp_path: Path) -> None:
    _run_cases(spark, kafka_bootstrap, tmp_path, SLOW_CASES)


def state_after(job: PipelineJob) -> tuple[int, dict[str, int]]:
    """After the last batch: the query's state store operators, and the bytes each keyed
    stage stores (``tidemark.spark.state_bytes``). Not rows: a store's rows are its state
    buckets, a handful however many join rows they hold."""
    by_stage = job.reports[-1].state_bytes_by_stage
    assert by_stage is not None, "a new checkpoint's state size is known"
    return len(state_operators(job.query.lastProgress)), by_stage


def test_delta_join_keeps_no_join_state_while_the_regular_join_grows(spark, kafka_bootstrap: str, tmp_path: Path) -> None:
    delta, regular = pipelines(7, "eventual")
    changes = changes_of(7, "eventual", keys=40)  # many join keys: the join's state grows
    half = {k: v[: len(v) // 2] for k, v in changes.items()}
    rest = {k: v[len(v) // 2:] for k, v in changes.items()}
    # the delta job uses a service of its own (--index-url), not an embedded one
    service = EmbeddedIndexService(kafka_bootstrap)
    service.start()
    jobs = [PipelineJob(spark, p, kafka_bootstrap, str(tmp_path / tag), name=f"dj-state-{tag}-{topic_of(p.sink)}",
                        max_records_per_trigger=20, **kw)
            for p, tag, kw in ((delta, "delta", dict(index_url=service.url, index_token=service.token)),
                               (regular, "regular", {}))]
    rounds: list[list[tuple[int, dict[str, int]]]] = []

    def run_round(job: PipelineJob) -> tuple[int, dict[str, int]]:
        job.start(until_idle=True)  # a restart continues from the checkpoint
        job.wait()  # restarts the query on a transient Spark failure
        return state_after(job)

    try:
        with ThreadPoolExecutor(2) as pool:
            for part in (half, rest):
                produce_changes(kafka_bootstrap, delta, part)
                rounds.append(list(pool.map(run_round, jobs)))
        metrics = jobs[0].metrics.value()
        assert jobs[0].index is not None and jobs[0].index.embedded is None
        assert jobs[1].index is None
        # every committed batch released its fences: the history horizon is the last end
        last = max(jobs[0].reports, key=lambda r: r.batch_id)
        for name, table in delta.sources.items():
            described = httpx.get(f"{service.url}/v1/tables/{name}",
                                  headers={"Authorization": f"Bearer {service.token}"}).json()
            want = {p: o for p, o in last.end_offsets[topic_of(table)].items() if o > 0}  # 0 releases nothing
            assert described["released_offsets"] == want, name
    finally:
        for job in jobs:
            job.close()
        service.stop()
    (delta_1, regular_1), (delta_2, regular_2) = rounds
    # the delta join: no state store operator at all (the upsert sink keyed by both
    # inputs' primary keys needs no materializer either)
    assert delta_1 == (0, {}) and delta_2 == (0, {})
    # the regular join: a materializer and the join; the join's state grows with the input
    assert regular_1[0] == 2 and regular_2[0] == 2
    join = [name for name in regular_1[1] if name.startswith("join")]
    assert len(join) == 1 and sorted(regular_1[1]) == sorted(regular_2[1]), (regular_1, regular_2)
    assert 0 < regular_1[1][join[0]] < regular_2[1][join[0]]
    # and the delta join did look rows up in the (embedded) index service
    assert sum(n for k, n in metrics.items() if k.endswith(".lookup_keys")) > 0, metrics
    assert not any(k.endswith("unbound_regular_join_keys") for k in metrics), metrics
    assert sink_table(kafka_bootstrap, delta) == sink_table(kafka_bootstrap, regular)
