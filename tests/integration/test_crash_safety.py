"""Crash safety of ``tidemark run``: while a CDC workload streams into Kafka, the driver
(the ``tidemark run`` process with its JVM and Python workers) is SIGKILLed at random,
seeded points and restarted from the same checkpoint, several times; a last run goes to
idle. The materialized sink topic must equal ``ReplayHost`` on the same input (the
in-process host, no crash), and every bad record must be in the dead-letter topic exactly
once (read as an exactly-once consumer reads it).

The kill points are random but seeded (``TIDEMARK_CRASH_SEED``): after ``b`` committed
batches of that run plus a random delay, so kills land while a batch is being planned,
computed, written to the sink, written to the DLQ or committed. Timing still varies from
run to run (the machine is shared); the assertion does not depend on it.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tidemark.engine.changelog import Change
from tidemark.engine.pipeline import compile_sql
from tidemark.engine.replay import ReplayHost
from tidemark.formats.dead_letter import decode as decode_dead_letter
from tidemark.kafka.read import materialize_upsert, read_topic
from tidemark.kafka.transactional import read_exactly_once
from tidemark.spark.job import run_id_of

from run_support import example_sql

pytestmark = pytest.mark.integration

TIDEMARK = str(Path(sys.executable).parent / "tidemark")
SEED = int(os.environ.get("TIDEMARK_CRASH_SEED", "20261122"))
PHASE_TIMEOUT_S = 420


#: one of each kind of bad record the decode step routes to the DLQ
BAD_VALUES = [
    b"{not json",  # undecodable
    json.dumps({"op": "x", "after": {"id": 1, "level": 1}}).encode(),  # unknown op
    json.dumps({"op": "c", "after": {"level": 1}}).encode(),  # missing primary key
    json.dumps({"op": "c", "after": {"id": "abc", "level": 1}}).encode(),  # wrong type
]


# ---------------------------------------------------------------------------- workload


@dataclass
class Event:
    table: str  # "s1" | "s2"
    key: int | None
    value: bytes
    changes: list[Change] = field(default_factory=list)  # empty for a bad record

    @property
    def bad(self) -> bool:
        return not self.changes


def generate(rng: random.Random, n_events: int, n_s1: int = 80, n_s2: int = 8) -> list[Event]:
    """A seeded Debezium CDC stream over s1 and s2: inserts, updates (s1 rows move between
    join keys, s2 rows change attr), deletes and re-inserts, with a bad record about every
    25 events. Every before-image is exact, as Debezium's is."""
    state = {"s1": {}, "s2": {}}
    events: list[Event] = []
    bad = 0
    for seq in range(n_events):
        if rng.random() < 0.04:
            table = rng.choice(["s1", "s2"])
            events.append(Event(table, None, BAD_VALUES[bad % len(BAD_VALUES)]))
            bad += 1
            continue
        table = "s2" if rng.random() < 0.3 else "s1"
        rows = state[table]
        key = rng.randint(1, n_s1 if table == "s1" else n_s2)

        def image(k: int) -> dict:
            if table == "s1":
                return {"id": k, "level": rng.randint(1, n_s2 + 2)}  # some levels never match
            return {"id": k, "attr": f"a{k}-{rng.randint(0, 9)}"}

        def row(obj: dict) -> tuple:
            return (obj["id"], obj["level"]) if table == "s1" else (obj["id"], obj["attr"])

        pos = (seq,)
        before = rows.get(key)
        if before is None:
            after = image(key)
            env, changes = {"op": "c", "before": None, "after": after}, [Change("+I", row(after), pos)]
            rows[key] = after
        elif rng.random() < 0.2:
            env, changes = {"op": "d", "before": before, "after": None}, [Change("-D", row(before), pos)]
            del rows[key]
        else:
            after = image(key)
            env = {"op": "u", "before": before, "after": after}
            changes = [Change("-U", row(before), pos), Change("+U", row(after), pos)]
            rows[key] = after
        env["ts_ms"] = 1_700_000_000_000 + seq
        events.append(Event(table, key, json.dumps(env).encode(), changes))
    return events


def chunks(events: list[Event], size: int) -> list[list[Event]]:
    return [events[i:i + size] for i in range(0, len(events), size)]


def expected_table(sql: str, batches: list[list[Event]]) -> dict:
    """The sink table of an uninterrupted in-process run, one batch per produced chunk."""
    host = ReplayHost(compile_sql(sql))
    for batch in batches:
        inputs: dict[str, list[Change]] = {"s1": [], "s2": []}
        for e in batch:
            inputs[e.table].extend(e.changes)
        host.run_batch(inputs)
    return host.table()


class Feed:
    """Produces the chunks to the source topics from a thread, one chunk per interval, up
    to the number ``release()`` allows (so each driver run gets records arriving while it
    runs), partitioned by key (as CDC is) so both partitions of a topic carry traffic; bad
    records go to a random partition. ``bad_coordinates`` gets where each bad record landed."""

    def __init__(self, bootstrap: str, topics: dict[str, str], batches: list[list[Event]], interval_s: float, rng: random.Random):
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
        self.topics = topics
        self.batches = batches
        self.interval_s = interval_s
        self.rng = rng
        self.bad_coordinates: dict[str, bytes] = {}
        self.produced = 0
        self.hurry = threading.Event()
        self.allowed = 0
        self.more = threading.Condition()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="feed", daemon=True)

    def start(self) -> Feed:
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            for index, batch in enumerate(self.batches):
                with self.more:
                    self.more.wait_for(lambda: index < self.allowed or self.hurry.is_set())
                for e in batch:
                    topic = self.topics[e.table]
                    partition = (e.key % 2) if e.key is not None else self.rng.randint(0, 1)
                    key = json.dumps({"id": e.key}).encode() if e.key is not None else None
                    on_delivery = self._on_bad_delivery(e.value) if e.bad else None
                    self.producer.produce(topic, e.value, key, partition=partition, on_delivery=on_delivery)
                assert self.producer.flush(60) == 0, "produce did not complete"
                self.produced += 1
                if not self.hurry.is_set():
                    time.sleep(self.interval_s)
        except BaseException as exc:  # reported by finish()
            self.error = exc

    def _on_bad_delivery(self, value: bytes):
        def done(err, msg) -> None:
            if err is None:
                self.bad_coordinates[f"{msg.topic()}/{msg.partition()}/{msg.offset()}"] = value
            else:
                self.error = RuntimeError(f"bad record not delivered: {err}")

        return done

    def release(self, upto: int) -> None:
        """Let the feed produce chunks up to index ``upto`` (exclusive)."""
        with self.more:
            self.allowed = max(self.allowed, upto)
            self.more.notify_all()

    def finish(self) -> None:
        """Produce everything left, now."""
        with self.more:
            self.hurry.set()
            self.more.notify_all()
        self.thread.join(timeout=PHASE_TIMEOUT_S)
        assert not self.thread.is_alive(), "producer thread did not finish"
        self.producer = None  # no reconnect attempts after the broker is gone
        if self.error is not None:
            raise self.error


# ---------------------------------------------------------------------------- driver


class Driver:
    """One ``tidemark run`` process in its own process group (driver Python, its JVM and
    the JVM's Python workers), watched through the status channel (JSON Lines)."""

    def __init__(self, workdir: Path, run_no: int, args: list[str]):
        self.status = workdir / f"status-{run_no}.jsonl"
        self.output = workdir / f"run-{run_no}.out"
        env = dict(os.environ, TIDEMARK_STATUS_FILE=str(self.status))
        with open(self.output, "wb") as out:
            self.proc = subprocess.Popen(
                [TIDEMARK, "run", *args], stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=env, start_new_session=True,
            )

    def events(self) -> list[dict]:
        try:
            lines = self.status.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in lines if line.strip()]

    def batches(self) -> list[int]:
        return [e["batch_id"] for e in self.events() if e["event"] == "batch"]

    def wait_started(self) -> None:
        """Until the query runs (Spark session up, query started from the checkpoint)."""
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        while not any(e["event"] == "started" for e in self.events()):
            assert self.proc.poll() is None, f"driver exited {self.proc.returncode}:\n{self.tail()}"
            assert time.monotonic() < deadline, f"not started in {PHASE_TIMEOUT_S}s:\n{self.tail()}"
            time.sleep(0.1)

    def wait_batches(self, n: int) -> None:
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        while len(self.batches()) < n:
            assert self.proc.poll() is None, f"driver exited {self.proc.returncode}:\n{self.tail()}"
            assert time.monotonic() < deadline, f"no {n} batches in {PHASE_TIMEOUT_S}s:\n{self.tail()}"
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL the whole driver: nothing gets to clean up, as in a machine failure."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        raise AssertionError(f"driver process group {self.proc.pid} survived SIGKILL")

    def wait(self) -> int:
        try:
            return self.proc.wait(timeout=PHASE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"driver did not finish in {PHASE_TIMEOUT_S}s:\n{self.tail()}") from None

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.output.read_text(encoding="utf-8", errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return "(no output)"


# ---------------------------------------------------------------------------- the test


def sink_table(bootstrap: str, topic: str) -> dict:
    columns = ("id", "level", "attr")
    out = {}
    for value in materialize_upsert(read_topic(bootstrap, topic)).values():
        obj = json.loads(value)
        out[(obj["id"],)] = tuple(obj[c] for c in columns)
    return out


def crash_and_recover(kafka_bootstrap, make_topic, tmp_path, *, n_events: int, chunk: int, kills: int, seed: int) -> None:
    rng = random.Random(seed)
    topics = {"s1": make_topic("s1", partitions=2), "s2": make_topic("s2", partitions=2)}
    sink = make_topic("t1", compacted=True)
    sql = example_sql("s1_s2_join.sql", {**topics, "t1": sink})
    sql_file = tmp_path / "crash.sql"
    sql_file.write_text(sql, encoding="utf-8")
    name = f"crash-{rng.getrandbits(32):08x}"
    checkpoint = str(tmp_path / "checkpoint")
    events = generate(rng, n_events)
    batches = chunks(events, chunk)
    n_bad = sum(e.bad for e in events)
    assert n_bad >= 4, "the workload must carry bad records"

    args = [str(sql_file), "--bootstrap-servers", kafka_bootstrap, "--checkpoint", checkpoint,
            "--name", name, "--max-records-per-trigger", "150", "--trigger-interval", "200 milliseconds"]
    feed = Feed(kafka_bootstrap, topics, batches, interval_s=0.75, rng=random.Random(seed + 1)).start()
    committed: list[int] = []
    plan = [(rng.randint(0, 3), rng.uniform(0.0, 2.5)) for _ in range(kills)]
    plan[0] = (max(plan[0][0], 1), plan[0][1])  # at least one kill with state to lose
    try:
        for run_no, (after_batches, delay) in enumerate(plan):
            driver = Driver(tmp_path, run_no, args)
            try:
                driver.wait_started()
                # this run's share of the stream arrives while it runs
                feed.release(len(batches) * (run_no + 1) // (kills + 1))
                driver.wait_batches(after_batches)
                time.sleep(delay)
            finally:
                driver.kill()
            committed += driver.batches()
    finally:
        feed.finish()

    final = Driver(tmp_path, kills, [*args, "--until-idle"])
    status = final.wait()
    assert status == 0, f"final run exited {status}:\n{final.tail()}"
    final_batches = final.batches()
    assert committed, "no run before the last committed a batch: the kills tested nothing"
    # the last run resumed from the checkpoint instead of starting over (it may find
    # nothing left to do when the killed runs got through everything)
    assert not final_batches or final_batches[0] > max(committed), (committed, final_batches)

    expected = expected_table(sql, batches)
    assert len(expected) > 10
    assert sink_table(kafka_bootstrap, sink) == expected

    letters = read_exactly_once(kafka_bootstrap, f"{name}.dlq", f"{name}.dlq.{run_id_of(checkpoint)}")
    decoded = [decode_dead_letter(r.value) for r in letters]
    seen = Counter(d.coordinate for d in decoded)
    duplicated = {c: n for c, n in seen.items() if n > 1}
    assert not duplicated, f"dead letters written more than once: {duplicated}"
    assert set(seen) == set(feed.bad_coordinates), (
        f"lost: {sorted(set(feed.bad_coordinates) - set(seen))}, unexpected: {sorted(set(seen) - set(feed.bad_coordinates))}"
    )
    for d in decoded:
        assert d.value == feed.bad_coordinates[d.coordinate], f"{d.coordinate}: original bytes changed"
        assert d.pipeline == name and d.reason


def test_sigkilled_driver_restarts_from_checkpoint_without_loss_or_duplicates(kafka_bootstrap, make_topic, tmp_path):
    """The make-test variant: one kill after at least one committed batch, then a restart
    that runs to idle (each driver start costs a JVM and a first batch: minutes on a loaded
    2-core machine). The slow variant below kills six times."""
    crash_and_recover(kafka_bootstrap, make_topic, tmp_path, n_events=800, chunk=20, kills=1, seed=SEED)


@pytest.mark.slow
def test_many_random_kills_over_a_longer_stream(kafka_bootstrap, make_topic, tmp_path):
    crash_and_recover(kafka_bootstrap, make_topic, tmp_path, n_events=4000, chunk=40, kills=6, seed=SEED + 1)
