"""Everything an operator configures about a control service, in one place."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path


def default_job_command() -> list[str]:
    """``tidemark run`` from the same installation as this service."""
    script = Path(sys.executable).parent / "tidemark"
    if script.exists():
        return [str(script), "run"]
    found = shutil.which("tidemark")
    if found:
        return [found, "run"]
    return [sys.executable, "-c", "from tidemark.cli.main import app; app()", "run"]


def job_command_from_env() -> list[str]:
    """``TIDEMARK_JOB_COMMAND`` (operator configuration, split like a shell would, never
    combined with user text) replaces ``tidemark run``; tests point it at a stand-in."""
    raw = os.environ.get("TIDEMARK_JOB_COMMAND", "").strip()
    return shlex.split(raw) if raw else default_job_command()


@dataclass
class ControlSettings:
    bootstrap_servers: str
    state_dir: Path
    api_token: str | None
    registry_topic: str = "tidemark.registry"
    service_id: str | None = None  # default: persisted in state_dir, so a restart is the same owner
    spark_master: str | None = None
    checkpoint_root: str | None = None  # default state_dir/checkpoints; shared storage for fail-over
    job_command: list[str] = field(default_factory=job_command_from_env)
    # the index service of delta-join pipelines; None: an embedded one, started on demand
    index_url: str | None = None
    index_token: str | None = field(default_factory=lambda: os.environ.get("TIDEMARK_INDEX_TOKEN") or None)
    lease_ttl_s: float = 15.0
    lease_grace_s: float = 2.0
    reconcile_interval_s: float = 0.5
    # signs registry records; default: derived from api_token (see registry_signing)
    registry_key: str | None = field(default_factory=lambda: os.environ.get("TIDEMARK_REGISTRY_KEY") or None)
    max_body_bytes: int = 1024 * 1024
    max_pipelines: int = 500
    max_registry_sql_bytes: int = 64 * 1024 * 1024
    job_stop_timeout_s: float = 20.0
    restart_backoff_base_s: float = 1.0
    #: ``--kafka-config``: librdkafka settings of every client, passed on to the jobs
    kafka_config: str | None = field(default_factory=lambda: os.environ.get("TIDEMARK_KAFKA_CONFIG") or None)
    #: a copy of the registry kept in the state dir (the embedded broker forgets it); None: none
    registry_copy: Path | None = None
