"""Flink 2.3's half of the benchmark suite: run workload variants in a local mini-cluster.

Two halves in one file:

- ``run(workloads_and_variants, work_dir, ...)`` (stdlib only: the suite calls it from the
  Tidemark venv) builds a JSON job spec and runs this file with the Flink venv's python
  (``$TIDEMARK_FLINK_PYTHON``, default ``.venv-flink/bin/python``) as a subprocess;
- ``main()`` (in the Flink venv) reads the spec on stdin, starts ONE mini-cluster in the
  PyFlink gateway JVM (its start-up is timed and reported apart, never in a throughput),
  runs each job one after the other and writes one JSON report on stdout.

What is measured, per job (parallelism 2, state backend RocksDB unless the spec says
``hashmap``; the same backend for every workload so the figures compare):

- ``throughput_rows_s`` = input records / (end of input at the sink - job RUNNING). The
  sink (``tidemark-bench``, Java, ``flink_java/``) stamps the moment it receives end-of-input
  in every subtask: every record has then passed every operator; the last stamp counts.
  RUNNING is the job's status timestamp from the REST API, taken when scheduling starts, so
  task deployment and code generation are inside the measured time, Python-side planning
  and submission are not. ``job_seconds`` runs to the job's end (final checkpoint included).
- The JVM and cluster start-up (``jvm_start_seconds``) is paid once per subprocess and never
  counted. Jobs of one subprocess share the JVM, whose heap does not shrink between jobs:
  for a clean ``peak_rss_bytes`` per workload, run each workload variant in its own
  ``run()`` call (repeats of one variant can share it).
- ``peak_rss_bytes``: the largest sum of RSS over the gateway JVM's process tree (psutil,
  sampled every 100 ms while the job runs); ``peak_rss_with_driver_bytes`` adds this Python
  process.
- ``state_bytes``: size of the final checkpoint, triggered (full, not incremental) as soon as
  every sink subtask has seen end-of-input, when all operators have finished: the state every
  operator holds at the end of input (Flink's checkpoint statistics ``state_size``;
  ``state_by_vertex`` per job vertex, e.g. the materializer's or the join's share). Periodic
  checkpoints run during the job every ``checkpoint_interval`` (default 10 s).
- ``source_timeline`` (when the spec asks, ``sample_sources``): [epoch s, rows the source
  vertices had emitted] every ~200 ms while the job runs (the cluster refreshes the REST IO
  metrics that often), ``source_rows_total`` what they emitted over the whole job and
  ``end_of_input_s`` the sink's last end-of-input stamp: the sustained mode's steady-state
  clock (``sustained.flink_steady``) is computed from them.
- ``rows``: the final sink table. The sink is an upsert sink (so Flink plans the same sink
  materializer as for upsert-kafka or JDBC) that keeps the table in a hash map per subtask
  (the materializer before it is keyed by the sink PK, so subtasks hold disjoint keys) and
  dumps it at end-of-input. ``'materialize' = 'false'`` makes it a counting blackhole (same
  clock), to measure what keeping the table costs.
- A job given ``cap_s`` (or one that reaches ``timeout_s``) is cancelled at that time and
  reported with ``capped: true``, ``ok: false``, no table, and how far it got:
  ``records_in`` = records that entered the sink materializer's job vertex (the writer's when
  there is no materializer), read from the vertex's IO metrics (``read-records`` of
  ``/jobs/<id>``) after the cancellation, ``elapsed_s`` = cap time - job RUNNING, and
  ``throughput_upper_rows_s`` = input records / ``elapsed_s``: the job had not finished by
  the cap, so the whole input takes longer than that. (``rate_so_far_rows_s`` =
  ``records_in / elapsed_s`` is no bound: W3's LEGACY materializer rewrites a list as long as
  the key's active rows on every record, so it slows down through the inserts but speeds up
  again as the deletes shrink the list.) The count is read once the tasks have stopped, so it
  includes what passed between the cap and the cancellation.

``DO NOTHING``/``DO ERROR`` need watermarks in Flink 2.3 (workloads.Workload.flink_sql adds a
constant rowtime); periodic watermarks are disabled (``pipeline.auto-watermark-interval`` = 0),
so the only watermark is end-of-input's and the compacting materializer compacts once. Why: a
Debezium update that moves a row between join keys leaves the parallel join as a -U on one
subtask and a +U on another; a watermark passing between them would split the pair across
compaction steps and make ``DO ERROR`` fail on conflict-free input.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
JAVA_SRC = HERE / "flink_java" / "src"
DEFAULT_FLINK_PYTHON = REPO / ".venv-flink" / "bin" / "python"
STRATEGY_OPTION = "table.exec.sink.upsert-materialize-strategy.type"
#: how often ``sample_sources`` reads the sources' progress (BenchCluster refreshes it as often)
SAMPLE_S = 0.2

BASE_CONFIG = {
    "parallelism.default": "2",
    "restart-strategy.type": "none",
    "execution.checkpointing.incremental": "false",
    "execution.checkpointing.checkpoints-after-tasks-finish": "true",
    "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
    "execution.checkpointing.max-concurrent-checkpoints": "1",
    "pipeline.auto-watermark-interval": "0 ms",
}


# --------------------------------------------------------------------------------------------
# Client side (any venv, stdlib only)
# --------------------------------------------------------------------------------------------

def job_spec(workload: Any, variant: str, work_dir: Path, materialize: bool = True,
             backend: str = "rocksdb", checkpoint_interval: str = "10 s", timeout_s: float = 1800,
             cap_s: float | None = None, sample_sources: bool = False) -> dict:
    """One job of the spec: ``workload`` (a workloads.Workload) in Flink variant ``variant``.
    ``cap_s``: cancel the job after that many seconds and report its progress (``capped``);
    ``sample_sources``: record the sources' progress (``source_timeline``)."""
    job_dir = Path(work_dir) / f"{workload.name}-{variant}-{'collect' if materialize else 'count'}"
    if job_dir.exists():
        shutil.rmtree(job_dir)
    (job_dir / "sink").mkdir(parents=True)
    sql = workload.flink_sql(sink_options={"connector": "tidemark-bench", "dir": str(job_dir / "sink"),
                                           "materialize": "true" if materialize else "false"})
    return {
        "id": f"{workload.name}/{variant}",
        "sql": sql,
        "options": dict(workload.flink_variants[variant]),
        "input_rows": workload.input_rows,
        "sink_columns": list(workload.sink_columns),
        "sink_pk": list(workload.sink_pk),
        "sink_dir": str(job_dir / "sink"),
        "checkpoint_dir": str(job_dir / "checkpoints"),
        "backend": backend,
        "checkpoint_interval": checkpoint_interval,
        "timeout_s": timeout_s,
        "cap_s": cap_s,
        "sample_sources": sample_sources,
    }


def run(jobs: list[dict], python: str | None = None, timeout_s: float | None = None) -> dict:
    """Run ``jobs`` (``job_spec`` results) in one Flink subprocess; returns its report:
    ``{"flink_version", "jvm_start_seconds", "jobs": [{"id", "ok", "error", "throughput_rows_s",
    "peak_rss_bytes", "state_bytes", "rows", ...}]}``. Raises RuntimeError when the
    subprocess itself fails (the message carries its stderr tail)."""
    python = python or os.environ.get("TIDEMARK_FLINK_PYTHON", str(DEFAULT_FLINK_PYTHON))
    proc = subprocess.run([python, str(Path(__file__).resolve())], input=json.dumps({"jobs": jobs}),
                          capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(f"flink_runner exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------
# Flink side
# --------------------------------------------------------------------------------------------

def build_jar() -> Path:
    """The ``flink_java`` benchmark sink, compiled like the conformance oracle's connector."""
    sys.path.insert(0, str(HERE.parent / "conformance"))
    from flink_oracle import build_connector_jar

    return build_connector_jar(JAVA_SRC, "tidemark-flink-bench")


class RssSampler:
    """Peak RSS of this process's descendants (the gateway JVM) and of the whole tree, each
    address space once (``process_memory``)."""

    def __init__(self, interval_s: float = 0.1) -> None:
        import psutil

        self._me = psutil.Process()
        self.interval_s = interval_s
        self.peak_children = 0
        self.peak_total = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        from process_memory import tree_rss

        children = tree_rss(self._me, include_root=False)
        total = children + self._me.memory_info().rss
        self.peak_children = max(self.peak_children, children)
        self.peak_total = max(self.peak_total, total)

    def __enter__(self) -> RssSampler:
        self.peak_children = self.peak_total = 0

        def loop() -> None:
            while not self._stop.is_set():
                self.sample()
                self._stop.wait(self.interval_s)

        self._stop.clear()
        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
        self.sample()


def _lap(phases: dict[str, float]) -> Any:
    """``lap(name)`` stores the seconds since the previous lap (or the call) under ``name``."""
    last = [time.monotonic()]

    def lap(name: str) -> None:
        now = time.monotonic()
        phases[name] = round(now - last[0], 2)
        last[0] = now

    return lap


def _rest(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
        return json.loads(r.read())


def _java_error(exc: BaseException) -> str:
    import re

    text = str(exc)
    causes = re.findall(r"(?:Caused by: |^: |\n: )([\w.$]+(?:Exception|Error)[^\n]*)", text)
    return (causes[-1] if causes else text.strip().splitlines()[0]).strip()


class Runner:
    def __init__(self, slots: int = 4) -> None:
        from pyflink.java_gateway import get_gateway

        self.jvm = get_gateway().jvm
        self.port = self.jvm.tidemark.flinkbench.BenchCluster.start(slots, 256)

    def run_job(self, job: dict) -> dict:
        from pyflink.table import EnvironmentSettings, TableEnvironment

        res: dict[str, Any] = {"id": job["id"], "ok": False, "error": None, "options": job["options"],
                               "backend": job["backend"], "input_rows": job["input_rows"]}
        # where the job's wall time went (seconds): plan (DDL, explain), submit, drive (to the
        # job's end, final checkpoint included), after (REST job view, checkpoint statistics)
        phases: dict[str, float] = {}
        res["phases"] = phases
        lap = _lap(phases)
        t = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
        conf = t.get_config()
        ckpt = Path(job["checkpoint_dir"])
        config = {**BASE_CONFIG, "execution.target": "remote", "rest.address": "127.0.0.1",
                  "rest.port": str(self.port), "state.backend.type": job["backend"],
                  "execution.checkpointing.dir": ckpt.resolve().as_uri(),
                  "execution.checkpointing.interval": job["checkpoint_interval"], **job["options"]}
        for k, v in config.items():
            conf.set(k, v)
        res["config"] = config
        stmts = [s.strip() for s in job["sql"].split(";\n") if s.strip()]
        sink_dir = Path(job["sink_dir"])
        try:
            for s in stmts[:-1]:
                t.execute_sql(s)
            res["plan"] = t.explain_sql(stmts[-1])
            lap("plan_s")
            with RssSampler() as rss:
                tr = t.execute_sql(stmts[-1])
                client = tr.get_job_client()
                job_id = str(client.get_job_id())
                future = client._j_job_client.getJobExecutionResult()
                lap("submit_s")
                timeline: list[tuple[float, int]] = []
                error, capped_at_ms = self._drive(job, job_id, future, sink_dir, timeline)
                lap("drive_s")
        except Exception as e:  # rejected at planning
            res["error"] = _java_error(e)
            return res
        res["job_id"] = job_id
        res["peak_rss_bytes"] = rss.peak_children
        res["peak_rss_with_driver_bytes"] = rss.peak_total
        info = _rest(self.port, f"/jobs/{job_id}")
        for _ in range(100):  # the REST view of the job lags its result future a little
            if info.get("end-time", -1) > 0:
                break
            time.sleep(0.1)
            info = _rest(self.port, f"/jobs/{job_id}")
        res["job_state"] = info.get("state")
        running_ms = info["timestamps"].get("RUNNING") or info["start-time"]
        res["job_seconds"] = round((info["end-time"] - running_ms) / 1000, 3) if info.get("end-time", -1) > 0 else None
        self._state(job_id, res)
        lap("after_s")
        if capped_at_ms is not None:
            res.update(capped=True, cap_s=job.get("cap_s") or job["timeout_s"],
                       **progress(info["vertices"], job["input_rows"], running_ms, capped_at_ms))
            res["error"] = (f"{error}: {res['records_in']:,} of {job['input_rows']:,} records reached "
                            f"{res['records_in_vertex'] or 'the sink'} in {res['elapsed_s']} s")
            return res
        if error:
            res["error"] = error
            return res
        parts = [json.loads(p.read_text()) for p in sorted(sink_dir.glob("part-*.json"))]
        end_ms = max(p["end_of_input_ms"] for p in parts)
        res["seconds"] = round((end_ms - running_ms) / 1000, 3)
        res["throughput_rows_s"] = round(job["input_rows"] / max(res["seconds"], 1e-3), 1)
        if job.get("sample_sources"):
            res.update(source_timeline=timeline, source_rows_total=source_rows(info["vertices"]),
                       end_of_input_s=end_ms / 1000)
        res["sink_changes"] = sum(p["changes"] for p in parts)
        res["materialized"] = all(p["materialized"] for p in parts)
        if res["materialized"]:
            rows, seen = [], set()
            pk_idx = [job["sink_columns"].index(c) for c in job["sink_pk"]]
            for p in parts:
                for row in p["rows"]:
                    key = json.dumps([row[i] for i in pk_idx])
                    if key in seen:
                        res["error"] = f"sink key {key} held by two sink subtasks (sink input not keyed by PK)"
                        return res
                    seen.add(key)
                    rows.append(row)
            res["rows"] = rows
        res["ok"] = True
        return res

    def _drive(self, job: dict, job_id: str, future: Any, sink_dir: Path,
               timeline: list[tuple[float, int]]) -> tuple[str | None, int | None]:
        """Wait for end-of-input at every sink subtask, then trigger the final checkpoint
        (repeatedly: one triggered while a task is still finishing is not the final one) until
        the job ends; meanwhile append (time, rows the sources emitted) to ``timeline`` every
        ``SAMPLE_S`` when the spec asks (``sample_sources``). Returns the job's error, if it
        failed, and the epoch ms at which it was cancelled for reaching its cap or timeout
        (None when it ran to its end)."""
        cap = job.get("cap_s")
        limit = min(cap, job["timeout_s"]) if cap else job["timeout_s"]
        deadline = time.time() + limit
        n_sinks = None
        next_sample = 0.0
        while not future.isDone():
            if job.get("sample_sources") and time.time() >= next_sample:
                next_sample = time.time() + SAMPLE_S
                with contextlib.suppress(Exception):  # not yet scheduled: no sample this time
                    timeline.append((time.time(), source_rows(_rest(self.port, f"/jobs/{job_id}")["vertices"])))
            if time.time() > deadline:
                capped_at_ms = int(time.time() * 1000)
                _cancel(self.port, job_id)
                try:  # wait for the tasks to stop: their final IO metrics are then exact
                    future.get()
                except Exception:  # noqa: BLE001 - the cancellation itself
                    pass
                what = "capped" if cap and cap <= job["timeout_s"] else "timed out"
                return f"{what} at {limit:g} s", capped_at_ms
            if n_sinks is None:
                n_sinks = _sink_parallelism(self.port, job_id)
            if n_sinks and len(list(sink_dir.glob("part-*.json"))) >= n_sinks:
                self.jvm.tidemark.flinkbench.BenchCluster.checkpoint(job_id, 10_000)
            time.sleep(0.05)
        try:
            future.get()
        except Exception as e:
            return _java_error(e), None
        return None, None

    def _state(self, job_id: str, res: dict) -> None:
        try:
            stats = _rest(self.port, f"/jobs/{job_id}/checkpoints")
        except Exception as e:  # noqa: BLE001 - reported, not fatal
            res["state_error"] = str(e)
            return
        latest = (stats.get("latest") or {}).get("completed")
        res["checkpoints_completed"] = (stats.get("counts") or {}).get("completed")
        if not latest:
            res["state_bytes"] = None
            return
        res["state_bytes"] = latest.get("state_size")
        res["checkpoint_id"] = latest.get("id")
        try:
            details = _rest(self.port, f"/jobs/{job_id}/checkpoints/details/{latest['id']}")
            names = {v["id"]: v["name"] for v in _rest(self.port, f"/jobs/{job_id}")["vertices"]}
            res["state_by_vertex"] = {names.get(vid, vid)[:160]: t.get("state_size")
                                      for vid, t in (details.get("tasks") or {}).items()}
        except Exception as e:  # noqa: BLE001
            res["state_error"] = str(e)


def progress(vertices: list[dict], input_rows: int, running_ms: int, capped_at_ms: int) -> dict[str, Any]:
    """How far a cancelled job got: records into the materializer's vertex (else the sink
    writer's), from the ``vertices`` of ``/jobs/<id>`` read after the tasks stopped."""
    by_vertex = {v["name"][:160]: (v.get("metrics") or {}).get("read-records") for v in vertices}
    exact = all((v.get("metrics") or {}).get("read-records-complete", False) for v in vertices)
    pick = (next((n for n in by_vertex if "SinkMaterializer" in n), None)
            or next((n for n in by_vertex if "Writer" in n), None))
    records = int(by_vertex.get(pick) or 0) if pick else 0
    elapsed = max((capped_at_ms - running_ms) / 1000, 1e-3)
    return {"records_in": records, "records_in_vertex": pick, "records_in_exact": exact,
            "records_in_by_vertex": by_vertex, "elapsed_s": round(elapsed, 3),
            "throughput_upper_rows_s": round(input_rows / elapsed, 1), "rate_so_far_rows_s": round(records / elapsed, 1),
            "capped_fraction": round(records / max(input_rows, 1), 4)}


def source_rows(vertices: list[dict]) -> int:
    """Rows the source vertices (``Source: ...``, with whatever is chained to them) have
    emitted, from the ``vertices`` of ``/jobs/<id>``."""
    return sum(int((v.get("metrics") or {}).get("write-records") or 0)
               for v in vertices if v["name"].startswith("Source: "))


def _sink_parallelism(port: int, job_id: str) -> int | None:
    try:
        for v in _rest(port, f"/jobs/{job_id}")["vertices"]:
            if v["name"].endswith(": Writer"):  # the sink writer's vertex (chained or not)
                return int(v["parallelism"])
    except Exception:  # noqa: BLE001 - not yet known
        return None
    return None


def _cancel(port: int, job_id: str) -> None:
    try:
        urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/jobs/{job_id}", method="PATCH"),
                               timeout=30).read()
    except Exception:  # noqa: BLE001
        pass


def main() -> int:
    out = os.fdopen(os.dup(1), "w")  # the JVM writes to stdout; keep it for the report
    os.dup2(2, 1)
    spec = json.load(sys.stdin)
    jar = build_jar()
    os.environ["HADOOP_CLASSPATH"] = os.pathsep.join(p for p in (str(jar), os.environ.get("HADOOP_CLASSPATH", "")) if p)
    t0 = time.time()
    runner = Runner()
    report: dict[str, Any] = {"jvm_start_seconds": round(time.time() - t0, 2), "jobs": []}
    import pyflink.version

    report["flink_version"] = pyflink.version.__version__
    for job in spec["jobs"]:
        print(f"flink_runner: {job['id']} ...", file=sys.stderr, flush=True)
        res = runner.run_job(job)
        print(f"flink_runner: {job['id']} ok={res['ok']} {res.get('throughput_rows_s')} rows/s "
              f"state={res.get('state_bytes')} error={res.get('error')}", file=sys.stderr, flush=True)
        report["jobs"].append(res)
    json.dump(report, out)
    out.write("\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
