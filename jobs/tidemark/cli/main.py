"""Entry point of the ``tidemark`` console script: one typer app, one module per command."""

from __future__ import annotations

from typing import Annotated

import typer

from tidemark.version import tidemark_version

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Changelog-correct streaming pipelines on Spark and Kafka.")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"tidemark {tidemark_version()}")
        raise typer.Exit()


@app.callback()
def _root(
    _version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, metavar="",
                     help="Print the installed version and exit."),
    ] = False,
) -> None:
    """Tidemark: plan, replay and run changelog pipelines."""


from tidemark.cli.replay import replay as _replay  # noqa: E402

app.command("replay")(_replay)

from tidemark.cli.explain import explain as _explain  # noqa: E402

app.command("explain")(_explain)

from tidemark.control.cli import control as _control  # noqa: E402

app.command("control")(_control)

from tidemark.cli.run import run as _run  # noqa: E402

app.command("run")(_run)

from tidemark.index.cli import index as _index  # noqa: E402

app.command("index")(_index)

from tidemark.cli.dlq import dlq as _dlq  # noqa: E402

app.command("dlq")(_dlq)
