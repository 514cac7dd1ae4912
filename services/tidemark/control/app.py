"""The REST API: thin handlers over ``Controller``; every error is JSON with a message.

All ``/v1`` endpoints need the bearer token (``TIDEMARK_API_TOKEN``), compared in constant
time; ``/healthz``, ``/readyz``, ``/metrics`` and ``/openapi.json`` do not. Handlers are
plain ``def`` functions: FastAPI runs them in its thread pool, which is right for the
blocking Kafka round trips behind them. Bodies are strict JSON (``json_body``).
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, Path, Query, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from tidemark.control import planning
from tidemark.control.api_support import bearer_check, validation_detail
from tidemark.control.controller import Conflict, Controller, LimitExceeded, NotFound
from tidemark.control.indexes import IndexConflict, IndexRejected, IndexUnavailable
from tidemark.control.json_body import StrictJsonRoute
from tidemark.control.metrics import build_registry
from tidemark.control.middleware import AccessLog, BodySizeLimit
from tidemark.control.models import (
    NAME_PATTERN, ErrorBody, ExplainRequest, Health, PageQuery, PipelineCreate, PipelineCreated, PipelineList,
    PipelineStatus, PipelineView,
)
from tidemark.control.registry_kafka import RegistryUnavailable
from tidemark.control.registry_log import PipelineRecord
from tidemark.control.upgrade import PipelineUpdate
from tidemark.control.topic_rules import TopicRuleViolation
from tidemark.version import tidemark_version

log = logging.getLogger("tidemark.control.app")

PipelineName = Annotated[str, Path(pattern=NAME_PATTERN, description="Pipeline name")]


def _errors(*codes: int) -> dict:
    return {code: {"model": ErrorBody} for code in codes}


def _view(rec: PipelineRecord) -> dict:
    return {"name": rec.name, "sql": rec.sql, "options": rec.options, "desired": rec.desired,
            "version": rec.version, "created_at": rec.created_at, "updated_at": rec.updated_at}


def _answer_errors_as_json(app: FastAPI) -> None:
    """Every error is JSON with a message, never a stack trace: the caller's mistakes are
    4xx naming what was wrong, a dependency's failure 502/503."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(_req: Request, exc: RequestValidationError) -> JSONResponse:
        errors = jsonable_encoder(exc.errors(), custom_encoder={bytes: lambda b: b.decode("utf-8", "replace")})
        return JSONResponse({"detail": validation_detail(errors), "errors": errors}, status_code=422)

    @app.exception_handler(HTTPException)
    async def _http(_req: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse({"detail": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    async def _rejected(_req: Request, exc: Exception) -> JSONResponse:
        """SQL the service will not take, with ``kind`` saying which check refused it."""
        kind = exc.kind if isinstance(exc, planning.PlanRejected) else type(exc).__name__
        return JSONResponse({"detail": str(exc), "kind": kind}, status_code=422)

    for error_type in (planning.PlanRejected, TopicRuleViolation, IndexRejected):
        app.add_exception_handler(error_type, _rejected)

    # errors that are the caller's or a dependency's, never a 5xx with a stack trace; a
    # delta join's tables that could not be registered with the index service leave the
    # pipeline unregistered (502: that service is unusable, unreachable or refuses our token);
    # a registration past a limit is 409: the registry's state, not the request, is in the way
    statuses = {NotFound: 404, Conflict: 409, LimitExceeded: 409, RegistryUnavailable: 503, IndexUnavailable: 502,
                IndexConflict: 409}

    async def _by_status(_req: Request, exc: Exception) -> JSONResponse:
        status = next(statuses[t] for t in type(exc).__mro__ if t in statuses)  # subclasses too
        return JSONResponse({"detail": str(exc)}, status_code=status)

    for error_type in statuses:
        app.add_exception_handler(error_type, _by_status)

    @app.exception_handler(Exception)
    async def _crash(_req: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled error", exc_info=exc)
        return JSONResponse({"detail": "internal error; see the control service log"}, status_code=500)


def create_app(controller: Controller, api_token: str | None, *, max_body_bytes: int = 1024 * 1024,
               manage_controller: bool = True) -> FastAPI:
    """``api_token=None`` means ``--insecure-dev``: no authentication at all."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        if manage_controller:
            controller.start()
        try:
            yield
        finally:
            if manage_controller:
                controller.close()

    app = FastAPIOffline(title="Tidemark control service", version="1", lifespan=lifespan,
                  description="Register, explain, run and watch changelog pipelines.")
    app.router.route_class = StrictJsonRoute
    metrics_registry, request_histogram = build_registry(controller)
    app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes)
    app.add_middleware(AccessLog, histogram=request_histogram)

    def ready() -> None:
        reason = controller.ready_reason if not controller.registry.loaded else None
        if reason:
            raise HTTPException(503, f"not ready: {reason}")

    v1 = [Depends(bearer_check(api_token, "TIDEMARK_API_TOKEN")), Depends(ready)]

    _answer_errors_as_json(app)

    # -- pipelines --------------------------------------------------------------------------

    @app.post("/v1/pipelines", status_code=201, response_model=PipelineCreated, dependencies=v1,
              responses=_errors(400, 401, 409, 413, 415, 422, 502, 503), summary="Register a pipeline (not started)")
    def create_pipeline(body: PipelineCreate) -> dict:
        plan = planning.explain(body.sql)
        rec, binding = controller.create(body.name, body.sql, body.options.model_dump())
        indexes = None if binding is None else {"url": binding.url, "tables": list(binding.tables),
                                                 "embedded": binding.embedded}
        return {**_view(rec), "plan": plan, "indexes": indexes}

    @app.post("/v1/explain", dependencies=v1, responses=_errors(400, 401, 413, 415, 422, 503),
              summary="Plan SQL without registering it")
    def explain(body: ExplainRequest) -> dict:
        return planning.explain(body.sql)

    @app.get("/v1/pipelines", response_model=PipelineList, dependencies=v1, responses=_errors(401, 422, 503),
             summary="Pipelines in name order, with their state, a page at a time")
    def list_pipelines(query: Annotated[PageQuery, Query()]) -> dict:
        page, next_token = controller.page(query.page_token, query.limit)
        return {"pipelines": [{**_view(rec), "state": st["state"], "owner": st["owner"]} for rec, st in page],
                "next_page_token": next_token}

    @app.get("/v1/pipelines/{name}", response_model=PipelineView, dependencies=v1,
             responses=_errors(401, 404, 422, 503))
    def get_pipeline(name: PipelineName) -> dict:
        return _view(controller.get(name))

    @app.put("/v1/pipelines/{name}", response_model=PipelineCreated, dependencies=v1,
             responses=_errors(400, 401, 404, 409, 413, 415, 422, 502, 503),
             summary="Change the pipeline's SQL and options, keeping its state when the change allows it "
                     "(409 says why not; fresh_start drops it); a running job restarts with the new version")
    def update_pipeline(name: PipelineName, body: PipelineUpdate) -> dict:
        plan = planning.explain(body.sql)
        rec = controller.update(name, body.sql, body.options.model_dump(), body.fresh_start)
        return {**_view(rec), "plan": plan}

    @app.delete("/v1/pipelines/{name}", status_code=204, dependencies=v1, responses=_errors(401, 404, 422, 503),
                summary="Stop the pipeline's job and remove it from the registry")
    def delete_pipeline(name: PipelineName) -> Response:
        controller.delete(name)
        return Response(status_code=204)

    @app.post("/v1/pipelines/{name}/start", status_code=202, response_model=PipelineStatus, dependencies=v1,
              responses=_errors(401, 404, 409, 422, 503),
              summary="Desire the pipeline running (again, if its job failed or finished)")
    def start_pipeline(name: PipelineName) -> dict:
        controller.set_desired(name, "running")
        return controller.status(name)

    @app.post("/v1/pipelines/{name}/stop", status_code=202, response_model=PipelineStatus, dependencies=v1,
              responses=_errors(401, 404, 409, 422, 503))
    def stop_pipeline(name: PipelineName) -> dict:
        controller.set_desired(name, "stopped")
        return controller.status(name)

    @app.get("/v1/pipelines/{name}/status", response_model=PipelineStatus, dependencies=v1,
             responses=_errors(401, 404, 422, 503))
    def pipeline_status(name: PipelineName) -> dict:
        return controller.status(name)

    # -- operations ---------------------------------------------------------------------------

    @app.get("/healthz", response_model=Health, summary="The process is alive")
    def healthz() -> dict:
        return {"status": "ok", "service_id": controller.service_id, "version": tidemark_version()}

    @app.get("/readyz", response_model=Health, responses={503: {"model": Health}},
             summary="Broker reachable and registry loaded")
    def readyz() -> JSONResponse:
        reason = controller.ready_reason
        body = {"status": "ready" if reason is None else "not ready", "reason": reason,
                "service_id": controller.service_id}
        return JSONResponse(body, status_code=200 if reason is None else 503)

    @app.get("/metrics", response_class=Response, summary="Prometheus text format",
             responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}})
    def metrics() -> Response:
        return Response(generate_latest(metrics_registry), media_type=CONTENT_TYPE_LATEST)

    return app
