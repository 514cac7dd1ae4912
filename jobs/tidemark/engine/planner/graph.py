"""The plan graph under construction: nodes, sources (with their normalize stage) and
calcs, which every stage builder adds through."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlglot import exp

from tidemark.engine import limits, options
from tidemark.engine.catalog import TableDef
from tidemark.engine.errors import PlanError
from tidemark.engine.expressions import check_supported, col_index, col_ref, infer_type, referenced_columns
from tidemark.engine.planner.keys import project_keys
from tidemark.engine.planner.node import Key, Node
from tidemark.engine.planner.rewrite import conjoin, substitute
from tidemark.engine.sql import Script


@dataclass
class NamedQuery:
    """A CTE or a view: a query read by name, with the column names it gives."""

    name: str
    columns: list[str] | None
    query: exp.Query
    where: exp.Expr
    is_view: bool = False


class PlanGraph:
    """The nodes planned so far and the state the builders share while planning."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.nodes: list[Node] = []
        self._sources: dict[str, int] = {}  # table name -> node id feeding queries (after normalize)
        self.used_tables: dict[str, TableDef] = {}
        self.materializer_reason: str | None = None
        #: sink table name -> why it got a materializer (None: it needs none), per INSERT
        self.materializer_reasons: dict[str, str | None] = {}
        self.sink_sources: dict[int, str] = {}  # sink position -> query column name
        # eventual delta joins: join node id -> (regular join stage, mode, upsert keys) to fall back to
        self._delta_fallback: dict[int, tuple[Any, str, frozenset]] = {}
        # named queries in scope while planning: CTEs (innermost WITH last), then views
        self.ctes: list[dict[str, NamedQuery]] = []
        self.expanding: list[str] = []  # CTE and view names being planned (a cycle check)
        # FROM subqueries (by node identity) -> their processing-time attribute (LookupPlanner)
        self.derived_proctime: dict[int, str] = {}
        #: views already planned, by lower-case name, in a statement set: the INSERTs that
        #: read one view share its stages (``shared_view``)
        self._views: dict[str, int] = {}

    # ------------------------------------------------------------------ node helpers

    def _add(self, kind: str, name: str, inputs: list[int], columns: list[str], types: list, **kw: Any) -> Node:
        node = Node(len(self.nodes), kind, name, inputs, list(columns), list(types), **kw)
        self.nodes.append(node)
        return node

    def _stage_name(self, kind: str) -> str:
        return f"{kind}#{len(self.nodes)}"

    def node(self, node_id: int) -> Node:
        return self.nodes[node_id]

    # ------------------------------------------------------------------ shared views

    def shared_view(self, name: str) -> int | None:
        """The node a view read by an earlier INSERT of the statement set planned to."""
        return self._views.get(name.lower())

    def share_view(self, name: str, node_id: int) -> None:
        """Remember a view's node for the statement set's later INSERTs. The node is pinned:
        no later calc folds into it or renames it in place, as it has other readers."""
        if self.script.statement_set:
            self._views[name.lower()] = node_id

    def _pinned(self, node_id: int) -> bool:
        return node_id in self._views.values()

    # ------------------------------------------------------------------ sources

    def source(self, table: TableDef) -> int:
        if table.name in self._sources:
            return self._sources[table.name]
        misplaced = options.misplaced(table.name, table.options, "source")
        if misplaced is not None:
            raise PlanError(misplaced)
        mode = table.changelog_mode
        keys = frozenset({Key(table.pk_indexes)}) if table.primary_key else frozenset()
        src = self._add(
            "source", f"source:{table.name}", [], table.column_names, table.types,
            upsert_keys=keys, changelog_mode=mode, table=table.name,
            detail={"format": table.format, "primary_key": list(table.primary_key)},
        )  # fmt: skip
        out = src
        if mode == "upsert":
            if not table.primary_key:
                raise PlanError(
                    f"table '{table.name}': format '{table.format}' is an upsert format and needs a PRIMARY KEY"
                )
            from tidemark.engine.stages.normalize import Normalize

            name = f"normalize:{table.name}"
            out = self._add(
                "normalize", name, [src.id], table.column_names, table.types,
                upsert_keys=keys, changelog_mode="retract",
                stage=Normalize(table.pk_indexes, len(table.columns), name=name,
                                columns=tuple(zip(table.column_names, table.types))),
                detail={"primary_key": list(table.primary_key)},
            )  # fmt: skip
        self._sources[table.name] = out.id
        self.used_tables[table.name] = table
        return out.id

    def compare_read_columns(self) -> None:
        """Tell each normalize which columns its consumers read when all of them are calcs
        (``Normalize.compared``): an upsert changing only other columns is then dropped, as
        it is below Flink's ``ChangelogNormalize``, where those columns are pruned."""
        for n in self.nodes:
            if n.kind != "normalize":
                continue
            consumers = [c for c in self.nodes if n.id in c.inputs]
            if not consumers or any(c.kind != "calc" or c.stage.projections is None for c in consumers):
                continue
            read = set(n.stage.pk)
            for c in consumers:
                for e in [*c.stage.projections, *([c.stage.predicate] if c.stage.predicate is not None else [])]:
                    read |= referenced_columns(e)
            if len(read) < n.width:
                n.stage.compared = tuple(sorted(read))

    # ------------------------------------------------------------------ calc

    def calc(
        self,
        input_id: int,
        projections: list[exp.Expr] | None,
        predicate: exp.Expr | None,
        names: list[str] | None,
        purpose: str = "",
    ) -> int:
        """Add a Calc (skipped when it would do nothing; composed into a preceding calc of
        this query when possible, so explain shows one calc per step)."""
        inp = self.node(input_id)
        if projections is not None and predicate is None and len(projections) == inp.width:
            if all(col_index(e) == i for i, e in enumerate(projections)):
                if names is None or list(names) == inp.columns:
                    return input_id
                if inp.kind not in ("source", "normalize") and inp.id == len(self.nodes) - 1 and not self._pinned(inp.id):
                    # a pure rename of a node made for this query: rename it, no stage
                    inp.columns = list(names)
                    if inp.stage is not None and hasattr(inp.stage, "output_names"):
                        inp.stage.output_names = list(names)
                    return input_id
                projections = [col_ref(i) for i in range(inp.width)]
        if projections is None and predicate is None:
            return input_id
        for e in [*(projections or []), *([predicate] if predicate is not None else [])]:
            check_supported(e)
        if (
            inp.kind == "calc"
            and inp.detail.get("composable")
            and inp.id == len(self.nodes) - 1
            and not self._consumers(inp.id)
            and not self._pinned(inp.id)
            and self._fold_within_limits(inp.stage, projections, predicate)
        ):
            # fold into the previous calc: substitute its projections into ours
            prev = inp.stage
            base = prev.projections if prev.projections is not None else [col_ref(i) for i in range(len(prev.input_names))]
            new_proj = [substitute(e, base) for e in projections] if projections is not None else list(base)
            new_pred = conjoin([p for p in (prev.predicate, substitute(predicate, base) if predicate is not None else None) if p is not None])
            self.nodes.pop()
            return self.calc(inp.inputs[0], new_proj, new_pred, names if projections is not None else (names or inp.columns), purpose or inp.detail.get("purpose", ""))
        from tidemark.engine.stages.calc import Calc

        out_names = list(names) if names is not None else (inp.columns if projections is None else [f"EXPR${i}" for i in range(len(projections))])
        out_types = inp.types if projections is None else [infer_type(e, inp.types) for e in projections]
        name = self._stage_name("calc")
        stage = Calc(projections, predicate, inp.columns, out_names, name=name, input_types=inp.types, output_types=out_types)
        out_types = [t if t is not None else k for t, k in zip(out_types, stage.output_types)]
        node = self._add(
            "calc", name, [input_id], out_names, out_types,
            upsert_keys=project_keys(inp.upsert_keys, projections), changelog_mode=inp.changelog_mode,
            stage=stage, detail={"composable": True, "purpose": purpose},
        )  # fmt: skip
        return node.id

    @staticmethod
    def _fold_within_limits(prev: Any, projections: list[exp.Expr] | None, predicate: exp.Expr | None) -> bool:
        """Folding substitutes the previous calc's expressions into ours, so sizes multiply
        (``c * c`` over ``c * c`` doubles per level): fold only while every composed
        expression stays within the expression limits, else stack a second calc."""
        if prev.projections is None:
            return True
        inputs = [limits.measure(e) for e in prev.projections]
        mine = [*(projections or []), *([predicate] if predicate is not None else [])]
        return all(limits.within(*limits.measure(e, inputs)) for e in mine)

    def _consumers(self, node_id: int) -> list[int]:
        return [n.id for n in self.nodes if node_id in n.inputs]
