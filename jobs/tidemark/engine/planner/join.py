"""Stage construction for joins: equi-join keys, the residual condition, and the choice
between a regular and a delta join."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlglot import exp

from tidemark.engine import limits
from tidemark.engine.catalog import TableDef
from tidemark.engine.errors import PlanError, SqlError
from tidemark.engine.expressions import RowPredicate, check_supported, col_index, referenced_columns, to_spark_sql
from tidemark.engine.planner.graph import PlanGraph
from tidemark.engine.planner.keys import join_keys
from tidemark.engine.planner.node import Key, Node
from tidemark.engine.planner.pushdown import JOIN_TYPES, split_for_join
from tidemark.engine.planner.rewrite import conjoin, conjuncts, unique_names
from tidemark.engine.planner.scope import Scope
from tidemark.engine.sql import describe, position_of, sql_error
from tidemark.engine.types import SqlType

if TYPE_CHECKING:
    import pyarrow as pa


class JoinPlanner(PlanGraph):
    """Joins: ON or a comma join's WHERE conditions become equi keys plus a residual."""

    def join(self, join: exp.Join, scope: Scope, left_id: int, pending: list[exp.Expr] | None = None,
             push_filters: bool = False) -> int:
        """Plan one JOIN. ``pending`` holds the WHERE conjuncts not yet placed: a comma join
        (``FROM a, b WHERE a.id = b.id``) takes those that refer to its right side and to
        nothing not yet joined as its condition, which is the same inner join as ON. With
        ``push_filters`` (the joins after this one keep its rows), those that read one
        input only and cannot fail become a filter on that input (``pushdown``)."""
        if isinstance(join.this, exp.Table) and join.this.args.get("version") is not None:
            return self.lookup_join(join, scope, left_id)  # FOR SYSTEM_TIME AS OF: LookupPlanner
        side = (join.text("side") or "").upper()
        kind = (join.text("kind") or "").upper()
        if join.args.get("method"):
            raise sql_error(f"{join.text('method').upper()} JOIN is not supported", join)
        if kind in ("SEMI", "ANTI", "CROSS") or kind not in ("", "INNER", "OUTER"):
            raise sql_error(f"{kind} JOIN is not supported", join)
        if join.args.get("using"):
            raise sql_error("JOIN ... USING is not supported; write ON a.col = b.col", join)
        on = join.args.get("on")
        comma = on is None and not side and not kind
        if on is None and not comma:
            raise sql_error(f"a {side} JOIN without ON is not supported; equi-joins only", join.this)
        join_type = JOIN_TYPES.get(side)
        if join_type is None:
            raise sql_error(f"{side} JOIN is not supported", join)
        left_width = scope.width
        right_id = self.relation(join.this, scope)
        if scope.width > limits.COLUMNS.value:
            raise limits.COLUMNS.refuse(f"the join is {scope.width} columns wide", *position_of(join.this))
        if comma:
            on, condition = self._comma_condition(join, scope, left_width, pending if pending is not None else [])
        else:
            condition = self.resolve(on, scope)
        lkeys: list[int] = []
        rkeys: list[int] = []
        residual: list[exp.Expr] = []
        for conj in conjuncts(condition):
            if isinstance(conj, exp.EQ):
                a, b = col_index(conj.this), col_index(conj.expression)
                if a is not None and b is not None:
                    if a < left_width <= b:
                        lkeys.append(a), rkeys.append(b - left_width)
                        continue
                    if b < left_width <= a:
                        lkeys.append(b), rkeys.append(a - left_width)
                        continue
            residual.append(conj)
        if not lkeys:
            raise sql_error(
                f"join condition {describe(on)} has no equality between a column of each side; "
                "only equi-joins are supported (non-equi conditions may be added with AND)",
                on,
            )
        pushed: dict[str, str] = {}
        if push_filters and pending:
            left_id, right_id, pushed = self._push_filters(pending, scope, left_width, join_type, left_id, right_id)
        left, right = self.node(left_id), self.node(right_id)
        res_expr = conjoin(residual)
        if res_expr is not None:
            check_supported(res_expr)
        from tidemark.engine.stages.join import Join

        name = self._stage_name("join")
        names = unique_names(scope.names)
        types = scope.types
        stage = Join(
            join_type, tuple(lkeys), tuple(rkeys), left.width, right.width,
            residual=RowPredicate(res_expr) if res_expr is not None else None, name=name,
            input_schemas=_input_schemas(names, left.types, right.types),
        )  # fmt: skip
        keys = join_keys(
            join_type, left.upsert_keys, right.upsert_keys, Key(lkeys), Key(rkeys), left.width
        )
        appendish = left.changelog_mode == "append" and right.changelog_mode == "append" and join_type == "inner"
        node = self._add(
            "join", name, [left_id, right_id], names, types,
            upsert_keys=keys, changelog_mode="append" if appendish else "retract", stage=stage,
            detail={
                "join_type": join_type,
                "on": [f"{names[a]} = {names[left.width + b]}" for a, b in zip(lkeys, rkeys)],
                "residual": to_spark_sql(res_expr, names) if res_expr is not None else None,
                # the stored rows are the filtered ones: a checkpoint of the join without the
                # filters holds others (``tidemark.engine.fingerprint`` compares the detail)
                **({"filtered_inputs": pushed} if pushed else {}),
            },
        )  # fmt: skip
        self._choose_delta_join(node, left, right, lkeys, rkeys)
        return node.id

    def _push_filters(self, pending: list[exp.Expr], scope: Scope, left_width: int, join_type: str,
                      left_id: int, right_id: int) -> tuple[int, int, dict[str, str]]:
        """Move the ``pending`` WHERE conjuncts ``pushdown.split_for_join`` allows into a
        filter on the join's inputs; returns the inputs' new node ids and each moved
        filter as SQL, by side."""
        written: list[exp.Expr] = []
        resolved: list[exp.Expr] = []
        for conj in pending:
            try:
                resolved.append(self.resolve(conj, scope))
            except SqlError:
                continue  # refers to a table joined later (or is wrong: reported with the WHERE)
            written.append(conj)
        moved, to_left, to_right = split_for_join(resolved, scope.types, left_width, join_type)
        gone = {id(written[i]) for i in moved}
        pending[:] = [c for c in pending if id(c) not in gone]
        inputs = {"left": left_id, "right": right_id}
        pushed: dict[str, str] = {}
        for side, parts in (("left", to_left), ("right", to_right)):
            predicate = conjoin(parts)
            if predicate is not None:
                pushed[side] = to_spark_sql(predicate, self.node(inputs[side]).columns)
                inputs[side] = self.calc(inputs[side], None, predicate, None, purpose="filter pushed below a join")
        return inputs["left"], inputs["right"], pushed

    def _comma_condition(
        self, join: exp.Join, scope: Scope, left_width: int, pending: list[exp.Expr]
    ) -> tuple[exp.Expr, exp.Expr]:
        """Move the WHERE conjuncts this comma join can evaluate (all their columns joined
        by now, one on its right side) from ``pending`` into its condition: (as written, resolved)."""
        written: list[exp.Expr] = []
        taken: list[exp.Expr] = []
        for conj in list(pending):
            try:
                resolved = self.resolve(conj, scope)
            except SqlError as e:
                if "ambiguous" in str(e):
                    raise
                continue  # refers to a table joined later (or is wrong: reported with the WHERE)
            if any(i >= left_width for i in referenced_columns(resolved)):
                written.append(conj)
                taken.append(resolved)
                pending.remove(conj)
        condition = conjoin(taken)
        if condition is None:
            raise sql_error(
                f"comma join with {describe(join.this)} has no join condition in WHERE (a cross join); "
                "add an equality between a column of each side",
                join.this,
            )
        return conjoin(written), condition

    def _choose_delta_join(self, node: Node, left: Node, right: Node, lkeys: list[int], rkeys: list[int]) -> None:
        """Delta join or regular join (``tidemark.engine.delta_plan`` has the rules)."""
        from tidemark.engine import delta_plan as dp
        from tidemark.engine.stages.delta_join import DeltaJoin

        opts = dp.read_options(self.script.options)
        node.detail["strategy"] = "regular"
        if opts.strategy == "NONE":
            node.detail["strategy_reason"] = f"SET '{dp.STRATEGY}' = 'NONE'"
            return
        join_type = node.detail["join_type"]
        try:
            q = dp.qualify(self, join_type, left.id, right.id, lkeys, rkeys, opts)
        except dp.NotQualified as e:
            self._not_delta(node, str(e), opts.strategy)
            return
        regular = node.stage
        node.stage = DeltaJoin(
            join_type, tuple(lkeys), tuple(rkeys), left.width, right.width, residual=regular.residual,
            sides=(q.left.side, q.right.side), consistency=opts.consistency, cache_enabled=opts.cache_enabled,
            cache_sizes=opts.cache_sizes, name=node.name,
        )  # fmt: skip
        node.detail.update(strategy="delta", strategy_reason=q.why, delta_join=node.stage.describe())
        if opts.consistency == "eventual":
            self._delta_fallback[node.id] = (regular, node.changelog_mode, node.upsert_keys)
            node.changelog_mode = "upsert"
            # (left PK, right PK) identifies an output row; equal join columns may stand in for each other
            same = {left.width + r: lk for lk, r in zip(lkeys, rkeys)}
            right_pk = [p + left.width for p in q.right.pk_positions]
            pairs = {Key(q.left.pk_positions) | Key(right_pk), Key(q.left.pk_positions) | Key(same.get(p, p) for p in right_pk)}
            node.upsert_keys = node.upsert_keys | pairs

    def _not_delta(self, node: Node, reason: str, strategy: str) -> None:
        from tidemark.engine import delta_plan as dp

        if strategy == "FORCE":
            raise PlanError(
                f"SET '{dp.STRATEGY}' = 'FORCE': join [{node.id}] ON {' AND '.join(node.detail['on'])} "
                f"cannot be a delta join: {reason}"
            )
        node.detail["strategy"] = "regular"
        node.detail["strategy_reason"] = f"not a delta join: {reason}"

    def _check_eventual_delta(self, query_out: int, sink: TableDef) -> bool:
        """Downstream rules of eventual delta joins (known only now); a join failing them
        goes back to a regular join (AUTO) or fails planning (FORCE). True when an
        eventual delta join feeds the sink."""
        from tidemark.engine import delta_plan as dp

        feeding = False
        for join_id, (regular, mode, keys) in list(self._delta_fallback.items()):
            node = self.node(join_id)
            try:
                dp.check_downstream(self, join_id, query_out, sink)
            except dp.NotQualified as e:
                node.stage, node.changelog_mode, node.upsert_keys = regular, mode, keys
                node.detail.pop("delta_join", None)
                self._not_delta(node, str(e), dp.read_options(self.script.options).strategy)
                continue
            feeding = True
            n = self.node(query_out)
            while n.id != join_id:  # calcs between the join and the sink carry its upsert stream
                n.changelog_mode = "upsert"
                n = self.node(n.inputs[0])
        return feeding


def _input_schemas(names: list[str], left: list[SqlType | None], right: list[SqlType | None]) -> tuple[pa.Schema, pa.Schema] | None:
    """Each side's columns as Arrow types, named as the join's output names them (unique), for
    the join's batch kernel; None when a column's type is unknown (the join then runs per key)."""
    if any(t is None for t in (*left, *right)):
        return None
    import pyarrow as pa  # here: a plan without a join does not load it

    from tidemark.engine.arrow_types import arrow_type

    try:
        fields = [pa.field(n, arrow_type(t)) for n, t in zip(names, (*left, *right))]
    except ValueError:
        return None
    return pa.schema(fields[: len(left)]), pa.schema(fields[len(left):])
