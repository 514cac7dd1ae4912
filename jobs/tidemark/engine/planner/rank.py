"""Stage construction for ``ROW_NUMBER() OVER (PARTITION BY ... ORDER BY ...)`` filtered by
the enclosing query (Top-N, and with ``rn = 1`` deduplication), as Flink plans it.

The SELECT with the ROW_NUMBER item gets a rank stage whose range is open; the enclosing
SELECT that reads it (alone in its FROM) closes it with the conjuncts of its WHERE that bound
the row number (``rn <= N``, ``rn < N``, ``rn = N``, ``rn BETWEEN a AND b``, ``rn >= a``...),
which the stage then applies itself. Whether that query reads ``rn`` decides whether the stage
outputs it (and the upsert keys, ``tidemark.engine.stages.rank``). A ROW_NUMBER that no
enclosing query bounds is refused at the end of planning: numbering every row of a
changelog is not something Flink runs either.

``ORDER BY`` a processing-time attribute (a table's ``name AS PROCTIME()``, a FROM
subquery's ``PROCTIME() AS name``) ranks by arrival, as Flink 2.3 runs it: ascending keeps the
rows that arrived first (a Deduplicate for ``rn = 1``, a Top-N otherwise); descending keeps the
last row, and only as a Deduplicate (``rn = 1``, insert-only input). Any other descending rank,
over a changelog too, is refused: Flink plans a Top-N for it that keeps the first arrivals
whatever the direction. Over a join it is refused too: Flink ranks by the wall-clock time the
attribute becomes there. The attribute is no column, so the stage gets no sort key, only the
tie order of ``tidemark.engine.stages.rank`` (source position). A changelog input is ranked as
any other (every active row kept, the first arrival first), which is what Flink 2.3 runs for it
too. Keeping the first row of an append-only input never replaces it, so that output is
append-only (Flink's ``outputInsertOnly``).
"""

from __future__ import annotations

from sqlglot import exp

from tidemark.engine.errors import SqlError
from tidemark.engine.expressions import col_index, col_ref
from tidemark.engine.planner.graph import PlanGraph
from tidemark.engine.planner.keys import project_keys
from tidemark.engine.planner.node import Key, Node
from tidemark.engine.planner.rewrite import conjoin, conjuncts, unique_names
from tidemark.engine.planner.scope import Scope
from tidemark.engine.sql import Script, describe, sql_error
from tidemark.engine.types import make_type

_UNBOUNDED = 2**62  # the open end of a rank range until the enclosing query bounds it


class RankPlanner(PlanGraph):
    """ROW_NUMBER items and the filters that bound them (module docstring)."""

    def __init__(self, script: Script) -> None:
        super().__init__(script)
        # rank node id -> the window expression, until an enclosing query bounds it
        self.open_ranks: dict[int, exp.Window] = {}

    @staticmethod
    def rank_items(sel: exp.Select) -> list[exp.Window]:
        """The select items that are a ``ROW_NUMBER() OVER (...)``, alone (aliased or not)."""
        out = []
        for item in sel.expressions:
            inner = item.this if isinstance(item, exp.Alias) else item
            if isinstance(inner, exp.Window) and isinstance(inner.this, exp.RowNumber):
                out.append(inner)
        return out

    def rank(self, sel: exp.Select, scope: Scope, input_id: int, predicate: exp.Expr | None) -> int:
        """The SELECT with a ROW_NUMBER item: its other items and the window's partition and
        order expressions in a calc, the rank stage (range open), then the items in order."""
        from tidemark.engine.stages.rank import Rank, SortKey

        windows = self.rank_items(sel)
        if len(windows) > 1:
            raise sql_error("several ROW_NUMBER() items in one SELECT are not supported", windows[1])
        window = windows[0]
        if sel.args.get("group") is not None or sel.args.get("having") is not None or any(
            self._find_aggs(e) for e in sel.expressions
        ):
            raise sql_error("ROW_NUMBER() OVER in a SELECT with GROUP BY or aggregates is not supported; nest the query", window)
        if sel.args.get("distinct") is not None:
            raise sql_error("SELECT DISTINCT with ROW_NUMBER() OVER is not supported; nest the query", window)
        if window.args.get("spec") is not None:
            raise sql_error(f"a frame clause on ROW_NUMBER() ({describe(window)}) is not supported", window)
        order = window.args.get("order")
        if order is None or not order.expressions:
            raise sql_error("ROW_NUMBER() OVER needs ORDER BY (which row is first in its partition)", window)
        at = next(i for i, item in enumerate(sel.expressions) if (item.this if isinstance(item, exp.Alias) else item) is window)
        others = sel.copy()
        others.set("expressions", [e.copy() for i, e in enumerate(sel.expressions) if i != at])
        projections, names = self.projections(others, scope) if others.expressions else ([], [])
        rn_name = self._item_name(sel.expressions[at], at)
        before = sel.copy()
        before.set("expressions", [e.copy() for e in sel.expressions[:at]])
        rn_at = len(self.projections(before, scope)[0]) if at else 0  # where * items expand

        def slot(e: exp.Expr) -> int:
            resolved = self.resolve(e, scope)
            if isinstance(resolved, exp.Literal):
                raise sql_error(f"ROW_NUMBER() OVER: {describe(e)} is a constant; name a column or expression", e)
            if resolved not in projections:
                projections.append(resolved)
                names.append(f"$rank{len(projections)}")
            return projections.index(resolved)

        width = len(names)
        by_arrival = self._arrival_order(window, sel)
        partition = [slot(p) for p in window.args.get("partition_by") or []]
        # a processing-time attribute is no column: ranked by arrival alone, with no sort key
        sort = [] if by_arrival else [
            SortKey(slot(o.this), bool(o.args.get("desc")), bool(o.args.get("nulls_first"))) for o in order.expressions
        ]
        calc_id = self.calc(input_id, projections, predicate, unique_names(names), purpose="rank input")
        inp = self.node(calc_id)
        name = self._stage_name("rank")
        stage = Rank(partition, sort, 1, _UNBOUNDED, inp.types, append_only=inp.changelog_mode == "append", name=name,
                     ties=by_arrival or "first")
        order_by = [f"{inp.columns[k.column]}{' DESC' if k.descending else ''}" for k in sort]
        if by_arrival:
            order_by = [f"{order.expressions[0].this.name}{' DESC' if by_arrival == 'last' else ''} (processing time)"]
        node = self._add(
            "rank", name, [calc_id], [*inp.columns, rn_name], [*inp.types, make_type("BIGINT")],
            changelog_mode="retract", stage=stage,
            detail={"partition_by": [inp.columns[i] for i in partition], "order_by": order_by},
        )  # fmt: skip
        if by_arrival:
            node.detail["by_arrival"] = by_arrival
        if len(sort) == 1 and sort[0].descending and self._is_event_time(calc_id, sort[0].column):
            node.detail["last_by_event_time"] = True
        self.open_ranks[node.id] = window
        out = [col_ref(i) for i in range(width)]
        out.insert(rn_at, col_ref(inp.width))
        out_names = list(inp.columns[:width])
        out_names.insert(rn_at, rn_name)
        return self.calc(node.id, out, None, unique_names(out_names), purpose="select")

    def bound_rank(self, sel: exp.Select, scope: Scope, node_id: int, predicate: exp.Expr | None) -> exp.Expr | None:
        """If ``sel`` reads an open rank alone, close its range with the WHERE conjuncts on
        the row number; returns the predicate left for the query's calc."""
        if not self.open_ranks or len(scope.relations) != 1 or predicate is None:
            return predicate
        found = self._rank_below(node_id)
        if found is None:
            return predicate
        rank, rn, path = found
        start, end, rest = 1, _UNBOUNDED, []
        for conj in conjuncts(predicate):
            bounds = _rank_bounds(conj, rn)
            if bounds is None:
                rest.append(conj)
                continue
            start, end = max(start, bounds[0]), min(end, bounds[1])
        if end == _UNBOUNDED:
            return predicate
        window = self.open_ranks.pop(rank.id)
        if start > end:
            raise sql_error(f"the filter on {scope.names[rn]} leaves no rank ({start}..{end})", window)
        reads_rn = any(col_index(n) == rn for c in rest for n in c.walk()) or self._reads_column(sel, scope, rn)
        if rank.detail.get("by_arrival") == "last" and ((start, end) != (1, 1) or not rank.stage.append_only):
            raise sql_error(
                f"{describe(window)}: descending processing time is supported only as a deduplication keeping the "
                f"last row ({scope.names[rn]} = 1) of an insert-only input; for any other rank, and over a changelog, "
                "Flink 2.3 keeps the first arrivals whatever the direction, so this is refused",
                window,
            )
        self._close(rank, path, start, end, reads_rn)
        return conjoin(rest)

    def check_ranks_bounded(self) -> None:
        """Refuse a ROW_NUMBER no enclosing query bounds (module docstring)."""
        for window in self.open_ranks.values():
            raise sql_error(
                f"{describe(window)} needs a filter on its result in the enclosing query: "
                "WHERE rn <= N (Top-N) or rn = 1 (deduplication); numbering every row is not supported",
                window,
            )

    # ------------------------------------------------------------------ helpers

    def _rank_below(self, node_id: int) -> tuple[Node, int, list[Node]] | None:
        """The open rank under ``node_id`` through calcs that only pick columns, the position
        of its row number at ``node_id``, and the calcs on the way (top first)."""
        path: list[Node] = []
        node = self.node(node_id)
        while node.id not in self.open_ranks:
            if node.kind != "calc" or node.stage.predicate is not None or node.stage.projections is None:
                return None
            path.append(node)
            node = self.node(node.inputs[0])
        rn = node.width - 1
        for calc in reversed(path):
            picks = [col_index(e) for e in calc.stage.projections]
            if rn not in picks:
                return None
            rn = picks.index(rn)
        return node, rn, path

    def _arrival_order(self, window: exp.Window, sel: exp.Select) -> str | None:
        """``"first"`` or ``"last"`` when the window's only sort key is a processing-time
        attribute of ``sel``'s FROM, ascending or descending (module docstring); None when it
        names none. Such an attribute anywhere else in the window is refused: it is no column."""

        def proctime(e: exp.Expr) -> exp.Column | None:
            declared = self.declared_proctime  # type: ignore[attr-defined]  (LookupPlanner)
            return next((c for c in e.walk() if isinstance(c, exp.Column) and declared(c, sel)), None)

        for p in window.args.get("partition_by") or []:
            if (attr := proctime(p)) is not None:
                raise sql_error(f"ROW_NUMBER() OVER (PARTITION BY {describe(attr)}): a processing-time attribute "
                                "cannot partition a rank; it may only be the one ORDER BY key", attr)  # fmt: skip
        items = window.args["order"].expressions
        timed = [(o, attr) for o in items if (attr := proctime(o.this)) is not None]
        if not timed:
            return None
        if sel.args.get("joins"):
            raise sql_error(f"ROW_NUMBER() OVER (ORDER BY {describe(timed[0][0])}) over a join: Flink 2.3 turns the "
                            "processing-time attribute into the wall-clock time of each row there, an order no "
                            "replay can reproduce; rank the table before joining it", timed[0][1])  # fmt: skip
        if len(items) > 1 or timed[0][1] is not items[0].this:
            raise sql_error(f"ROW_NUMBER() OVER (ORDER BY {describe(timed[0][0])}): a processing-time attribute must be "
                            "the only ORDER BY key (it keeps the first or last rows by arrival)", timed[0][1])  # fmt: skip
        return "last" if items[0].args.get("desc") else "first"

    def _is_event_time(self, node_id: int, column: int) -> bool:
        """Whether ``column`` of ``node_id`` is an event-time attribute (``OverPlanner``'s
        rule: a ``WATERMARK FOR`` column passed on unchanged)."""
        return self._time_attribute(node_id, column) is not None  # type: ignore[attr-defined]

    @staticmethod
    def _reads_column(sel: exp.Select, scope: Scope, position: int) -> bool:
        """Whether ``sel`` reads column ``position`` of its scope outside its WHERE."""
        where = sel.args.get("where")
        for item in sel.expressions:
            if isinstance(item, exp.Star) or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star)):
                return True
        for node in sel.walk():
            if not isinstance(node, exp.Column) or isinstance(node.this, exp.Star):
                continue
            if where is not None and node.find_ancestor(exp.Where) is where:
                continue
            try:
                if scope.resolve(node) == position:
                    return True
            except SqlError:  # a column of a nested query: not this scope's
                continue
        return False

    def _close(self, rank: Node, path: list[Node], start: int, end: int, output_rank: bool) -> None:
        stage = rank.stage
        stage.start, stage.end, stage.output_rank = start, end, output_rank
        inp = self.node(rank.inputs[0])
        partition = frozenset(stage.partition)
        keys = {k for k in inp.upsert_keys if partition <= k}
        if stage.top1:
            keys = {Key(partition)}
        elif output_rank:
            keys.add(Key(partition | {inp.width}))
        rank.upsert_keys = frozenset(keys)
        if stage.top1 and rank.detail.pop("last_by_event_time", False):
            stage.ties = "last"  # Flink plans a Deduplicate keeping the last row by event time
            rank.detail["deduplicate"] = "keep the last row by event time (an equal one replaces)"
        by_arrival = rank.detail.pop("by_arrival", None)
        if by_arrival is not None:
            what = "row" if stage.top1 else f"rows ({start}..{end})"
            rank.detail["deduplicate" if stage.top1 else "order"] = f"keep the {by_arrival} {what} by processing time (arrival)"
        if by_arrival == "first" and stage.top1 and stage.append_only:
            rank.changelog_mode = "append"  # the first row is never replaced (module docstring)
        rank.detail["range"] = f"{start}..{end}"
        rank.detail["row_number"] = "output" if output_rank else "not read (NULL)"
        rank.detail["input"] = "append-only: keeps the top rows" if stage.append_only else "changelog: keeps every active row"
        below = rank
        for calc in reversed(path):
            calc.upsert_keys = project_keys(below.upsert_keys, calc.stage.projections)
            calc.changelog_mode = below.changelog_mode
            below = calc


def _rank_bounds(conj: exp.Expr, rn: int) -> tuple[int, int] | None:
    """``(start, end)`` a conjunct puts on row number column ``rn``; None if it is not such a
    bound (then it stays a filter after the rank)."""
    if isinstance(conj, exp.Between) and col_index(conj.this) == rn:
        lo, hi = _int(conj.args.get("low")), _int(conj.args.get("high"))
        return (lo, hi) if lo is not None and hi is not None else None
    ops = {exp.LTE: "<=", exp.LT: "<", exp.EQ: "=", exp.GTE: ">=", exp.GT: ">"}
    op = ops.get(type(conj))
    if op is None:
        return None
    left, right = conj.this, conj.expression
    if col_index(right) == rn and _int(left) is not None:
        left, right = right, left
        op = {"<=": ">=", "<": ">", ">=": "<=", ">": "<", "=": "="}[op]
    if col_index(left) != rn or (n := _int(right)) is None:
        return None
    return {"<=": (1, n), "<": (1, n - 1), "=": (n, n), ">=": (n, _UNBOUNDED), ">": (n + 1, _UNBOUNDED)}[op]


def _int(e: exp.Expr | None) -> int | None:
    if isinstance(e, exp.Literal) and not e.is_string and e.this.lstrip("-").isdigit():
        return int(e.this)
    return None
