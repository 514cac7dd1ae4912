"""``make demo`` through the control service: the seed's changelog-disorder example operated
the way a user operates Tidemark -- over REST.

1. Starts the embedded broker and ``tidemark control --insecure-dev`` on it (its warning is
   shown: the demo has no token on purpose).
2. Registers the s1/s2 join pipeline with ``POST /v1/pipelines``, starts it, shows its status.
3. Produces the seed's CDC events (``tidemark.cli.demo``: every ordering of s1's
   ``level 10 -> 20`` update, each row in its own transaction and partition); the pipeline
   runs with ``max_records_per_trigger: 1`` so the disorder really reaches the sink.
4. Waits for the sink topic to hold the seed's answer, shows the status figures, prints the
   sink topic and table, stops the pipeline and the service.

Alongside, a delta-join pipeline (orders x customers, ``demo_delta``): registering it
registers its tables with the control service's embedded index service; it runs while the
s1/s2 part does; at the end its sink table and delta-join figures are printed and it is stopped.

Exit status 0 when the sink table is right, 1 otherwise. Each step prints the curl call that
does the same by hand (docs/control.md).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

PIPELINE = "s1-s2-join"


def _say(text: str = "") -> None:
    print(text, flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.5)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def _status_line(st: dict[str, Any]) -> str:
    lag = sum(e["lag"] for e in st.get("lag") or [])
    return (f"state {st['state']}, last batch {st['last_batch_id']}, rows in {st['rows_in']}, "
            f"rows out {st['rows_out']}, lag {lag}, dlq {st['dlq']}, state size {st['state_size_bytes']} bytes")


class ControlProcess:
    """``tidemark control --insecure-dev`` as a child process, its log in a file."""

    def __init__(self, command: list[str], bootstrap: str, state_dir: Path, registry_topic: str):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = state_dir / "control.log"
        state_dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k not in ("TIDEMARK_API_TOKEN", "TIDEMARK_JOB_COMMAND")}
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [*command, "control", "--insecure-dev", "--port", str(self.port), "--bootstrap-servers", bootstrap,
                 "--state-dir", str(state_dir / "control"), "--registry-topic", registry_topic],
                stdout=out, stderr=out, stdin=subprocess.DEVNULL, env=env)
        self.client = httpx.Client(base_url=self.url, timeout=30)

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"tidemark control exited with {self.proc.returncode}:\n{self.log_tail()}")
        try:
            return httpx.get(self.url + "/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def log_tail(self, n: int = 20) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def warnings(self) -> list[str]:
        return [ln for ln in self.log.read_text(errors="replace").splitlines() if ln.startswith("WARNING")]

    def status(self) -> dict[str, Any]:
        return self.client.get(f"/v1/pipelines/{PIPELINE}/status").json()

    def stop(self) -> int:
        """SIGTERM: the service stops its jobs, releases their leases and exits."""
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def main() -> int:
    from tidemark.cli import demo as seed
    from tidemark.control import demo_delta
    from tidemark.kafka.admin import ensure_topics
    from tidemark.kafka.broker import EmbeddedBroker, configured_bootstrap

    with EmbeddedBroker() if configured_bootstrap() is None else seed._Existing() as broker:
        bootstrap = broker.bootstrap_servers
        _say(f"broker: {broker.kind} at {bootstrap}")
        run = uuid.uuid4().hex[:6]
        # s2's topic sorts first, so rate-limited batches put s2's rows in the join's state
        # before s1's changes arrive one batch at a time (see tidemark.cli.demo)
        topics = {"s1": f"demo-{run}-1-s1", "s2": f"demo-{run}-0-s2", "t1": f"demo-{run}-t1"}
        ensure_topics(bootstrap, {topics["s1"]: 3, topics["s2"]: 1, topics["t1"]: 1})
        delta_topics = demo_delta.topics(run) if demo_delta.supported() else None
        if delta_topics:
            ensure_topics(bootstrap, dict.fromkeys(delta_topics.values(), 1))
        work = Path(tempfile.mkdtemp(prefix="tidemark-demo-"))

        _say("\n$ tidemark control --insecure-dev --bootstrap-servers ... --port ...")
        control = ControlProcess(seed.tidemark_command(), bootstrap, work, f"tidemark.registry.demo-{run}")
        try:
            _wait(control.ready, 120, "the control service to be ready")
            for line in control.warnings():
                _say(line)
            _say(f"control service ready at {control.url} (log: {control.log})")
            return _drive(control, seed, bootstrap, topics, delta_topics)
        except (TimeoutError, RuntimeError, httpx.HTTPError) as exc:
            _say(f"\nFAILED: {exc}\n--- control service log (last lines) ---\n{control.log_tail()}")
            return 1
        finally:
            status = control.stop()
            _say(f"\ncontrol service stopped (exit status {status}: SIGTERM after a clean shutdown)")


def _drive(control: ControlProcess, seed: Any, bootstrap: str, topics: dict[str, str],
           delta_topics: dict[str, str] | None) -> int:
    from tidemark.control import demo_delta

    c = control.client
    sql = seed.DEMO_SQL.format(**topics)
    _say(f"\n$ curl -X POST {control.url}/v1/pipelines -d '{{\"name\": \"{PIPELINE}\", \"sql\": ..., "
         "\"options\": {\"max_records_per_trigger\": 1}}'")
    r = c.post("/v1/pipelines", json={"name": PIPELINE, "sql": sql, "options": {"max_records_per_trigger": 1}})
    if r.status_code != 201:
        _say(f"{r.status_code} {r.text}")
        return 1
    plan = r.json()["plan"]
    _say(f"201 registered {PIPELINE}: desired {r.json()['desired']}; plan: "
         + json.dumps({k: plan[k] for k in ("sink", "on_conflict") if k in plan}))

    index_url = None
    if delta_topics is None:
        _say("\n(delta-join pipeline skipped: this `tidemark run` has no --index-url yet)")
    else:
        index_url = demo_delta.register(c, control.url, delta_topics, _say)
        if index_url is None:
            return 1
        demo_delta.produce(bootstrap, delta_topics, _say)
        _say(f"\n$ curl -X POST {control.url}/v1/pipelines/{demo_delta.PIPELINE}/start")
        r = c.post(f"/v1/pipelines/{demo_delta.PIPELINE}/start")
        _say(f"{r.status_code} state {r.json()['state']}")

    _say(f"\n$ curl -X POST {control.url}/v1/pipelines/{PIPELINE}/start")
    r = c.post(f"/v1/pipelines/{PIPELINE}/start")
    _say(f"{r.status_code} state {r.json()['state']}")
    started = time.monotonic()
    st = _wait(lambda: (s := control.status())["state"] in ("running", "failed") and s, 300, "the job to start")
    if st["state"] == "failed":
        _say(f"the job failed: {st['error']}")
        return 1
    _say(f"\n$ curl {control.url}/v1/pipelines/{PIPELINE}/status     # after {time.monotonic() - started:.0f}s")
    _say(json.dumps(st))

    records = seed.s2_records(topics["s2"])
    for case in seed.ORDERINGS:
        records += seed.s1_case_records(topics["s1"], case, id_=case)
    _say(f"\nproducing {len(records)} CDC records, each in its own transaction:")
    _say("  s2: +I(10, 'a1'), +I(20, 'b1')")
    for case, kinds in seed.ORDERINGS.items():
        shown = ", ".join(f"{k}({case}, {seed.S1_ROWS[k]})" for k in kinds)
        _say(f"  s1 case {case} ({'in order' if case == 1 else 'out of order'}): {shown}  [partitions 0, 1, 2]")
    seed.produce_in_transactions(bootstrap, records)

    expected = {case: seed.EXPECTED_ROW for case in seed.ORDERINGS}
    last_in = -1

    def done() -> bool:
        nonlocal last_in
        st = control.status()
        if st["state"] == "failed":
            raise RuntimeError(f"the job failed: {st['error']}")
        if st["rows_in"] != last_in:
            last_in = st["rows_in"]
            _say(f"  status: {_status_line(st)}")
        return st["rows_in"] >= len(records) and _table(seed.sink_history(bootstrap, topics["t1"])) == expected

    _wait(done, 600, "the sink to hold every case's final row")
    st = _wait(lambda: (s := control.status())["lag"] and all(e["lag"] == 0 for e in s["lag"]) and s, 60, "no lag")
    _say(f"\n$ curl {control.url}/v1/pipelines/{PIPELINE}/status")
    _say(json.dumps(st))

    history = seed.sink_history(bootstrap, topics["t1"])
    _say(f"\nsink topic {topics['t1']}, every record in order (key id -> value; tombstone = delete):")
    _say(seed.table_text(["offset", "id", "level", "attr"],
                         [(i, k, *(v if v else ("(tombstone)", ""))) for i, (k, v) in enumerate(history)]))
    table = _table(history)
    _say("\nsink table t1 (the topic materialized: last value per key):")
    _say(seed.table_text(["id", "level", "attr"], [(k, *table[k]) for k in sorted(table)]))

    _say(f"\n$ curl -X POST {control.url}/v1/pipelines/{PIPELINE}/stop")
    r = c.post(f"/v1/pipelines/{PIPELINE}/stop")
    _say(f"{r.status_code} desired {r.json()['desired']}")
    st = _wait(lambda: (s := control.status())["state"] in ("stopped", "failed") and s, 120, "the job to stop")
    _say(f"state {st['state']}")
    if table != expected:
        _say(f"\nWRONG: expected every id to end at {seed.EXPECTED_ROW}")
        return 1
    _say("\nall three orderings end at (id, 20, 'b1'), as a changelog-correct join must.")
    if delta_topics is None or index_url is None:
        return 0
    def status_of() -> dict[str, Any]:
        return c.get(f"/v1/pipelines/{demo_delta.PIPELINE}/status").json()

    first = _wait(lambda: demo_delta.done(s := status_of(), bootstrap, delta_topics) and s, 300,
                  f"{demo_delta.PIPELINE}'s sink table")
    demo_delta.produce_late(bootstrap, delta_topics, _say)
    _wait(lambda: demo_delta.done(status_of(), bootstrap, delta_topics, late=True), 120,
          f"{demo_delta.PIPELINE}'s late order")
    # the sink is written before the job reports the batch: wait for that report too
    st = _wait(lambda: (s := status_of())["last_batch_id"] is not None
               and s["last_batch_id"] > (first["last_batch_id"] or -1) and s, 60, f"{demo_delta.PIPELINE}'s status")
    ok = demo_delta.report(st, bootstrap, delta_topics, index_url, _say)
    _say(f"\n$ curl -X POST {control.url}/v1/pipelines/{demo_delta.PIPELINE}/stop")
    r = c.post(f"/v1/pipelines/{demo_delta.PIPELINE}/stop")
    st = _wait(lambda: (s := status_of())["state"] in ("stopped", "failed") and s, 120, "the job to stop")
    _say(f"{r.status_code} desired {r.json()['desired']}; state {st['state']}")
    return 0 if ok else 1


def _table(history: list[tuple[int, tuple | None]]) -> dict[int, tuple]:
    table: dict[int, tuple] = {}
    for k, v in history:
        if v is None:
            table.pop(k, None)
        else:
            table[k] = v
    return table


if __name__ == "__main__":
    sys.exit(main())
