"""The calc's batch kernel: a filter and projections over a batch's columns, in polars.

Compiled once per calc (``tidemark.engine.vectorized``); per batch it reads the row
columns of the batch's Arrow table, keeps the rows whose predicate is TRUE, computes the
projections and hands the kind, weight and position columns through untouched. Output
columns take the planner's types where the planner knows them and the compiled
expression's type otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import polars as pl
import pyarrow as pa
from sqlglot import exp

from tidemark.engine.arrow_types import arrow_type, python_values
from tidemark.engine.types import SqlType, make_type
from tidemark.engine.vectorized import Compiler, PerValue, Typed, decimal_column, input_column, kind_of, scale_of, to_float


class CalcKernel:
    """``projections`` (None: the row as it is) and ``predicate`` over inputs of
    ``input_types``; ``output_types`` are the planner's (None where it does not know).
    Raises ``NotVectorized`` for an expression it cannot compile."""

    def __init__(
        self,
        projections: Sequence[exp.Expr] | None,
        predicate: exp.Expr | None,
        input_types: Sequence[SqlType | None],
        output_types: Sequence[SqlType | None] | None = None,
    ) -> None:
        compiler = Compiler(input_types)
        self._predicate = compiler.compile(predicate) if predicate is not None else None
        self._projections = [compiler.compile(e) for e in projections] if projections is not None else None
        self.per_value: list[PerValue] = compiler.per_value
        if self._projections is not None:
            wanted = list(output_types) if output_types is not None else [None] * len(self._projections)
            self.output_types = [_output_type(v, t) for v, t in zip(self._projections, wanted)]
        else:
            self.output_types = list(input_types)

    def run(self, table: pa.Table) -> pa.Table:
        """The batch table (``ChangeBatch`` layout) after the filter and projections."""
        row_names = [n for n in table.column_names if not n.startswith("$")]
        meta_names = [n for n in table.column_names if n.startswith("$")]
        frame = pl.from_arrow(
            pa.Table.from_arrays(table.columns, names=[*(input_column(i) for i in range(len(row_names))), *meta_names])
        )
        assert isinstance(frame, pl.DataFrame)
        for pv in self.per_value:
            frame = frame.with_columns(_evaluate_per_value(pv, table, row_names))
        if self._predicate is not None:
            frame = frame.filter(_condition(self._predicate))
        if self._projections is None:
            rows = table.select(row_names).schema
            out = frame.select(*(input_column(i) for i in range(len(row_names)))).to_arrow()
            columns = [out.column(i).cast(rows.field(i).type) for i in range(len(row_names))]
            names = row_names
        else:
            exprs = [_finish(v, t).alias(f"o{i}") for i, (v, t) in enumerate(zip(self._projections, self.output_types))]
            # selected beside the batch's own columns, so that a constant is one value per row
            out = frame.select(*exprs, *meta_names).to_arrow()
            columns = [out.column(i).cast(_arrow(t)) for i, t in enumerate(self.output_types)]
            names = [f"_{i}" for i in range(len(columns))]
            frame = frame.select(meta_names)
        meta = frame.select(meta_names).to_arrow()
        metas = [meta.column(n).cast(table.schema.field(n).type) for n in meta_names]
        return pa.Table.from_arrays([*columns, *metas], names=[*names, *meta_names])


_ARROW_SCALARS = {
    pa.int8(): "TINYINT", pa.int16(): "SMALLINT", pa.int32(): "INT", pa.int64(): "BIGINT", pa.float64(): "DOUBLE",
    pa.float32(): "FLOAT", pa.string(): "STRING", pa.large_string(): "STRING", pa.bool_(): "BOOLEAN", pa.date32(): "DATE",
}  # fmt: skip


def sql_type_of_arrow(t: pa.DataType) -> SqlType | None:
    """The SQL type of an Arrow column's values (None: one the kernel does not compute on)."""
    if t in _ARROW_SCALARS:
        return make_type(_ARROW_SCALARS[t])
    if pa.types.is_decimal(t):
        return make_type("DECIMAL", (t.precision, t.scale))
    if pa.types.is_timestamp(t):
        return make_type("TIMESTAMP")
    return None


def _arrow(t: SqlType | None) -> pa.DataType:
    if t is None or t.name == "NULL":
        return pa.null()
    return arrow_type(t)


def _output_type(v: Typed, wanted: SqlType | None) -> SqlType | None:
    """The planner's type when it is of the compiled value's family, else the value's own."""
    if wanted is not None and (kind_of(wanted) == v.kind or v.kind == "null" or (kind_of(wanted), v.kind) == ("dec", "int")):
        return wanted
    return v.type if v.type.name != "NULL" else wanted


def _finish(v: Typed, t: SqlType | None) -> pl.Expr:
    """A compiled value as the polars column of SQL type ``t``."""
    if t is None or t.name == "NULL":
        return v.expr
    k = kind_of(t)
    if k == "dec":
        return decimal_column(v.expr.cast(pl.Int128), scale_of(v.type), t)
    if v.kind == "dec" and k == "float":
        return to_float(v)
    if k == "int":
        return v.expr.cast(pl.from_arrow(pa.array([], arrow_type(t))).dtype, strict=True)
    return v.expr


def _condition(v: Typed) -> pl.Expr:
    """Where a predicate keeps a row: TRUE (NULL and FALSE drop it)."""
    if v.kind == "null":
        return pl.lit(False)
    if v.kind == "bool":
        return v.expr.fill_null(False)
    if v.kind in ("int", "float"):
        return (v.expr != 0).fill_null(False)  # the reference keeps a row whose value is truthy
    if v.kind == "str":
        return (v.expr.str.len_bytes() > 0).fill_null(False)
    raise TypeError(f"a filter on a value of type {v.type}")


def _evaluate_per_value(pv: PerValue, table: pa.Table, row_names: Sequence[str]) -> pl.Series:
    """``pv``'s values, from the reference evaluator called once per distinct inputs."""
    width = max(pv.inputs, default=-1) + 1
    columns = {i: python_values(table.column(row_names[i])) for i in pv.inputs}
    cache: dict[tuple, Any] = {}
    values: list[Any] = []
    for n in range(table.num_rows):
        key = tuple(_distinct(columns[i][n]) for i in pv.inputs)
        if key not in cache:
            row: list[Any] = [None] * width
            for i in pv.inputs:
                row[i] = columns[i][n]
            cache[key] = _typed(pv.fn(tuple(row)), pv.type)
        values.append(cache[key])
    series = pl.from_arrow(pa.array(values, _arrow(pv.type)))
    assert isinstance(series, pl.Series)
    return series.alias(pv.column)


def _distinct(value: Any) -> Any:
    """A cache key telling apart values Python counts equal but SQL functions do not (-0.0, 0.0)."""
    return (value, math.copysign(1.0, value)) if isinstance(value, float) else value


def _typed(value: Any, t: SqlType) -> Any:
    """A reference value in the per-value column's Arrow type (DECIMAL at its scale)."""
    if value is None or t.name != "DECIMAL" or not isinstance(value, Decimal):
        return value
    from decimal import ROUND_HALF_UP

    return value.quantize(Decimal(1).scaleb(-t.params[1]), rounding=ROUND_HALF_UP)
