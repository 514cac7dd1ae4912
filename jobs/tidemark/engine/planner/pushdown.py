"""Which WHERE conjuncts may be evaluated below a join, on one of its inputs.

A filter that reads only one input's columns commutes with the join on that input when the
join keeps every row of that input it does not drop for want of a partner (inner join: both
inputs; LEFT JOIN: the left one; RIGHT JOIN: the right one). As Z-sets, with p reading only
L's columns and the join bilinear:

    sigma_p(L join R) = sigma_p(L) join R

because every output row made from a row l of L carries l's columns unchanged, so p holds of
the output row exactly when it holds of l; a LEFT JOIN's row l without partner is padded on
R's side only, so the same holds for a predicate on L there. Joins applied after this one must
keep its rows as well (an inner join or a LEFT JOIN taking it as the left input): a later
RIGHT or FULL JOIN pads this join's columns with NULLs, which the WHERE would have judged.

The filtered changes keep their positions, and a filtered-out row's changes would all have
been filtered after the join (they carry the same columns), so every change the join still
emits is one it emitted before, at the same position: the downstream stages see the same
changelog. The join keeps only the rows that pass, so it stores and joins fewer.

Only conjuncts that cannot fail are moved: below the join they are evaluated on rows the join
would have dropped, and an evaluation error stops the job. Column references, literals, AND,
OR, NOT, IS [NOT] NULL, and comparisons, BETWEEN and IN between values of one type family
cannot fail; anything else (casts, arithmetic, functions) stays in the WHERE. Flink's planner
pushes such filters the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlglot import exp

from tidemark.engine.expressions import col_index, col_ref, infer_type, referenced_columns
from tidemark.engine.planner.rewrite import substitute
from tidemark.engine.types import SqlType

#: joins that keep every row of an input apart from those without a partner, by join type
KEEPS = {"inner": ("left", "right"), "left": ("left",), "right": ("right",), "full": ()}

#: the join type of a JOIN's side keyword
JOIN_TYPES = {"": "inner", "LEFT": "left", "RIGHT": "right", "FULL": "full"}

_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ)


def _family(t: SqlType | None) -> str | None:
    if t is None:
        return None
    if t.name == "NULL":
        return "NULL"
    if t.is_numeric:
        return "numeric"
    if t.is_string:
        return "string"
    return t.name if t.name in ("BOOLEAN", "DATE", "TIMESTAMP") else None


def _same_family(operands: Sequence[exp.Expr], types: Sequence[SqlType | None]) -> bool:
    families = {_family(infer_type(o, types)) for o in operands}
    families.discard("NULL")
    return None not in families and len(families) <= 1


def cannot_fail(e: exp.Expr, types: Sequence[SqlType | None]) -> bool:
    """Whether evaluating resolved expression ``e`` on any row of ``types`` gives a value
    (possibly NULL) and never an error (module docstring)."""
    if col_index(e) is not None or isinstance(e, (exp.Literal, exp.Null, exp.Boolean)):
        return True
    if isinstance(e, exp.Paren):
        return cannot_fail(e.this, types)
    if isinstance(e, exp.Not):
        return cannot_fail(e.this, types)
    if isinstance(e, (exp.And, exp.Or)):
        return cannot_fail(e.this, types) and cannot_fail(e.expression, types)
    if isinstance(e, exp.Is):
        return isinstance(e.expression, exp.Null) and cannot_fail(e.this, types)
    if isinstance(e, _COMPARISONS):
        operands = [e.this, e.expression]
    elif isinstance(e, exp.Between):
        operands = [e.this, e.args["low"], e.args["high"]]
    elif isinstance(e, exp.In) and not e.args.get("query") and not e.args.get("unnest") and not e.args.get("field"):
        operands = [e.this, *e.expressions]
    else:
        return False
    return all(col_index(o) is not None or isinstance(o, (exp.Literal, exp.Null)) for o in operands) and _same_family(
        operands, types
    )


def keeps_left_rows(join: exp.Join) -> bool:
    """Whether a JOIN after the one being planned keeps that one's rows: a regular inner
    join or LEFT JOIN emits the rows of its left input that it does not drop for want of a
    partner with their columns as they were, never NULLs in their place."""
    if isinstance(join.this, exp.Table) and join.this.args.get("version") is not None:
        return False  # a lookup join: left as planned
    if (join.text("kind") or "").upper() not in ("", "INNER", "OUTER"):
        return False
    join_type = JOIN_TYPES.get((join.text("side") or "").upper())
    return join_type is not None and "left" in KEEPS[join_type]


def split_for_join(
    conjuncts: Sequence[exp.Expr], types: Sequence[SqlType | None], left_width: int, join_type: str
) -> tuple[list[int], list[exp.Expr], list[exp.Expr]]:
    """For resolved WHERE ``conjuncts`` over a join's row (``left_width`` columns of the
    left input, then the right's): (the indexes of those that move, the left input's
    filter, the right input's filter), the right's re-indexed to its own columns. The
    caller knows that the joins after this one keep its rows."""
    keeps = KEEPS[join_type]
    moved: list[int] = []
    left: list[exp.Expr] = []
    right: list[exp.Expr] = []
    width = len(types)
    for i, conj in enumerate(conjuncts):
        cols = referenced_columns(conj)
        if not cols or not cannot_fail(conj, types):
            continue
        if max(cols) < left_width and "left" in keeps:
            left.append(conj)
        elif min(cols) >= left_width and "right" in keeps:
            shift = [col_ref(c - left_width) if c >= left_width else col_ref(c) for c in range(width)]
            right.append(substitute(conj, shift))
        else:
            continue
        moved.append(i)
    return moved, left, right
