"""Makes this service's jobs match the registry: a reconcile loop over the shared state.

The HTTP layer only writes desired state into the registry topic; this loop (every
``reconcile_interval_s``) looks at what the registry says and at the jobs this service
runs, and closes the gap:

* desired ``running`` and nobody holds the lease -> claim it; if the claim won, start the job;
* lease held by this service -> keep the job running, renew the lease every ttl/3
  (the renewal carries the job's status for the other services);
* desired ``stopped``, pipeline deleted, or lease lost to someone else -> stop the job and
  release the lease (self-fencing: a job whose lease this service can no longer confirm
  is stopped before the lease can expire for the others).

A job that finishes on its own with status 0 (``until_idle``) sets desired ``stopped``, so
a restarted service does not run it again.
"""

from __future__ import annotations

import fcntl
import logging
import shutil
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidemark.control import planning, topic_rules, upgrade
from tidemark.control.indexes import IndexBinding, IndexRegistrar
from tidemark.control.registry_kafka import KafkaRegistry, RegistryUnavailable
from tidemark.control.registry_log import LEASE_PREFIX, Lease, LeaseRecord, PipelineRecord, RegistryState
from tidemark.control.registry_signing import signing_key
from tidemark.control.registry_snapshot import RegistrySnapshot, orphaned_checkpoints
from tidemark.control.settings import ControlSettings
from tidemark.control.status_channel import JobProgress
from tidemark.control.supervisor import JobSpec, JobSupervisor

if TYPE_CHECKING:
    from collections.abc import Callable

    from tidemark.engine.pipeline import Pipeline

log = logging.getLogger("tidemark.control.controller")


class NotFound(Exception):
    pass


class Conflict(Exception):
    pass


class LimitExceeded(Exception):
    """A registration would pass one of the service's limits; the message names it."""


class StateDirInUse(Exception):
    pass


class UnsafePath(Exception):
    """A path built from a registry record would leave the state dir (never created or deleted)."""


def job_argv(base: list[str], sql_file: Path, bootstrap_servers: str, checkpoint: str,
             master: str | None, until_idle: bool, max_records_per_trigger: int | None = None,
             kafka_config: str | None = None) -> list[str]:
    """The job's command line as a list: user text (the SQL) only ever travels in a file."""
    argv = [*base, str(sql_file), "--bootstrap-servers", bootstrap_servers, "--checkpoint", checkpoint]
    if kafka_config:
        argv += ["--kafka-config", kafka_config]
    if master:
        argv += ["--master", master]
    if until_idle:
        argv.append("--until-idle")
    if max_records_per_trigger:
        argv += ["--max-records-per-trigger", str(int(max_records_per_trigger))]
    return argv


class Controller:
    def __init__(self, settings: ControlSettings):
        self.settings = settings
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(settings.state_dir / ".lock", "w")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise StateDirInUse(f"state dir {settings.state_dir} is used by another control service; "
                                "give each service its own --state-dir") from exc
        self.service_id = settings.service_id or self._persistent_service_id()
        key = signing_key(settings.registry_key, settings.api_token)
        if key.insecure:
            log.warning("registry records are signed with %s: anyone who can write the registry topic can "
                        "forge them; set TIDEMARK_API_TOKEN or TIDEMARK_REGISTRY_KEY beyond local development",
                        key.source)
        self.registry = KafkaRegistry(settings.bootstrap_servers, settings.registry_topic, key,
                                      lease_grace_s=settings.lease_grace_s, sql_check=planning.compile_pipeline)
        self.indexes = IndexRegistrar(settings.bootstrap_servers, settings.index_url, settings.index_token,
                                      settings.state_dir / "index")
        self.supervisors: dict[str, JobSupervisor] = {}
        self._progress: dict[str, JobProgress] = {}
        self._renewed_at: dict[str, float] = {}
        self._confirmed_until: dict[str, float] = {}
        self._started_version: dict[str, int] = {}
        self._started_config: dict[str, tuple[str, dict[str, Any]]] = {}  # the SQL and options a job runs
        self._copy = RegistrySnapshot(settings.registry_copy) if settings.registry_copy else None
        self._copy_lock = threading.Lock()  # API handlers and the supervisors' callbacks persist
        self._orphans_reported = False
        self._mutex = threading.RLock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="reconcile", daemon=True)

    def _persistent_service_id(self) -> str:
        path = self.settings.state_dir / "service-id"
        if not path.exists():
            path.write_text(f"control-{uuid.uuid4().hex[:12]}\n")
        return path.read_text().strip()

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        self.registry.start()
        if self._copy is not None:
            self._restore()
        self._thread.start()

    def _restore(self, timeout_s: float = 60.0) -> None:
        """Write the kept copy's pipelines into a registry that lacks them (a fresh embedded
        broker), before the API answers, so a restart lists what it listed before."""
        assert self._copy is not None
        deadline = time.monotonic() + timeout_s
        while not self.registry.loaded and time.monotonic() < deadline:
            time.sleep(0.05)
        if not self.registry.loaded:
            log.warning("registry not loaded within %.0f s: pipelines of %s not restored", timeout_s, self._copy.path)
            return
        known = self.registry.read(lambda s: set(s.pipelines))
        missing = [rec for rec in self._copy.load() if rec.name not in known]
        for rec in missing:
            self.registry.write(rec.name, rec.to_value())
        log.info("restored %d pipeline(s) from %s", len(missing), self._copy.path)
        self._persist()

    def _persist(self) -> None:
        """After every accepted change: the registry's pipelines into the kept copy."""
        if self._copy is not None:
            with self._copy_lock:
                self._copy.save(self._records())

    def _records(self) -> list[PipelineRecord]:
        return self.registry.read(lambda s: list(s.pipelines.values()))

    def _report_orphans(self) -> None:
        """Once, with the registry loaded: checkpoints of no registered pipeline, in one line.
        They are never deleted here: they may be the only copy of someone's state."""
        self._orphans_reported = True
        if "://" in self._checkpoint_root():
            return
        expected = {Path(self._checkpoint(rec)).name for rec in self._records()}
        orphans = orphaned_checkpoints(Path(self._checkpoint_root()), expected)
        if orphans:
            log.warning("%d checkpoint(s) belong to no registered pipeline (kept; delete them if unneeded): %s",
                        len(orphans), ", ".join(f"{p.name} ({p})" for p in orphans))

    def close(self) -> None:
        """Stop every local job and hand their leases back, so another service (or this one,
        restarted) takes over at once instead of after the lease expires."""
        self._stop.set()
        self._thread.join(30)
        with self._mutex:
            sups = dict(self.supervisors)
            for sup in sups.values():
                sup.stop(wait=False)  # all jobs stop in parallel
            for name, sup in sups.items():
                sup.stop(wait=True)
                self._release_if_held(name)
        self.indexes.close()  # after the jobs: they look rows up until they stop
        self.registry.close()
        self._lock_file.close()

    @property
    def ready_reason(self) -> str | None:
        """None when ready; otherwise why not (for /readyz)."""
        if not self.registry.loaded:
            return self.registry.load_error or "registry not loaded yet"
        return self.registry.reachable()

    # -- the reconcile loop ---------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.wait(self.settings.reconcile_interval_s):
            if not self.registry.loaded:
                continue
            try:
                if not self._orphans_reported:
                    self._report_orphans()
                self.reconcile_once()
            except RegistryUnavailable as exc:
                log.warning("reconcile: %s", exc)
            except Exception:
                log.exception("reconcile failed")

    def reconcile_once(self) -> None:
        with self._mutex:
            self._reconcile()

    def _reconcile(self) -> None:
        """One pass. It never waits for a job to stop (that can take the job's whole stop
        timeout, longer than a lease renewal period): it asks, and looks again next pass."""
        now = time.time()
        pipelines, holders = self.registry.read(
            lambda s: (dict(s.pipelines), {n: s.lease_holder(n, now) for n in s.pipelines}))
        for name, sup in list(self.supervisors.items()):
            rec = pipelines.get(name)
            if rec is None or rec.uid != self._uid_of(name):  # deleted (or deleted and re-created)
                sup.stop(wait=False)
                if sup.alive:
                    self._renew_if_due(name, holders.get(name), now)
                else:
                    self._forget(name)
        for name, rec in pipelines.items():
            if name in self.supervisors and self._uid_of(name) != rec.uid:
                continue  # the previous incarnation's job is still stopping
            holder = holders.get(name)
            sup = self.supervisors.get(name)
            if sup is not None and sup.alive and not sup.stopping and self._started_config.get(name) != (
                    rec.sql, rec.options or {}):
                log.info("pipeline %s: changed (version %d); restarting its job with the new version",
                         name, rec.version)
                sup.stop(wait=False)  # started again below once it is gone (its version is newer)
            if sup is not None and sup.alive and (sup.stopping or rec.desired != "running"):
                # keep the lease until the job is really gone, so nobody else starts it meanwhile
                sup.stop(wait=False)
                self._renew_if_due(name, holder, now)
                continue
            if rec.desired != "running":
                if holder == self.service_id:
                    self._lease_write(name, "release")
                continue
            # a job that died (failed or finished) stays down until the next start request;
            # one stopped by fencing comes back when the lease does
            wants_job = sup is None or (not sup.alive and (sup.fenced or rec.version > self._started_version[name]))
            if holder is None:
                if wants_job and self._lease_write(name, "claim"):
                    self._start_local(rec)
            elif holder == self.service_id:
                # renew before (re)starting: a job only ever runs under a confirmed lease
                if wants_job or now - self._renewed_at.get(name, 0.0) >= self.settings.lease_ttl_s / 3:
                    if not self._lease_write(name, "renew"):
                        self._fence(name, "lease renewal lost")
                        continue
                if wants_job:
                    self._start_local(rec)
            elif sup is not None and sup.alive:
                self._fence(name, f"lease now held by {holder}")
        # self-fencing (the supervisor enforces it too): never run past the confirmed expiry
        for name, sup in list(self.supervisors.items()):
            if sup.alive and not sup.stopping and time.time() >= self._confirmed_until.get(name, 0.0):
                self._fence(name, "lease not confirmed in time")

    def _renew_if_due(self, name: str, holder: str | None, now: float) -> None:
        if holder == self.service_id and now - self._renewed_at.get(name, 0.0) >= self.settings.lease_ttl_s / 3:
            self._lease_write(name, "renew")

    def _fence(self, name: str, why: str) -> None:
        """Stop the local job without releasing: the lease is not ours any more (or soon
        will not be). ``fenced`` lets the job start again if the lease comes back here."""
        log.warning("pipeline %s: %s; stopping the local job", name, why)
        sup = self.supervisors[name]
        sup.fenced = True
        sup.stop(wait=False)

    def _uid_of(self, name: str) -> str:
        return self.supervisors[name].spec.env.get("TIDEMARK_PIPELINE_UID", "")

    def _lease_write(self, name: str, op: str) -> bool:
        sup = self.supervisors.get(name)
        status = sup.snapshot() if sup else {}
        now = time.time()
        rec = LeaseRecord(owner=self.service_id, op=op, ts=now, ttl=self.settings.lease_ttl_s,
                          status=status, request_id=self.registry.new_request_id())
        self.registry.write(LEASE_PREFIX + name, rec.to_value())
        won = self.registry.outcome(rec.request_id)
        if won and op != "release":
            self._renewed_at[name] = now
            self._confirmed_until[name] = now + self.settings.lease_ttl_s
        if not won and op == "claim":
            log.info("pipeline %s: another service claimed it first", name)
        return won

    def pipeline_dir(self, rec: PipelineRecord) -> Path:
        """The job's work dir, from the record's validated name and uid, and checked to be
        inside the state dir all the same (``UnsafePath`` otherwise)."""
        return self._inside_state_dir(self.settings.state_dir / "pipelines" / f"{rec.name}-{rec.uid[:12]}")

    def _inside_state_dir(self, path: Path) -> Path:
        root = self.settings.state_dir.resolve()
        resolved = path.resolve()
        if resolved == root or not resolved.is_relative_to(root):
            raise UnsafePath(f"{path} is not inside the state dir {root}")
        return path

    def _checkpoint(self, rec: PipelineRecord) -> str:
        leaf = f"{rec.name}-{rec.uid[:12]}"
        if self.settings.checkpoint_root:  # the operator's (maybe remote) storage
            return f"{self.settings.checkpoint_root.rstrip('/')}/{leaf}"
        return str(self._inside_state_dir(self.settings.state_dir / "checkpoints" / leaf))

    def _checkpoint_root(self) -> str:
        return (self.settings.checkpoint_root or str(self.settings.state_dir / "checkpoints")).rstrip("/")

    def _start_local(self, rec: PipelineRecord) -> None:
        with self._mutex:
            try:
                workdir, checkpoint = self.pipeline_dir(rec), self._checkpoint(rec)
            except UnsafePath as exc:  # records are validated on load; this is the backstop
                log.error("pipeline %s: not started: %s", rec.name, exc)
                return
            workdir.mkdir(parents=True, exist_ok=True)
            sql_file = workdir / f"{rec.name}.sql"  # the stem names the pipeline (its DLQ topic)
            sql_file.write_text(rec.sql)
            options = rec.options or {}
            argv = job_argv(self.settings.job_command, sql_file, self.settings.bootstrap_servers, checkpoint,
                            self.settings.spark_master, bool(options.get("until_idle")),
                            options.get("max_records_per_trigger"), self.settings.kafka_config)
            spec = JobSpec(name=rec.name, argv=argv, workdir=workdir,
                           env={"TIDEMARK_PIPELINE_UID": rec.uid},
                           restart=bool(options.get("restart")),
                           backoff_base_s=self.settings.restart_backoff_base_s,
                           backoff_max_s=float(options.get("restart_max_backoff_s") or 60.0),
                           stop_timeout_s=self.settings.job_stop_timeout_s,
                           prepare=lambda: self._prepare_job(rec))
            progress = self._progress.setdefault(rec.name, JobProgress())
            sup = JobSupervisor(spec, progress, on_finished=self._on_finished,
                                lease_deadline=lambda: self._confirmed_until.get(rec.name, 0.0))
            self.supervisors[rec.name] = sup
            self._started_version[rec.name] = rec.version
            self._started_config[rec.name] = (rec.sql, options)
            sup.start()
            log.info("pipeline %s: started locally (owner %s)", rec.name, self.service_id)

    def _prepare_job(self, rec: PipelineRecord) -> tuple[list[str], dict[str, str]]:
        """Before each launch: (re-)register a delta join's tables with the index service
        (it may have restarted and forgotten them) and tell the job where it is."""
        binding = self.indexes.ensure(rec.name, planning.compile_pipeline(rec.sql))
        return (binding.job_args(), binding.job_env()) if binding is not None else ([], {})

    def _release_if_held(self, name: str) -> None:
        try:
            if self.registry.read(lambda s: s.lease_holder(name, time.time())) == self.service_id:
                self._lease_write(name, "release")
        except RegistryUnavailable as exc:
            log.warning("pipeline %s: could not release its lease: %s", name, exc)

    def _forget(self, name: str) -> None:
        """A deleted pipeline whose job has exited: drop its lease record and its files."""
        sup = self.supervisors.pop(name)
        self._progress.pop(name, None)
        self._started_version.pop(name, None)
        self._started_config.pop(name, None)
        self._confirmed_until.pop(name, None)
        self._renewed_at.pop(name, None)
        try:
            shutil.rmtree(self._inside_state_dir(sup.spec.workdir), ignore_errors=True)
        except UnsafePath as exc:
            log.error("pipeline %s: not deleting its files: %s", name, exc)
        if self.registry.read(lambda s: name not in s.pipelines):
            self.registry.write(LEASE_PREFIX + name, None)

    def _on_finished(self, name: str) -> None:
        """The job ended by itself with status 0: record desired ``stopped`` in the registry."""
        try:
            self.set_desired(name, "stopped")
        except (NotFound, Conflict, RegistryUnavailable) as exc:
            log.warning("pipeline %s finished; could not record it as stopped: %s", name, exc)

    # -- operations behind the API ----------------------------------------------------------

    def create(self, name: str, sql: str, options: dict[str, Any]) -> tuple[PipelineRecord, IndexBinding | None]:
        """Register a pipeline. A delta join's tables are registered with the index service
        first: a pipeline whose indexes cannot be set up is not registered at all."""
        others, sql_bytes = self.registry.read(lambda s: (dict(s.pipelines), s.sql_bytes))
        if name in others:
            raise Conflict(f"pipeline '{name}' already exists")
        pipeline = planning.compile_pipeline(sql)
        self._check_topics(name, pipeline, others)
        self._check_limits(len(others) + 1, sql_bytes + len(sql.encode()))
        binding = self.indexes.ensure(name, pipeline)
        now = time.time()
        rec = PipelineRecord(name=name, sql=sql, options=options, desired="stopped", version=1,
                             uid=uuid.uuid4().hex, request_id=self.registry.new_request_id(),
                             created_at=now, updated_at=now)
        offset = self.registry.write(name, rec.to_value())
        if not self.registry.outcome(rec.request_id):
            self._repair(name, offset)
            raise Conflict(f"pipeline '{name}' already exists")
        self._persist()
        return rec, binding

    def _check_topics(self, name: str, pipeline: Pipeline, others: dict[str, PipelineRecord]) -> None:
        """The topic rules (``topic_rules``): the pipeline's own, then against ``others``
        (every other registered pipeline; their plans come from the planning cache)."""
        topic_rules.check_pipeline(pipeline, self.settings.registry_topic)
        topic_rules.check_against_others(name, pipeline, {
            other: planning.compile_pipeline(rec.sql) for other, rec in others.items()})

    def _check_limits(self, pipelines: int, sql_bytes: int) -> None:
        limits = self.settings
        if pipelines > limits.max_pipelines:
            raise LimitExceeded(f"this service holds at most {limits.max_pipelines} pipelines "
                                "(--max-pipelines); delete one first")
        if sql_bytes > limits.max_registry_sql_bytes:
            raise LimitExceeded(f"the registered pipelines' SQL would exceed {limits.max_registry_sql_bytes} bytes "
                                "(--max-registry-sql-bytes); delete one first")

    def set_desired(self, name: str, desired: str) -> PipelineRecord:
        """A start always writes a new version, even when already desired running: that is
        how the owner learns to start again a job that failed or finished."""

        def change(cur: PipelineRecord) -> PipelineRecord | None:
            if cur.desired == desired == "stopped":
                return None
            return replace(cur, desired=desired, ever_started=cur.ever_started or desired == "running")

        return self._rewrite(name, change)

    def update(self, name: str, sql: str, options: dict[str, Any], fresh_start: bool) -> PipelineRecord:
        """Change a pipeline's SQL and options (``upgrade``). A change its state cannot serve is
        a Conflict unless ``fresh_start``, which gives it a new uid: a new checkpoint, read
        from the sources' start position. A running job restarts with the new version."""
        others, sql_bytes = self.registry.read(lambda s: (dict(s.pipelines), s.sql_bytes))
        cur = others.pop(name, None)
        if cur is None:
            raise NotFound(f"no pipeline named '{name}'")
        pipeline = planning.compile_pipeline(sql)
        self._check_topics(name, pipeline, others)
        self._check_limits(len(others) + 1, sql_bytes - len(cur.sql.encode()) + len(sql.encode()))
        self._check_upgrade(cur, pipeline, fresh_start)  # refused: nothing registered anywhere
        self.indexes.ensure(name, pipeline)

        def change(cur: PipelineRecord) -> PipelineRecord:
            self._check_upgrade(cur, pipeline, fresh_start)
            return replace(cur, sql=sql, options=options, uid=uuid.uuid4().hex if fresh_start else cur.uid)

        return self._rewrite(name, change)

    def _rewrite(self, name: str, change: Callable[[PipelineRecord], PipelineRecord | None]) -> PipelineRecord:
        """Write ``change(current record)`` as the next version (``None``: nothing to write).
        Writes race through the registry topic; the loser repairs and retries on the winner's
        record, so a change is never applied on top of a version it did not see."""
        for _ in range(5):
            cur = self.get(name)
            changed = change(cur)
            if changed is None:
                return cur
            rec = replace(changed, version=cur.version + 1, request_id=self.registry.new_request_id(),
                          updated_at=time.time())
            offset = self.registry.write(name, rec.to_value())
            if self.registry.outcome(rec.request_id):
                self._persist()
                return rec
            self._repair(name, offset)
        raise Conflict(f"pipeline '{name}' is being changed by another request; try again")

    def _check_upgrade(self, cur: PipelineRecord, pipeline: Pipeline, fresh_start: bool) -> None:
        reason = None if fresh_start else upgrade.incompatibility(cur, self._checkpoint(cur), pipeline)
        if reason is not None:
            raise Conflict(reason)

    def _repair(self, name: str, lost_offset: int) -> None:
        """A rejected write must not be the last record under its key: compaction would keep
        it and a service replaying the compacted topic would see the loser. Re-publish the
        accepted state if nothing newer has landed since."""
        if not self.registry.is_latest(name, lost_offset):
            return
        cur = self.registry.read(lambda s: s.pipelines.get(name))
        self.registry.write(name, cur.to_value() if cur else None)

    def delete(self, name: str) -> None:
        """Tombstone the pipeline, then reconcile until a local job has stopped (and its lease
        and files are gone) before answering; a job on another service stops when that
        service reads the tombstone."""
        self.get(name)
        self.registry.write(name, None)
        self._persist()
        deadline = time.monotonic() + self.settings.job_stop_timeout_s + 10
        while True:
            self.reconcile_once()
            if name not in self.supervisors or time.monotonic() >= deadline:
                return
            time.sleep(0.1)

    def get(self, name: str) -> PipelineRecord:
        rec = self.registry.read(lambda s: s.pipelines.get(name))
        if rec is None:
            raise NotFound(f"no pipeline named '{name}'")
        return rec

    def page(self, after: str | None, limit: int) -> tuple[list[tuple[PipelineRecord, dict[str, Any]]], str | None]:
        """Up to ``limit`` pipelines named after ``after``, in name order, each with its
        status; and the name to continue after (None on the last page)."""
        now = time.time()

        def view(s: RegistryState) -> tuple[list, bool]:
            names = sorted(n for n in s.pipelines if after is None or n > after)
            return ([(s.pipelines[n], s.lease_holder(n, now), s.leases.get(n)) for n in names[:limit]],
                    len(names) > limit)

        rows, more = self.registry.read(view)
        page = [(rec, self._status(rec, holder, lease)) for rec, holder, lease in rows]
        return page, (page[-1][0].name if more else None)

    def status(self, name: str) -> dict[str, Any]:
        rec = self.get(name)
        now = time.time()
        holder, lease = self.registry.read(lambda s: (s.lease_holder(name, now), s.leases.get(name)))
        return self._status(rec, holder, lease)

    def _status(self, rec: PipelineRecord, holder: str | None, lease: Lease | None) -> dict[str, Any]:
        name = rec.name
        sup = self.supervisors.get(name)
        base = {"state": None, "error": None, "restarts": 0, "pid": None, **JobProgress().snapshot()}
        if sup is not None and (holder in (None, self.service_id) or not sup.alive):
            view, owner = sup.snapshot(), self.service_id if sup.alive else holder
        elif holder is not None and lease is not None and holder != self.service_id:
            view, owner = {**base, **lease.status}, holder
            view["pid"] = None  # a pid on another host means nothing here
        else:
            view, owner = dict(base), holder
        if view.get("state") is None:
            if rec.desired == "running":
                view["state"] = "starting"
            else:
                view["state"] = "stopped" if rec.ever_started else "registered"
        if view["state"] != "failed":
            view["error"] = None
        return {"name": name, "desired": rec.desired, "owner": owner, **view}

