"""Stage construction for OVER aggregations: ``agg(x) OVER (PARTITION BY k ORDER BY ts
ROWS|RANGE BETWEEN ... PRECEDING AND CURRENT ROW)`` items of a SELECT, as Flink plans them.

The SELECT becomes a calc (its input's columns, then the partition keys and call arguments
that are expressions), the ``OverAggregate`` stage (``tidemark.engine.stages.over``), which
appends one column per call, and a calc of the SELECT items over that. Flink's rules, each
refused with its reason at the construct: ORDER BY one event-time attribute ascending (a
column with ``WATERMARK FOR`` on its table, passed on unchanged), a frame that ends at the
current row, every OVER item of the SELECT on the same window, and an insert-only input
(OVER aggregation never retracts what it emitted).
"""

from __future__ import annotations

from sqlglot import exp

from tidemark.engine.expressions import col_index, col_ref
from tidemark.engine.intervals import interval_ms
from tidemark.engine.planner.graph import PlanGraph
from tidemark.engine.planner.rewrite import unique_names
from tidemark.engine.planner.scope import Scope
from tidemark.engine.sql import describe, sql_error

#: the aggregate functions an OVER item may call
_OVER_AGGS = (exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max)


class OverPlanner(PlanGraph):
    """OVER aggregate items of a SELECT (module docstring)."""

    @staticmethod
    def over_items(sel: exp.Select) -> list[exp.Window]:
        """The OVER aggregate calls among the SELECT's items (ROW_NUMBER is a rank's)."""
        return [
            w for item in sel.expressions for w in item.find_all(exp.Window)
            if isinstance(w.this, _OVER_AGGS) and w.parent_select is sel
        ]  # fmt: skip

    def over(self, sel: exp.Select, scope: Scope, input_id: int, predicate: exp.Expr | None) -> int:
        """The SELECT with OVER items: input calc, the OVER stage, the items over its output."""
        from tidemark.engine.stages.over import OverAggregate

        windows = self.over_items(sel)
        first = windows[0]
        if sel.args.get("group") is not None or sel.args.get("having") is not None or any(
            a for e in sel.expressions for a in self._find_aggs(e) if a.find_ancestor(exp.Window) is None
        ):
            raise sql_error("an OVER aggregation in a SELECT with GROUP BY or aggregates is not supported; nest the query", first)
        if sel.args.get("distinct") is not None:
            raise sql_error("SELECT DISTINCT with an OVER aggregation is not supported; nest the query", first)
        if self.rank_items(sel):  # type: ignore[attr-defined]  (RankPlanner, a sibling base of Planner)
            raise sql_error("ROW_NUMBER() and an OVER aggregation in one SELECT are not supported; nest the query", first)
        shape = self._window_shape(first)
        for w in windows[1:]:
            if self._window_shape(w) != shape:
                raise sql_error(
                    "all OVER aggregations of one SELECT must be computed on the same window "
                    f"(Flink's rule); {describe(w)} differs from the first", w,
                )  # fmt: skip
        projections = [col_ref(i) for i in range(scope.width)]
        names = list(scope.names)

        def slot(e: exp.Expr) -> int:
            resolved = self.resolve(e, scope)
            if resolved not in projections:
                projections.append(resolved)
                names.append(f"$over{len(projections)}")
            return projections.index(resolved)

        time_index, sources = self._time_order(first, scope, input_id)
        partition = [slot(p) for p in first.args.get("partition_by") or []]
        calls = self._calls(windows, slot)
        calc_id = self.calc(input_id, projections, predicate, unique_names(names), purpose="over input")
        src = self.node(calc_id)
        call_list = list(dict.fromkeys(calls.values()))
        result_types = [self._agg_type(c, src.types) for c in call_list]  # type: ignore[attr-defined]
        name = self._stage_name("over")
        frame = shape[2]
        stage = OverAggregate(partition, time_index, frame, call_list, sources, src.types, result_types, name=name)
        node = self._add(
            "over_aggregate", name, [calc_id], [*src.columns, *[f"$over_agg{i}" for i in range(len(call_list))]],
            [*src.types, *result_types], upsert_keys=src.upsert_keys, changelog_mode="append", stage=stage,
            detail={"partition_by": [src.columns[i] for i in partition], "order_by": src.columns[time_index],
                    "frame": frame.describe(), "watermark_of": sorted(sources),
                    "aggregates": [f"{c.func}({src.columns[c.arg] if c.arg is not None else '*'})" for c in call_list]},
        )  # fmt: skip
        items = sel.copy()  # the same tree: its OVER items in the same order
        at = {id(c): src.width + call_list.index(calls[w]) for w, c in zip(windows, self.over_items(items))}
        items.set("expressions", [e.transform(lambda n: _placeholder(n, at), copy=False) for e in items.expressions])
        out, out_names = self.projections(items, scope)  # type: ignore[attr-defined]
        out = [e.transform(_from_placeholder, copy=False) for e in out]
        return self.calc(node.id, out, None, unique_names(out_names), purpose="select")

    # ------------------------------------------------------------------ helpers

    def _time_order(self, window: exp.Window, scope: Scope, input_id: int) -> tuple[int, set[str]]:
        """The ORDER BY column (an input position) and the sources whose watermark it carries,
        checked as Flink checks them: an event-time attribute, over an insert-only input."""
        order = window.args["order"].expressions[0]
        if isinstance(order.this, exp.Column) and order.this.name.lower() in {
            a.lower() for a in self.script.proctime.values()
        }:
            raise sql_error(
                f"OVER ... ORDER BY {order.this.name}: processing-time OVER aggregations are not supported yet "
                "(order by an event-time attribute: a column with WATERMARK FOR on its table)",
                order,
            )
        time_index = col_index(self.resolve(order.this, scope))
        sources = self._time_attribute(input_id, time_index) if time_index is not None else None
        if time_index is None or sources is None:
            raise sql_error(
                f"OVER windows' ordering in stream mode must be defined on a time attribute: {describe(order.this)} "
                "is not one here (an event-time attribute is a column with WATERMARK FOR on its table, passed on "
                "unchanged; a join or aggregate makes it an ordinary TIMESTAMP, as in Flink; processing-time OVER "
                "aggregations are not supported yet)",
                order,
            )
        inp = self.node(input_id)
        if inp.changelog_mode != "append":
            raise sql_error(
                f"an OVER aggregation needs an insert-only input, and '{inp.name}' produces update and delete "
                "changes (Flink's rule: OverAggregate doesn't support consuming update and delete changes)",
                window,
            )
        return time_index, sources

    def _window_shape(self, w: exp.Window) -> tuple:
        """What makes two OVER items one window: partition, order and frame (checked here)."""
        from tidemark.engine.stages.over import Frame

        order = w.args.get("order")
        if order is None or len(order.expressions) != 1:
            raise sql_error(
                f"window function {describe(w)} is not supported: an OVER aggregation needs ORDER BY "
                "exactly one time attribute (Flink's rule)", w,
            )  # fmt: skip
        ordered = order.expressions[0]
        if ordered.args.get("desc"):
            raise sql_error("OVER windows' ordering in stream mode must be ascending on a time attribute", ordered)
        spec = w.args.get("spec")
        if spec is None:
            frame = Frame("RANGE", None)  # the SQL default with ORDER BY
        else:
            end = spec.args.get("end")
            if end not in (None, "CURRENT ROW"):
                side = spec.args.get("end_side") or ""
                raise sql_error(
                    f"an OVER frame must end at CURRENT ROW, not {end if isinstance(end, str) else describe(end)} "
                    f"{side}".rstrip() + " (Flink runs PRECEDING frames only)",
                    end if isinstance(end, exp.Expr) else spec,
                )  # fmt: skip
            start, side, kind = spec.args.get("start"), spec.args.get("start_side"), spec.args["kind"].upper()
            if start == "CURRENT ROW":
                frame = Frame(kind, 0)
            elif side != "PRECEDING":
                raise sql_error(f"an OVER frame must start PRECEDING the current row ({describe(spec)})", spec)
            elif start == "UNBOUNDED":
                frame = Frame(kind, None)
            elif kind == "ROWS":
                if not (isinstance(start, exp.Literal) and not start.is_string and start.this.isdigit()):
                    raise sql_error(f"ROWS BETWEEN n PRECEDING needs a whole number of rows, not {describe(start)}", start)
                frame = Frame(kind, int(start.this))
            else:
                frame = Frame(kind, interval_ms(start, "RANGE BETWEEN ... PRECEDING"))
        partition = tuple(p.sql() for p in w.args.get("partition_by") or [])
        return partition, ordered.this.sql(), frame

    def _calls(self, windows: list[exp.Window], slot) -> dict:  # noqa: ANN001
        """Each OVER item's aggregate call (the same call twice is computed once)."""
        from tidemark.engine.stages.aggregate import AggCall

        calls = {}
        for w in windows:
            func, arg, distinct = self._agg_call(w.this)  # type: ignore[attr-defined]  (AggregatePlanner)
            if distinct:
                raise sql_error(f"{func}(DISTINCT ...) in an OVER aggregation is not supported", w.this)
            calls[w] = AggCall(func, slot(arg) if arg is not None else None)
        return calls

    def _time_attribute(self, node_id: int, column: int) -> set[str] | None:
        """The source tables whose watermark ``column`` of ``node_id`` carries, if it is an
        event-time attribute passed on unchanged by calcs and ranks (a join or aggregate in
        between makes it an ordinary TIMESTAMP, as in Flink); None if it is not one."""
        node = self.node(node_id)
        while True:
            event_time = node.detail.get("event_time")
            if event_time is not None and event_time[1] == column:
                return self.event_time_sources(node.id)  # type: ignore[attr-defined]  (WindowPlanner)
            if node.kind not in ("calc", "rank"):
                return None
            if node.kind == "calc" and node.stage.projections is not None:
                picked = col_index(node.stage.projections[column])
                if picked is None:
                    return None
                column = picked
            node = self.node(node.inputs[0])


def _placeholder(node: exp.Expr, at: dict[int, int]) -> exp.Expr:
    """An OVER call replaced by a marker of its output column, which name resolution leaves alone."""
    return exp.Placeholder(this=str(at[id(node)])) if id(node) in at else node


def _from_placeholder(node: exp.Expr) -> exp.Expr:
    if isinstance(node, exp.Placeholder):
        return col_ref(int(node.this))
    return node
