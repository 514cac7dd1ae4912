"""Helpers shared by the index service tests: a table and its records, ``tidemark index``
as a real process."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
from confluent_kafka import Producer

TIDEMARK = str(Path(sys.executable).parent / "tidemark")
PROCESS_TOKEN = "index-token-" + uuid.uuid4().hex


def ddl(name: str, topic: str, fmt: str = "upsert-json") -> str:
    return (f"CREATE TABLE {name} (id BIGINT, k BIGINT, v STRING, PRIMARY KEY (id) NOT ENFORCED) "
            f"WITH ('topic' = '{topic}', 'format' = '{fmt}', 'index.by_k.columns' = 'k')")


def produce(bootstrap: str, topic: str, records: list[tuple[dict | None, dict | None]]) -> None:
    p = Producer({"bootstrap.servers": bootstrap})
    for key, value in records:
        p.produce(topic, key=json.dumps(key).encode() if key is not None else None,
                  value=json.dumps(value).encode() if value is not None else None)
    assert p.flush(30) == 0


def upsert(i: int, k: int, v: str) -> tuple[dict, dict]:
    return {"id": i}, {"id": i, "k": k, "v": v}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class IndexProcess:
    """``tidemark index`` as a child process; ``client`` sends the token, ``anon`` does not."""

    def __init__(self, bootstrap: str, log: Path, *args: str):
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = log
        env = {**os.environ, "TIDEMARK_INDEX_TOKEN": PROCESS_TOKEN}
        with open(log, "ab") as out:
            self.p = subprocess.Popen([TIDEMARK, "index", "--port", self.url.rsplit(":", 1)[1],
                                       "--bootstrap-servers", bootstrap, *args], stdout=out, stderr=out, env=env)
        self.client = httpx.Client(base_url=self.url, timeout=30, headers={"Authorization": f"Bearer {PROCESS_TOKEN}"})
        self.anon = httpx.Client(base_url=self.url, timeout=30)
        deadline = time.monotonic() + 60
        while not self._healthy():
            assert time.monotonic() < deadline, f"tidemark index not healthy: {log.read_text()[-2000:]}"
            time.sleep(0.1)

    def _healthy(self) -> bool:
        assert self.p.poll() is None, f"tidemark index exited: {self.log.read_text()[-2000:]}"
        try:
            return self.anon.get("/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while (r := self.anon.get("/readyz")).status_code != 200:
            assert time.monotonic() < deadline, f"never ready: {r.text}"
            time.sleep(0.05)

    def stop(self) -> None:
        self.client.close()
        self.anon.close()
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
