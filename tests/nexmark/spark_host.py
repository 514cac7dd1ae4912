"""Running one Nexmark query on the Spark job host, as ``tidemark run --until-idle`` does.

The generated events go into three topics of the broker (``person``, ``auction``, ``bid``,
renamed unique to the run: tests share one broker, never a topic), one partition each so a
topic keeps generation order. q13's side table is loaded first: its compacted topic is
drained by the job, which is then restarted on the same checkpoint for the events. The job
(``run_pipeline``, the real host) reads the event topics rate-limited to about ``Data.n_batches``
micro-batches and writes the sink topic, which is read back as a consumer sees it. The
session's Python workers get q14's UDF module (``nexmark_udfs.py``) as a file of the job
(``addPyFile``): the test run's one session was started without its folder on PYTHONPATH.

The oracle runs bounded inputs: at their end Flink emits the greatest watermark and every
event-time window still open fires (q5, q11). The job reads the event topics as Flink reads
a bounded Kafka source, ``'scan.bounded.mode' = 'latest-offset'`` (``bounded``), added here
so the query texts stay the ones replay and Flink run. Not with a side table (q13): the
first run that drains it would fix the event topics' end while they are still empty.

Spark's micro-batches cut the three topics by record counts per topic, not where the
generator's batches end, so only the final table is comparable with Flink's: a sink with a
primary key as the table its upserts stand for, a sink without one as the multiset of its
changes (``harness.canon`` either way).
"""

from __future__ import annotations

import math
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))
import harness  # noqa: E402  (sibling modules, not a package)
from run_support import encode_source, produce, sink_changes, sink_records, sink_table, topic_of, unique_topics  # noqa: E402

from tidemark.engine.pipeline import Pipeline, compile_sql  # noqa: E402
from tidemark.kafka.admin import ensure_topics  # noqa: E402
from tidemark.spark.job import run_pipeline  # noqa: E402


def source_records(pipeline: Pipeline, data: harness.Data) -> dict[str, list[dict]]:
    """Per source table, its ``{"kind", "row"}`` records in generation order (side tables:
    ``harness.SIDE_TABLES``)."""
    out: dict[str, list[dict]] = {name: [] for name in pipeline.sources}
    for name in out:
        if name in harness.SIDE_TABLES:
            out[name] = [{"kind": "+I", "row": row} for row in harness.SIDE_TABLES[name]()]
    for batch in data.batches():
        for e in batch:
            if e.table in out:
                out[e.table].append({"kind": "+I", "row": e.row})
    return out


def bounded(sql: str, pipeline: Pipeline) -> str:
    """``sql`` with every source table read bounded, as the oracle reads its inputs."""
    for table in pipeline.sources.values():
        topic = topic_of(table)
        sql = sql.replace(f"'topic' = '{topic}'", f"'topic' = '{topic}', 'scan.bounded.mode' = 'latest-offset'")
    return sql


def _final_table(bootstrap: str, pipeline: Pipeline, writer_id: str | None) -> list[list]:
    if pipeline.sink.pk_indexes:
        return harness.canon(sink_table(bootstrap, pipeline, writer_id).values())
    multiset: Counter = Counter()
    for c in sink_changes(pipeline, sink_records(bootstrap, pipeline, writer_id)):
        multiset[c.row] += c.weight
    assert all(n >= 0 for n in multiset.values()), "the sink retracted a row it never added"
    return harness.canon([r for r, n in multiset.items() for _ in range(n)])


def run_spark(spark: Any, bootstrap: str, query: str, sql: str, data: harness.Data, workdir: Path) -> tuple[list[list], int]:
    """The sink's final table after the job drained every topic, and how many data batches
    it took. Raises what the job raises (``PlanError`` for a pipeline the host refuses)."""
    sql, _ = unique_topics(sql, f"nx-{query}")
    pipeline = compile_sql(sql)
    if not any(n in harness.SIDE_TABLES for n in pipeline.sources):
        pipeline = compile_sql(bounded(sql, pipeline))
    # q14's UDF module, for the Python workers of a session started without it on PYTHONPATH
    spark.sparkContext.addPyFile(str(HERE / "nexmark_udfs.py"))
    records = source_records(pipeline, data)
    for name, table in pipeline.sources.items():
        ensure_topics(bootstrap, {topic_of(table): 1}, compacted=bool(table.primary_key))
    checkpoint = str(workdir / "checkpoint")
    side = [n for n in records if n in harness.SIDE_TABLES]
    if side:
        # a side table is loaded before the first event (as the oracle and replay have it):
        # the job drains its topic, then is restarted on the same checkpoint for the events
        _produce(bootstrap, pipeline, records, side)
        run_pipeline(spark, pipeline, bootstrap, checkpoint, name=f"nexmark-{query}")
    events = [n for n in records if n not in side]
    _produce(bootstrap, pipeline, records, events)
    per_batch = math.ceil(max(len(records[n]) for n in events) / data.n_batches)
    result = run_pipeline(spark, pipeline, bootstrap, checkpoint, name=f"nexmark-{query}",
                          max_records_per_trigger=per_batch)
    # every event read: the last batch ends each topic at its record count (one partition,
    # produced without transactions: one offset a record). Not ``rows_in``: Spark counts a
    # source's rows once per branch of the query that reads it (q5, q7 read bid twice).
    read: dict[str, int] = {}
    for r in result.reports:
        for t, parts in r.end_offsets.items():
            read[t] = max(read.get(t, 0), sum(parts.values()))
    for n in events:
        topic = topic_of(pipeline.sources[n])
        assert read.get(topic) == len(records[n]), f"{query}: {n} read to offset {read.get(topic)} of {len(records[n])}"
    batches = sum(1 for r in result.reports if r.rows_in)
    return _final_table(bootstrap, pipeline, result.sink_writer_id), batches


def run_spark_streaming(spark: Any, bootstrap: str, query: str, sql: str, data: harness.Data, workdir: Path,
                        window_ms: int, timeout_s: float = 240) -> list[tuple]:
    """The sink's changes (rows) of a job that runs as a streaming job does (unbounded
    sources, a micro-batch every 200 ms): stopped once it has read every event and the
    wall clock has passed the end of the processing-time window (``window_ms`` long) its
    last records went to, with a margin for the batch its timer fires in."""
    from run_support import sink_changes as changes_of
    from tidemark.spark.job import PipelineJob

    sql, _ = unique_topics(sql, f"nx-{query}")
    pipeline = compile_sql(sql)
    records = source_records(pipeline, data)
    for table in pipeline.sources.values():
        ensure_topics(bootstrap, {topic_of(table): 1})
    _produce(bootstrap, pipeline, records, list(records))
    total = sum(len(r) for r in records.values())
    job = PipelineJob(spark, pipeline, bootstrap, str(workdir / "checkpoint"), name=f"nexmark-{query}",
                      max_records_per_trigger=math.ceil(total / data.n_batches), trigger_interval="200 milliseconds")
    deadline = time.monotonic() + timeout_s
    try:
        job.start()
        while sum(r.rows_in for r in job.reports) < total:
            assert time.monotonic() < deadline, f"{query}: the job did not read every event in {timeout_s:.0f} s"
            time.sleep(0.2)
            job.poll()
        now_ms = time.time_ns() // 1_000_000
        time.sleep((window_ms - now_ms % window_ms) / 1000)
        # two batches more: the second started after the window's end, and its timer fired
        seen = len(job.poll()) + len(job.reports)
        while len(job.reports) < seen + 2:
            assert time.monotonic() < deadline, f"{query}: no batch ran after the last window's end"
            time.sleep(0.2)
            job.poll()
    finally:
        job.close()
    return [c.row for c in changes_of(pipeline, sink_records(bootstrap, pipeline, job.result().sink_writer_id))]


def _produce(bootstrap: str, pipeline: Pipeline, records: dict[str, list[dict]], names: list[str]) -> None:
    for name in names:
        table = pipeline.sources[name]
        produce(bootstrap, topic_of(table), encode_source(table, records[name]))
