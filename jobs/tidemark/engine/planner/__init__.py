"""The planner: one INSERT ... SELECT becomes a DAG of stages, each with its upsert key and
changelog mode, and the sink gets a materializer exactly when it needs one. The INSERTs of
a statement set become one DAG with a sink each, sharing their sources and the views they
read (``SinkPlanner.check_statement_set``).

Each job has its module: ``scope`` resolves names, ``keys`` infers upsert keys,
``select``, ``join``, ``lookup``, ``aggregate``, ``rank``, ``over`` and ``union`` build stages, ``window``
event time and windows, ``window_ops`` window Top-N and window joins, ``sink`` applies the
sink policy;
``graph`` holds the nodes they add. ``Planner`` puts the builders together.
"""

from __future__ import annotations

from tidemark.engine.errors import PlanError
from tidemark.engine.planner.aggregate import AggregatePlanner
from tidemark.engine.planner.join import JoinPlanner
from tidemark.engine.planner.lookup import LookupPlanner
from tidemark.engine.planner.node import Node, format_key
from tidemark.engine.planner.over import OverPlanner
from tidemark.engine.planner.rank import RankPlanner
from tidemark.engine.planner.select import SelectPlanner
from tidemark.engine.planner.sink import COMPACTION_MODES, SinkPlanner
from tidemark.engine.planner.window import WindowPlanner
from tidemark.engine.planner.window_ops import WindowOpsPlanner
from tidemark.engine.planner.union import UnionPlanner

__all__ = ["Node", "Planner", "format_key"]


class Planner(
    WindowOpsPlanner, WindowPlanner, SelectPlanner, JoinPlanner, LookupPlanner, AggregatePlanner, RankPlanner,
    OverPlanner, UnionPlanner,
    SinkPlanner,
):
    """All builders over one graph: ``plan()`` plans the script's INSERTs."""

    def plan(self) -> list[Node]:
        mode = self.script.options.get("table.exec.sink.upserts.compaction-mode")
        if mode is not None and mode.upper() not in COMPACTION_MODES:
            raise PlanError(
                f"SET 'table.exec.sink.upserts.compaction-mode' = '{mode}': expected one of {', '.join(COMPACTION_MODES)}"
            )
        self.check_statement_set()
        for ins in self.script.inserts:
            body = self.insert(ins)
            self.check_ranks_bounded()
            self.finish(ins, body)
        self.compare_read_columns()
        for n in self.nodes:
            n.detail.pop("composable", None)
        return self.nodes
