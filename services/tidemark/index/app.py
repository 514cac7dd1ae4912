"""The index service's REST API (``docs/delta-join.md`` has the reference).

Every ``/v1`` endpoint needs the bearer token (``TIDEMARK_INDEX_TOKEN``): lookups return
the indexed rows, which are as confidential as the topics they come from.

- ``POST /v1/tables``: register a source table: its ``CREATE TABLE`` text (with
  ``'index.<name>.columns'`` options), optionally the topic (default: the ``topic``
  option, else the table name). The service reads the topic from the beginning; a table
  whose topic cannot be read yet is retried with backoff, and at once when registered again.
- ``GET /v1/tables``, ``GET /v1/tables/{name}``: applied offsets per partition, rows, history.
- ``POST /v1/lookup``: one table, one index, a batch of keys -> the rows per key, in one
  round trip (JSON). ``min_offsets`` waits (up to ``timeout_ms``, bounded by the service)
  until the index has applied them, else 503 naming what is missing; ``as_of`` answers
  from the version history as of those offsets (and waits for them too).
- ``POST /v1/tables/{name}/release``: no lookup will ask as of offsets below these any
  more; older versions are dropped.
- ``/healthz``; ``/readyz`` (503 until every table's initial load has caught up);
  ``/metrics`` (Prometheus). These three are open: they say nothing about the rows.

Bad requests are 4xx with a message. Lookups are plain ``def`` handlers, which FastAPI runs
in its thread pool (40 threads), so a waiting lookup blocks a worker thread, not the event
loop; that is why at most ``max_waiters`` lookups may wait at once (the next one is 429 at
once), leaving the other threads to the lookups that need no wait.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException

from tidemark.control.api_support import bearer_check, validation_detail
from tidemark.control.json_body import StrictJsonRoute
from tidemark.control.middleware import BodySizeLimit
from tidemark.engine.catalog import TableDef
from tidemark.engine.errors import TidemarkError
from tidemark.engine.sql import _table_def, parse_statements
from tidemark.engine.types import coerce_value, to_json_value
from tidemark.index_client import MAX_LOOKUP_KEYS
from tidemark.index_client.store import PRIMARY, AsOfUnavailable
from tidemark.index.feed import TableFeed
from tidemark.version import tidemark_version


class TableRegistration(BaseModel):
    ddl: str = Field(description="CREATE TABLE statement of the source table", max_length=100_000)
    topic: str | None = Field(default=None, description="Topic to read (default: the table's 'topic' option)")
    history: bool = Field(default=True, description="Keep versions for as-of lookups (strong delta joins)")


class LookupRequest(BaseModel):
    table: str
    index: str = PRIMARY
    keys: list[list[Any]] = Field(max_length=MAX_LOOKUP_KEYS)
    min_offsets: dict[int, int] | None = None
    as_of: dict[int, int] | None = None
    timeout_ms: int | None = Field(default=None, ge=0)


class Release(BaseModel):
    offsets: dict[int, int]


class ErrorBody(BaseModel):
    detail: str = Field(description="What was wrong, and where")


def _errors(*codes: int, body: bool = True) -> dict:
    """Documented error answers (every 4xx/503 is ``{"detail": message}``); an endpoint with
    a body may also answer 413 (too large), 415 (not JSON) and 422 (not valid JSON)."""
    return {code: {"model": ErrorBody} for code in (400, 401, *codes, *((413, 415, 422) if body else ()))}


class IndexService:
    """The tables being indexed; shared by the API handlers and the metrics collector."""

    def __init__(self, bootstrap: str, max_wait_ms: int = 30_000, feed_factory: type[TableFeed] = TableFeed,
                 max_waiters: int = 8, load_backoff_s: tuple[float, float] = (0.5, 30.0)):
        self.feed_factory = feed_factory
        self.bootstrap = bootstrap
        self.max_wait_ms = max_wait_ms
        self.max_waiters = max_waiters
        self.load_backoff_s = load_backoff_s
        self.feeds: dict[str, TableFeed] = {}
        self.lock = threading.Lock()
        self._waiters = threading.BoundedSemaphore(max_waiters)

    @contextmanager
    def wait_slot(self, table: str) -> Iterator[None]:
        """One of the ``max_waiters`` slots for a lookup that must wait for offsets; 429 at
        once when none is free (a waiting lookup holds a worker thread until it returns)."""
        if not self._waiters.acquire(blocking=False):
            raise HTTPException(429, f"table '{table}': {self.max_waiters} lookups are already waiting for offsets "
                                     "(--max-waiters); retry later", headers={"Retry-After": "1"})
        try:
            yield
        finally:
            self._waiters.release()

    def register(self, reg: TableRegistration) -> TableFeed:
        stmts = parse_statements(reg.ddl)
        if len(stmts) != 1 or type(stmts[0]).__name__ != "Create":
            raise HTTPException(400, "ddl: expected exactly one CREATE TABLE statement")
        table = _table_def(stmts[0])
        from tidemark.engine.delta_plan import declared_indexes

        declared_indexes(table)  # unknown index columns -> PlanError (400)
        if not table.primary_key:
            raise HTTPException(400, f"table '{table.name}' has no PRIMARY KEY; the index keeps the latest row per key")
        topic = reg.topic or table.options.get("topic") or table.name
        with self.lock:
            old = self.feeds.get(table.name)
            if old is not None:
                if old.topic != topic or old.table != table or old.index.keep_history != reg.history:
                    raise HTTPException(409, f"table '{table.name}' is already registered with another definition")
                if not old.failed:
                    old.retry_now()  # still loading its topic: try now rather than after the backoff
                    return old  # otherwise registering the same table again is a no-op
                old.stop()  # it stopped on an error: follow the topic again from the beginning
            feed = self.feed_factory(table, topic, self.bootstrap, reg.history, backoff_s=self.load_backoff_s)
            self.feeds[table.name] = feed
        feed.start()
        return feed

    def feed(self, name: str) -> TableFeed:
        feed = self.feeds.get(name)
        if feed is None:
            raise HTTPException(404, f"no table '{name}' is registered (registered: {', '.join(sorted(self.feeds)) or 'none'})")
        return feed

    def close(self) -> None:
        for feed in list(self.feeds.values()):
            feed.stop()


def describe(feed: TableFeed) -> dict[str, Any]:
    with feed.cond:
        idx = feed.index
        return {
            "table": feed.table.name,
            "topic": feed.topic,
            "indexes": {n: [feed.table.column_names[i] for i in s.columns] for n, s in idx.indexes.items()},
            "applied_offsets": dict(idx.applied),
            "initial_end_offsets": feed.initial_end,
            "released_offsets": dict(idx.horizon),
            "rows": idx.rows,
            "history_versions": idx.history_versions,
            "history": idx.keep_history,
            "ready": feed.initial_end is not None and idx.caught_up(feed.initial_end),
            "records": feed.records,
            "bad_records": feed.bad_records,
            "error": feed.error,
        }


class _TableCollector:
    """Per-table gauges, read from the feeds at scrape time."""

    def __init__(self, service: IndexService) -> None:
        self.service = service

    def collect(self) -> Iterator[GaugeMetricFamily]:
        rows = GaugeMetricFamily("tidemark_index_rows", "Current rows per table", labels=["table"])
        hist = GaugeMetricFamily("tidemark_index_history_versions", "Versions kept for as-of lookups", labels=["table"])
        applied = GaugeMetricFamily("tidemark_index_applied_offset", "Next offset to apply", labels=["table", "partition"])
        ready = GaugeMetricFamily("tidemark_index_ready", "1 once the initial load caught up", labels=["table"])
        for name, feed in sorted(self.service.feeds.items()):
            d = describe(feed)
            rows.add_metric([name], d["rows"])
            hist.add_metric([name], d["history_versions"])
            ready.add_metric([name], 1 if d["ready"] else 0)
            for p, off in sorted(d["applied_offsets"].items()):
                applied.add_metric([name, str(p)], off)
        yield from (rows, hist, applied, ready)


class LookupMetrics:
    """The service's Prometheus registry: lookup counters and latency, and the tables' gauges."""

    def __init__(self, service: IndexService) -> None:
        self.registry = CollectorRegistry()
        self.lookups = Counter("tidemark_index_lookups", "Lookup requests", ["table", "outcome"], registry=self.registry)
        self.keys = Counter("tidemark_index_lookup_keys", "Keys looked up", ["table"], registry=self.registry)
        self.latency = Histogram("tidemark_index_lookup_seconds", "Lookup latency (including fence waits)", ["table"],
                                 registry=self.registry,
                                 buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5))
        self.waiting = Gauge("tidemark_index_waiting_lookups", "Lookups waiting for their offsets now",
                             registry=self.registry)
        self.registry.register(_TableCollector(service))


def create_app(service: IndexService, api_token: str | None, *, max_body_bytes: int = 4 * 1024 * 1024) -> FastAPI:
    """``api_token=None`` means ``--insecure-dev``: no endpoint needs a token."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        try:
            yield
        finally:
            service.close()

    app = FastAPIOffline(title="Tidemark index service", version="1", lifespan=lifespan,
                  description="Delta-join lookup index over source topics.")
    app.router.route_class = StrictJsonRoute  # NaN, Infinity, lone surrogates: 422, never a 500
    app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes)
    m = LookupMetrics(service)
    @app.exception_handler(RequestValidationError)
    async def _invalid(_req: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": validation_detail(exc.errors())}, status_code=400)

    @app.exception_handler(TidemarkError)
    async def _tidemark(_req: Request, exc: TidemarkError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=400)

    @app.get("/healthz")
    def healthz() -> dict:
        return {"status": "ok", "version": tidemark_version()}

    @app.get("/readyz", responses={503: {"description": "a table is loading or failed"}})
    def readyz(response: Response) -> dict:
        tables = {name: describe(f) for name, f in service.feeds.items()}
        waiting = [n for n, d in tables.items() if not d["ready"]]
        failed = {n: d["error"] for n, d in tables.items() if d["error"]}
        if waiting or failed:
            response.status_code = 503
            return {"status": "loading", "loading": waiting, "failed": failed}
        return {"status": "ready", "tables": sorted(tables)}

    @app.get("/metrics", response_class=Response, summary="Prometheus text format",
             responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}})
    def metrics() -> Response:
        return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)

    needs_token = [Depends(bearer_check(api_token, "TIDEMARK_INDEX_TOKEN"))]

    @app.post("/v1/tables", status_code=201, dependencies=needs_token, responses=_errors(409))
    def register(reg: TableRegistration) -> dict:
        return describe(service.register(reg))

    @app.get("/v1/tables", dependencies=needs_token, responses=_errors(body=False))
    def tables() -> dict:
        return {"tables": [describe(f) for _, f in sorted(service.feeds.items())]}

    @app.get("/v1/tables/{name}", dependencies=needs_token, responses=_errors(404, body=False))
    def table(name: str) -> dict:
        return describe(service.feed(name))

    @app.post("/v1/tables/{name}/release", dependencies=needs_token, responses=_errors(404))
    def release(name: str, body: Release) -> dict:
        feed = service.feed(name)
        with feed.cond:
            dropped = feed.index.release(body.offsets)
        return {"dropped_versions": dropped, **describe(feed)}

    @app.post("/v1/lookup", dependencies=needs_token, responses=_errors(404, 409, 429, 503))
    def lookup(req: LookupRequest) -> JSONResponse:
        feed = service.feed(req.table)
        spec = feed.index.indexes.get(req.index)
        if spec is None:
            raise HTTPException(400, f"table '{req.table}' has no index '{req.index}' (it has: {', '.join(feed.index.indexes)})")
        table: TableDef = feed.table
        types = [table.columns[i].type for i in spec.columns]
        keys = []
        for n, raw in enumerate(req.keys):
            if len(raw) != len(types):
                raise HTTPException(400, f"keys[{n}]: index '{req.index}' has {len(types)} column(s), got {len(raw)} value(s)")
            try:
                keys.append(tuple(coerce_value(t, v) for t, v in zip(types, raw)))
            except ValueError as exc:
                raise HTTPException(400, f"keys[{n}]: {exc}") from None
        wait = [o for o in (req.min_offsets, req.as_of) if o and not feed.applied_all(o)]
        timeout_ms = min(req.timeout_ms if req.timeout_ms is not None else service.max_wait_ms, service.max_wait_ms)
        with m.latency.labels(req.table).time():
            if wait:
                try:
                    with service.wait_slot(req.table), m.waiting.track_inprogress():
                        for offsets in wait:
                            _wait_for(feed, offsets, timeout_ms)
                except HTTPException as exc:
                    m.lookups.labels(req.table, "timeout" if exc.status_code == 503 else "too_many_waiters").inc()
                    raise
            with feed.cond:
                try:
                    found = feed.index.lookup(req.index, keys, req.as_of)
                except AsOfUnavailable as exc:
                    m.lookups.labels(req.table, "as_of_unavailable").inc()
                    raise HTTPException(409, str(exc)) from None
                applied = dict(feed.index.applied)
        m.lookups.labels(req.table, "ok").inc()
        m.keys.labels(req.table).inc(len(keys))
        col_types = table.types
        rows = [[[to_json_value(t, v) for t, v in zip(col_types, row)] for row, _pos in per_key] for per_key in found]
        # the values are JSON values already (to_json_value): a response of its own skips
        # FastAPI's encoding walk over every value, several times the json.dumps itself
        return JSONResponse({"rows": rows, "applied_offsets": applied})

    return app


def _wait_for(feed: TableFeed, offsets: dict[int, int], timeout_ms: int) -> None:
    if not feed.wait_applied(offsets, timeout_ms / 1000):
        with feed.cond:
            applied = dict(feed.index.applied)
        raise HTTPException(503, f"table '{feed.table.name}': offsets {offsets} not applied within "
                                 f"{timeout_ms} ms (applied: {applied}{'; ' + feed.error if feed.error else ''})")
