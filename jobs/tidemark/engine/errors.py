"""Errors a user can act on. Each names what was wrong and where; none carries a stack trace
to the terminal (the CLI prints ``str(err)`` and exits with the error's status)."""

from __future__ import annotations


#: how much of a bad value an error message quotes
QUOTE_CHARS = 80


def shorten(text: str, limit: int = QUOTE_CHARS) -> str:
    """At most ``limit`` characters of ``text``: an error quotes a bad value so that it can
    be found, never a whole 50 MB line."""
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


class TidemarkError(Exception):
    """Base class: ``exit_status`` is what the CLI exits with."""

    exit_status = 1


class _Located(TidemarkError):
    """An error in the pipeline SQL, with the line and column it concerns when known."""

    exit_status = 2

    def __init__(self, message: str, line: int | None = None, col: int | None = None):
        where = f" (line {line}, column {col})" if line is not None else ""
        super().__init__(f"{message}{where}")
        self.line, self.col = line, col


class SqlError(_Located):
    """The pipeline SQL is outside the supported subset or malformed."""


class PlanError(_Located):
    """The SQL is valid but cannot be planned (e.g. a missing ON CONFLICT clause, an
    unknown option)."""


class InputError(TidemarkError):
    """A bad input record: names the file (or topic) and line (or offset)."""

    exit_status = 2

    def __init__(self, where: str, message: str):
        super().__init__(f"{where}: {message}")
        self.where = where


class ConflictError(TidemarkError):
    """``ON CONFLICT DO ERROR`` found two active rows for one sink primary key."""

    exit_status = 3

    def __init__(self, table: str, pk: dict, message: str = ""):
        pk_text = ", ".join(f"{k}={v!r}" for k, v in pk.items())
        super().__init__(
            f"ON CONFLICT DO ERROR: table '{table}' received two active rows with different "
            f"upsert keys for primary key ({pk_text}){': ' + message if message else ''}"
        )
        self.table, self.pk = table, pk
