"""Where a Spark micro-batch's seconds go, read from Spark's event log.

    .venv/bin/python tests/bench/event_log.py EVENT_LOG [--query w1] [--skip 1] [--stages]

``EVENT_LOG`` is what ``spark.eventLog.enabled=true`` writes under ``spark.eventLog.dir``: one
JSON file, or a rolling log's ``eventlog_v2_*`` directory (its ``events_N_*`` files in order).
``suite.py --event-log DIR`` turns it on for the measured Spark session.

Why the event log and not a profiler: it is Spark's own account of every stage and task of
every micro-batch (the same figures its UI shows), it costs the job nothing measurable, and the
streaming query's progress reports are in it too, so one file holds both halves of a batch:

- the driver's half, from each batch's progress (``durationMs``: ``queryPlanning``,
  ``latestOffset``, ``walCommit``, ``commitOffsets``, ``addBatch``) and the batch's wall
  time minus the union of its stages' intervals (``driver_ms``: planning, offsets, the WAL
  and commit logs, and the driver's part of ``foreachBatch``);
- the executors' half, per stage: its wall time, its tasks' summed run, JVM CPU, deserialize,
  result serialization, GC, shuffle write and fetch wait times, scheduler delay (a task's
  duration not accounted for by the above, as Spark's UI computes it), the SQL metrics of
  the Python operators in it (``time to run Python workers``...) and of its stateful
  operator (``time to commit changes``, RocksDB's commit and load times).

Task figures are summed over a stage's tasks (two cores run two at once), so they are
CPU-seconds-like and can exceed the stage's wall time; the Python metrics of two Python
operators pipelined in one stage overlap (the downstream one waits on the upstream one).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import polars as pl

from tidemark.spark.progress import offsets_of

PROGRESS_EVENT = "org.apache.spark.sql.streaming.StreamingQueryListener$QueryProgressEvent"
#: the driver-side phases of a batch, as its progress names them
PROGRESS_PHASES = ("queryPlanning", "latestOffset", "getBatch", "walCommit", "addBatch", "commitOffsets")
#: stage accumulables (SQL metrics, milliseconds) summed per stage, by Spark's metric name
SQL_TIMES = {
    "python_run_ms": "time to run Python workers",
    "python_exec_ms": "time to execute Python code",
    "python_init_ms": "time to initialize Python workers",
    "state_update_ms": "time to update",
    "state_commit_ms": "time to commit changes",
    "rocksdb_sync_ms": "RocksDB: commit - file sync to external storage time",
    "rocksdb_load_ms": "RocksDB: load - time taken to load the store",
}
#: the same for byte counts
SQL_BYTES = {"python_bytes_sent": "data sent to Python workers", "python_bytes_returned": "data returned from Python workers"}
#: the per-stage figures a batch and a run are summed over
STAGE_SUMS = ("wall_ms", "tasks", "run_ms", "jvm_cpu_ms", "deserialize_ms", "result_ser_ms", "gc_ms", "shuffle_write_ms",
              "fetch_wait_ms", "scheduler_delay_ms", *SQL_TIMES, *SQL_BYTES)


class EventLogError(ValueError):
    """The file is not a Spark event log; the message names the file and line."""


def events(path: Path) -> Iterator[dict[str, Any]]:
    """The events of one event log (a file, or a rolling log's directory), in order."""
    files = sorted(path.glob("events_*"), key=lambda p: int(p.name.split("_")[1])) if path.is_dir() else [path]
    if not files:
        raise EventLogError(f"{path}: no events_* files in this directory")
    for file in files:
        with open(file, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                except json.JSONDecodeError as err:
                    raise EventLogError(f"{file} line {number}: not a Spark event log line ({err})") from None
                if not isinstance(event, dict) or "Event" not in event:
                    raise EventLogError(f"{file} line {number}: not a Spark event log line (no \"Event\" field)")
                yield event


def offsets_spanned(sources: list[dict[str, Any]]) -> int:
    """A batch's records by its offsets, end minus start per topic partition (a first
    batch starts at 0). Tidemark's scans emit change blobs, so Spark's ``numInputRows``
    counts those; the benchmark's input topics hold no transaction markers, so every
    offset is a record."""
    total = 0
    for src in sources:
        start = offsets_of(src.get("startOffset"))
        for topic, parts in offsets_of(src.get("endOffset")).items():
            total += sum(end - start.get(topic, {}).get(p, 0) for p, end in parts.items())
    return total


def operator_of(stage_info: dict[str, Any]) -> str:
    """What a stage runs, from the plan operators its RDDs were built by: the decode pass
    reads the source (``MicroBatchScan``), a keyed stage is a ``TransformWithStateInPySpark``,
    the sink is the ``foreachBatch`` frame (``SQLExecutionRDD``) and its produce pass."""
    scopes = {json.loads(r["Scope"])["name"] for r in stage_info.get("RDD Info", []) if r.get("Scope")}
    has_sink = any(r.get("Name") == "SQLExecutionRDD" for r in stage_info.get("RDD Info", []))
    parts = []
    if "MicroBatchScan" in scopes:
        parts.append("decode pass")
    if "TransformWithStateInPySpark" in scopes:
        parts.append("keyed stage")
    if has_sink:
        parts.append("sink split")
    if not parts:
        parts.append("sink produce" if "MapInArrow" in scopes else "+".join(sorted(scopes)) or "?")
    return " + ".join(parts)


def _sum_accumulables(stage_info: dict[str, Any], names: dict[str, str]) -> dict[str, float]:
    by_name: dict[str, float] = {}
    for acc in stage_info.get("Accumulables", []):
        name, value = acc.get("Name"), acc.get("Value")
        if name is not None and value is not None:
            try:
                by_name[name] = by_name.get(name, 0.0) + float(value)
            except (TypeError, ValueError):
                continue
    return {col: by_name.get(metric, 0.0) for col, metric in names.items()}


def _task_figures(task: dict[str, Any]) -> dict[str, float]:
    """One finished task's times (ms), scheduler delay as Spark's UI computes it."""
    info, m = task["Task Info"], task.get("Task Metrics") or {}
    run, deser = m.get("Executor Run Time", 0), m.get("Executor Deserialize Time", 0)
    result_ser = m.get("Result Serialization Time", 0)
    getting = (info["Finish Time"] - info["Getting Result Time"]) if info.get("Getting Result Time") else 0
    duration = info["Finish Time"] - info["Launch Time"]
    return {
        "run_ms": run, "jvm_cpu_ms": m.get("Executor CPU Time", 0) / 1e6, "deserialize_ms": deser, "result_ser_ms": result_ser, "gc_ms": m.get("JVM GC Time", 0),
        "shuffle_write_ms": (m.get("Shuffle Write Metrics") or {}).get("Shuffle Write Time", 0) / 1e6,
        "fetch_wait_ms": (m.get("Shuffle Read Metrics") or {}).get("Fetch Wait Time", 0),
        "scheduler_delay_ms": max(0, duration - run - deser - result_ser - getting),
    }


def _epoch_ms(timestamp: str) -> float:
    return dt.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp() * 1000


def read(path: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(stages, batches) of one event log: a row per stage of a streaming micro-batch, and a
    row per micro-batch that ran (its progress has ``addBatch``)."""
    job_batch: dict[int, tuple[str, int]] = {}  # job id -> (query name, batch id)
    stage_job: dict[int, int] = {}
    tasks: dict[int, list[dict[str, float]]] = {}
    stages: list[dict[str, Any]] = []
    progress: list[dict[str, Any]] = []
    for ev in events(path):
        kind = ev["Event"]
        if kind == "SparkListenerJobStart":
            props = ev.get("Properties") or {}
            if "streaming.sql.batchId" in props:
                name = (props.get("spark.job.description") or props.get("sql.streaming.queryId", "")).split("\n")[0]
                job_batch[ev["Job ID"]] = (name, int(props["streaming.sql.batchId"]))
                stage_job.update({s: ev["Job ID"] for s in ev["Stage IDs"]})
        elif kind == "SparkListenerTaskEnd" and ev.get("Task Info", {}).get("Finish Time"):
            tasks.setdefault(ev["Stage ID"], []).append(_task_figures(ev))
        elif kind == "SparkListenerStageCompleted":
            info = ev["Stage Info"]
            job = stage_job.get(info["Stage ID"])
            if job is None or "Submission Time" not in info:
                continue
            query, batch = job_batch[job]
            row: dict[str, Any] = {
                "query": query, "batch": batch, "stage": info["Stage ID"], "operator": operator_of(info),
                "start_ms": info["Submission Time"], "end_ms": info["Completion Time"],
                "wall_ms": info["Completion Time"] - info["Submission Time"], "tasks": info["Number of Tasks"],
            }
            for figures in tasks.pop(info["Stage ID"], []):
                for k, v in figures.items():
                    row[k] = row.get(k, 0) + v
            row.update(_sum_accumulables(info, SQL_TIMES))
            row.update(_sum_accumulables(info, SQL_BYTES))
            stages.append(row)
        elif kind == PROGRESS_EVENT:
            p = ev["progress"]
            durations = p.get("durationMs") or {}
            if "addBatch" not in durations:
                continue
            progress.append({
                "query": p["name"], "batch": int(p["batchId"]), "rows_in": offsets_spanned(p.get("sources") or []),
                "start_ms": _epoch_ms(p["timestamp"]), "batch_ms": int(durations.get("triggerExecution", 0)),
                **{f"{k}_ms": int(durations.get(k, 0)) for k in PROGRESS_PHASES},
                "state_commit_progress_ms": sum(int(op.get("commitTimeMs") or 0) for op in p.get("stateOperators") or []),
                "state_rows": sum(int(op.get("numRowsTotal") or 0) for op in p.get("stateOperators") or []),
            })
    stage_frame = pl.DataFrame(stages, infer_schema_length=None).fill_null(0) if stages else pl.DataFrame()
    batches = pl.DataFrame(progress) if progress else pl.DataFrame()
    if not batches.is_empty() and not stage_frame.is_empty():
        in_stages = [_union_ms(_intervals(stage_frame, b["query"], b["batch"])) for b in batches.iter_rows(named=True)]
        batches = batches.with_columns(pl.Series("stages_ms", in_stages, dtype=pl.Float64))
        batches = batches.with_columns(driver_ms=pl.col("batch_ms") - pl.col("stages_ms"))
    return stage_frame, batches


def _intervals(stages: pl.DataFrame, query: str, batch: int) -> list[tuple[float, float]]:
    rows = stages.filter((pl.col("query") == query) & (pl.col("batch") == batch))
    return list(zip(rows["start_ms"].to_list(), rows["end_ms"].to_list()))


def _union_ms(intervals: Iterable[tuple[float, float]]) -> float:
    """Milliseconds covered by at least one interval (stages of one batch may overlap)."""
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def per_batch(stages: pl.DataFrame, batches: pl.DataFrame) -> pl.DataFrame:
    """One row per micro-batch: its wall time, its driver phases and the time outside any
    stage, and its stages' figures summed."""
    sums = stages.group_by("query", "batch").agg([pl.col(c).sum() for c in STAGE_SUMS], stages=pl.len())
    return batches.join(sums, on=["query", "batch"], how="left").sort("start_ms")


def per_operator(stages: pl.DataFrame) -> pl.DataFrame:
    """Per query and stage position in its batch's job (the same operator every batch):
    the stages' figures summed over the batches given."""
    ordered = stages.sort("stage").with_columns(position=pl.col("stage").rank("ordinal").over("query", "batch"))
    return (ordered.group_by("query", "position")
            .agg(pl.col("operator").first(), pl.len().alias("batches"), *[pl.col(c).sum() for c in STAGE_SUMS])
            .sort("query", "position"))


def shares(batch_rows: pl.DataFrame) -> pl.DataFrame:
    """Per query: where its batches' wall time went, in seconds and as shares of it."""
    total = pl.col("batch_ms").sum()
    return batch_rows.group_by("query").agg(
        batches=pl.len(), rows_in=pl.col("rows_in").sum(), wall_s=total / 1000,
        stages_share=pl.col("stages_ms").sum() / total, driver_share=pl.col("driver_ms").sum() / total,
        planning_share=pl.col("queryPlanning_ms").sum() / total,
        offsets_wal_commit_share=(pl.col("latestOffset_ms") + pl.col("walCommit_ms") + pl.col("commitOffsets_ms")).sum() / total,
        task_run_s=pl.col("run_ms").sum() / 1000, jvm_cpu_s=pl.col("jvm_cpu_ms").sum() / 1000, python_run_s=pl.col("python_run_ms").sum() / 1000,
        state_commit_s=pl.col("state_commit_ms").sum() / 1000, rocksdb_sync_s=pl.col("rocksdb_sync_ms").sum() / 1000,
        scheduler_delay_s=pl.col("scheduler_delay_ms").sum() / 1000, deserialize_s=pl.col("deserialize_ms").sum() / 1000,
        gc_s=pl.col("gc_ms").sum() / 1000, shuffle_write_s=pl.col("shuffle_write_ms").sum() / 1000,
        fetch_wait_s=pl.col("fetch_wait_ms").sum() / 1000,
    ).sort("query")


def progress_lines(path: Path) -> Iterator[str]:
    """The streaming progress of every batch in the log, one JSON object a line (what the
    query's ``recentProgress`` held, kept past its last 100 entries)."""
    for ev in events(path):
        if ev["Event"] == PROGRESS_EVENT:
            yield json.dumps(ev["progress"])


def _show(title: str, frame: pl.DataFrame) -> None:
    print(f"\n{title}\n")
    with pl.Config(tbl_formatting="ASCII_MARKDOWN", tbl_hide_column_data_types=True, tbl_hide_dataframe_shape=True,
                   tbl_rows=-1, tbl_cols=-1, tbl_width_chars=400, fmt_str_lengths=60, float_precision=3):
        print(frame)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("event_log", type=Path, help="an event log file or an eventlog_v2_* directory")
    ap.add_argument("--query", default="", help="only queries whose name contains this")
    ap.add_argument("--skip", type=int, default=1,
                    help="leave out each query's first N batches from the totals (default 1: the warm-up batch)")
    ap.add_argument("--stages", action="store_true", help="also print every stage of every batch")
    args = ap.parse_args(argv)
    try:
        if not args.event_log.exists():
            raise EventLogError(f"{args.event_log}: no such file or directory")
        stages, batches = read(args.event_log)
        if batches.is_empty() or stages.is_empty():
            raise EventLogError(f"{args.event_log}: no streaming micro-batch in this event log")
    except EventLogError as err:
        print(f"event_log.py: {err}", file=sys.stderr)
        return 2
    stages = stages.filter(pl.col("query").str.contains(args.query, literal=True))
    batches = batches.filter(pl.col("query").str.contains(args.query, literal=True))
    rows = per_batch(stages, batches)
    steady = rows.filter(pl.col("batch") >= args.skip)
    steady_stages = stages.filter(pl.col("batch") >= args.skip)
    cols = ["query", "batch", "rows_in", "batch_ms", "stages_ms", "driver_ms", *[f"{k}_ms" for k in PROGRESS_PHASES],
            "stages", "run_ms", "jvm_cpu_ms", "python_run_ms", "state_commit_ms", "rocksdb_sync_ms", "scheduler_delay_ms",
            "deserialize_ms", "gc_ms", "shuffle_write_ms", "fetch_wait_ms"]
    _show("per micro-batch (ms; task figures summed over tasks)", rows.select(cols))
    _show(f"per stage position, batches >= {args.skip} (ms, summed over those batches)",
          per_operator(steady_stages).drop("python_bytes_sent", "python_bytes_returned"))
    _show(f"totals, batches >= {args.skip}", shares(steady))
    if args.stages:
        _show("every stage", stages.drop("start_ms", "end_ms"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
