"""Stage construction for set operations: ``UNION ALL`` (a union stage), ``UNION``
(``UNION ALL`` then ``DISTINCT``, as Flink plans it); ``INTERSECT`` and ``EXCEPT`` are
refused by name.

As in Flink: the branches must give the same number of columns, the union's columns are
named as the first branch's, and each column's type is the branches' common type (numeric
types widen, strings become STRING, NULL takes the other type); a branch whose type is
narrower is cast in a calc before the union. A union has no upsert key (two branches may
emit the same key; Flink's ``FlinkRelMdUpsertKeys`` gives none either) and is append-only
when every branch is.
"""

from __future__ import annotations

from sqlglot import exp

from tidemark.engine.expressions import _numeric_result, col_ref
from tidemark.engine.planner.graph import PlanGraph
from tidemark.engine.sql import Tidemark, describe, sql_error
from tidemark.engine.types import SqlType, make_type

_REFUSED = {exp.Intersect: "INTERSECT", exp.Except: "EXCEPT"}
_UNSUPPORTED_ARGS = {"order": "ORDER BY", "limit": "LIMIT", "offset": "OFFSET"}


def common_type(a: SqlType | None, b: SqlType | None) -> SqlType | None | bool:
    """The type both ``a`` and ``b`` widen to; None when unknown; False when they have none."""
    if a is None or b is None:
        return None
    if a.name == "NULL" or a == b:
        return b
    if b.name == "NULL":
        return a
    if a.is_numeric and b.is_numeric:
        return _numeric_result(a, b)
    if a.is_string and b.is_string:
        return make_type("STRING")
    return False


class UnionPlanner(PlanGraph):
    """Set operations; each branch is planned as a query (``SelectPlanner.query``)."""

    def set_operation(self, q: exp.SetOperation) -> int:
        refused = _REFUSED.get(type(q))
        if refused is not None or not isinstance(q, exp.Union):
            raise sql_error(f"{refused or type(q).__name__.upper()} is not supported (UNION ALL and UNION are)", q)
        for arg, what in _UNSUPPORTED_ARGS.items():
            if q.args.get(arg):
                raise sql_error(f"{what} on a UNION is not supported in a streaming query", q.args[arg])
        distinct = bool(q.args.get("distinct"))
        branches = self._branches(q, distinct)
        ids = [self.query(b) for b in branches]
        first = self.node(ids[0])
        types = list(first.types)
        for b, node_id in zip(branches[1:], ids[1:]):
            n = self.node(node_id)
            if n.width != first.width:
                raise sql_error(
                    f"UNION branches give different numbers of columns: the first gives {first.width} "
                    f"({', '.join(first.columns)}), {describe(b, 40)} gives {n.width} ({', '.join(n.columns)})",
                    b,
                )
            for i, t in enumerate(n.types):
                wide = common_type(types[i], t)
                if wide is False:
                    raise sql_error(
                        f"UNION column {i + 1} ('{first.columns[i]}') is {types[i]} in the first branch but "
                        f"{t} in {describe(b, 40)}; the types have no common type (add a CAST)",
                        b,
                    )
                types[i] = wide
        # last branch first: its cast folds into the calc that ends it (the newest node)
        ids = [self._cast_to(node_id, types) for node_id in reversed(ids)][::-1]
        from tidemark.engine.stages.union import Union

        name = self._stage_name("union")
        inputs = [self.node(i) for i in ids]
        append = all(n.changelog_mode == "append" for n in inputs)
        node = self._add(
            "union", name, ids, first.columns, types, upsert_keys=frozenset(),
            changelog_mode="append" if append else "retract", stage=Union(len(ids), name=name),
            detail={"union": "ALL"},
        )  # fmt: skip
        return node.id if not distinct else self.distinct(node.id)

    @staticmethod
    def _branches(q: exp.Union, distinct: bool) -> list[exp.Expr]:
        """``a UNION ALL b UNION ALL c`` (parsed left-deep) as one list: one union stage."""
        out: list[exp.Expr] = []
        for side in (q.this, q.expression):
            nested = (
                isinstance(side, exp.Union)
                and bool(side.args.get("distinct")) == distinct
                and not side.args.get("with_")
                and not any(side.args.get(a) for a in _UNSUPPORTED_ARGS)
            )
            out.extend(UnionPlanner._branches(side, distinct) if nested else [side])
        return out

    def _cast_to(self, node_id: int, types: list[SqlType | None]) -> int:
        """The branch with each column cast to the union's type where it differs."""
        n = self.node(node_id)
        if all(t is None or have is None or have == t for have, t in zip(n.types, types)):
            return node_id
        projections: list[exp.Expr] = []
        for i, (have, t) in enumerate(zip(n.types, types)):
            ref = col_ref(i)
            if t is not None and have is not None and have != t:
                ref = exp.Cast(this=ref, to=exp.DataType.build(str(t), dialect=Tidemark))
            projections.append(ref)
        return self.calc(node_id, projections, None, n.columns, purpose="union")
