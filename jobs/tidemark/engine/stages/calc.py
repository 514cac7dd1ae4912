"""Calc: a stateless projection and/or filter, compiled from the pipeline SQL.

Kinds pass through unchanged: projecting or filtering each row of a consistent changelog
keeps it consistent, because a retraction is filtered and projected exactly like the add
it cancels (so the expressions must be deterministic; the planner rejects the others).
A filter keeps a row only when its predicate is TRUE; NULL counts as false, as in SQL.

A batch runs through ``process_batch``: the filter and projections compiled once to polars
expressions over the batch's columns (``tidemark.engine.kernels.calc``). Building the
stage compiles them, so an expression without a vectorized form is refused at planning,
naming the construct and where it is. ``process`` is the per-row reference the vectorized
path is tested against (``tidemark.engine.expressions.compile_row_fn``).

The stage keeps the sqlglot expressions (positional column references, see
``tidemark.engine.expressions``) so the Spark host can run the same calc as Spark SQL
(``to_spark_sql``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl
import pyarrow as pa
from sqlglot import exp

from tidemark.engine.arrow_types import arrow_type
from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change
from tidemark.engine.errors import InputError
from tidemark.engine.expressions import compile_row_fn, to_spark_sql
from tidemark.engine.kernels.calc import CalcKernel, sql_type_of_arrow
from tidemark.engine.types import SqlType
from tidemark.engine.vectorized import NotVectorized


class Calc:
    """``projections`` (None = pass the row through) and an optional ``predicate``, both
    over the input row's positions; ``input_names`` / ``output_names`` name the columns
    (used for Spark SQL and for explain); ``input_types`` / ``output_types`` are the
    planner's column types (None where unknown), which the vectorized kernel computes in."""

    def __init__(
        self,
        projections: Sequence[exp.Expr] | None,
        predicate: exp.Expr | None,
        input_names: Sequence[str],
        output_names: Sequence[str] | None = None,
        name: str = "calc",
        input_types: Sequence[SqlType | None] | None = None,
        output_types: Sequence[SqlType | None] | None = None,
    ) -> None:
        self.name = name
        self.projections = list(projections) if projections is not None else None
        self.predicate = predicate
        self.input_names = list(input_names)
        if output_names is None:
            output_names = self.input_names if self.projections is None else [f"_{i}" for i in range(len(self.projections))]
        self.output_names = list(output_names)
        self.input_types = list(input_types) if input_types is not None else [None] * len(self.input_names)
        self.wanted_types = list(output_types) if output_types is not None else None
        self._compile()

    def _compile(self) -> None:
        types = self.input_types
        self._project = [compile_row_fn(e, types) for e in self.projections] if self.projections is not None else None
        self._filter = compile_row_fn(self.predicate, types) if self.predicate is not None else None
        # a stage built without its input types (tests of the reference) compiles on its first batch
        known = all(t is not None for t in self.input_types)
        self._kernel = self._compile_kernel(self.input_types) if known else None

    def _compile_kernel(self, input_types: Sequence[SqlType | None]) -> CalcKernel:
        try:
            return CalcKernel(self.projections, self.predicate, input_types, self.wanted_types)
        except NotVectorized as e:
            from tidemark.engine.sql import sql_error

            raise sql_error(f"{e}: this expression has no vectorized form", e.node) from None

    @property
    def output_types(self) -> list[SqlType | None]:
        """The types of the columns ``process_batch`` gives (the planner's where the kernel
        is not compiled yet)."""
        if self._kernel is None:
            return list(self.wanted_types) if self.wanted_types is not None else [None] * len(self.output_names)
        return list(self._kernel.output_types)

    @property
    def per_value_constructs(self) -> list[str]:
        """The subexpressions evaluated once per distinct input value (module docstring of
        ``tidemark.engine.vectorized``), as SQL text."""
        return [pv.expr.sql() for pv in self._kernel.per_value] if self._kernel is not None else []

    # compiled lambdas are not picklable; the expressions are, so recompile after unpickling
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for name in ("_project", "_filter", "_kernel"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._compile()

    def process_batch(self, batch: ChangeBatch) -> ChangeBatch:
        """The batch filtered and projected; kinds, weights and positions untouched. A value
        an expression cannot handle (a bad cast, an integer out of its type's range) is an
        InputError naming the row, as ``process`` names it."""
        if len(batch) == 0:
            return ChangeBatch.from_changes([])
        table = batch.table()
        if self._kernel is None:
            self._kernel = self._compile_kernel([sql_type_of_arrow(f.type) for f in table.schema][: len(self.input_names)])
        try:
            return ChangeBatch.from_table(self._kernel.run(table))
        except (pl.exceptions.PolarsError, pa.ArrowException, ArithmeticError, ValueError) as e:
            self.process(batch.changes())  # the reference names the row it fails on
            raise InputError(f"stage '{self.name}'", f"cannot evaluate on this batch: {e}") from None

    def input_schema(self) -> pa.Schema | None:
        """The Arrow schema of this stage's input rows (None when a type is unknown)."""
        if any(t is None for t in self.input_types):
            return None
        return pa.schema([(f"c{i}", arrow_type(t)) for i, t in enumerate(self.input_types)])

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
