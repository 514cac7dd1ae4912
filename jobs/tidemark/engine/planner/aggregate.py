"""Stage construction for GROUP BY and aggregate functions: the pre-projection of group
expressions and arguments, the aggregate stage, and the SELECT/HAVING over its output."""

from __future__ import annotations

from typing import Any

from sqlglot import exp

from tidemark.engine.errors import SqlError
from tidemark.engine.expressions import col_index, col_ref
from tidemark.engine.planner.graph import PlanGraph
from tidemark.engine.planner.node import Key
from tidemark.engine.planner.rewrite import unique_names
from tidemark.engine.planner.scope import Scope
from tidemark.engine.sql import describe, sql_error
from tidemark.engine.types import SqlType, make_type

_AGG_FUNCS = {exp.Sum: "SUM", exp.Min: "MIN", exp.Max: "MAX", exp.Avg: "AVG", exp.LastValue: "LAST_VALUE"}


class AggregatePlanner(PlanGraph):
    """GROUP BY, aggregate calls (with DISTINCT and FILTER) and SELECT DISTINCT."""

    def aggregate(self, sel: exp.Select, scope: Scope, input_id: int, predicate: exp.Expr | None) -> int:
        from tidemark.engine.stages.aggregate import AggCall, GroupAggregate

        group = sel.args.get("group")
        group_exprs: list[exp.Expr] = []
        if group is not None:
            for arg in ("grouping_sets", "cube", "rollup", "totals"):
                if group.args.get(arg):
                    raise sql_error(f"GROUP BY {arg.upper().replace('_', ' ')} is not supported", group)
            for g in group.expressions:
                if isinstance(g, (exp.Rollup, exp.Cube, exp.GroupingSets)):
                    what = {exp.Rollup: "ROLLUP", exp.Cube: "CUBE", exp.GroupingSets: "GROUPING SETS"}[type(g)]
                    raise sql_error(f"GROUP BY {what} is not supported", g)
                if isinstance(g, exp.Literal):
                    raise sql_error("GROUP BY position numbers are not supported; name the column", g)
                group_exprs.append(self.resolve(g, scope))
        # pre-projection: group expressions, then distinct aggregate arguments
        pre: list[exp.Expr] = list(group_exprs)
        calls: list[tuple[str, int | None, bool]] = []
        call_nodes: list[exp.Expr] = []

        def agg_slot(node: exp.Expr) -> int:
            func, arg_expr, distinct = self._agg_call(node)
            arg_pos = None
            if arg_expr is not None:
                resolved = self.resolve(arg_expr, scope)
                for agg in self._find_aggs(resolved):
                    raise sql_error(f"nested aggregate {describe(agg)} is not supported", agg)
                if resolved in pre:
                    arg_pos = pre.index(resolved)
                else:
                    pre.append(resolved)
                    arg_pos = len(pre) - 1
            call = (func, arg_pos, distinct)
            if call not in calls:
                calls.append(call)
                call_nodes.append(node)
            return calls.index(call)

        k = len(group_exprs)

        def rewrite(e: exp.Expr) -> exp.Expr:
            """Map a select/having expression onto the aggregate's output row."""

            def sub(node: exp.Expr) -> exp.Expr:
                if isinstance(node, exp.Filter) and isinstance(node.this, exp.AggFunc):
                    return exp.Column(this=exp.Identifier(this=f"__a{k + agg_slot(self._without_filter(node))}"))
                if isinstance(node, exp.AggFunc):
                    return exp.Column(this=exp.Identifier(this=f"__a{k + agg_slot(node)}"))
                if not isinstance(node, exp.Star) and not (isinstance(node, exp.Column) and isinstance(node.this, exp.Star)):
                    try:
                        resolved = self.resolve(node, scope) if not isinstance(node, exp.Literal) else None
                    except SqlError:
                        resolved = None
                    if resolved is not None and resolved in group_exprs and (isinstance(node, exp.Column) or node.find(exp.Column)):
                        return exp.Column(this=exp.Identifier(this=f"__a{group_exprs.index(resolved)}"))
                if isinstance(node, exp.Column):
                    if isinstance(node.this, exp.Star):
                        raise sql_error("SELECT * cannot be used with GROUP BY", node)
                    scope.resolve(node)  # unknown columns: report as such first
                    raise sql_error(
                        f"column {node.sql()} must appear in GROUP BY or inside an aggregate function", node
                    )
                return node

            out = e.transform(sub, copy=True)

            def finish(node: exp.Expr) -> exp.Expr:
                if isinstance(node, exp.Column) and node.name.startswith("__a"):
                    return col_ref(int(node.name[3:]))
                return node

            return out.transform(finish, copy=False)

        post: list[exp.Expr] = []
        names: list[str] = []
        for i, item in enumerate(sel.expressions):
            if isinstance(item, exp.Star) or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star)):
                raise sql_error("SELECT * cannot be used with GROUP BY or aggregates", item)
            inner = item.this if isinstance(item, exp.Alias) else item
            post.append(rewrite(inner))
            names.append(self._item_name(item, i))
        having = sel.args.get("having")
        having_pred = rewrite(having.this) if having is not None else None

        inp = self.node(input_id)
        if all(col_index(e) is not None for e in pre) and predicate is None:
            agg_input = input_id
            group_by = tuple(col_index(e) for e in group_exprs)
            agg_calls = [AggCall(f, col_index(pre[a]) if a is not None else None, d) for f, a, d in calls]
        else:
            pre_names = [inp.columns[col_index(e)] if col_index(e) is not None else f"$f{i}" for i, e in enumerate(pre)]
            agg_input = self.calc(input_id, pre, predicate, unique_names(pre_names), purpose="aggregate input")
            group_by = tuple(range(k))
            agg_calls = [AggCall(f, a, d) for f, a, d in calls]
        src = self.node(agg_input)
        name = self._stage_name("aggregate")
        group_names = [src.columns[i] for i in group_by]
        agg_names = [
            f"{c.func}({'DISTINCT ' if c.distinct else ''}{src.columns[c.arg] if c.arg is not None else '*'})"
            for c in agg_calls
        ]
        agg_types = [self._agg_type(c, src.types) for c in agg_calls]
        node = self._add(
            "aggregate", name, [agg_input], unique_names(group_names + [f"$agg{i}" for i in range(len(agg_calls))]),
            [src.types[i] for i in group_by] + agg_types,
            upsert_keys=frozenset({Key(range(k))}), changelog_mode="retract",
            stage=GroupAggregate(group_by, agg_calls, name=name, input_types=list(src.types)),
            detail={"group_by": group_names, "aggregates": agg_names},
        )  # fmt: skip
        return self.calc(node.id, post, having_pred, unique_names(names), purpose="select")

    def distinct(self, input_id: int) -> int:
        """SELECT DISTINCT: a group aggregate on every column with no aggregate call (a
        group's row is there while at least one input row is, as Flink plans it)."""
        from tidemark.engine.stages.aggregate import GroupAggregate

        src = self.node(input_id)
        name = self._stage_name("aggregate")
        group_by = tuple(range(src.width))
        node = self._add(
            "aggregate", name, [input_id], src.columns, src.types,
            upsert_keys=frozenset({Key(group_by)}), changelog_mode="retract",
            stage=GroupAggregate(group_by, [], name=name, input_types=list(src.types)),
            detail={"group_by": list(src.columns), "aggregates": []},
        )  # fmt: skip
        return node.id

    @staticmethod
    def _without_filter(node: exp.Expr) -> exp.Expr:
        """``AGG(x) FILTER (WHERE c)`` is ``AGG(CASE WHEN c THEN x END)``: every aggregate
        ignores NULLs, so the rows the filter drops do not count (``COUNT(*)`` counts 1s)."""
        if not isinstance(node, exp.Filter):
            return node
        agg, cond = node.this, node.expression.this

        def when(value: exp.Expr) -> exp.Expr:
            return exp.Case(ifs=[exp.If(this=cond.copy(), true=value.copy())])

        out = agg.copy()
        arg = out.this
        if isinstance(out, exp.Count) and (arg is None or isinstance(arg, exp.Star)):
            out.set("this", when(exp.Literal.number(1)))
        elif isinstance(arg, exp.Distinct):
            arg.set("expressions", [when(e) for e in arg.expressions])
        elif arg is not None:
            out.set("this", when(arg))
        return out

    def _agg_call(self, node: exp.Expr) -> tuple[str, exp.Expr | None, bool]:
        if isinstance(node, exp.Count):
            arg = node.this
            if isinstance(arg, exp.Star) or arg is None:
                return "COUNT_STAR", None, False
            if isinstance(arg, exp.Distinct):
                if len(arg.expressions) != 1:
                    raise sql_error("COUNT(DISTINCT ...) over several columns is not supported", node)
                return "COUNT", arg.expressions[0], True
            return "COUNT", arg, False
        func = _AGG_FUNCS.get(type(node))
        if func is None:
            raise sql_error(
                f"aggregate function {node.sql_name()} is not supported (SUM, COUNT, MIN, MAX, AVG, LAST_VALUE are)",
                node,
            )
        arg = node.this
        distinct = False
        if isinstance(arg, exp.Distinct):
            if len(arg.expressions) != 1:
                raise sql_error(f"{func}(DISTINCT ...) over several columns is not supported", node)
            arg, distinct = arg.expressions[0], True
        if arg is None or len([a for a in node.args.values() if isinstance(a, exp.Expr)]) > 1:
            raise sql_error(f"{func} takes exactly one argument", node)
        return func, arg, distinct

    @staticmethod
    def _agg_type(call: Any, types: list[SqlType | None]) -> SqlType | None:
        if call.func in ("COUNT", "COUNT_STAR"):
            return make_type("BIGINT")
        t = types[call.arg] if call.arg is not None else None
        if t is None:
            return None
        if call.func == "SUM" and t.name == "DECIMAL":
            return make_type("DECIMAL", (38, t.params[1]))
        if call.func == "AVG" and t.name == "DECIMAL":
            return make_type("DECIMAL", (38, max(6, t.params[1])))
        return t
