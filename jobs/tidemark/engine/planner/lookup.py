"""Stage construction for lookup joins: ``FROM s [LEFT] JOIN dim FOR SYSTEM_TIME AS OF
s.proc_time [AS d] ON <stream expression> = d.col [AND ...]`` (``stages.lookup_join``).

What the planner checks, each refusal naming the construct and its position:

- the time attribute is processing time: a table's ``name AS PROCTIME()`` attribute, a FROM
  subquery's ``PROCTIME() AS name`` item, or a column a query computes as ``PROCTIME()``; any other column would make it an event-time
  temporal join, which is refused (it needs versioned dimension state and watermarks);
- the dimension is a table with a PRIMARY KEY (its rows are kept per key, as the index
  service keeps a compacted topic's), joined INNER or LEFT;
- ON holds at least one equality between a dimension column and an expression over the
  stream's columns; every other condition is evaluated on the joined row.

The stage knows which index of the dimension its join key covers, so a host with an index
service can look the dimension up there instead of keeping it in state.

Upsert keys follow the regular join's rule (``keys.join_keys``): the stage repartitions
the stream by the join key as a join does. The output is append-only when the stream is:
dimension changes never emit.
"""

from __future__ import annotations

from sqlglot import exp

from tidemark.engine.catalog import TableDef
from tidemark.engine.errors import SqlError
from tidemark.engine.expressions import RowPredicate, check_supported, col_index, referenced_columns, to_spark_sql
from tidemark.engine.planner.graph import PlanGraph
from tidemark.engine.planner.keys import join_keys
from tidemark.engine.planner.node import Key
from tidemark.engine.planner.rewrite import conjoin, conjuncts, unique_names
from tidemark.engine.planner.scope import Scope
from tidemark.engine.sql import describe, is_proctime_call, sql_error
from tidemark.index_client.store import PRIMARY


class LookupPlanner(PlanGraph):
    """Lookup joins; ``JoinPlanner.join`` hands over a JOIN whose table has ``FOR SYSTEM_TIME``."""

    def lookup_join(self, join: exp.Join, scope: Scope, left_id: int) -> int:
        item: exp.Table = join.this
        version: exp.Version = item.args["version"]
        side = (join.text("side") or "").upper()
        kind = (join.text("kind") or "").upper()
        if join.args.get("method") or kind not in ("", "INNER", "OUTER") or side not in ("", "LEFT"):
            what = " ".join(w for w in (side, kind) if w) or join.text("method").upper()
            raise sql_error(f"{what} JOIN ... FOR SYSTEM_TIME AS OF is not supported: a lookup join is INNER or LEFT", join)
        if version.text("kind").upper() != "AS OF":
            raise sql_error(f"{item.name} FOR SYSTEM_TIME {version.text('kind').upper()} is not supported (AS OF is)", version)
        on = join.args.get("on")
        if on is None:
            raise sql_error(f"lookup join with {item.name} needs ON <stream expression> = {item.name}.<column>", item)
        self._check_processing_time(item, version.expression, scope, join, left_id)
        table = self.script.table(item.name)
        if table is None:
            what = "a view or CTE" if self.named_query(item.name) is not None else "not a declared table"
            raise sql_error(f"lookup join: '{item.name}' is {what}; FOR SYSTEM_TIME AS OF reads a table", item)
        if not table.primary_key:
            raise sql_error(
                f"lookup join: table '{table.name}' has no PRIMARY KEY (its rows are kept per primary key, "
                "as a compacted topic holds them)",
                item,
            )
        left = self.node(left_id)
        left_width = scope.width
        dim_id = self.source(table)
        scope.add(item.alias or table.name, table.column_names, table.types, item)
        condition = self.resolve(on, scope)
        stream_key: list[exp.Expr] = []
        dim_key: list[int] = []
        residual: list[exp.Expr] = []
        for conj in conjuncts(condition):
            pair = _key_pair(conj, left_width) if isinstance(conj, exp.EQ) else None
            if pair is None:
                residual.append(conj)
            else:
                stream_key.append(pair[0])
                dim_key.append(pair[1])
        if not dim_key:
            raise sql_error(
                f"lookup join condition {describe(on)} has no equality between a column of '{table.name}' and "
                "an expression of the stream",
                on,
            )
        for e in [*stream_key, *residual]:
            check_supported(e)
        res_expr = conjoin(residual)
        join_type = "left" if side == "LEFT" else "inner"
        from tidemark.engine.stages.lookup_join import LookupJoin

        name = self._stage_name("lookup_join")
        index = _covered_index(table, dim_key)
        stage = LookupJoin(
            join_type, stream_key, tuple(dim_key), len(table.columns),
            residual=RowPredicate(res_expr) if res_expr is not None else None, table=table.name,
            index=index, name=name,
        )  # fmt: skip
        plain = [col_index(e) for e in stream_key]
        stream_cols = Key(plain) if None not in plain else Key(range(left_width))
        dim = self.node(dim_id)
        keys = join_keys(join_type, left.upsert_keys, dim.upsert_keys, stream_cols, Key(dim_key), left_width)
        names = unique_names(scope.names)
        node = self._add(
            "lookup_join", name, [left_id, dim_id], names, scope.types,
            upsert_keys=keys, changelog_mode="append" if left.changelog_mode == "append" else "retract", stage=stage,
            detail={
                "join_type": join_type,
                "table": table.name,
                "on": [f"{to_spark_sql(e, names)} = {names[left_width + d]}" for e, d in zip(stream_key, dim_key)],
                "residual": to_spark_sql(res_expr, names) if res_expr is not None else None,
                "index": index[0] if index is not None else None,
            },
        )  # fmt: skip
        return node.id

    def _check_processing_time(
        self, item: exp.Table, attr: exp.Expr, scope: Scope, join: exp.Join, left_id: int
    ) -> None:
        """``attr`` must be a processing-time attribute (module docstring)."""
        if isinstance(attr, exp.Column) and (
            self.declared_proctime(attr, join.parent, skip=join.this) or self._computed_proctime(attr, scope, left_id)
        ):
            return
        raise sql_error(
            f"{item.name} FOR SYSTEM_TIME AS OF ... (a temporal join) is not supported yet on event time: "
            f"{describe(attr)} is not a processing-time attribute (declare it `name AS PROCTIME()` or select "
            "PROCTIME() AS name); only lookup joins, on processing time, are",
            attr,
        )

    def without_proctime(self, sub: exp.Subquery) -> exp.Expr:
        """The query of a FROM subquery, without its ``PROCTIME() AS name`` items: such an
        item declares the subquery's processing-time attribute (as Nexmark's q13 writes
        ``(SELECT *, PROCTIME() AS p_time FROM bid) B``), which, like a table's, is no column
        and may only be named in ``FOR SYSTEM_TIME AS OF``."""
        q = sub.this
        if not isinstance(q, exp.Select):
            return q
        items = [e for e in q.expressions if isinstance(e, exp.Alias) and is_proctime_call(e.this)]
        if not items:
            return q
        self.derived_proctime[id(sub)] = items[-1].alias
        q = q.copy()
        q.set("expressions", [e for e in q.expressions if not (isinstance(e, exp.Alias) and is_proctime_call(e.this))])
        return q

    def declared_proctime(self, attr: exp.Column, sel: exp.Select, skip: exp.Expr | None = None) -> bool:
        """Whether ``attr`` is a table's ``name AS PROCTIME()`` attribute, or a FROM
        subquery's ``PROCTIME() AS name`` item, read through its name or alias in the FROM of
        ``sel`` (the relation ``skip`` aside: a lookup join's dimension table)."""
        items = [sel.args["from_"].this, *(j.this for j in sel.args.get("joins") or [])]
        for t in items:
            if t is skip:
                continue
            if isinstance(t, exp.Table):
                table = self.script.table(t.name)
                declared = self.script.proctime.get(table.name) if table is not None else None
            else:
                declared = self.derived_proctime.get(id(t))
            named_here = not attr.table or attr.table.lower() == (t.alias or t.name).lower()
            if declared is not None and named_here and declared.lower() == attr.name.lower():
                return True
        return False

    def _computed_proctime(self, attr: exp.Column, scope: Scope, left_id: int) -> bool:
        """A column of the stream computed as ``PROCTIME()`` by a query (a calc), followed
        back through the stages between that calc and this join."""
        try:
            pos = scope.resolve(attr)
        except SqlError:  # not a column of the stream: not a time attribute
            return False
        node = self.node(left_id)
        while True:
            if node.kind == "calc" and node.stage.projections is not None:
                e = node.stage.projections[pos]
                if is_proctime_call(e):
                    return True
                if col_index(e) is None:
                    return False
                pos = col_index(e)
            elif node.kind in ("join", "lookup_join"):
                left_width = self.node(node.inputs[0]).width
                if pos >= left_width:
                    return False  # a time attribute of a joined table: not the stream's
            elif node.kind != "calc":
                return False
            node = self.node(node.inputs[0])


def _covered_index(table: TableDef, dim_key: list[int]) -> tuple[str, tuple[int, ...]] | None:
    """The dimension's index (``delta_plan.declared_indexes``) whose columns the join key
    holds, primary key first, as (name, positions in the join key); None without one."""
    from tidemark.engine.delta_plan import declared_indexes

    names = [table.column_names[d] for d in dim_key]
    fitting = [(n, cols) for n, cols in declared_indexes(table).items() if set(cols) <= set(names)]
    if not fitting:
        return None
    name, cols = min(fitting, key=lambda f: (f[0] != PRIMARY, len(f[1]), f[0]))
    return name, tuple(names.index(c) for c in cols)


def _key_pair(conj: exp.EQ, left_width: int) -> tuple[exp.Expr, int] | None:
    """``stream expression = dim column`` (either way round) as (expression, dim position)."""
    for dim_side, stream_side in ((conj.expression, conj.this), (conj.this, conj.expression)):
        d = col_index(dim_side)
        refs = referenced_columns(stream_side)
        if d is not None and d >= left_width and refs and max(refs) < left_width:
            return stream_side, d - left_width
    return None
