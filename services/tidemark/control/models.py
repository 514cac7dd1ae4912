"""Request and response bodies of the REST API (they are also the OpenAPI schema)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

NAME_PATTERN = r"^[a-z][a-z0-9_-]{0,62}$"
MAX_SQL_CHARS = 256 * 1024
DEFAULT_PAGE, MAX_PAGE = 100, 1000

State = Literal["registered", "starting", "running", "failed", "stopped"]


class PipelineOptions(BaseModel):
    """How the job runs. Unknown options are rejected, so a typo is an error, not a no-op;
    types are strict, so ``true`` is no number and ``1`` no boolean."""

    model_config = ConfigDict(extra="forbid", strict=True)

    restart: bool = Field(False, description="Restart the job with exponential backoff when it dies")
    until_idle: bool = Field(False, description="Stop once every input is consumed (backfills, tests)")
    restart_max_backoff_s: float = Field(60.0, ge=1.0, le=3600.0, description="Cap of the restart backoff")
    max_records_per_trigger: int | None = Field(
        None, ge=1, le=1_000_000_000, description="Rate limit: at most N source records per micro-batch")


class PipelineCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN, description="Lower-case letters, digits, '-' and '_'; 1-63 chars",
                      examples=["orders-enriched"])
    sql: str = Field(min_length=1, max_length=MAX_SQL_CHARS, description="CREATE TABLE ...; INSERT INTO ...")
    options: PipelineOptions = Field(default_factory=PipelineOptions)


class ExplainRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sql: str = Field(min_length=1, max_length=MAX_SQL_CHARS)


class PageQuery(BaseModel):
    """``GET /v1/pipelines``'s query; an unknown parameter is refused like an unknown field."""

    model_config = ConfigDict(extra="forbid")

    limit: int = Field(DEFAULT_PAGE, ge=1, le=MAX_PAGE, description="Pipelines per page")
    page_token: str | None = Field(None, pattern=NAME_PATTERN, description="`next_page_token` of the previous page")


class PipelineView(BaseModel):
    name: str
    sql: str
    options: dict[str, Any]
    desired: Literal["running", "stopped"]
    version: int
    created_at: float
    updated_at: float


class IndexesView(BaseModel):
    url: str = Field(description="The index service the job looks rows up in")
    tables: list[str] = Field(description="Delta-join source tables registered there")
    embedded: bool = Field(description="The control service's own index service (no --index-url)")


class PipelineCreated(PipelineView):
    plan: dict[str, Any] = Field(description="The plan, as `tidemark explain --json` prints it")
    indexes: IndexesView | None = Field(None, description="Where a delta join's tables were registered")


class PipelineListItem(PipelineView):
    state: State
    owner: str | None = Field(None, description="Id of the control service that runs the job")


class PipelineList(BaseModel):
    pipelines: list[PipelineListItem]
    next_page_token: str | None = Field(None, exclude_if=lambda v: v is None,
                                        description="Pass as `page_token` for the next page; "
                                                    "absent on the last page")


class LagEntry(BaseModel):
    topic: str
    partition: int
    lag: int


class PipelineStatus(BaseModel):
    name: str
    desired: Literal["running", "stopped"]
    state: State
    error: str | None = Field(None, description="Why the job failed (its last error lines)")
    owner: str | None = Field(None, description="Id of the control service that runs the job")
    restarts: int = 0
    pid: int | None = None
    last_batch_id: int | None = None
    last_batch_time: float | None = Field(None, description="Unix seconds")
    rows_in: int = 0
    rows_out: int = 0
    lag: list[LagEntry] = Field(default_factory=list)
    dlq: int = 0
    conflicts: int = Field(0, description="Rows dropped by ON CONFLICT DO NOTHING")
    retractions_without_state: int = 0
    state_size_bytes: int | None = None
    metrics: dict[str, int] = Field(default_factory=dict,
                                    description="Stage counters summed over batches, e.g. delta_join.left.cache_hits")


class ErrorBody(BaseModel):
    detail: str
    kind: str | None = Field(None, description="Planner error class for 422 plan errors")
    errors: list[dict[str, Any]] | None = Field(None, description="Field errors of a malformed request")


class Health(BaseModel):
    status: str
    reason: str | None = None
    service_id: str | None = None
    version: str | None = None
