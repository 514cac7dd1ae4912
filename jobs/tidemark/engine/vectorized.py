"""Scalar SQL expressions compiled to polars expressions over a whole batch's columns.

The per-row evaluator (``tidemark.engine.expressions.compile_row_fn``) is the reference:
every node compiled here gives, on each row, the value that evaluator gives (the property
tests in tests/unit/test_vectorized_expressions.py check it family by family). Values are
held as:

- integral types: ``Int128`` once arithmetic touches them, so that no intermediate value
  wraps (Python's ints do not); the output column's type range-checks the result;
- ``DECIMAL(p, s)``: the unscaled integer as ``Int128`` at scale ``s``: polars' own
  decimal arithmetic rounds products to the larger operand scale, SQL's keeps them exact;
- DOUBLE/FLOAT ``Float64``, strings ``String``, BOOLEAN, DATE ``Date``, TIMESTAMP
  ``Datetime("us")``.

A subtree without column references is evaluated once, by the reference evaluator, and
becomes a literal (``DATE '2024-01-01'``, ``CAST('1.5' AS DECIMAL(3, 1))``). A few
functions have no polars counterpart with the reference's exact semantics (Python's
``re``, ``strftime``, ``float`` parsing and ``repr``): those subtrees are evaluated by the
reference evaluator once per distinct combination of the column values they read
(``PerValue``), so their cost grows with the distinct values of a batch, not with its
rows; ``Calc.per_value_constructs`` lists them for a calc.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
from sqlglot import exp

from tidemark.engine.expressions import DateFormat, SplitIndex, UdfCall, col_index, compile_row_fn, referenced_columns
from tidemark.engine.types import BOOLEAN, DOUBLE, INT, INTEGRAL, STRING, SqlType, make_type

_I128 = pl.Int128
_NULL = SqlType("NULL")


def kind_of(t: SqlType) -> str:
    """The value family a type computes in."""
    if t.name in INTEGRAL:
        return "int"
    if t.name in ("DOUBLE", "FLOAT"):
        return "float"
    if t.name == "DECIMAL":
        return "dec"
    if t.is_string:
        return "str"
    return {"BOOLEAN": "bool", "DATE": "date", "TIMESTAMP": "ts", "NULL": "null"}.get(t.name, "other")


def scale_of(t: SqlType) -> int:
    return t.params[1] if t.name == "DECIMAL" else 0


@dataclass
class Typed:
    """A compiled node: its polars expression over the batch frame and its SQL type."""

    expr: pl.Expr
    type: SqlType

    @property
    def kind(self) -> str:
        return kind_of(self.type)


class NotVectorized(Exception):
    """A node the compiler has no vectorized form for; ``node`` names it."""

    def __init__(self, message: str, node: exp.Expr) -> None:
        super().__init__(message)
        self.node = node


@dataclass
class PerValue:
    """A subtree evaluated by the reference evaluator once per distinct input values."""

    column: str
    expr: exp.Expr
    inputs: list[int]
    type: SqlType
    fn: Callable[[tuple], Any] = field(repr=False, default=None)  # type: ignore[assignment]


def input_column(i: int) -> str:
    """The frame's name for input position ``i``."""
    return f"c{i}"


# --------------------------------------------------------------------------- helpers


def _negate(x: pl.Expr) -> pl.Expr:
    """``-x`` of an Int128 (polars has no negation for it)."""
    return pl.lit(0, _I128) - x


def _ten(n: int) -> pl.Expr:
    return pl.lit(10**n, _I128)


def _as_int128(v: Typed) -> pl.Expr:
    """An integral or decimal value as its unscaled Int128."""
    return v.expr.cast(_I128)


def _rescale(unscaled: pl.Expr, frm: int, to: int) -> pl.Expr:
    """An unscaled decimal at scale ``frm`` at scale ``to``, rounding half away from zero
    (``ROUND_HALF_UP`` of Python's decimal, as the reference quantizes)."""
    if to >= frm:
        return unscaled * _ten(to - frm) if to > frm else unscaled
    q = 10 ** (frm - to)
    mag = (unscaled.abs() + pl.lit(q // 2, _I128)) // pl.lit(q, _I128)
    return pl.when(unscaled < 0).then(_negate(mag)).otherwise(mag)


def to_float(v: Typed) -> pl.Expr:
    """As the reference's ``float(value)``: a DECIMAL through its text, so the DOUBLE is
    the nearest to the exact value (dividing the unscaled integer rounds twice)."""
    if v.kind == "dec":
        s = scale_of(v.type)
        return decimal_column(v.expr, s, _dec_type(s)).cast(pl.String).cast(pl.Float64)
    return v.expr.cast(pl.Float64)


def _dec_type(scale: int) -> SqlType:
    return make_type("DECIMAL", (38, min(max(scale, 0), 38)))


def _as_dec(v: Typed, scale: int) -> pl.Expr:
    """An integral or decimal value unscaled at ``scale`` (``scale`` >= its own)."""
    return _rescale(_as_int128(v), scale_of(v.type), scale)


def decimal_column(unscaled: pl.Expr, scale: int, t: SqlType) -> pl.Expr:
    """An unscaled Int128 at ``scale`` as polars Decimal of type ``t`` (rounded half up)."""
    p, s = t.params
    at = _rescale(unscaled, scale, s)
    return (at.cast(pl.Decimal(38, 0)).cast(pl.Decimal(38, s)) / pl.lit(10**s).cast(pl.Decimal(38, 0))).cast(pl.Decimal(p, s))


def _null_if_any(args: Sequence[Typed], value: pl.Expr) -> pl.Expr:
    cond = None
    for a in args:
        c = a.expr.is_null()
        cond = c if cond is None else cond | c
    return value if cond is None else pl.when(cond).then(None).otherwise(value)


def _truthy(v: Typed) -> pl.Expr:
    """Where the reference's ``if value`` holds: TRUE, never NULL."""
    if v.kind == "null":
        return pl.lit(False)
    if v.kind != "bool":
        raise NotVectorized("a condition that is not BOOLEAN", exp.Null())
    return v.expr.fill_null(False)


# --------------------------------------------------------------------------- compiler


class Compiler:
    """Compiles positional expressions over inputs of ``input_types`` (None: unknown)."""

    def __init__(self, input_types: Sequence[SqlType | None]) -> None:
        self.input_types = list(input_types)
        self.per_value: list[PerValue] = []

    def compile(self, node: exp.Expr) -> Typed:
        if not referenced_columns(node) and not isinstance(node, (exp.Literal, exp.Null, exp.Boolean)):
            folded = self._fold(node)
            if folded is not None:
                return folded
        method = getattr(self, f"_{type(node).__name__.lower()}", None)
        if method is None:
            return self._per_value(node)
        try:
            out = method(node)
        except NotVectorized:
            return self._per_value(node)
        if node.args.get("negate"):  # ``NOT LIKE``, ``NOT BETWEEN``, ... as sqlglot parses them
            return Typed(~out.expr, out.type)
        return out

    # -- constants and columns

    def _fold(self, node: exp.Expr) -> Typed | None:
        from tidemark.engine.expressions import infer_type

        t = infer_type(node, self.input_types)
        if t is None or kind_of(t) == "other":
            return None
        try:
            value = compile_row_fn(node)(())
        except Exception:
            return None  # fails on every row: the reference raises there, and so will we
        return literal(value, t)

    def _column(self, node: exp.Column) -> Typed:
        i = col_index(node)
        if i is None:
            raise NotVectorized(f"column {node.sql()}", node)
        t = self.input_types[i]
        if t is None:
            raise NotVectorized(f"column {node.sql()} of unknown type", node)
        col = pl.col(input_column(i))
        if t.name == "DECIMAL":
            col = (col * pl.lit(10 ** t.params[1])).cast(_I128)
        return Typed(col, t)

    def _literal(self, node: exp.Literal) -> Typed:
        from tidemark.engine.expressions import infer_type

        t = infer_type(node, self.input_types)
        return literal(compile_row_fn(node)(()), t)

    def _null(self, node: exp.Null) -> Typed:
        return Typed(pl.lit(None), _NULL)

    def _boolean(self, node: exp.Boolean) -> Typed:
        return Typed(pl.lit(bool(node.this)), BOOLEAN)

    def _paren(self, node: exp.Paren) -> Typed:
        return self.compile(node.this)

    # -- per value

    def _per_value(self, node: exp.Expr) -> Typed:
        t = _result_type(node, self.input_types)
        if t is None or kind_of(t) == "null":
            what = _CONSTRUCTS.get(type(node)) or (node.sql_name() if isinstance(node, exp.Func) else node.key.upper())
            raise NotVectorized(f"{what} (of a type the planner cannot tell)", node)
        pv = PerValue(f"pv{len(self.per_value)}", node, sorted(referenced_columns(node)), t, compile_row_fn(node))
        self.per_value.append(pv)
        col = pl.col(pv.column)
        if t.name == "DECIMAL":
            col = (col * pl.lit(10 ** t.params[1])).cast(_I128)
        return Typed(col, t)

    # -- arithmetic

    def _arith(self, node: exp.Expr, op: str) -> Typed:
        a, b = self.compile(node.this), self.compile(node.expression)
        kinds = {a.kind, b.kind}
        if not kinds <= {"int", "dec", "float", "null"}:
            raise NotVectorized(op, node)
        if "null" in kinds:
            other = b if a.kind == "null" else a
            return Typed(pl.lit(None, dtype=_dtype(other.type)), other.type if other.kind != "null" else _NULL)
        zero = b.expr == 0
        if "float" in kinds:
            x, y = to_float(a), to_float(b)
            if op == "/":
                return Typed(pl.when(zero).then(None).otherwise(x / y), DOUBLE)
            if op == "%":
                out = pl.struct(x.alias("x"), y.alias("y")).map_batches(_fmod, return_dtype=pl.Float64)
                return Typed(_null_if_any([a, b], pl.when(zero).then(None).otherwise(out)), DOUBLE)
            return Typed({"+": x + y, "-": x - y, "*": x * y}[op], DOUBLE)
        if kinds == {"int"} and op != "/":
            x, y = _as_int128(a), _as_int128(b)
            t = _wider_int(a.type, b.type)
            if op == "%":
                return Typed(pl.when(zero).then(None).otherwise(_trunc_mod(x, y)), t)
            return Typed({"+": x + y, "-": x - y, "*": x * y}[op], t)
        if kinds == {"int"}:  # true division of integers is a DOUBLE
            quotient = pl.struct(a.expr.cast(_I128).alias("x"), b.expr.cast(_I128).alias("y")).map_batches(
                _int_true_div, return_dtype=pl.Float64
            )
            return Typed(_null_if_any([a, b], pl.when(zero).then(None).otherwise(quotient)), DOUBLE)
        sa, sb = scale_of(a.type), scale_of(b.type)
        if op == "*":
            return Typed(_as_int128(a) * _as_int128(b), _dec_type(sa + sb))
        if op == "/":
            s = max(6, sa, sb)
            # a/b at scale s: (a * 10^(s + sb - sa)) / b, rounded half away from zero
            x, y = _as_int128(a), _as_int128(b)
            q = ((x.abs() * _ten(s + sb - sa + 1)) // y.abs() + 5) // 10
            signed = pl.when((x < 0) != (y < 0)).then(_negate(q)).otherwise(q)
            return Typed(pl.when(zero).then(None).otherwise(signed), _dec_type(s))
        s = max(sa, sb)
        x, y = _as_dec(a, s), _as_dec(b, s)
        if op == "%":
            return Typed(pl.when(zero).then(None).otherwise(_trunc_mod(x, y)), _dec_type(s))
        return Typed(x + y if op == "+" else x - y, _dec_type(s))

    def _add(self, node: exp.Add) -> Typed:
        return self._arith(node, "+")

    def _sub(self, node: exp.Sub) -> Typed:
        return self._arith(node, "-")

    def _mul(self, node: exp.Mul) -> Typed:
        return self._arith(node, "*")

    def _div(self, node: exp.Div) -> Typed:
        return self._arith(node, "/")

    def _mod(self, node: exp.Mod) -> Typed:
        return self._arith(node, "%")

    def _neg(self, node: exp.Neg) -> Typed:
        v = self.compile(node.this)
        if v.kind == "float":
            return Typed(-v.expr, v.type)
        if v.kind in ("int", "dec"):
            return Typed(_negate(_as_int128(v)), v.type)
        raise NotVectorized("unary -", node)

    # -- comparison and logic

    def _compare(self, node: exp.Expr, op: str) -> Typed:
        a, b = self.compile(node.this), self.compile(node.expression)
        if {a.kind, b.kind} == {"int", "float"}:
            # Python compares an int and a float exactly; a DOUBLE cannot hold every BIGINT
            x, y = _three_way(a, b) if a.kind == "int" else (-_three_way(b, a)), pl.lit(0)
        else:
            x, y = _comparable(a, b, node)
        out = {"=": x == y, "<>": x != y, "<": x < y, "<=": x <= y, ">": x > y, ">=": x >= y}[op]
        if {a.kind, b.kind} == {"int", "float"}:
            f = b.expr if a.kind == "int" else a.expr
            out = pl.when(f.is_nan()).then(pl.lit(op == "<>")).otherwise(out)
            out = _null_if_any([a, b], out)
        return Typed(out, BOOLEAN)

    def _eq(self, node: exp.EQ) -> Typed:
        return self._compare(node, "=")

    def _neq(self, node: exp.NEQ) -> Typed:
        return self._compare(node, "<>")

    def _lt(self, node: exp.LT) -> Typed:
        return self._compare(node, "<")

    def _lte(self, node: exp.LTE) -> Typed:
        return self._compare(node, "<=")

    def _gt(self, node: exp.GT) -> Typed:
        return self._compare(node, ">")

    def _gte(self, node: exp.GTE) -> Typed:
        return self._compare(node, ">=")

    def _boolean_operand(self, node: exp.Expr) -> pl.Expr:
        v = self.compile(node)
        if v.kind == "null":
            return pl.lit(None, pl.Boolean)
        if v.kind != "bool":
            raise NotVectorized("a logical operand that is not BOOLEAN", node)
        return v.expr

    def _and(self, node: exp.And) -> Typed:
        return Typed(self._boolean_operand(node.this) & self._boolean_operand(node.expression), BOOLEAN)

    def _or(self, node: exp.Or) -> Typed:
        return Typed(self._boolean_operand(node.this) | self._boolean_operand(node.expression), BOOLEAN)

    def _not(self, node: exp.Not) -> Typed:
        return Typed(~self._boolean_operand(node.this), BOOLEAN)

    def _is(self, node: exp.Is) -> Typed:
        v = self.compile(node.this)
        target = node.expression
        if isinstance(target, exp.Null):
            return Typed(v.expr.is_null(), BOOLEAN)
        if isinstance(target, exp.Boolean) and v.kind == "bool":
            return Typed((v.expr == bool(target.this)).fill_null(False), BOOLEAN)
        raise NotVectorized("IS", node)

    def _in(self, node: exp.In) -> Typed:
        if node.args.get("query") is not None or node.args.get("unnest") is not None:
            raise NotVectorized("IN (subquery)", node)
        v = self.compile(node.this)
        out = None
        for c in node.expressions:
            x, y = _comparable(v, self.compile(c), node)
            eq = x == y
            out = eq if out is None else out | eq
        if out is None:
            raise NotVectorized("IN ()", node)
        # the reference: NULL when the value is NULL, whatever the candidates
        return Typed(pl.when(v.expr.is_null()).then(None).otherwise(out), BOOLEAN)

    def _between(self, node: exp.Between) -> Typed:
        v, lo, hi = self.compile(node.this), self.compile(node.args["low"]), self.compile(node.args["high"])
        x1, l1 = _comparable(v, lo, node)
        x2, h2 = _comparable(v, hi, node)
        return Typed(_null_if_any([v, lo, hi], (l1 <= x1) & (x2 <= h2)), BOOLEAN)

    def _distinct(self, node: exp.Expr) -> pl.Expr:
        a, b = self.compile(node.this), self.compile(node.expression)
        x, y = _comparable(a, b, node)
        return ~x.eq_missing(y)

    def _nullsafeneq(self, node: exp.NullSafeNEQ) -> Typed:
        return Typed(self._distinct(node), BOOLEAN)

    def _nullsafeeq(self, node: exp.NullSafeEQ) -> Typed:
        return Typed(~self._distinct(node), BOOLEAN)

    def _like(self, node: exp.Like) -> Typed:
        import re

        s, pattern = self.compile(node.this), node.expression
        if s.kind != "str" or not (isinstance(pattern, exp.Literal) and pattern.is_string) or node.args.get("escape"):
            raise NotVectorized("LIKE", node)
        regex = "(?s)^" + re.escape(pattern.this).replace("_", ".").replace("%", ".*") + "$"
        return Typed(s.expr.str.contains(regex), BOOLEAN)

    # -- conditional

    def _branches(self, values: Sequence[Typed], node: exp.Expr) -> tuple[list[pl.Expr], SqlType]:
        """The values of a conditional's branches in one type (the first typed branch's)."""
        typed = [v for v in values if v.kind != "null"]
        if not typed:
            return [pl.lit(None) for _ in values], _NULL
        t = typed[0].type
        out = []
        for v in values:
            if v.kind == "null":
                out.append(pl.lit(None, dtype=_dtype(t)))
            elif v.type == t or (v.kind == typed[0].kind and v.kind in ("str", "int", "float", "bool", "date", "ts")):
                out.append(v.expr)
            else:
                raise NotVectorized("branches of different types", node)
        return out, t

    def _case(self, node: exp.Case) -> Typed:
        operand = node.args.get("this")
        ifs = node.args.get("ifs") or []
        conds, values = [], []
        for branch in ifs:
            cond = branch.this if operand is None else exp.EQ(this=operand.copy(), expression=branch.this.copy())
            conds.append(_truthy(self.compile(cond)))
            values.append(self.compile(branch.args["true"]))
        default = node.args.get("default")
        values.append(self.compile(default) if default is not None else Typed(pl.lit(None), _NULL))
        exprs, t = self._branches(values, node)
        out = pl.when(conds[0]).then(exprs[0])
        for c, e in zip(conds[1:], exprs[1:-1]):
            out = out.when(c).then(e)
        return Typed(out.otherwise(exprs[-1]), t)

    def _if(self, node: exp.If) -> Typed:
        cond = _truthy(self.compile(node.this))
        false = node.args.get("false")
        values = [self.compile(node.args["true"]), self.compile(false) if false is not None else Typed(pl.lit(None), _NULL)]
        exprs, t = self._branches(values, node)
        return Typed(pl.when(cond).then(exprs[0]).otherwise(exprs[1]), t)

    def _coalesce(self, node: exp.Coalesce) -> Typed:
        values = [self.compile(node.this), *(self.compile(e) for e in node.expressions)]
        exprs, t = self._branches(values, node)
        return Typed(pl.coalesce(exprs), t)

    def _nullif(self, node: exp.Nullif) -> Typed:
        a, b = self.compile(node.this), self.compile(node.expression)
        x, y = _comparable(a, b, node)
        return Typed(pl.when((x == y).fill_null(False)).then(None).otherwise(a.expr), a.type)

    # -- numeric functions

    def _abs(self, node: exp.Abs) -> Typed:
        v = self.compile(node.this)
        if v.kind not in ("int", "dec", "float"):
            raise NotVectorized("ABS", node)
        return Typed(v.expr.abs() if v.kind == "float" else _as_int128(v).abs(), v.type)  # ABS(INT_MIN) leaves INT

    def _integral(self, node: exp.Expr, up: bool) -> Typed:
        if node.args.get("decimals") is not None or node.args.get("to") is not None:
            raise NotVectorized(node.sql_name(), node)
        v = self.compile(node.this)
        if v.kind == "int":
            return v
        if v.kind == "float":
            return Typed(v.expr.ceil() if up else v.expr.floor(), v.type)
        if v.kind == "dec":
            q = _ten(scale_of(v.type))
            floor = v.expr // q  # Int128 division floors
            whole = floor + pl.when(v.expr % q != 0).then(pl.lit(1, _I128)).otherwise(pl.lit(0, _I128)) if up else floor
            return Typed(whole * q, v.type)
        raise NotVectorized(node.sql_name(), node)

    def _floor(self, node: exp.Floor) -> Typed:
        return self._integral(node, up=False)

    def _ceil(self, node: exp.Ceil) -> Typed:
        return self._integral(node, up=True)

    def _round(self, node: exp.Round) -> Typed:
        v = self.compile(node.this)
        digits = node.args.get("decimals")
        if digits is not None and not (isinstance(digits, exp.Literal) and not digits.is_string):
            raise NotVectorized("ROUND with a computed number of digits", node)
        d = int(digits.this) if digits is not None else 0
        if v.kind not in ("int", "dec"):
            raise NotVectorized("ROUND", node)  # of a DOUBLE: the reference rounds its shortest repr
        s = scale_of(v.type)
        if d >= s:
            return v
        return Typed(_rescale(_as_int128(v), s, d) * _ten(s - d), v.type)

    def _sqrt(self, node: exp.Sqrt) -> Typed:
        v = self.compile(node.this)
        if v.kind not in ("int", "dec", "float"):
            raise NotVectorized("SQRT", node)
        x = to_float(v)
        return Typed(pl.when(x >= 0).then(x.sqrt()).otherwise(pl.when(x.is_null()).then(None).otherwise(float("nan"))), DOUBLE)

    # -- strings

    def _string(self, node: exp.Expr) -> pl.Expr:
        v = self.compile(node)
        if v.kind == "null":
            return pl.lit(None, pl.String)
        if v.kind != "str":
            raise NotVectorized("a string argument that is not a STRING", node)
        return v.expr

    def _int_arg(self, node: exp.Expr) -> pl.Expr:
        v = self.compile(node)
        if v.kind == "null":
            return pl.lit(None, pl.Int64)
        if v.kind != "int":
            raise NotVectorized("an integer argument that is not integral", node)
        return v.expr.cast(pl.Int64)

    def _upper(self, node: exp.Upper) -> Typed:
        return Typed(self._string(node.this).str.to_uppercase(), STRING)

    def _lower(self, node: exp.Lower) -> Typed:
        return Typed(self._string(node.this).str.to_lowercase(), STRING)

    def _length(self, node: exp.Length) -> Typed:
        return Typed(self._string(node.this).str.len_chars().cast(pl.Int64), INT)

    def _reverse(self, node: exp.Reverse) -> Typed:
        return Typed(self._string(node.this).str.reverse(), STRING)

    def _text(self, node: exp.Expr) -> pl.Expr:
        """A CONCAT argument as the reference's ``str(value)``."""
        v = self.compile(node)
        if v.kind == "str":
            return v.expr
        if v.kind == "int":
            return v.expr.cast(pl.String)
        if v.kind == "null":
            return pl.lit(None, pl.String)
        raise NotVectorized("CONCAT of a value that is not a STRING or integer", node)

    def _concat(self, node: exp.Concat) -> Typed:
        parts = [self._text(e) for e in node.expressions]
        return Typed(pl.concat_str(parts), STRING)

    def _dpipe(self, node: exp.DPipe) -> Typed:
        return Typed(pl.concat_str([self._text(node.this), self._text(node.expression)]), STRING)

    def _concatws(self, node: exp.ConcatWs) -> Typed:
        sep, *values = node.expressions
        sep_expr = self._string(sep)
        parts = [self._text(e) for e in values]
        if not (isinstance(sep, exp.Literal) and sep.is_string):
            raise NotVectorized("CONCAT_WS with a computed separator", node)
        joined = pl.concat_str(parts, separator=sep.this, ignore_nulls=True) if parts else pl.lit("")
        return Typed(pl.when(sep_expr.is_null()).then(None).otherwise(joined.fill_null("")), STRING)

    def _substring(self, node: exp.Substring) -> Typed:
        s = self._string(node.this)
        start_node, length_node = node.args.get("start"), node.args.get("length")
        if start_node is None:
            return Typed(s, STRING)
        start = self._int_arg(start_node)
        n = s.str.len_chars().cast(pl.Int64)
        # the reference: 1-based; 0 gives ''; a negative start counts from the end
        begin = pl.when(start > 0).then(start - 1).otherwise(pl.max_horizontal(n + start, pl.lit(0, pl.Int64)))
        if length_node is None:
            out = s.str.slice(begin)
        else:
            length = self._int_arg(length_node)
            if not (isinstance(length_node, exp.Literal) and int(length_node.this) >= 0):
                raise NotVectorized("SUBSTRING with a computed length", node)
            out = s.str.slice(begin, length)
        args = [s, start] + ([self._int_arg(length_node)] if length_node is not None else [])
        out = pl.when(start == 0).then(pl.lit("")).otherwise(out)
        for a in args:
            out = pl.when(a.is_null()).then(None).otherwise(out)
        return Typed(out, STRING)

    def _left(self, node: exp.Left) -> Typed:
        n = node.expression
        if not (isinstance(n, exp.Literal) and not n.is_string and int(n.this) >= 0):
            raise NotVectorized("LEFT with a negative or computed length", node)
        return Typed(self._string(node.this).str.slice(0, int(n.this)), STRING)

    def _right(self, node: exp.Right) -> Typed:
        n = node.expression
        if not (isinstance(n, exp.Literal) and not n.is_string and int(n.this) > 0):
            raise NotVectorized("RIGHT with a non-positive or computed length", node)
        return Typed(self._string(node.this).str.tail(int(n.this)), STRING)

    def _replace(self, node: exp.Replace) -> Typed:
        s, search, repl = (self._string(node.args[a]) for a in ("this", "expression", "replacement"))
        lit_search, lit_repl = node.expression, node.args["replacement"]
        if not all(isinstance(x, exp.Literal) and x.is_string for x in (lit_search, lit_repl)):
            raise NotVectorized("REPLACE with a computed search or replacement", node)
        if lit_search.this == "":
            return Typed(s, STRING)
        return Typed(s.str.replace_all(lit_search.this, lit_repl.this, literal=True), STRING)

    def _pad(self, node: exp.Pad) -> Typed:
        s = self._string(node.this)
        length, fill = node.expression, node.args.get("fill_pattern")
        fill_text = " " if fill is None else (fill.this if isinstance(fill, exp.Literal) and fill.is_string else None)
        if fill_text is None or not (isinstance(length, exp.Literal) and not length.is_string):
            raise NotVectorized("LPAD/RPAD with a computed length or fill", node)
        n = int(length.this)
        if n < 0 or fill_text == "":
            return Typed(pl.lit(None, pl.String), STRING)
        pad = (fill_text * n)[:n]
        short = n - s.str.len_chars().cast(pl.Int64)
        piece = pl.lit(pad).str.slice(0, pl.max_horizontal(short, pl.lit(0, pl.Int64)))
        padded = pl.concat_str([piece, s]) if node.args.get("is_left") else pl.concat_str([s, piece])
        return Typed(pl.when(short <= 0).then(s.str.slice(0, n)).otherwise(padded), STRING)

    def _splitindex(self, node: SplitIndex) -> Typed:
        s = self._string(node.this)
        sep, index = node.expression, node.args["index"]
        if not (isinstance(sep, exp.Literal) and sep.is_string and isinstance(index, exp.Literal) and not index.is_string):
            raise NotVectorized("SPLIT_INDEX with a computed separator or index", node)
        i = int(index.this)
        if i < 0 or sep.this == "":
            return Typed(pl.lit(None, pl.String), STRING)
        return Typed(s.str.split(sep.this, inclusive=False).list.get(i, null_on_oob=True), STRING)

    def _regexpextract(self, node: exp.RegexpExtract) -> Typed:
        import re

        s = self._string(node.this)
        regex, group = node.expression, node.args.get("group")
        g = 0 if group is None else (int(group.this) if isinstance(group, exp.Literal) and not group.is_string else None)
        if not (isinstance(regex, exp.Literal) and regex.is_string) or g is None:
            raise NotVectorized("REGEXP_EXTRACT with a computed regex or group", node)
        try:
            groups = re.compile(regex.this).groups
        except re.error:
            return Typed(pl.lit(None, pl.String), STRING)  # the reference: NULL for an invalid regex
        if g < 0 or g > groups or not _same_regex_dialect(regex.this):
            raise NotVectorized("REGEXP_EXTRACT", node)
        return Typed(s.str.extract(regex.this, g), STRING)

    # -- casts

    def _cast(self, node: exp.Cast) -> Typed:
        from tidemark.engine.sql import sql_type_of

        t = sql_type_of(node.args["to"], node)
        v = self.compile(node.this)
        target = kind_of(t)
        if v.kind == "null":
            return Typed(pl.lit(None, dtype=_dtype(t)), t)
        if target == "int" and v.kind in ("int", "dec"):
            q = _ten(scale_of(v.type))
            x = _as_int128(v)
            trunc = pl.when(x < 0).then(_negate(_negate(x) // q)).otherwise(x // q) if scale_of(v.type) else x
            return Typed(trunc, t)
        if target == "float" and v.kind in ("int", "dec", "float"):
            return Typed(to_float(v), t)
        if target == "dec" and v.kind in ("int", "dec"):
            return Typed(_as_dec(v, t.params[1]) if t.params[1] >= scale_of(v.type) else _rescale(_as_int128(v), scale_of(v.type), t.params[1]), t)
        if target == "str" and v.kind in ("str", "int"):
            return Typed(v.expr.cast(pl.String), t)
        if target == "str" and v.kind == "bool":
            return Typed(pl.when(v.expr).then(pl.lit("TRUE")).otherwise(pl.when(v.expr.is_null()).then(None).otherwise(pl.lit("FALSE"))), t)
        if target == "str" and v.kind == "date":
            return Typed(v.expr.dt.strftime("%Y-%m-%d"), t)
        if target == v.kind and target in ("bool", "date", "ts", "str"):
            return Typed(v.expr, t)
        if target == "date" and v.kind == "ts":
            return Typed(v.expr.dt.date(), t)
        if target == "ts" and v.kind == "date":
            return Typed(v.expr.cast(pl.Datetime("us")), t)
        raise NotVectorized(f"CAST to {t}", node)

    _trycast = _cast

    # -- user-defined functions

    def _udfcall(self, node: UdfCall) -> Typed:
        from tidemark.udf import load

        path = node.args["path"].this
        _, result = load(path)
        if kind_of(result) in ("null", "other"):
            raise NotVectorized(f"function {node.name} with result type {result}", node)
        args = [self.compile(a) for a in node.expressions]
        fields = [_user_column(a).alias(f"a{i}") for i, a in enumerate(args)]
        out = pl.struct(fields).map_batches(
            functools.partial(_call_udf, node.name, path, len(fields)), return_dtype=_user_dtype(result)
        )
        if result.name == "DECIMAL":
            out = (out * pl.lit(10 ** result.params[1])).cast(_I128)
        return Typed(out, result)

    # -- dates

    def _year(self, node: exp.Year) -> Typed:
        return self._date_part(node.this, "year", node)

    def _month(self, node: exp.Month) -> Typed:
        return self._date_part(node.this, "month", node)

    def _hour(self, node: exp.Hour) -> Typed:
        return self._date_part(node.this, "hour", node)

    def _extract(self, node: exp.Extract) -> Typed:
        unit = node.this.name.lower() if node.this is not None else ""
        return self._date_part(node.expression, unit, node)

    def _date_part(self, arg: exp.Expr, unit: str, node: exp.Expr) -> Typed:
        v = self.compile(arg)
        if v.kind not in ("date", "ts") or unit not in ("year", "month", "day", "hour", "minute", "second"):
            raise NotVectorized(f"EXTRACT({unit.upper()})", node)
        if v.kind == "date" and unit in ("hour", "minute", "second"):
            raise NotVectorized(f"EXTRACT({unit.upper()}) of a DATE", node)
        return Typed(getattr(v.expr.dt, unit)().cast(pl.Int64), INT)

    def _datediff(self, node: exp.DateDiff) -> Typed:
        a, b = self.compile(node.this), self.compile(node.expression)
        if node.args.get("unit") is not None or a.kind != b.kind or a.kind not in ("date", "ts"):
            raise NotVectorized("DATEDIFF", node)
        micros = (a.expr.cast(pl.Datetime("us")) - b.expr.cast(pl.Datetime("us"))).dt.total_microseconds()
        return Typed(micros.cast(_I128) // pl.lit(86_400_000_000, _I128), INT)


#: result types of functions ``infer_type`` leaves open (the reference's Python value types)
_RESULT_TYPES: dict[type, SqlType] = {
    DateFormat: STRING, exp.RegexpExtract: STRING, exp.Trim: STRING, exp.Left: STRING, exp.Right: STRING,
    exp.Reverse: STRING, exp.Year: INT, exp.Month: INT, exp.Hour: INT, exp.Extract: INT,
    exp.DateDiff: INT, exp.StrPosition: INT, exp.Pow: DOUBLE,
}  # fmt: skip


#: how refusals name constructs that have no function name
_CONSTRUCTS: dict[type, str] = {exp.Bracket: "element access on ARRAY and MAP values (a[i], m['k'])", exp.Dot: "field access (r.f)"}


def _result_type(node: exp.Expr, input_types: Sequence[SqlType | None]) -> SqlType | None:
    from tidemark.engine.expressions import infer_type

    t = infer_type(node, input_types)
    return t if t is not None else _RESULT_TYPES.get(type(node))


def _dtype(t: SqlType) -> pl.DataType | None:
    return {
        "int": _I128, "float": pl.Float64, "dec": _I128, "str": pl.String, "bool": pl.Boolean,
        "date": pl.Date, "ts": pl.Datetime("us"),
    }.get(kind_of(t))  # fmt: skip


def _int_true_div(s: pl.Series) -> pl.Series:
    """``x / y`` of integers, correctly rounded as Python's: in floats where both are exact
    DOUBLEs (|v| <= 2^53), by Python's int division for the rare rows where one is not."""
    x, y = s.struct.field("x"), s.struct.field("y")
    limit = 2**53
    with np.errstate(invalid="ignore", divide="ignore"):
        out = x.cast(pl.Float64).to_numpy() / y.cast(pl.Float64).to_numpy()
    wide = (((x.abs() > limit) | (y.abs() > limit)) & (y != 0) & x.is_not_null() & y.is_not_null()).fill_null(False)
    for i in wide.arg_true().to_list():
        out[i] = x[i] / y[i]
    return pl.Series(out)


def _user_column(v: Typed) -> pl.Expr:
    """A value as a UDF receives it: integers as Int64, DECIMAL as a decimal column (the
    row path types its one-value arrays alike: ``tidemark.udf.argument_type``)."""
    if v.kind == "int":
        return v.expr.cast(pl.Int64)
    if v.kind == "dec":
        return decimal_column(v.expr, scale_of(v.type), make_type("DECIMAL", (38, scale_of(v.type))))
    return v.expr


def _user_dtype(t: SqlType) -> pl.DataType:
    if t.name == "DECIMAL":
        return pl.Decimal(*t.params)
    from tidemark.engine.arrow_types import arrow_type

    return pl.from_arrow(pa.array([], arrow_type(t))).dtype  # type: ignore[union-attr]


def _call_udf(name: str, path: str, n_args: int, s: pl.Series) -> pl.Series:
    from tidemark.udf import call

    args = [s.struct.field(f"a{i}").to_arrow() for i in range(n_args)]
    out = pl.from_arrow(call(name, path, args, len(s)))
    assert isinstance(out, pl.Series)
    return out


def _wider_int(a: SqlType, b: SqlType) -> SqlType:
    return a if INTEGRAL.index(a.name) >= INTEGRAL.index(b.name) else b


def _trunc_mod(x: pl.Expr, y: pl.Expr) -> pl.Expr:
    """The remainder with the sign of the dividend (Int128 ``%`` floors, like Python's)."""
    r = x % y
    return pl.when((r != 0) & ((r < 0) != (x < 0))).then(r - y).otherwise(r)


def _fmod(s: pl.Series) -> pl.Series:
    x = s.struct.field("x").to_numpy()
    y = s.struct.field("y").to_numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        return pl.Series(np.fmod(x, y))


def _three_way(n: Typed, f: Typed) -> pl.Expr:
    """-1, 0 or 1 as the integer ``n`` is below, equal to or above the finite or infinite
    DOUBLE ``f``, exactly (``f``'s floor as an integer, then its fraction breaks the tie)."""
    x = f.expr
    big = x.abs() >= 2.0**64  # beyond every BIGINT: f's sign decides
    floor = pl.when(big).then(0.0).otherwise(x.floor())
    whole = floor.cast(_I128)
    frac_above = (x - floor) > 0
    ni = n.expr.cast(_I128)
    near = pl.when(ni < whole).then(-1).when(ni > whole).then(1).when(frac_above).then(-1).otherwise(0)
    return pl.when(big).then(pl.when(x > 0).then(-1).otherwise(1)).otherwise(near)


def _comparable(a: Typed, b: Typed, node: exp.Expr) -> tuple[pl.Expr, pl.Expr]:
    """Both sides of a comparison in one representation (the reference compares Python
    values: numbers exactly across int, Decimal and float; other types only with their own)."""
    ka, kb = a.kind, b.kind
    if "null" in (ka, kb):
        return (pl.lit(None) if ka == "null" else a.expr), (pl.lit(None) if kb == "null" else b.expr)
    if {ka, kb} <= {"int", "dec"}:
        s = max(scale_of(a.type), scale_of(b.type))
        return _as_dec(a, s), _as_dec(b, s)
    if {ka, kb} <= {"int", "float"}:
        return to_float(a), to_float(b)
    if ka == kb and ka in ("str", "bool", "date", "ts"):
        return a.expr, b.expr
    raise NotVectorized(f"comparison of {a.type} and {b.type}", node)


#: regex syntax both Python's ``re`` and polars' (Rust) engine read alike
_REGEX_SAFE = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ,.;:-_+*?()[]|^$=!@#%&/'\"<>~`")


def _same_regex_dialect(regex: str) -> bool:
    """True for regexes whose meaning is the same in Python's ``re`` and in Rust's regex:
    literal text, classes, groups, quantifiers and the escapes ``\\w \\d \\s \\W \\D \\S .``
    (no lookaround, backreferences, ``{m,n}``, inline flags or other escapes)."""
    i = 0
    while i < len(regex):
        ch = regex[i]
        if ch == "\\":
            if i + 1 >= len(regex) or regex[i + 1] not in "wdsWDS.\\()[]|*+?^$-":
                return False
            i += 2
            continue
        if ch not in _REGEX_SAFE or regex[i : i + 2] in ("(?", "[^]", "[]"):
            return False
        i += 1
    return True


def literal(value: Any, t: SqlType | None) -> Typed:
    """A constant of type ``t`` in the compiled representation."""
    if t is None:
        raise NotVectorized("a constant of unknown type", exp.Null())
    if value is None:
        return Typed(pl.lit(None, dtype=_dtype(t)), t)
    k = kind_of(t)
    if k == "dec":
        from decimal import Decimal

        s = t.params[1]
        d = Decimal(value) if not isinstance(value, Decimal) else value
        exponent = d.as_tuple().exponent
        if isinstance(exponent, int) and -exponent > s:  # more digits than the type says: keep them
            s = min(-exponent, 38)
            t = _dec_type(s)
        return Typed(pl.lit(int(d.scaleb(s)), _I128), t)
    if k == "int":
        return Typed(pl.lit(int(value), _I128), t)
    if k == "float":
        return Typed(pl.lit(float(value), pl.Float64), t)
    if k == "ts":
        return Typed(pl.lit(value, pl.Datetime("us")), t)
    return Typed(pl.lit(value, dtype=_dtype(t)), t)
