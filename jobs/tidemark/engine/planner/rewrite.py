"""Small rewrites of resolved expressions and names shared by the stage builders."""

from __future__ import annotations

from sqlglot import exp

from tidemark.engine.expressions import col_index


def conjuncts(e: exp.Expr | None) -> list[exp.Expr]:
    if e is None:
        return []
    if isinstance(e, exp.Paren):
        return conjuncts(e.this)
    if isinstance(e, exp.And):
        return conjuncts(e.this) + conjuncts(e.expression)
    return [e]


def conjoin(parts: list[exp.Expr]) -> exp.Expr | None:
    if not parts:
        return None
    out = parts[0]
    for p in parts[1:]:
        out = exp.And(this=out, expression=p)
    return out


def substitute(expr: exp.Expr, replacements: list[exp.Expr]) -> exp.Expr:
    """Replace positional column i in ``expr`` by ``replacements[i]`` (composes calcs)."""

    def sub(node: exp.Expr) -> exp.Expr:
        i = col_index(node)
        return replacements[i].copy() if i is not None else node

    return expr.transform(sub, copy=True)


def unique_names(names: list[str]) -> list[str]:
    """Output names of a stage must differ (case-insensitively): later repeats get a suffix."""
    seen: dict[str, int] = {}
    out = []
    for n in names:
        k = n.lower()
        if k in seen:
            seen[k] += 1
            out.append(f"{n}{seen[k] - 1}")
        else:
            seen[k] = 1
            out.append(n)
    return out
