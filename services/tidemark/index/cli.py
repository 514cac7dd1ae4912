"""``tidemark index``: the delta-join index service under uvicorn.

Exit status 2 for a bad command line (no ``TIDEMARK_INDEX_TOKEN`` without
``--insecure-dev``, ``--insecure-dev`` on a non-loopback host). Tables are registered over
the API (``POST /v1/tables``) or with ``--table FILE.sql`` at start; a restarted service
rebuilds every table from its topic.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
import uvicorn

from tidemark.index_client import INDEX_TOKEN_ENV

log = logging.getLogger("tidemark.index")


def index(
    host: Annotated[str, typer.Option(help="Listen address (loopback by default; expose on purpose)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Listen port")] = 8090,
    bootstrap_servers: Annotated[str | None, typer.Option(help="Kafka brokers (default: $KAFKA_BOOTSTRAP_SERVERS)")] = None,
    table: Annotated[list[Path] | None, typer.Option(help="CREATE TABLE file to index at start (repeatable)")] = None,
    max_wait_ms: Annotated[int, typer.Option(min=0, help="Longest a lookup waits for its offsets before 503")] = 30_000,
    max_waiters: Annotated[int, typer.Option(
        min=1, help="Lookups that may wait for offsets at once; one more is answered 429 at once")] = 8,
    no_history: Annotated[bool, typer.Option(
        "--no-history", metavar="", help="Keep only current rows (no as-of lookups)")] = False,
    insecure_dev: Annotated[bool, typer.Option(
        "--insecure-dev", metavar="",
        help="Run without a bearer token (dev only; loopback --host only): TIDEMARK_INDEX_TOKEN is then not needed")] = False,
    kafka_config: Annotated[Path | None, typer.Option(help="librdkafka settings (key=value lines, e.g. security.protocol=SASL_SSL) for every Kafka client")] = None,
) -> None:
    """Start the index service: follows source topics, answers batched lookups.

    Clients authenticate with a bearer token: export TIDEMARK_INDEX_TOKEN=... before starting
    (required unless --insecure-dev) and send "Authorization: Bearer $TIDEMARK_INDEX_TOKEN"
    with every /v1 request, lookups included. /healthz, /readyz, /metrics, /docs and
    /openapi.json need no token.
    """
    from tidemark.index.app import IndexService, TableRegistration, create_app
    from tidemark.service_cli import bearer_token, use_kafka_config

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    token = bearer_token(INDEX_TOKEN_ENV, insecure_dev=insecure_dev, host=host)
    servers = bootstrap_servers or os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not servers:
        typer.echo("error: give --bootstrap-servers (or set KAFKA_BOOTSTRAP_SERVERS)", err=True)
        raise typer.Exit(2)
    use_kafka_config(kafka_config)
    service = IndexService(servers, max_wait_ms=max_wait_ms, max_waiters=max_waiters)
    for path in table or []:
        try:
            service.register(TableRegistration(ddl=path.read_text(encoding="utf-8"), history=not no_history))
        except Exception as exc:  # a bad file is a bad command line
            typer.echo(f"error: --table {path}: {getattr(exc, 'detail', exc)}", err=True)
            raise typer.Exit(2) from None
    app = create_app(service, token)
    log.info("index service on http://%s:%d (brokers %s)", host, port, servers)
    uvicorn.run(app, host=host, port=port, access_log=False, log_config=None, timeout_graceful_shutdown=10)
