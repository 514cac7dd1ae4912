"""The registry as a deterministic state machine over the records of one log partition.

Every control service replays the same single-partition topic in the same order, so if
each one applies records with the same pure rules below, they all agree on which
pipelines exist and who runs each one -- without a coordinator and without Kafka
transactions. The log order is the arbiter: when two services race, the record that
landed first wins and the writer of the other learns so by reading its own record back.

Two kinds of records share the topic (``key`` tells them apart; pipeline names cannot
contain ``/``):

* ``<name>`` -> pipeline record ``{"name","sql","options","desired","version","uid",...}``
  or a tombstone (``None``) when the pipeline is deleted. An update is accepted only if
  its ``version`` is the current version + 1 (optimistic concurrency); a record for an
  unknown name is accepted whatever its version, because compaction may have removed
  the records before it.
* ``lease/<name>`` -> lease record ``{"owner","op","ts","ttl"}`` (op: claim | renew |
  release), or a tombstone. A claim or renewal is accepted if the lease is free -- none,
  released, or expired *as of the record's own timestamp plus a grace* -- or already held
  by the same owner. Renewals carry the owner's latest job status so that any service can
  answer status questions for pipelines it does not run.

Every record read back is validated before it is applied: strict types, a name and uid of
the API's shapes (a uid is 32 hex digits: it becomes part of paths), a known desired state,
options the API accepts, and -- through ``sql_check`` -- SQL that plans. A record that fails
is skipped with its reason, never applied and never fatal.

Nothing here touches Kafka; ``registry_kafka`` feeds records in (after checking signatures).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tidemark.control.models import MAX_SQL_CHARS, NAME_PATTERN, PipelineOptions

LEASE_PREFIX = "lease/"
UID_PATTERN = r"^[0-9a-f]{32}$"


class _StoredPipeline(BaseModel):
    """A pipeline record as it must look to be applied (``extra`` ignored: newer fields)."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False)

    name: str = Field(pattern=NAME_PATTERN)
    sql: str = Field(min_length=1, max_length=MAX_SQL_CHARS)
    options: PipelineOptions
    desired: Literal["running", "stopped"]
    version: int = Field(ge=1)
    uid: str = Field(pattern=UID_PATTERN)
    request_id: str = Field(max_length=128)
    created_at: float
    updated_at: float
    ever_started: bool = False


class _StoredLease(BaseModel):
    model_config = ConfigDict(strict=True, allow_inf_nan=False)

    owner: str = Field(min_length=1, max_length=256)
    op: Literal["claim", "renew", "release"]
    ts: float
    ttl: float = Field(gt=0)
    status: dict[str, Any] = Field(default_factory=dict)
    request_id: str = Field("", max_length=128)


@dataclass(frozen=True)
class PipelineRecord:
    """One accepted registration: what the pipeline is and whether it should run."""

    name: str
    sql: str
    options: dict[str, Any]
    desired: str  # "running" | "stopped"
    version: int
    uid: str  # changes on every re-creation, so a recreated pipeline gets fresh checkpoints
    request_id: str
    created_at: float
    updated_at: float
    ever_started: bool = False

    def to_value(self) -> bytes:
        return json.dumps(
            {
                "kind": "pipeline",
                "name": self.name,
                "sql": self.sql,
                "options": self.options,
                "desired": self.desired,
                "version": self.version,
                "uid": self.uid,
                "request_id": self.request_id,
                "created_at": self.created_at,
                "updated_at": self.updated_at,
                "ever_started": self.ever_started,
            },
            sort_keys=True,
        ).encode()

    @staticmethod
    def from_value(value: bytes) -> "PipelineRecord":
        """Raises ``ValueError`` (pydantic's ``ValidationError``) naming what is wrong."""
        d = _StoredPipeline.model_validate_json(value)
        return PipelineRecord(name=d.name, sql=d.sql, options=d.options.model_dump(), desired=d.desired,
                              version=d.version, uid=d.uid, request_id=d.request_id, created_at=d.created_at,
                              updated_at=d.updated_at, ever_started=d.ever_started)


@dataclass(frozen=True)
class LeaseRecord:
    """A claim, renewal or release of the right to run one pipeline."""

    owner: str
    op: str  # "claim" | "renew" | "release"
    ts: float  # the writer's clock, seconds since the epoch
    ttl: float
    status: dict[str, Any] = field(default_factory=dict)
    request_id: str = ""

    def to_value(self) -> bytes:
        return json.dumps(
            {"kind": "lease", "owner": self.owner, "op": self.op, "ts": self.ts, "ttl": self.ttl,
             "status": self.status, "request_id": self.request_id},
            sort_keys=True,
        ).encode()

    @staticmethod
    def from_value(value: bytes) -> "LeaseRecord":
        d = _StoredLease.model_validate_json(value)
        return LeaseRecord(owner=d.owner, op=d.op, ts=d.ts, ttl=d.ttl, status=d.status, request_id=d.request_id)


@dataclass(frozen=True)
class Lease:
    owner: str
    expires_at: float
    released: bool
    status: dict[str, Any]
    request_id: str


@dataclass
class RegistryState:
    """What every service agrees on after applying the same records in the same order.

    ``accepted`` remembers, per request id, whether that write won -- that is how a
    writer learns the outcome of its own record when it reads it back. ``sql_check`` raises
    ``ValueError`` for SQL that does not plan (the service passes the planner, cached).
    """

    grace_s: float = 2.0
    pipelines: dict[str, PipelineRecord] = field(default_factory=dict)
    leases: dict[str, Lease] = field(default_factory=dict)
    accepted: dict[str, bool] = field(default_factory=dict)
    max_outcomes: int = 10_000
    skipped: int = 0  # records that failed validation (logged by the caller)
    sql_check: Callable[[str], object] | None = None
    sql_bytes: int = 0  # UTF-8 size of every registered pipeline's SQL

    def apply(self, key: str, value: bytes | None) -> str | None:
        """Apply one record; returns why it was skipped, or None. A bad record is counted and
        skipped, never fatal: it must not stop a service from loading the rest."""
        try:
            name = key[len(LEASE_PREFIX):] if key.startswith(LEASE_PREFIX) else key
            if not _NAME.match(name):
                raise ValueError(f"key {key[:80]!r} does not name a pipeline")
            if key.startswith(LEASE_PREFIX):
                self._apply_lease(name, value)
            else:
                self._apply_pipeline(name, value)
        except (ValueError, KeyError, TypeError) as err:
            self.skipped += 1
            return _one_line(err)
        return None

    def _apply_pipeline(self, name: str, value: bytes | None) -> None:
        if value is None:
            self._set_pipeline(name, None)
            return
        rec = PipelineRecord.from_value(value)
        if rec.name != name:
            raise ValueError(f"record for '{rec.name}' under key '{name}'")
        if self.sql_check is not None:
            try:
                self.sql_check(rec.sql)
            except ValueError as err:
                raise ValueError(f"sql does not plan: {_one_line(err)}") from err
        cur = self.pipelines.get(name)
        ok = cur is None or rec.version == cur.version + 1
        if ok:
            self._set_pipeline(name, rec)
        if rec.request_id:
            # a repeated record of the current state (a repair write) is not a new outcome
            if rec.request_id not in self.accepted:
                self._remember(rec.request_id, ok)

    def _set_pipeline(self, name: str, rec: PipelineRecord | None) -> None:
        old = self.pipelines.pop(name, None)
        if old is not None:
            self.sql_bytes -= len(old.sql.encode())
        if rec is not None:
            self.pipelines[name] = rec
            self.sql_bytes += len(rec.sql.encode())

    def _apply_lease(self, name: str, value: bytes | None) -> None:
        if value is None:
            self.leases.pop(name, None)
            return
        rec = LeaseRecord.from_value(value)
        cur = self.leases.get(name)
        free = cur is None or cur.released or rec.ts >= cur.expires_at + self.grace_s
        mine = cur is not None and not cur.released and cur.owner == rec.owner
        if rec.op == "release":
            ok = mine
            if ok:
                self.leases[name] = Lease(rec.owner, 0.0, True, rec.status, rec.request_id)
        else:
            ok = free or mine
            if ok:
                self.leases[name] = Lease(rec.owner, rec.ts + rec.ttl, False, rec.status, rec.request_id)
        if rec.request_id:
            self._remember(rec.request_id, ok)

    def _remember(self, request_id: str, ok: bool) -> None:
        # bounded: a writer reads its outcome back within seconds, renewals never stop
        self.accepted[request_id] = ok
        while len(self.accepted) > self.max_outcomes:
            self.accepted.pop(next(iter(self.accepted)))

    def lease_holder(self, name: str, now: float) -> str | None:
        lease = self.leases.get(name)
        if lease is None or lease.released or now >= lease.expires_at:
            return None
        return lease.owner


_NAME = re.compile(NAME_PATTERN)


def _one_line(err: Exception) -> str:
    """A skip reason for the log: pydantic's errors without the echoed input, one line."""
    if isinstance(err, ValidationError):
        return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}" for e in err.errors())
    return str(err).splitlines()[0][:300] if str(err) else type(err).__name__
