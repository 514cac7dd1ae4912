"""``tidemark control``: the control service under uvicorn.

Uvicorn owns the signals: on SIGTERM/SIGINT it stops taking requests and runs the app's
lifespan shutdown, which stops the local jobs and releases their leases (so another
service, or this one restarted, takes them over at once). Exit status 2 for a bad
command line or configuration, with one line saying what is wrong.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
import uvicorn

log = logging.getLogger("tidemark.control")


@contextlib.contextmanager
def _broker(bootstrap_servers: str | None):
    """The given brokers, else KAFKA_BOOTSTRAP_SERVERS, else the project's embedded broker;
    yields (servers, whether they are the embedded broker's)."""
    servers = bootstrap_servers or os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if servers:
        yield servers, False
        return
    try:
        from tidemark.kafka.broker import embedded_broker
    except ImportError as exc:
        raise typer.BadParameter(
            "no --bootstrap-servers given and the embedded broker (tidemark.kafka.broker) is not available: "
            f"{exc}", param_hint="--bootstrap-servers") from exc
    with embedded_broker() as servers:
        log.info("embedded broker at %s (memory only: the registry survives as a copy in the state dir)", servers)
        yield servers, True


def _registry_copy(path: Path) -> Path:
    """The registry copy the embedded broker's registry is restored from; an unreadable one
    stops the service (exit 2) instead of being overwritten by an empty registry."""
    from tidemark.control.registry_snapshot import RegistrySnapshot

    try:
        RegistrySnapshot(path).load()
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    return path


def control(
    host: Annotated[str, typer.Option(help="Listen address (loopback by default; expose on purpose)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Listen port")] = 8080,
    bootstrap_servers: Annotated[str | None, typer.Option(help="Kafka brokers; default: embedded broker")] = None,
    state_dir: Annotated[Path, typer.Option(help="Job files, logs and checkpoints; one per service")] = Path(
        ".tidemark/control"),
    registry_topic: Annotated[str, typer.Option(help="Compacted topic holding the registry")] = "tidemark.registry",
    master: Annotated[str | None, typer.Option(help="Spark master URL for the jobs (default local[*])")] = None,
    checkpoint_root: Annotated[str | None, typer.Option(
        help="Where job checkpoints live; shared storage lets another service take over")] = None,
    service_id: Annotated[str | None, typer.Option(help="Lease owner id; default: persisted in the state dir")] = None,
    index_url: Annotated[str | None, typer.Option(
        help="Index service for delta-join pipelines (token: $TIDEMARK_INDEX_TOKEN); "
             "default: start one on loopback when the first delta-join pipeline arrives")] = None,
    lease_ttl: Annotated[float, typer.Option(help="Seconds a pipeline lease lasts without renewal")] = 15.0,
    max_pipelines: Annotated[int, typer.Option(min=1, help="Registrations past this many pipelines get 409")] = 500,
    max_registry_sql_bytes: Annotated[int, typer.Option(
        min=1, help="Registrations past this total of SQL bytes get 409")] = 64 * 1024 * 1024,
    insecure_dev: Annotated[bool, typer.Option(
        "--insecure-dev", metavar="",
        help="Run without a bearer token (dev only; loopback --host only): TIDEMARK_API_TOKEN is then not needed")] = False,
    kafka_config: Annotated[Path | None, typer.Option(
        help="librdkafka settings (key=value lines, e.g. security.protocol=SASL_SSL) for every Kafka client (registry, admin, index service, and the jobs it starts)")] = None,
) -> None:
    """Start the control service: REST API, pipeline registry, job supervision.

    Clients authenticate with a bearer token: export TIDEMARK_API_TOKEN=... before starting
    (required unless --insecure-dev) and send "Authorization: Bearer $TIDEMARK_API_TOKEN".
    /healthz, /readyz, /metrics, /docs and /openapi.json need no token.
    """
    from tidemark.control.app import create_app
    from tidemark.control.controller import Controller, StateDirInUse
    from tidemark.control.settings import ControlSettings
    from tidemark.service_cli import bearer_token, use_kafka_config

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    token = bearer_token("TIDEMARK_API_TOKEN", insecure_dev=insecure_dev, host=host)
    if index_url is not None and not index_url.startswith(("http://", "https://")):
        typer.echo(f"error: --index-url {index_url!r}: expected an http:// or https:// URL", err=True)
        raise typer.Exit(2)
    if index_url is None and master and not master.startswith("local"):
        log.warning("--master without --index-url: delta-join pipelines get an index service on this "
                    "machine's loopback, which executors on other machines cannot reach")
    use_kafka_config(kafka_config)
    registry_copy = _registry_copy(state_dir.resolve() / "registry.json")
    with _broker(bootstrap_servers) as (servers, embedded):
        settings = ControlSettings(bootstrap_servers=servers, state_dir=state_dir.resolve(), api_token=token,
                                   registry_topic=registry_topic, service_id=service_id, spark_master=master,
                                   checkpoint_root=checkpoint_root, lease_ttl_s=lease_ttl, index_url=index_url,
                                   max_pipelines=max_pipelines, max_registry_sql_bytes=max_registry_sql_bytes,
                                   registry_copy=registry_copy if embedded else None)
        try:
            controller = Controller(settings)
        except StateDirInUse as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        app = create_app(controller, token, max_body_bytes=settings.max_body_bytes)
        log.info("control service %s on http://%s:%d (registry %s on %s)", controller.service_id, host, port,
                 registry_topic, servers)
        uvicorn.run(app, host=host, port=port, access_log=False, log_config=None, timeout_graceful_shutdown=30)
