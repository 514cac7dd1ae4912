"""Stage construction for queries: SELECT, FROM items and projections (joins and
aggregates are planned by their own builders)."""

from __future__ import annotations

from sqlglot import exp

from tidemark.engine.expressions import UdfCall, col_ref
from tidemark.engine.planner.graph import NamedQuery, PlanGraph
from tidemark.engine.planner.pushdown import keeps_left_rows
from tidemark.engine.planner.rewrite import conjoin, conjuncts, unique_names
from tidemark.engine.planner.scope import Scope
from tidemark.engine.sql import describe, position_of, sql_error

_UNSUPPORTED_SELECT_ARGS = {
    "order": "ORDER BY in a streaming query",
    "limit": "LIMIT in a streaming query",
    "offset": "OFFSET",
    "windows": "WINDOW clauses",
    "qualify": "QUALIFY",
    "laterals": "LATERAL",
    "sample": "TABLESAMPLE",
    "connect": "CONNECT BY",
    "into": "SELECT INTO",
    "exclude": "SELECT * EXCLUDE",
    "prewhere": "PREWHERE",
    "cluster": "CLUSTER BY",
    "distribute": "DISTRIBUTE BY",
    "sort": "SORT BY",
    "settings": "SETTINGS",
    "format": "FORMAT",
    "locks": "locking clauses",
    "kind": "SELECT AS STRUCT/VALUE",
    "hint": "query hints",
    "operation_modifiers": "select modifiers",
}


#: functions refused before their arguments are resolved (see SelectPlanner.resolve)
_UNEVALUATED_FUNCS = (exp.Anonymous, exp.TimestampAdd, exp.TimestampDiff)


class SelectPlanner(PlanGraph):
    """Queries and FROM items; a join or aggregate it meets is planned by ``JoinPlanner``
    or ``AggregatePlanner``, which ``Planner`` combines with it."""

    def query(self, q: exp.Expr) -> int:
        """Plan a query; returns the node producing its rows (columns named as the query)."""
        if isinstance(q, exp.Subquery):
            return self.query(q.this)
        if not isinstance(q, (exp.Select, exp.SetOperation)):
            raise sql_error(f"unsupported query {describe(q)}", q)
        with_ = q.args.get("with_")
        if with_ is None:
            return self._query_body(q)
        if with_.args.get("recursive"):
            raise sql_error("WITH RECURSIVE is not supported", with_)
        named: dict[str, NamedQuery] = {}
        self.ctes.append(named)
        try:
            for cte in with_.expressions:
                alias = cte.args.get("alias")
                columns = [c.name for c in alias.columns] if alias is not None and alias.columns else None
                if cte.alias.lower() in named:
                    raise sql_error(f"WITH defines '{cte.alias}' twice", cte)
                named[cte.alias.lower()] = NamedQuery(cte.alias, columns, cte.this, cte)
            body = q.copy()
            body.set("with_", None)
            return self._query_body(body)
        finally:
            self.ctes.pop()

    def _query_body(self, q: exp.Expr) -> int:
        """A query without its WITH: a SELECT, or a set operation (``UnionPlanner``)."""
        return self.set_operation(q) if isinstance(q, exp.SetOperation) else self.select(q)

    def named_query(self, name: str) -> NamedQuery | None:
        """A CTE in scope (innermost first) or a view, by name; tables come after both."""
        for named in reversed(self.ctes):
            if name.lower() in named:
                return named[name.lower()]
        view = self.script.view(name)
        return None if view is None else NamedQuery(view.name, view.columns, view.query, view.node, is_view=True)

    def plan_named(self, named: NamedQuery, where: exp.Expr) -> int:
        """Plan a CTE or view where it is read (as Flink inlines views), renamed to its column list."""
        if named.name.lower() in self.expanding:
            raise sql_error(f"'{named.name}' refers to itself (recursive views and CTEs are not supported)", where)
        self.expanding.append(named.name.lower())
        outer = self.ctes
        # a view sees tables and other views, never the CTEs of the query that reads it
        self.ctes = [] if named.is_view else outer
        try:
            node_id = self.query(named.query)
        finally:
            self.ctes = outer
            self.expanding.pop()
        if named.columns is None:
            return node_id
        n = self.node(node_id)
        if len(named.columns) != n.width:
            raise sql_error(
                f"'{named.name}' lists {len(named.columns)} column names but its query gives {n.width} columns",
                named.where,
            )
        return self.calc(node_id, [col_ref(i) for i in range(n.width)], None, unique_names(named.columns), purpose="rename")

    def select(self, sel: exp.Select) -> int:
        for arg, what in _UNSUPPORTED_SELECT_ARGS.items():
            value = sel.args.get(arg)
            if value:
                where = value if isinstance(value, exp.Expr) and position_of(value)[0] is not None else sel
                raise sql_error(f"{what} is not supported", where)
        for node in sel.walk():
            if (isinstance(node, exp.Window) and node.parent_select is sel and node not in self.rank_items(sel)
                    and node not in self.over_items(sel)):
                raise sql_error(f"window function {describe(node)} is not supported", node)
            if isinstance(node, (exp.Subquery, exp.Exists)) and node is not sel and not self._is_from_item(node, sel):
                raise sql_error(f"subquery in an expression ({describe(node)}) is not supported; use a join", node)
        where = sel.args.get("where")
        pending = conjuncts(where.this) if where is not None else []
        for agg in (a for c in pending for a in c.find_all(exp.AggFunc)):
            raise sql_error(f"aggregate {describe(agg)} is not allowed in WHERE; use HAVING", agg)
        taken = list(pending)
        scope, node_id = self.from_clause(sel, pending)
        for conj in taken:
            self.resolve(conj, scope)  # a comma join's condition must also be unambiguous in the whole FROM
        if len(pending) == len(taken):  # no comma join took a conjunct: the WHERE as written
            predicate = self.resolve(where.this, scope) if where is not None else None
        else:
            predicate = conjoin([self.resolve(c, scope) for c in pending])

        predicate = self.bound_rank(sel, scope, node_id, predicate)
        if self.over_items(sel):
            return self.over(sel, scope, node_id, predicate)
        if self.rank_items(sel):
            return self.rank(sel, scope, node_id, predicate)

        group = sel.args.get("group")
        has_aggs = any(self._find_aggs(e) for e in sel.expressions) or sel.args.get("having") is not None
        distinct = sel.args.get("distinct")
        if distinct is not None and distinct.args.get("on") is not None:
            raise sql_error("SELECT DISTINCT ON is not supported", sel)
        if distinct is not None and (group is not None or has_aggs):
            raise sql_error("SELECT DISTINCT with GROUP BY or aggregates is not supported; drop DISTINCT or nest the query", sel)
        if group is not None or has_aggs:
            return self.aggregate(sel, scope, node_id, predicate)

        projections, names = self.projections(sel, scope)
        node_id = self.calc(node_id, projections, predicate, names, purpose="select")
        return node_id if distinct is None else self.distinct(node_id)

    @staticmethod
    def _is_from_item(node: exp.Expr, sel: exp.Select) -> bool:
        parent = node.parent
        while parent is not None and parent is not sel:
            if isinstance(parent, (exp.From, exp.Join)):
                return True
            if isinstance(parent, exp.Select):
                return False
            parent = parent.parent
        return False

    def from_clause(self, sel: exp.Select, pending: list[exp.Expr]) -> tuple[Scope, int]:
        from_ = sel.args.get("from_")
        if from_ is None:
            raise sql_error("SELECT without FROM is not supported: a pipeline reads tables", sel)
        scope = Scope()
        node_id = self.relation(from_.this, scope)
        joins = sel.args.get("joins") or []
        for k, join in enumerate(joins):
            # a WHERE conjunct may move below this join only if every later join keeps its rows
            rows_kept = all(keeps_left_rows(later) for later in joins[k + 1:])
            node_id = self.join(join, scope, node_id, pending, push_filters=rows_kept)
        return scope, node_id

    def relation(self, item: exp.Expr, scope: Scope) -> int:
        if isinstance(item, exp.Table):
            if item.args.get("db") or item.args.get("catalog"):
                raise sql_error(f"qualified table names ({item.sql()}) are not supported", item)
            if isinstance(item.this, exp.Func) or not isinstance(item.this, exp.Identifier):
                raise sql_error(f"table function {describe(item)} is not supported", item)
            if item.args.get("version") is not None:
                raise sql_error(
                    f"{item.name} FOR SYSTEM_TIME AS OF ... (a temporal join) is not supported yet; "
                    "a regular join would compute something else, so it is refused",
                    item.args["version"],
                )
            named = self.named_query(item.name)
            if named is not None:
                shared = self.shared_view(named.name) if named.is_view else None
                node_id = shared if shared is not None else self.plan_named(named, item)
                if named.is_view:
                    self.share_view(named.name, node_id)
                n = self.node(node_id)
                scope.add(item.alias or named.name, n.columns, n.types, item)
                return node_id
            table = self.script.table(item.name)
            if table is None:
                raise sql_error(f"unknown table '{item.name}' (declare it with CREATE TABLE)", item)
            node_id = self.source(table)
            alias = item.alias or table.name
            n = self.node(node_id)  # the table's columns, computed ones included
            scope.add(alias, n.columns, n.types, item)
            return node_id
        if isinstance(item, exp.Subquery):
            node_id = self.query(self.without_proctime(item))  # LookupPlanner: PROCTIME() AS name
            n = self.node(node_id)
            scope.add(item.alias, n.columns, n.types, item)
            return node_id
        raise sql_error(f"unsupported FROM item {describe(item)}", item)


    def resolve(self, e: exp.Expr, scope: Scope) -> exp.Expr:
        """Rewrite column references into positional references over the scope's row.
        A function Tidemark does not evaluate is named first: its unit arguments
        (``TIMESTAMPADD(HOUR, ...)``) would otherwise read as unknown columns."""

        def sub(node: exp.Expr) -> exp.Expr:
            if isinstance(node, exp.Anonymous) and self.script.function(node.name) is not None:
                return self.udf_call(node, scope)
            if isinstance(node, _UNEVALUATED_FUNCS):
                name = node.name.upper() if isinstance(node, exp.Anonymous) else node.sql_name()
                raise sql_error(f"unsupported function {name}()", node)
            if isinstance(node, exp.Column):
                if isinstance(node.this, exp.Star):
                    raise sql_error("* is only allowed as a whole select item", node)
                ref = col_ref(scope.resolve(node))
                where = node.find(exp.Identifier)
                if where is not None and where.meta:  # errors found later still point at the column
                    ref.this.meta.update(where.meta)
                return ref
            return node

        return e.transform(sub, copy=True)

    def udf_call(self, node: exp.Anonymous, scope: Scope) -> exp.Expr:
        """A call of a function declared with CREATE FUNCTION, its arguments resolved."""
        from tidemark.udf import UdfError, check_arity

        fn = self.script.function(node.name)
        assert fn is not None
        if not node.expressions:
            raise sql_error(f"function {node.name}() needs at least one argument (it is called on whole columns)", node)
        try:
            check_arity(fn.path, len(node.expressions))
        except UdfError as e:
            raise sql_error(f"function {node.name}(): {e}", node) from None
        args = [self.resolve(a, scope) for a in node.expressions]
        call = UdfCall(this=exp.Identifier(this=node.name), path=exp.Literal.string(fn.path), expressions=args)
        call.meta.update(node.meta)
        return call

    def projections(self, sel: exp.Select, scope: Scope) -> tuple[list[exp.Expr], list[str]]:
        projections: list[exp.Expr] = []
        names: list[str] = []
        for i, item in enumerate(sel.expressions):
            if isinstance(item, exp.Star):
                for n, pos in scope.star(None, item):
                    projections.append(col_ref(pos))
                    names.append(n)
                continue
            if isinstance(item, exp.Column) and isinstance(item.this, exp.Star):
                for n, pos in scope.star(item.table, item):
                    projections.append(col_ref(pos))
                    names.append(n)
                continue
            inner = item.this if isinstance(item, exp.Alias) else item
            projections.append(self.resolve(inner, scope))
            names.append(self._item_name(item, i))
        return projections, unique_names(names)

    @staticmethod
    def _item_name(item: exp.Expr, i: int) -> str:
        if isinstance(item, exp.Alias):
            return item.alias
        if isinstance(item, exp.Column):
            return item.name
        return f"EXPR${i}"

    @staticmethod
    def _find_aggs(e: exp.Expr) -> list[exp.Expr]:
        return [n for n in e.walk() if isinstance(n, exp.AggFunc)]
