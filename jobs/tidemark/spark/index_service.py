"""The index service a delta-join job uses: the one at ``--index-url``, or an embedded one
this process starts (the ``tidemark index`` app on loopback, for the job's lifetime), so the
same SQL runs offline and in tests with no service to deploy.

``JobIndex`` registers the pipeline's delta-join source tables (idempotent: the same DDL
again is a no-op), waits until the service has loaded them (``/readyz``), and releases the
as-of history of committed batches (``POST /v1/tables/{name}/release``).

Limits of the embedded service: it listens on 127.0.0.1, so executors must run on this
machine (``local[*]``, or a standalone cluster on this host); a cluster spread over hosts
needs ``--index-url``. Releases are per table, not per client: two strong jobs sharing one
index service for the same table would release each other's fences (one job per table per
service, or separate services).
"""

from __future__ import annotations

import logging
import secrets
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

import httpx

from tidemark.engine.errors import TidemarkError
from tidemark.engine.pipeline import Pipeline
from tidemark.spark.delta import IndexTarget

log = logging.getLogger("tidemark.spark.index_service")


class IndexServiceError(TidemarkError):
    exit_status = 1


class EmbeddedIndexService:
    """``tidemark index`` (``tidemark.index.app``) under uvicorn in a thread of this process."""

    def __init__(self, bootstrap: str, host: str = "127.0.0.1"):
        self.bootstrap = bootstrap
        self.host = host
        self.token = secrets.token_urlsafe(24)
        self.url: str | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self, timeout_s: float = 30.0) -> str:
        import uvicorn

        from tidemark.index.app import IndexService, create_app

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        port = sock.getsockname()[1]
        app = create_app(IndexService(self.bootstrap), self.token)
        config = uvicorn.Config(app, access_log=False, log_config=None, lifespan="on", timeout_graceful_shutdown=5)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name="tidemark-index-service", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise IndexServiceError("the embedded index service did not start")
            time.sleep(0.05)
        self.url = f"http://{self.host}:{port}"
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(15)
        self._server = self._thread = None


class JobIndex:
    """The index side of one delta-join job: which service, which tables, their fences."""

    def __init__(self, pipeline: Pipeline, bootstrap: str, url: str | None = None, token: str | None = None):
        from tidemark.index_client.pipeline_tables import indexed_tables

        self.pipeline = pipeline
        self.bootstrap = bootstrap
        self.url = url.rstrip("/") if url else None
        self.token = token
        self.tables = indexed_tables(pipeline)
        self.embedded: EmbeddedIndexService | None = None
        self._client: httpx.Client | None = None
        self._released: dict[str, dict[int, int]] = {}

    @property
    def needed(self) -> bool:
        return bool(self.tables)

    @property
    def client(self) -> httpx.Client:
        if self._client is None:
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            self._client = httpx.Client(base_url=self.url or "", headers=headers, timeout=30.0)
        return self._client

    def topics(self) -> dict[str, str]:
        src = self.pipeline.sources
        return {t.name: src[t.name].options.get("topic", t.name) for t in self.tables}

    def target(self) -> IndexTarget:
        assert self.url is not None, "start() first"
        src = self.pipeline.sources
        return IndexTarget(self.url, {t.name: src[t.name] for t in self.tables}, self.token, self.topics())

    def start(self, ready_timeout_s: float = 120.0) -> IndexTarget:
        """Start the embedded service if no URL was given, register the tables, wait until
        they are loaded. Idempotent (a restarted query calls it again)."""
        if self.url is None:
            self.embedded = EmbeddedIndexService(self.bootstrap)
            self.url = self.embedded.start()
            self.token = self.embedded.token
            self._client = None
        for t in self.tables:
            self._register(t)
        self._wait_ready(ready_timeout_s)
        return self.target()

    def _register(self, t: Any) -> None:
        try:
            resp = self.client.post("/v1/tables", json={"ddl": t.ddl, "history": t.history})
        except httpx.TransportError as exc:
            raise IndexServiceError(f"index service at {self.url} is unreachable ({type(exc).__name__}: {exc})") from None
        if resp.status_code in (200, 201):
            return
        raise IndexServiceError(
            f"index service at {self.url} refused table '{t.name}' ({resp.status_code}): {_detail(resp)}"
        )

    def _wait_ready(self, timeout_s: float) -> None:
        names = {t.name for t in self.tables}
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while True:
            try:
                resp = self.client.get("/v1/tables")
                tables = {d["table"]: d for d in resp.json().get("tables", [])} if resp.status_code == 200 else {}
                last = {n: tables.get(n) for n in names}
                failed = {n: d["error"] for n, d in last.items() if d and d.get("error")}
                if failed:
                    raise IndexServiceError(f"index service at {self.url} could not load {failed}")
                if all(d and d.get("ready") for d in last.values()):
                    return
            except httpx.TransportError as exc:
                last = str(exc)
            if time.monotonic() > deadline:
                raise IndexServiceError(f"index service at {self.url} not ready after {timeout_s:.0f}s: {last}")
            time.sleep(0.1)

    def release(self, end_offsets: Mapping[str, Mapping[str, int]]) -> None:
        """A batch with these end offsets (``{topic: {partition: offset}}``) is committed:
        no lookup will ask as of anything older. Errors are logged, not raised: a missed
        release only keeps history longer."""
        for table, topic in self.topics().items():
            offs = {int(p): int(o) for p, o in (end_offsets.get(topic) or {}).items()}
            if not offs or all(self._released.get(table, {}).get(p, -1) >= o for p, o in offs.items()):
                continue
            try:
                resp = self.client.post(f"/v1/tables/{table}/release", json={"offsets": offs})
                if resp.status_code == 200:
                    self._released[table] = offs
                else:
                    log.warning("release of %s at %s: %s %s", table, offs, resp.status_code, _detail(resp))
            except httpx.TransportError as exc:
                log.warning("release of %s at %s failed: %s", table, offs, exc)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        if self.embedded is not None:
            self.embedded.stop()
            self.embedded = None


def _detail(resp: httpx.Response) -> str:
    try:
        return str(resp.json().get("detail"))
    except ValueError:
        return resp.text
