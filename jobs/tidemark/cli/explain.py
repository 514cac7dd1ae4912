"""``tidemark explain [--init FILE]... FILE.sql [--json]``: show the stage graph a pipeline compiles to.

Each stage is shown with its upsert key and changelog mode, so a user can see why the
sink needs (or does not need) a materializer before registering the pipeline. Bad SQL or
an unplannable query prints one message on stderr and exits with status 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from tidemark.cli.script import InitOption, compile_script, read_init
from tidemark.engine.errors import TidemarkError


def explain(
    file: Annotated[Path, typer.Argument(help="Pipeline SQL file (CREATE TABLE ...; INSERT INTO ... SELECT ...).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON instead of text.")] = False,
    init: InitOption = [],  # noqa: B006 - typer reads the default, never mutates it
) -> None:
    """Compile a pipeline and print its stages with upsert keys and changelog modes.

    --init files run first: tidemark explain --init tests/nexmark/queries/sources.sql tests/nexmark/queries/q0.sql
    """
    try:
        sql = file.read_text(encoding="utf-8")
    except OSError as e:
        typer.echo(f"{file}: cannot read: {e.strerror or e}", err=True)
        raise typer.Exit(2) from None
    except UnicodeDecodeError as e:
        typer.echo(f"{file}: not UTF-8 text ({e.reason})", err=True)
        raise typer.Exit(2) from None
    try:
        pipeline = compile_script(sql, read_init(init))
    except TidemarkError as e:
        typer.echo(f"{file}: {e}", err=True)
        raise typer.Exit(e.exit_status) from None
    if as_json:
        json.dump(pipeline.explain(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        typer.echo(pipeline.explain_text())
