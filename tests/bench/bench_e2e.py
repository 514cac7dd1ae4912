"""End-to-end benchmark of ``tidemark run`` (a script, not a test): the s1/s2 join pipeline
of DESIGN.md (debezium-json in, join on ``s1.level = s2.id``, ``ON CONFLICT DO
DEDUPLICATE`` materializer, upsert-json out), Kafka topic to Kafka topic.

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python tests/bench/bench_e2e.py \
        [--repeats 3] [--rate 100] [--seconds 30] [--warmup-seconds 0] [--backlog 20000]

Against the embedded broker (or ``$KAFKA_BOOTSTRAP_SERVERS``). Each repetition starts the
real CLI (``tidemark run``, trigger every 200 ms, at most 5,000 source records per batch unless
``--max-records-per-trigger`` says otherwise)
on fresh topics and a fresh checkpoint, with 100 s2 rows, and waits for that first
batch: JVM start-up and the first batch's warm-up are not measured (nor, with
``--warmup-seconds``, that long of s1 inserts at the rate, once visible). Then:

1. Latency at a fixed input rate: s1 inserts (each joins one s2 row) are produced at
   ``--rate`` rows/s for ``--seconds``; a consumer on the sink topic (read_committed) notes
   when each id first becomes visible. Latency = that time - the time the source record was
   produced (both on this process's clock). p50/p99 over all ids, only if the job kept up
   (``sustained.keep_up``: its backlog of produced-but-not-visible rows, sampled every
   250 ms, did not grow across the phase); a job that fell behind is reported as such, with
   how its backlog grew, and no latency.
2. Throughput: ``--backlog`` s1 inserts are produced as fast as the producer goes; rows/s =
   backlog / (last sink row visible - first source row produced): source topic to sink
   topic, every batch's planning, decode, join, materializer and sink write included.

Medians over ``--repeats``. The machine is shared and noisy: quote medians with the load.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

from tidemark.kafka.admin import ensure_topics  # noqa: E402
from tidemark.kafka.broker import configured_bootstrap, embedded_broker  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sustained  # noqa: E402  (the keep-up verdict)

TIDEMARK = str(Path(sys.executable).parent / "tidemark")
N_S2 = 100
#: how often the latency phase notes its backlog (rows produced, not yet visible in the sink)
BACKLOG_SAMPLE_S = 0.25

#: the README's s1/s2 join, its topics renamed per repetition
EXAMPLE_SQL = Path(__file__).resolve().parents[2] / "examples" / "s1_s2_join.sql"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


class Setup:
    """Fresh topics, SQL file and checkpoint for one repetition."""

    def __init__(self, bootstrap: str, workdir: Path, tag: str):
        self.bootstrap = bootstrap
        self.workdir = workdir / tag
        self.workdir.mkdir(parents=True)
        suffix = f"{tag}-{os.getpid()}-{int(time.time())}"
        self.s1, self.s2, self.t1 = f"bench-s1-{suffix}", f"bench-s2-{suffix}", f"bench-t1-{suffix}"
        self.name = f"bench-{suffix}"
        ensure_topics(bootstrap, {self.s1: 2, self.s2: 2})
        ensure_topics(bootstrap, {self.t1: 1}, compacted=True)
        self.sql = self.workdir / "join.sql"
        sql = EXAMPLE_SQL.read_text(encoding="utf-8")
        for table, topic in (("s1", self.s1), ("s2", self.s2), ("t1", self.t1)):
            sql = sql.replace(f"'topic' = '{table}'", f"'topic' = '{topic}'")
        self.sql.write_text(sql, encoding="utf-8")
        self.checkpoint = self.workdir / "checkpoint"
        self.status = self.workdir / "status.jsonl"
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "queue.buffering.max.messages": 1_000_000})

    def produce(self, topic: str, obj: dict, key: int) -> None:
        while True:
            try:
                self.producer.produce(topic, json.dumps(obj).encode(), json.dumps({"id": key}).encode(), partition=key % 2)
                return
            except BufferError:
                self.producer.poll(0.05)

    def dimension(self) -> None:
        for i in range(1, N_S2 + 1):
            self.produce(self.s2, {"op": "c", "before": None, "after": {"id": i, "attr": f"attr-{i}"}}, i)
        self.producer.flush(60)

    def driver(self, *extra: str) -> subprocess.Popen:
        env = dict(os.environ, TIDEMARK_STATUS_FILE=str(self.status))
        return subprocess.Popen(
            [TIDEMARK, "run", str(self.sql), "--bootstrap-servers", self.bootstrap,
             "--checkpoint", str(self.checkpoint), "--name", self.name, *extra],
            stdout=subprocess.DEVNULL, stderr=open(self.workdir / "run.out", "wb"),  # noqa: SIM115
            stdin=subprocess.DEVNULL, env=env, start_new_session=True,
        )

    def events(self) -> list[dict]:
        if not self.status.exists():
            return []
        return [json.loads(line) for line in self.status.read_text(encoding="utf-8").splitlines() if line.strip()]


class SinkWatcher(threading.Thread):
    """Notes when each sink key first becomes visible to a read_committed consumer."""

    def __init__(self, bootstrap: str, topic: str):
        super().__init__(name="sink-watcher", daemon=True)
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": f"bench-{os.getpid()}-{time.time()}",
            "enable.auto.commit": False, "isolation.level": "read_committed", "fetch.wait.max.ms": 10,
            # never skip ahead: after a fetch answered "offset out of range", librdkafka's default
            # ("largest") jumps to the end and the rows in between are never seen. Once, under
            # load, this watcher stopped short of rows a fresh consumer saw, and the wait for them
            # hung; skipping is the likely cause, and "earliest" can only re-read
            "auto.offset.reset": "earliest",
        })
        self.consumer.assign([TopicPartition(topic, 0, 0)])
        self.seen: dict[int, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for m in self.consumer.consume(num_messages=1000, timeout=0.05):
                now = time.time()
                if m.error() is None and m.key() is not None and m.value() is not None:
                    key = json.loads(m.key())
                    self.seen.setdefault(key["id"] if isinstance(key, dict) else key, now)
        self.consumer.close()


def wait_for(what: str, done, proc: subprocess.Popen, s: Setup, timeout_s: float = 900) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if proc.poll() is not None:
            raise SystemExit(f"tidemark run exited {proc.returncode} waiting for {what}; see {s.workdir / 'run.out'}")
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.05)


def insert(s: Setup, key: int, rng: random.Random) -> None:
    s.produce(s.s1, {"op": "c", "before": None, "after": {"id": key, "level": rng.randint(1, N_S2)}}, key)


@dataclass
class RatePhase:
    """What producing at a fixed rate left: each key's produce time, the backlog samples
    (seconds since the phase began, rows produced and not yet visible) and the rate achieved."""

    produced: dict[int, float]
    samples: list[tuple[float, int]]
    achieved: float
    t_end: float


def at_rate(s: Setup, watcher: SinkWatcher, keys: range, rate: float, rng: random.Random) -> RatePhase:
    """Produce an insert per key at ``rate`` rows/s (every earlier key must be visible already:
    the backlog counts this phase's keys only)."""
    produced: dict[int, float] = {}
    samples: list[tuple[float, int]] = []
    seen_before = len(watcher.seen)
    t0 = next_sample = time.time()
    for n, key in enumerate(keys):
        now = time.time()
        if now >= next_sample:
            samples.append((now - t0, n - (len(watcher.seen) - seen_before)))
            next_sample = now + BACKLOG_SAMPLE_S
        wait = t0 + n / rate - now
        if wait > 0:
            time.sleep(wait)
        produced[key] = time.time()
        insert(s, key, rng)
        s.producer.poll(0)
    s.producer.flush(60)
    t_end = time.time()
    return RatePhase(produced, samples, len(keys) / (t_end - t0), t_end)


def one_run(bootstrap: str, workdir: Path, tag: str, rate: float, seconds: float, backlog: int,
            max_records_per_trigger: int | None = 5000, warmup_s: float = 0.0) -> dict:
    """One repetition: ``warmup_s`` of inserts at ``rate`` (unmeasured: a job's first batches
    of s1 rows pay one-off costs), then the latency phase, judged by ``sustained.keep_up`` (a
    job that fell behind gets no latency figures: ``p50_s`` etc. are None), then the backlog
    phase (skipped when ``backlog`` is 0). ``max_records_per_trigger`` None: no per-batch cap."""
    s = Setup(bootstrap, workdir, tag)
    s.dimension()
    cap = ["--max-records-per-trigger", str(max_records_per_trigger)] if max_records_per_trigger else []
    proc = s.driver("--trigger-interval", "200 milliseconds", *cap)
    watcher = SinkWatcher(bootstrap, s.t1)
    watcher.start()
    rng = random.Random(7)
    try:
        wait_for("the first batch", lambda: any(e["event"] == "batch" for e in s.events()), proc, s)
        warm = at_rate(s, watcher, range(2_000_001, 2_000_001 + int(rate * warmup_s)), rate, rng)
        wait_for("the warm-up's rows in the sink", lambda: all(k in watcher.seen for k in warm.produced), proc, s, 1800)

        # 1. latency at a fixed rate
        phase = at_rate(s, watcher, range(1, int(rate * seconds) + 1), rate, rng)
        n, produced, achieved = len(phase.produced), phase.produced, phase.achieved
        verdict = sustained.keep_up(phase.samples, rate, achieved)
        wait_for("the rate phase's rows in the sink", lambda: all(i in watcher.seen for i in produced), proc, s, 1800)
        drained_after_s = max(watcher.seen[i] for i in produced) - phase.t_end
        latencies = [watcher.seen[i] - produced[i] for i in produced]
        batches_before = len([e for e in s.events() if e["event"] == "batch"])

        # 2. throughput of a backlog
        keys = range(1_000_001, 1_000_001 + backlog)
        t1 = time.time()
        for key in keys:
            insert(s, key, rng)
        s.producer.flush(120)
        produce_s = time.time() - t1
        wait_for("the backlog's rows in the sink", lambda: all(k in watcher.seen for k in keys), proc, s, 1800)
        t2 = max((watcher.seen[k] for k in keys), default=t1)
        batches = len([e for e in s.events() if e["event"] == "batch"]) - batches_before
    finally:
        watcher.stop.set()
        watcher.join(timeout=10)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    kept = verdict.kept_up
    return {"rate_rows": n, "asked_rate": rate, "achieved_rate": achieved, "seconds": seconds,
            "max_records_per_trigger": max_records_per_trigger, "keep_up": verdict.as_dict(),
            "verdict": verdict.text(), "backlog_samples": phase.samples, "drained_after_s": drained_after_s,
            "warmup_s": warmup_s,
            "p50_s": percentile(latencies, 0.5) if kept else None,
            "p99_s": percentile(latencies, 0.99) if kept else None, "max_s": max(latencies) if kept else None,
            "backlog": backlog, "produce_s": produce_s, "drain_s": t2 - t1,
            "rows_per_s": backlog / (t2 - t1) if backlog else None, "backlog_batches": batches}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rate", type=float, default=100.0, help="s1 inserts per second in the latency phase")
    ap.add_argument("--seconds", type=float, default=30.0, help="how long the latency phase produces")
    ap.add_argument("--warmup-seconds", type=float, default=0.0,
                    help="inserts at --rate for this long before the latency phase, not measured")
    ap.add_argument("--backlog", type=int, default=20_000, help="s1 inserts in the throughput phase")
    ap.add_argument("--max-records-per-trigger", type=int, default=5000,
                    help="source records per micro-batch at most; 0: no cap, as the suite's latency phase runs")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (status files, driver logs)")
    args = ap.parse_args()

    def run(bootstrap: str) -> None:
        workdir = Path(tempfile.mkdtemp(prefix="tidemark-bench-e2e-"))
        results = []
        try:
            for r in range(args.repeats):
                res = one_run(bootstrap, workdir, f"r{r}", args.rate, args.seconds, args.backlog,
                              max_records_per_trigger=args.max_records_per_trigger or None,
                              warmup_s=args.warmup_seconds)
                results.append(res)
                scalars = {k: round(v, 3) for k, v in res.items() if isinstance(v, int | float)}
                print(f"run {r + 1}: {res['verdict']}: {json.dumps(scalars)}", flush=True)
        finally:
            if args.keep:
                print(f"work directory kept: {workdir}")
            else:
                shutil.rmtree(workdir, ignore_errors=True)
        load = os.getloadavg()
        print(f"\nload average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; cpus: {os.cpu_count()}")
        med = lambda rs, k: statistics.median(x[k] for x in rs)  # noqa: E731
        for x in results:
            print(f"rate phase: {x['verdict']}, input {x['achieved_rate']:,.0f} of {args.rate:,.0f} rows/s asked")
        kept = [x for x in results if x["p50_s"] is not None]  # a latency only where the job kept up
        if kept:
            lat_runs = ", ".join(f"{x['p50_s']:.2f}/{x['p99_s']:.2f}" for x in kept)
            print(f"latency at {args.rate:g} rows/s for {args.seconds:g} s, medians of the {len(kept)} run(s) that "
                  f"kept up: p50 {med(kept, 'p50_s'):.2f} s, p99 {med(kept, 'p99_s'):.2f} s (runs p50/p99: {lat_runs})")
        else:
            print(f"at {args.rate:g} rows/s no run kept up: no latency to report")
        if args.backlog:
            thr_runs = ", ".join(f"{x['rows_per_s']:,.0f}" for x in results)
            print(f"throughput median: {med(results, 'rows_per_s'):,.0f} rows/s ({args.backlog:,} source rows; "
                  f"runs: {thr_runs})")

    explicit = configured_bootstrap()
    if explicit:
        run(explicit)
    else:
        with embedded_broker() as bootstrap:
            run(bootstrap)


if __name__ == "__main__":
    main()
