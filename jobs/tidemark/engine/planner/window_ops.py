"""Window Top-N and window join, as Flink plans them: a rank or a join is planned as usual
first, then becomes the window operator when its inputs are windowed.

A node is windowed when it holds a window table function's rows: its output, or a calc
over it that passes both ``window_start`` and ``window_end`` on (renamed or not). Then:

- a ``ROW_NUMBER`` closed by a constant range whose PARTITION BY holds the input's
  ``window_start`` and ``window_end`` is a window Top-N (``stages.window_rank``);
- a join of two windowed inputs with the same window whose equi keys pair both sides'
  ``window_start`` and both ``window_end`` is a window join (``stages.window_join``). Any
  other join stays a regular join, as in Flink 2.3 (pairing one bound only, two different
  windows, a windowed input joined with another).

Flink plans these over a window aggregate's output too (Nexmark q5 and q8 join two); here a
rank or join over a window aggregate stays the regular one, with the same final table,
because the Spark host runs an event-time stage only where it reads sources through
stateless stages (``tidemark.spark.watermark``), and it does run those queries.

Both need insert-only inputs and emit insert-only rows when the watermark passes the window;
over a changelog they are refused, as Flink 2.3 refuses them (its ``StreamPhysicalWindowRank``
and ``StreamPhysicalWindowJoin`` do not consume updates).
SESSION windows (a legacy group window here) carry no window for these, as in Flink.
"""

from __future__ import annotations

from sqlglot import exp

from tidemark.engine.expressions import col_index
from tidemark.engine.planner.graph import PlanGraph
from tidemark.engine.planner.node import Node
from tidemark.engine.planner.scope import Scope
from tidemark.engine.sql import sql_error


class WindowOpsPlanner(PlanGraph):
    """Turns ranks and joins over windowed inputs into window operators (module docstring);
    comes before the rank and join builders in ``Planner``'s bases."""

    def windowed(self, node_id: int) -> tuple[int, int, Node] | None:
        """``(window_start, window_end, window node)``: where ``node_id``'s rows carry their
        window's bounds, and the window table function that made them; None if they do not."""
        node = self.node(node_id)
        if node.kind == "window":
            return None if node.stage.spec.kind == "SESSION" else (node.width - 3, node.width - 2, node)
        if node.kind != "calc":
            return None
        below = self.windowed(node.inputs[0])
        if below is None or node.stage.projections is None:
            return below
        picks = [col_index(e) for e in node.stage.projections]
        if below[0] not in picks or below[1] not in picks:
            return None
        return picks.index(below[0]), picks.index(below[1]), below[2]

    # ------------------------------------------------------------------ window Top-N

    def bound_rank(self, sel: exp.Select, scope: Scope, node_id: int, predicate: exp.Expr | None) -> exp.Expr | None:
        open_before = dict(self.open_ranks)  # type: ignore[attr-defined]
        rest = super().bound_rank(sel, scope, node_id, predicate)  # type: ignore[misc]
        for rank_id, window in open_before.items():
            if rank_id not in self.open_ranks:  # type: ignore[attr-defined]
                self._make_window_rank(self.node(rank_id), node_id, window)
        return rest

    def _make_window_rank(self, rank: Node, top_id: int, where: exp.Expr) -> None:
        from tidemark.engine.stages.window_rank import WindowRank

        stage = rank.stage
        inp = self.node(rank.inputs[0])
        found = self.windowed(inp.id)
        if found is None or not {found[0], found[1]} <= set(stage.partition):
            return
        start, end, window = found
        self._check_insert_only(inp, "window Top-N", where)
        last = stage.top1 and len(stage.order) == 1 and stage.order[0].descending and (
            self._traced(inp.id, stage.order[0].column, window.inputs[0]) == window.stage.time_index
        )
        rank.stage = WindowRank(
            stage.partition, stage.order, stage.start, stage.end, stage.types, end, window.detail["watermark_of"],
            window_start_index=start, output_rank=stage.output_rank, ties="last" if last else "first", name=rank.name,
        )  # fmt: skip
        rank.kind = "window_rank"
        rank.detail["input"] = f"insert-only: keeps the first {stage.end} rows per partition until the window fires"
        rank.detail["window"] = window.detail["window"]
        if last:
            rank.detail["deduplicate"] = "keep the last row by event time (an equal one replaces)"
        node = self.node(top_id)
        while True:  # the rank and the calcs above it that the enclosing query reads
            node.changelog_mode = "append"
            if node.id == rank.id:
                break
            node = self.node(node.inputs[0])

    def _traced(self, node_id: int, column: int, target_id: int) -> int | None:
        """Which column of ``target_id`` column ``column`` of ``node_id`` is, through calcs
        that pass it on and window table functions; None if it is computed."""
        node = self.node(node_id)
        while node.id != target_id:
            if node.kind == "calc" and node.stage.projections is not None:
                column = col_index(node.stage.projections[column])
            elif node.kind == "window":
                column = column if column < node.width - 3 else None
            elif node.kind != "calc":
                return None
            if column is None:
                return None
            node = self.node(node.inputs[0])
        return column

    # ------------------------------------------------------------------ window join

    def join(self, join: exp.Join, scope: Scope, left_id: int, pending: list[exp.Expr] | None = None,
             push_filters: bool = False) -> int:
        node_id = super().join(join, scope, left_id, pending, push_filters)  # type: ignore[misc]
        node = self.node(node_id)
        if node.kind == "join":
            self._make_window_join(node, join.args.get("on") or join.this)
        return node_id

    def _make_window_join(self, node: Node, where: exp.Expr) -> None:
        from tidemark.engine.stages.window_join import WindowJoin

        left, right = self.node(node.inputs[0]), self.node(node.inputs[1])
        found = self.windowed(left.id), self.windowed(right.id)
        if found[0] is None or found[1] is None:
            return
        (ls, le, lwindow), (rs, re, rwindow) = found
        regular = getattr(node.stage, "join", node.stage)  # a delta join holds its regular join
        lkeys, rkeys = regular.keys
        pairs = set(zip(lkeys, rkeys))
        if (ls, rs) not in pairs or (le, re) not in pairs or lwindow.stage.spec != rwindow.stage.spec:
            return
        for side in (left, right):
            self._check_insert_only(side, "window join", where)
        sources = set(lwindow.detail["watermark_of"]) | set(rwindow.detail["watermark_of"])
        node.stage = WindowJoin(
            regular.join_type, lkeys, rkeys, (left.types, right.types), (le, re), sorted(sources), (ls, rs),
            residual=regular.residual, name=node.name,
        )  # fmt: skip
        node.kind = "window_join"
        node.changelog_mode = "append"
        self._delta_fallback.pop(node.id, None)
        for key in ("strategy", "strategy_reason", "delta_join"):
            node.detail.pop(key, None)
        node.detail["window"] = lwindow.detail["window"]

    def _check_insert_only(self, node: Node, what: str, where: exp.Expr) -> None:
        if node.changelog_mode != "append":
            while node.kind in ("calc", "window"):  # name the stage that makes the changelog
                node = self.node(node.inputs[0])
            raise sql_error(
                f"a {what} needs insert-only inputs, and '{node.name}' is a {node.changelog_mode} "
                f"changelog (as in Flink 2.3, a {what} does not consume updates)",
                where,
            )
