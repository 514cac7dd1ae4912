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

Nothing here touches Kafka; ``registry_kafka`` feeds records in.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

LEASE_PREFIX = "lease/"


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
        d = json.loads(value)
        return PipelineRecord(
            name=str(d["name"]),
            sql=str(d["sql"]),
            options=dict(d.get("options") or {}),
            desired=str(d.get("desired", "stopped")),
            version=int(d["version"]),
            uid=str(d["uid"]),
            request_id=str(d.get("request_id", "")),
            created_at=float(d.get("created_at", 0.0)),
            updated_at=float(d.get("updated_at", 0.0)),
            ever_started=bool(d.get("ever_started", False)),
        )


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
        d = json.loads(value)
        return LeaseRecord(
            owner=str(d["owner"]), op=str(d["op"]), ts=float(d["ts"]), ttl=float(d["ttl"]),
            status=dict(d.get("status") or {}), request_id=str(d.get("request_id", "")),
        )


@dataclass(frozen=True)
class Lease:
    owner: str
    expires_at: float
    released: bool
    status: dict[str, Any]
    request_id: str

    def held_by(self, owner: str, now: float) -> bool:
        return not self.released and self.owner == owner and now < self.expires_at


@dataclass
class RegistryState:
    """What every service agrees on after applying the same records in the same order.

    ``accepted`` remembers, per request id, whether that write won -- that is how a
    writer learns the outcome of its own record when it reads it back.
    """

    grace_s: float = 2.0
    pipelines: dict[str, PipelineRecord] = field(default_factory=dict)
    leases: dict[str, Lease] = field(default_factory=dict)
    accepted: dict[str, bool] = field(default_factory=dict)
    max_outcomes: int = 10_000
    skipped: int = 0  # records that could not be decoded (logged by the caller)

    def apply(self, key: str, value: bytes | None) -> None:
        """Apply one record. Undecodable records are counted and skipped, never fatal: one
        bad record must not stop a service from loading the rest of the registry."""
        try:
            if key.startswith(LEASE_PREFIX):
                self._apply_lease(key[len(LEASE_PREFIX):], value)
            else:
                self._apply_pipeline(key, value)
        except (ValueError, KeyError, TypeError):
            self.skipped += 1

    def _apply_pipeline(self, name: str, value: bytes | None) -> None:
        if value is None:
            self.pipelines.pop(name, None)
            return
        rec = PipelineRecord.from_value(value)
        if rec.name != name:
            raise ValueError(f"record for '{rec.name}' under key '{name}'")
        cur = self.pipelines.get(name)
        ok = cur is None or rec.version == cur.version + 1
        if ok:
            self.pipelines[name] = rec
        if rec.request_id:
            # a repeated record of the current state (a repair write) is not a new outcome
            if rec.request_id not in self.accepted:
                self._remember(rec.request_id, ok)

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
