"""The pipeline script a command compiles: its ``--init`` files' statements, then its own.

``--init`` (Flink's SQL client has ``-i``) lets many pipelines share one file of source
DDL instead of repeating it. The files are joined into one script, so an error's line
would count from the first init file; ``compile_script`` maps it back to the file and
line the user wrote.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tidemark.engine.errors import InputError, PlanError, SqlError

if TYPE_CHECKING:
    from tidemark.engine.pipeline import Pipeline

InitOption = Annotated[
    list[Path],
    typer.Option(
        "--init", metavar="FILE",
        help="SQL run before the pipeline file's (e.g. shared CREATE TABLEs of the sources); repeatable, in order.",
    ),
]


def read_init(paths: Sequence[Path]) -> list[tuple[Path, str]]:
    """Each init file with its text; an unreadable one is an error naming it."""
    parts = []
    for path in paths:
        try:
            parts.append((path, path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise InputError(f"--init {path}", f"cannot read: {reason}") from None
    return parts


def compile_script(sql: str, init: Sequence[tuple[Path, str]] = ()) -> Pipeline:
    """Compile the init files' text followed by ``sql``. An error located in an init file
    names that file; one in ``sql`` keeps its own line numbers."""
    from tidemark.engine.pipeline import compile_sql

    if not init:
        return compile_sql(sql)
    texts = [text for _, text in init]
    try:
        return compile_sql("\n".join([*texts, sql]))
    except (SqlError, PlanError) as e:
        if e.line is None:
            raise
        first_line = 1
        for path, text in init:
            n_lines = text.count("\n") + 1
            if e.line < first_line + n_lines:
                raise _moved(e, e.line - first_line + 1, f"--init {path}: ") from None
            first_line += n_lines
        raise _moved(e, e.line - first_line + 1, "") from None


def _moved(err: SqlError | PlanError, line: int, prefix: str) -> SqlError | PlanError:
    message = str(err).removesuffix(f" (line {err.line}, column {err.col})")
    return type(err)(f"{prefix}{message}", line, err.col)
