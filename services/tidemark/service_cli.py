"""What the command lines of both services (``tidemark control``, ``tidemark index``) share:
where the bearer token comes from, ``--insecure-dev`` only on a loopback address, and
``--kafka-config``.

Without a token a service answers anyone who can reach its port, so ``--insecure-dev`` is
refused on any listen address that is not loopback: ``0.0.0.0`` and ``::`` listen on every
interface, and a host name may resolve to anything. ``localhost`` counts as loopback.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import typer

INSECURE_DEV_WARNING = ("WARNING: --insecure-dev: the API accepts every request without a token; "
                        "never expose this service beyond your machine")


def is_loopback(host: str) -> bool:
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name other than localhost
        return False


def bearer_token(env_var: str, *, insecure_dev: bool, host: str) -> str | None:
    """The token clients must send (from ``env_var``), or None under ``--insecure-dev``.
    A bad combination exits with status 2 and one line on stderr saying what to change."""
    if insecure_dev and not is_loopback(host):
        typer.echo(f"error: --insecure-dev needs a loopback --host (127.0.0.1, ::1 or localhost), got {host!r}: "
                   f"an unauthenticated service must not listen beyond this machine; set {env_var} instead", err=True)
        raise typer.Exit(2)
    token = os.environ.get(env_var) or None
    if token is None and not insecure_dev:
        typer.echo(f"error: set {env_var} (the bearer token clients must send), "
                   "or pass --insecure-dev for a local, unauthenticated service", err=True)
        raise typer.Exit(2)
    if token is None:
        typer.echo(INSECURE_DEV_WARNING, err=True)
    return token


def use_kafka_config(path: Path | None) -> None:
    """Load ``--kafka-config`` for every Kafka client of the process (and the jobs it starts);
    a bad file exits with status 2 and one line on stderr naming what is wrong in it."""
    from tidemark.kafka.config import KafkaConfigError, use_config_file

    try:
        use_config_file(str(path) if path else None)
    except KafkaConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
