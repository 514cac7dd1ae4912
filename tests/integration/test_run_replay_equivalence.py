"""The Spark job and the in-process replay host (``tidemark replay``) agree on random CDC
workloads: same records, same batches, same source positions -> the sink topic the job
writes materializes to exactly the table ``ReplayHost`` computes.

Workloads come from the Flink conformance generator (``tests/conformance/generate.py``):
joins (inner, left), aggregates (with a join and a filter on top, and written to a sink
keyed by a sub-key), projections that drop the key, all three ``ON CONFLICT`` strategies,
debezium / upsert / append sources; plus a merge-engine sink (``aggregation``) and a
``changelog-json`` sink (read exactly once, batch by batch). Records go to 2-partition
topics in source order (one key stays in one partition, as CDC connectors do) and the
job reads them rate-limited, so the stages see several batches. The batches are the job's
own (from its reports), so this isolates the Spark hosting: decode, keying, state, the
chaining of keyed stages, and the sinks.

Several workloads run at once, as separate queries on the one SparkSession: each batch
has a fixed cost (planning, state commits) that is mostly waiting, so they overlap well.
``make test`` runs a handful; ``-m slow`` runs every shape and strategy over more seeds.
"""

from __future__ import annotations

import json
import math
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from run_support import encode_source, produce, replay_reference, sink_table, topic_of, unique_topics

from tidemark.engine.errors import ConflictError
from tidemark.engine.pipeline import Pipeline, compile_sql
from tidemark.kafka.admin import ensure_topics
from tidemark.spark.job import RunResult, run_pipeline
from tidemark.spark.progress import BatchReport

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "conformance"))
from generate import SHAPES, STRATEGIES, Workload, generate  # noqa: E402

pytestmark = pytest.mark.integration

PARTITIONS = 2
BATCHES = 3  # aim: each source topic read in about this many rate-limited batches

MERGE_SINK = """
CREATE TABLE totals (category STRING, total BIGINT, PRIMARY KEY (category) NOT ENFORCED)
  WITH ('topic' = 'totals', 'format' = 'upsert-json', 'merge-engine' = 'aggregation',
        'fields.total.aggregate-function' = 'sum');
INSERT INTO totals SELECT category, v FROM events;
"""


@dataclass
class Case:
    name: str
    workload: Workload
    sql: str


def case(seed: int, shape: str, strategy: str, variant: str = "") -> Case:
    w = generate(seed, shape, strategy)
    sql = w.sql
    if variant == "changelog-sink":
        sql = sql.replace("'format' = 'upsert-json');\nINSERT", "'format' = 'changelog-json');\nINSERT")
        assert "changelog-json" in sql
    elif variant == "merge-engine":
        assert shape == "agg_by_sub_key"
        sql = sql.split("\n")[0] + MERGE_SINK  # the events source, then the merge-engine sink
    return Case(f"{w.name}{'-' + variant if variant else ''}", w, sql)


FAST = [
    case(1, "join_id", "DEDUPLICATE"),
    case(2, "inventory", "NOTHING"),
    case(3, "agg_by_sub_key", "ERROR"),
    # DO ERROR stops the job at a batch whose second task conflicts after the first one's
    # changes passed: none of that batch may reach the sink
    case(10, "projection", "ERROR"),
    case(4, "left_join_id", "DEDUPLICATE", "changelog-sink"),
    case(5, "agg_by_sub_key", "DEDUPLICATE", "merge-engine"),
    # an upsert source: the UDF runs after normalize, on the row path, with NULL arguments
    case(6, "udf_view", "DEDUPLICATE"),
]
SLOW = [
    *(case(seed, shape, strategy) for seed in range(10, 14) for shape in sorted(SHAPES) for strategy in STRATEGIES),
    *(case(seed, "join_id", "DEDUPLICATE", "changelog-sink") for seed in range(20, 23)),
    *(case(seed, "agg_by_sub_key", "NOTHING", "merge-engine") for seed in range(20, 23)),
]


def failed_batch(checkpoint: Path, reports: list[BatchReport]) -> BatchReport:
    """The batch the job planned (offset log) but did not commit, as a report."""
    last = max(reports, key=lambda r: r.batch_id) if reports else None
    batch_id = last.batch_id + 1 if last else 0
    lines = (checkpoint / "offsets" / str(batch_id)).read_text().splitlines()[2:]
    end: dict[str, dict[str, int]] = {}
    for line in lines:
        if line.strip().startswith("{"):
            end.update(json.loads(line))
    return BatchReport(batch_id=batch_id, start_offsets=last.end_offsets if last else {}, end_offsets=end)


def run_case(spark, bootstrap: str, tmp: Path, c: Case) -> tuple[Pipeline, RunResult | None, list[BatchReport], bool]:
    sql, topics = unique_topics(c.sql, f"eq{c.workload.seed}")
    suffix = next(iter(topics.values())).rsplit("-", 1)[1]
    pipeline = compile_sql(sql)
    largest = 1
    for name, table in pipeline.sources.items():
        records = [r for batch in c.workload.inputs[name] for r in batch]
        kvs = encode_source(table, records)
        ensure_topics(bootstrap, {topic_of(table): PARTITIONS})
        produce(bootstrap, topic_of(table), kvs, partitions=PARTITIONS)
        largest = max(largest, len(kvs))
    checkpoint = tmp / c.name / "checkpoint"
    reports: list[BatchReport] = []
    try:
        result = run_pipeline(
            spark, pipeline, bootstrap, str(checkpoint), name=f"eq-{c.name}-{suffix}",
            max_records_per_trigger=math.ceil(largest / BATCHES), on_batch=reports.append,
        )
        return pipeline, result, result.reports, False
    except ConflictError:
        return pipeline, None, reports + [failed_batch(checkpoint, reports)], True


def check(spark, bootstrap: str, tmp: Path, c: Case) -> None:
    pipeline, result, reports, conflicted = run_case(spark, bootstrap, tmp, c)
    writer = result.sink_writer_id if result else None
    if conflicted:
        # the job stopped at the batch DO ERROR refused: the reference refuses that batch
        # too, and the sink holds exactly what the batches before it made. (The generator's
        # "no conflict" workloads are conflict-free at ITS batch ends; rate-limited batches
        # over partitions end elsewhere, where a sink key can be held by two rows.)
        assert c.workload.strategy == "ERROR", f"{c.name}: ConflictError without DO ERROR"
        with pytest.raises(ConflictError):
            replay_reference(bootstrap, pipeline, reports)
        expected = replay_reference(bootstrap, pipeline, reports[:-1]).table()
        assert sink_table(bootstrap, pipeline, writer) == expected, c.name
        return
    assert result is not None
    assert result.rows_in == sum(
        len(encode_source(t, [r for b in c.workload.inputs[n] for r in b])) for n, t in pipeline.sources.items()
    ), f"{c.name}: every source record is read exactly once"
    assert len(result.reports) >= 2, f"{c.name}: the rate limit should split the input"
    expected = replay_reference(bootstrap, pipeline, result.reports).table()
    assert sink_table(bootstrap, pipeline, writer) == expected, c.name


def run_all(spark, bootstrap: str, tmp: Path, cases: list[Case], parallel: int = 3) -> None:
    failures: list[str] = []

    def one(c: Case) -> None:
        try:
            check(spark, bootstrap, tmp, c)
        except Exception as err:  # collect, so one failure does not hide the others
            failures.append(f"{c.name}: {type(err).__name__}: {err}")

    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(one, cases))
    assert not failures, "\n".join(failures)


def test_spark_job_equals_replay_on_random_workloads(spark, kafka_bootstrap, tmp_path):
    run_all(spark, kafka_bootstrap, tmp_path, FAST)


@pytest.mark.slow
def test_spark_job_equals_replay_on_many_random_workloads(spark, kafka_bootstrap, tmp_path):
    run_all(spark, kafka_bootstrap, tmp_path, SLOW)
