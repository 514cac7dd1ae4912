"""Event time in plans: a table's computed columns and watermark, the window table functions
(``TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), INTERVAL ...))``, HOP, CUMULATE) and window
aggregation over them.

A window aggregate is planned as a group aggregate first (the same group expressions,
calls, HAVING and SELECT over its output), then its stage becomes a ``WindowAggregate`` when
the GROUP BY holds the window's ``window_start`` and ``window_end``: Flink's rule, and its
output is then insert-only. A window table function read any other way, SESSION windows and
the legacy ``GROUP BY TUMBLE(ts, ...)`` group windows are refused by name.
"""

from __future__ import annotations

from dataclasses import replace

from sqlglot import exp

from tidemark.engine.catalog import TableDef
from tidemark.engine.errors import PlanError
from tidemark.engine.expressions import col_index, col_ref
from tidemark.engine.intervals import interval_ms
from tidemark.engine.planner.graph import PlanGraph
from tidemark.engine.planner.scope import Scope
from tidemark.engine.sql import Script, WindowCall, describe, is_proctime_call, sql_error
from tidemark.engine.types import make_type

WINDOW_COLUMNS = ("window_start", "window_end", "window_time")
_TIMESTAMP = make_type("TIMESTAMP", (3,))
#: the node kinds that may read a window table function's rows
WINDOW_OPERATORS = ("window_aggregate", "window_rank", "window_join")


class WindowPlanner(PlanGraph):
    """Computed columns, watermarks and windows; the other builders come after it in
    ``Planner``'s bases, reached through ``super()``."""

    def __init__(self, script: Script) -> None:
        super().__init__(script)
        self._event_time_sources: dict[str, int] = {}  # table -> the node its queries read
        self._window_calls: dict[int, WindowCall] = {}  # window node -> its call, for messages

    def source(self, table: TableDef) -> int:
        """The table's rows as queries see them: physical columns, then computed ones; the
        node that has the event-time column says so (``detail['event_time']``) for hosts."""
        done = self._event_time_sources
        if table.name in done:
            return done[table.name]
        node_id = super().source(table)  # type: ignore[misc]
        if table.computed:
            scope = Scope()
            scope.add(table.name, table.column_names, table.types, None)
            width = len(table.columns)
            projections = [col_ref(i) for i in range(width)]
            projections += [self.resolve(c.expr, scope) for c in table.computed]  # type: ignore[attr-defined]
            names = table.column_names + [c.name for c in table.computed]
            node_id = self.calc(node_id, projections, None, names, purpose="computed columns")
            self.node(node_id).detail["composable"] = False  # queries' calcs must not fold it away
        node = self.node(node_id)
        if table.watermark is not None:
            column = next(i for i, c in enumerate(node.columns) if c.lower() == table.watermark.column.lower())
            if node.types[column] is None or node.types[column].name != "TIMESTAMP":
                raise PlanError(
                    f"table '{table.name}': WATERMARK FOR {table.watermark.column}: the column is "
                    f"{node.types[column] or 'of unknown type'}, a watermark needs a TIMESTAMP column"
                )
            node.detail["event_time"] = (table.name, column)
        done[table.name] = node_id
        return node_id

    # ------------------------------------------------------------------ FROM TABLE(...)

    def relation(self, item: exp.Expr, scope: Scope) -> int:
        fn = item.this if isinstance(item, exp.Table) else None
        if isinstance(fn, exp.Anonymous) and fn.name.upper() == "TABLE":
            calls = fn.expressions
            if len(calls) == 1 and isinstance(calls[0], WindowCall) and calls[0].args.get("table_arg"):
                return self.window_function(calls[0], item, scope)
            raise sql_error(f"table function {describe(item)} is not supported", item)
        return super().relation(item, scope)  # type: ignore[misc]

    def window_function(self, call: WindowCall, item: exp.Expr, scope: Scope) -> int:
        from tidemark.engine.stages.window_tvf import KINDS, WindowSpec

        kind = call.function
        if kind not in KINDS:
            raise sql_error(f"{kind} windows are not supported yet (TUMBLE, HOP and CUMULATE are)", call)
        args = call.expressions
        sizes = {"TUMBLE": 1, "HOP": 2, "CUMULATE": 2}[kind]
        if len(args) != 2 + sizes:
            shape = {"TUMBLE": "size", "HOP": "slide, size", "CUMULATE": "step, size"}[kind]
            raise sql_error(
                f"{kind}(TABLE t, DESCRIPTOR(time column), {shape}) takes {2 + sizes} arguments, not {len(args)}"
                + (" (a window offset is not supported)" if len(args) > 2 + sizes else ""),
                call,
            )
        descriptor = args[1]
        if not (isinstance(descriptor, exp.Anonymous) and descriptor.name.upper() == "DESCRIPTOR"
                and len(descriptor.expressions) == 1 and isinstance(descriptor.expressions[0], exp.Column)):
            raise sql_error(f"{kind}: the second argument must be DESCRIPTOR(time column), not {describe(descriptor)}", descriptor)
        lengths = [interval_ms(a, f"{kind} window") for a in args[2:]]
        size, step = lengths[-1], lengths[0]
        if step <= 0 or size % step:
            raise sql_error(f"{kind}: the window size must be a positive multiple of the {'slide' if kind == 'HOP' else 'step'}", call)
        spec = WindowSpec(kind, size, step)
        inner = Scope()
        proctime_input = self._proctime_input(args[0], descriptor.expressions[0], inner)
        if proctime_input is not None:
            node = self._proctime_window_node(spec, proctime_input, call)
        else:
            input_id = super().relation(args[0], inner)  # type: ignore[misc]
            time_index = inner.resolve(descriptor.expressions[0])
            node = self._window_node(spec, input_id, time_index, call, descriptor)
        alias = item.alias or (args[0].alias_or_name if isinstance(args[0], exp.Table) else "")
        scope.add(alias, node.columns, node.types, item)
        return node.id

    def _window_node(self, spec, input_id: int, time_index: int, call: WindowCall, where: exp.Expr):  # noqa: ANN001, ANN202
        """The window assignment over ``input_id``'s rows, by its column ``time_index``."""
        from tidemark.engine.stages.window_tvf import WindowAssign

        kind = spec.kind
        inp = self.node(input_id)
        if not self.event_time_sources(input_id):
            raise sql_error(
                f"{kind}: '{inp.columns[time_index]}' is not an event-time column: declare "
                "WATERMARK FOR it on its table (processing-time windows are not supported yet)",
                where,
            )
        if inp.types[time_index] is None or inp.types[time_index].name != "TIMESTAMP":
            raise sql_error(f"{kind}: the time column '{inp.columns[time_index]}' must be a TIMESTAMP", where)
        shape = f"size {spec.size_ms} ms" if kind != "SESSION" else f"gap {spec.size_ms} ms"
        if kind in ("HOP", "CUMULATE"):
            shape += f", step {spec.step_ms} ms"
        name = self._stage_name("window")
        node = self._add(
            "window", name, [input_id], inp.columns + list(WINDOW_COLUMNS), inp.types + [_TIMESTAMP] * 3,
            upsert_keys=frozenset(), changelog_mode=inp.changelog_mode,
            stage=WindowAssign(spec, time_index, name=name),
            detail={"window": f"{kind}({inp.columns[time_index]}, {shape})",
                    "watermark_of": sorted(self.event_time_sources(input_id))},
        )  # fmt: skip
        self._window_calls[node.id] = call
        return node

    def _proctime_input(self, table_arg: exp.Expr, column: exp.Column, scope: Scope) -> int | None:
        """``TABLE t`` whose processing-time attribute the descriptor names: a table's
        ``name AS PROCTIME()``, or a view's or CTE's ``PROCTIME() AS name`` item (the view
        is planned without it: a processing-time attribute is no column). Its columns are
        added to ``scope``; None for any other table argument."""
        if not isinstance(table_arg, exp.Table) or column.table:
            return None
        named = self.named_query(table_arg.name)  # type: ignore[attr-defined]
        if named is None:
            table = self.script.table(table_arg.name)
            declared = self.script.proctime.get(table.name) if table is not None else None
            if declared is None or declared.lower() != column.name.lower():
                return None
            node_id, name = self.source(table), table.name
        else:
            if named.columns is not None or not isinstance(named.query, exp.Select):
                return None
            items = [e for e in named.query.expressions if isinstance(e, exp.Alias) and is_proctime_call(e.this)]
            if not items or items[-1].alias.lower() != column.name.lower():
                return None
            query = named.query.copy()
            query.set("expressions", [e for e in query.expressions if e.alias_or_name != items[-1].alias_or_name
                                      or not is_proctime_call(e.unalias())])
            node_id, name = self.plan_named(replace(named, query=query), table_arg), named.name  # type: ignore[attr-defined]
        n = self.node(node_id)
        scope.add(table_arg.alias or name, n.columns, n.types, table_arg)
        return node_id

    def _proctime_window_node(self, spec, input_id: int, call: WindowCall):  # noqa: ANN001, ANN202
        """The window over ``input_id``'s rows by the processing time of their batch
        (``tidemark.engine.stages.proctime_window``): tumbling windows only."""
        from tidemark.engine.stages.proctime_window import ProctimeWindow

        if spec.kind != "TUMBLE":
            raise sql_error(f"{spec.kind} windows on processing time are not supported (TUMBLE is)", call)
        inp = self.node(input_id)
        name = self._stage_name("window")
        node = self._add(
            "window", name, [input_id], inp.columns + list(WINDOW_COLUMNS), inp.types + [_TIMESTAMP] * 3,
            upsert_keys=frozenset(), changelog_mode=inp.changelog_mode,
            stage=ProctimeWindow(spec, name=name),
            detail={"window": f"TUMBLE(PROCTIME(), size {spec.size_ms} ms)", "watermark_of": [], "proctime": True},
        )  # fmt: skip
        self._window_calls[node.id] = call
        return node

    def event_time_sources(self, node_id: int) -> set[str]:
        """The source tables with a watermark upstream of ``node_id``."""
        node = self.node(node_id)
        own = {node.detail["event_time"][0]} if "event_time" in node.detail else set()
        return own.union(*(self.event_time_sources(i) for i in node.inputs))

    # ------------------------------------------------------------------ GROUP BY window

    def aggregate(self, sel: exp.Select, scope: Scope, input_id: int, predicate: exp.Expr | None) -> int:
        group = sel.args.get("group")
        legacy = list(group.find_all(WindowCall)) if group is not None else []
        for call in legacy:
            if call.function != "SESSION" or len(legacy) > 1:
                raise sql_error(
                    f"GROUP BY {call.function}(...) (a legacy group window) is not supported: use the window "
                    f"table function, FROM TABLE({call.function}(TABLE t, DESCRIPTOR(ts), ...)) "
                    "GROUP BY window_start, window_end",
                    call,
                )
        if legacy:
            sel, input_id = self._session_group(sel, scope, input_id, legacy[0])
        first_new = len(self.nodes)
        out_id = super().aggregate(sel, scope, input_id, predicate)  # type: ignore[misc]
        if self.node(input_id).kind != "window":
            return out_id
        agg = next(n for n in self.nodes[first_new:] if n.kind == "aggregate")
        self._make_window_aggregate(agg, input_id, sel)
        for n in self.nodes[agg.id + 1:]:
            n.changelog_mode = "append"
        return out_id

    def _session_group(self, sel: exp.Select, scope: Scope, input_id: int, call: WindowCall) -> tuple[exp.Select, int]:
        """``GROUP BY k, SESSION(ts, gap)`` with ``SESSION_START(ts, gap)`` /
        ``SESSION_END(ts, gap)``: the session window's columns, as a window table function
        would give them, grouped by as ``window_start, window_end``."""
        from tidemark.engine.stages.window_tvf import WindowSpec

        if len(call.expressions) != 2 or not isinstance(call.expressions[0], exp.Column):
            raise sql_error("SESSION(time column, gap) takes a time column and an interval", call)
        time_index = scope.resolve(call.expressions[0])
        gap = interval_ms(call.expressions[1], "SESSION gap")
        node = self._window_node(WindowSpec("SESSION", gap, gap), input_id, time_index, call, call)
        scope.add("", list(WINDOW_COLUMNS), [_TIMESTAMP] * 3, call)
        rewritten = sel.copy()
        group = rewritten.args["group"]
        at = next(i for i, g in enumerate(group.expressions) if isinstance(g, WindowCall))
        bounds = [exp.column(c) for c in WINDOW_COLUMNS[:2]]
        group.set("expressions", group.expressions[:at] + bounds + group.expressions[at + 1:])
        names = {"SESSION_START": WINDOW_COLUMNS[0], "SESSION_END": WINDOW_COLUMNS[1]}

        def bound(n: exp.Expr) -> exp.Expr:
            if isinstance(n, exp.Anonymous) and n.name.upper() in names:
                return exp.column(names[n.name.upper()])
            return n

        for arg in ("expressions", "having"):
            value = rewritten.args.get(arg)
            if isinstance(value, list):
                rewritten.set(arg, [e.transform(bound) for e in value])
            elif value is not None:
                rewritten.set(arg, value.transform(bound))
        return rewritten, node.id

    def _make_window_aggregate(self, agg, window_id: int, sel: exp.Select) -> None:  # noqa: ANN001
        from tidemark.engine.stages.proctime_window import ProctimeWindowAggregate
        from tidemark.engine.stages.window_aggregate import WindowAggregate

        window = self.node(window_id)
        start, end = window.width - 3, window.width - 2
        feeder = self.node(agg.inputs[0])
        if feeder.id == window_id:
            positions = list(agg.stage.group_by)
        else:  # the aggregate's input calc: which of its columns are the window's
            positions = [col_index(feeder.stage.projections[i]) if feeder.stage.projections is not None else i
                         for i in agg.stage.group_by]
        if start not in positions or end not in positions:
            raise sql_error(
                "GROUP BY over a window table function must hold window_start and window_end "
                "(a window aggregate); other aggregations of a window table function are not supported",
                sel.args.get("group") or sel,
            )
        upstream = self.node(window.inputs[0])
        if upstream.changelog_mode != "append":
            raise sql_error(
                f"a window aggregate needs an insert-only input, and '{upstream.name}' is a "
                f"{upstream.changelog_mode} changelog (Flink's rule: window aggregation over updates is not defined)",
                self._window_calls[window_id],
            )
        bounds = tuple(agg.stage.group_by[positions.index(p)] for p in (start, end))
        try:
            if window.detail.get("proctime"):
                agg.stage = ProctimeWindowAggregate(agg.stage.group_by, agg.stage.aggs, bounds, window.stage.spec.size_ms,
                                                    name=agg.name)
            else:
                agg.stage = WindowAggregate(agg.stage.group_by, agg.stage.aggs, bounds, window.detail["watermark_of"],
                                            session=window.stage.spec.kind == "SESSION", name=agg.name)
        except PlanError as e:  # an aggregate function windows do not compute: at the SELECT
            raise sql_error(str(e), sel) from None
        agg.kind = "window_aggregate"
        agg.changelog_mode = "append"
        agg.detail["window"] = window.detail["window"]
        if window.detail.get("proctime"):
            agg.detail["proctime"] = True

    def finish(self, ins, body: int) -> None:  # noqa: ANN001
        """A window table function must feed a window operator: a window aggregate, a window
        Top-N or a window join (``planner.window_ops``)."""
        for window_id, call in self._window_calls.items():
            if self.node(window_id).detail.get("proctime") and not self._feeds_window_aggregate(window_id, ("window_aggregate",)):
                raise sql_error(
                    f"{call.function}(...) on processing time is only supported under GROUP BY window_start, "
                    "window_end (a window aggregate); window Top-N and window joins need event time",
                    call,
                )
            if not self._feeds_window_aggregate(window_id):
                raise sql_error(
                    f"{call.function}(...) is only supported under GROUP BY window_start, window_end (a window "
                    "aggregate), ROW_NUMBER() OVER (PARTITION BY window_start, window_end ...) filtered on the row "
                    "number (a window Top-N) or a join ON both sides' window_start and window_end (a window join); "
                    "selecting its rows directly is not supported yet",
                    call,
                )
        super().finish(ins, body)  # type: ignore[misc]

    def _feeds_window_aggregate(self, node_id: int, operators: tuple[str, ...] = WINDOW_OPERATORS) -> bool:
        consumers = [n for n in self.nodes if node_id in n.inputs]
        return bool(consumers) and all(
            n.kind in operators or (n.kind == "calc" and self._feeds_window_aggregate(n.id, operators)) for n in consumers
        )
