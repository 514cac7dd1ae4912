"""Calc: a stateless projection and/or filter, compiled from the pipeline SQL.

Kinds pass through unchanged: projecting or filtering each row of a consistent changelog
keeps it consistent, because a retraction is filtered and projected exactly like the add
it cancels (so the expressions must be deterministic; the planner rejects the others).
A filter keeps a row only when its predicate is TRUE; NULL counts as false, as in SQL.

The stage keeps the sqlglot expressions (positional column references, see
``tidemark.engine.expressions``) so the Spark host can run the same calc as Spark SQL
(``to_spark_sql``) instead of calling Python per row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlglot import exp

from tidemark.engine.changelog import Change
from tidemark.engine.errors import InputError
from tidemark.engine.expressions import compile_row_fn, to_spark_sql


class Calc:
    """``projections`` (None = pass the row through) and an optional ``predicate``, both
    over the input row's positions; ``input_names`` / ``output_names`` name the columns
    (used for Spark SQL and for explain)."""

    def __init__(
        self,
        projections: Sequence[exp.Expr] | None,
        predicate: exp.Expr | None,
        input_names: Sequence[str],
        output_names: Sequence[str] | None = None,
        name: str = "calc",
    ) -> None:
        self.name = name
        self.projections = list(projections) if projections is not None else None
        self.predicate = predicate
        self.input_names = list(input_names)
        if output_names is None:
            output_names = self.input_names if self.projections is None else [f"_{i}" for i in range(len(self.projections))]
        self.output_names = list(output_names)
        self._compile()

    def _compile(self) -> None:
        self._project = [compile_row_fn(e) for e in self.projections] if self.projections is not None else None
        self._filter = compile_row_fn(self.predicate) if self.predicate is not None else None

    # compiled lambdas are not picklable; the expressions are, so recompile after unpickling
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_project", None)
        state.pop("_filter", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._compile()

    def process(self, changes: list[Change]) -> list[Change]:
        out: list[Change] = []
        keep, project = self._filter, self._project
        for c in changes:
            row = c.row
            try:
                if keep is not None:
                    verdict = keep(row)
                    if verdict is None or not verdict:
                        continue
                if project is not None:
                    row = tuple(f(row) for f in project)
            except Exception as e:  # a value the expression cannot handle (e.g. bad cast)
                raise InputError(f"stage '{self.name}'", f"cannot evaluate on row {c.row!r}: {e}") from None
            out.append(Change(c.kind, row, c.pos))
        return out

    # ------------------------------------------------------------------ Spark / explain

    def to_spark_sql(self, input_names: Sequence[str] | None = None) -> dict[str, Any]:
        """``{"columns": [(output_name, spark_sql), ...] | None, "filter": spark_sql | None}``;
        input position i is referred to as ``input_names[i]`` (default: this stage's)."""
        names = list(input_names) if input_names is not None else self.input_names
        cols = (
            [(n, to_spark_sql(e, names)) for n, e in zip(self.output_names, self.projections)]
            if self.projections is not None
            else None
        )
        flt = to_spark_sql(self.predicate, names) if self.predicate is not None else None
        return {"columns": cols, "filter": flt}

    def describe(self) -> dict[str, Any]:
        return self.to_spark_sql()
