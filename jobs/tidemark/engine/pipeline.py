"""A compiled pipeline: the stage DAG of one ``INSERT ... SELECT`` (or of the INSERTs of a
statement set, one sink node each) plus its tables and options, and how to explain it.
Hosts (replay, Spark) run ``nodes`` in list order, which is a topological order."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tidemark.engine.catalog import TableDef
from tidemark.engine.fusion import fused_pairs
from tidemark.engine.planner import Node, Planner, format_key
from tidemark.engine.sql import parse_script, too_deep


@dataclass(frozen=True)
class SinkTarget:
    """One INSERT of the pipeline: the table it writes, its ON CONFLICT clause, its sink
    node and why a materializer stands before it (None: none does)."""

    table: TableDef
    on_conflict: str | None
    node_id: int
    materializer_reason: str | None = None


@dataclass
class Pipeline:
    sql: str
    tables: dict[str, TableDef]
    sources: dict[str, TableDef]
    #: one per INSERT, in statement order (several in a statement set)
    sinks: list[SinkTarget]
    options: dict[str, str]
    nodes: list[Node]
    statement_set: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def sink(self) -> TableDef:
        """The sink table of a one-INSERT pipeline (a statement set's first; its hosts
        write every one of ``sinks``)."""
        return self.sinks[0].table

    @property
    def on_conflict(self) -> str | None:
        return self.sinks[0].on_conflict

    @property
    def materializer_reason(self) -> str | None:
        return self.sinks[0].materializer_reason

    # ------------------------------------------------------------------ structure

    @property
    def sink_node(self) -> Node:
        return self.nodes[self.sinks[0].node_id]

    def upstream(self, node_id: int) -> set[int]:
        """``node_id`` and every node it reads from, transitively."""
        seen: set[int] = set()
        todo = [node_id]
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                todo.extend(self.nodes[n].inputs)
        return seen

    @property
    def source_nodes(self) -> dict[str, Node]:
        return {n.table: n for n in self.nodes if n.kind == "source"}

    @property
    def watermark_delays(self) -> dict[str, int]:
        """Source table -> its watermark delay (ms), for the sources that declare WATERMARK."""
        return {name: t.watermark.delay_ms for name, t in self.sources.items() if t.watermark is not None}

    @property
    def stage_nodes(self) -> list[Node]:
        """Nodes that carry a runtime stage, in topological order."""
        return [n for n in self.nodes if n.stage is not None]

    def node(self, node_id: int) -> Node:
        return self.nodes[node_id]

    def consumers(self, node_id: int) -> list[Node]:
        return [n for n in self.nodes if node_id in n.inputs]

    @property
    def materializer(self) -> Node | None:
        """The (first sink's) materializer."""
        return self.materializer_of(self.sinks[0])

    @property
    def merge_engine(self) -> Node | None:
        """The (first sink's) merge engine."""
        return self.merge_engine_of(self.sinks[0])

    def materializer_of(self, target: SinkTarget) -> Node | None:
        return self._before_sink(target, "materializer")

    def merge_engine_of(self, target: SinkTarget) -> Node | None:
        return self._before_sink(target, "merge_engine")

    def _before_sink(self, target: SinkTarget, kind: str) -> Node | None:
        before = self.nodes[self.nodes[target.node_id].inputs[0]]
        return before if before.kind == kind else None

    @property
    def compaction_mode(self) -> str:
        return self.options.get("table.exec.sink.upserts.compaction-mode", "CHECKPOINT").upper()

    # ------------------------------------------------------------------ explain

    def explain(self) -> dict[str, Any]:
        """A JSON-ready description: every stage with its upsert key and changelog mode;
        the first sink's policy at the top, every sink's in ``sinks``."""
        return {
            **self._explain_sink(self.sinks[0]),
            "statement_set": self.statement_set,
            "sinks": [self._explain_sink(t) for t in self.sinks],
            "compaction_mode": self.compaction_mode,
            "options": dict(self.options),
            "stages": [self._explain_node(n) for n in self.nodes],
        }

    def _explain_sink(self, target: SinkTarget) -> dict[str, Any]:
        """One sink's policy: its materializer (ON CONFLICT strategy, keys, reason), or its
        merge engine as the stage describes itself (engine, changelog producer, sequence
        fields, groups, functions) and why no ON CONFLICT is needed."""
        mat = self.materializer_of(target)
        engine = self.merge_engine_of(target)
        return {
            "sink": target.table.name,
            "sink_primary_key": list(target.table.primary_key),
            "on_conflict": target.on_conflict,
            "materializer": (
                {
                    "stage": mat.name,
                    "strategy": mat.detail["strategy"],
                    "upsert_key": mat.detail["upsert_key"],
                    "primary_key": mat.detail["primary_key"],
                    "reason": mat.detail["reason"],
                    "ttl_ms": mat.detail.get("ttl_ms"),
                }
                if mat is not None
                else None
            ),
            "merge_engine": {"stage": engine.name, **engine.detail} if engine is not None else None,
        }

    @staticmethod
    def _explain_node(n: Node) -> dict[str, Any]:
        key = n.upsert_key
        detail = {k: v for k, v in n.detail.items() if v not in (None, "", [], {})}
        if n.kind == "calc" and n.stage is not None:
            spark = n.stage.to_spark_sql()
            if spark["columns"] is not None:
                detail["projections"] = [f"{sql} AS {name}" for name, sql in spark["columns"]]
            if spark["filter"] is not None:
                detail["filter"] = spark["filter"]
        out: dict[str, Any] = {
            "id": n.id,
            "kind": n.kind,
            "name": n.name,
            "inputs": list(n.inputs),
            "columns": list(n.columns),
            "types": [str(t) if t is not None else None for t in n.types],
            "changelog_mode": n.changelog_mode,
            "upsert_key": n.key_names(key),
            "upsert_keys": sorted([n.columns[i] for i in sorted(k)] for k in n.upsert_keys),
        }
        if n.table is not None:
            out["table"] = n.table
        if detail:
            out["detail"] = detail
        return out

    def explain_text(self) -> str:
        if self.statement_set:
            lines = ["Pipeline EXECUTE STATEMENT SET ("
                     + "; ".join(self._insert_head(t) for t in self.sinks) + ")"]  # fmt: skip
        else:
            lines = [f"Pipeline {self._insert_head(self.sinks[0])}"]
        for n in self.nodes:
            head = f"[{n.id}] {n.kind}"
            if n.kind in ("source", "sink"):
                head += f" {n.table}"
            elif n.kind == "join":
                head += f" {n.detail['join_type']}"
                if n.detail.get("strategy") == "delta":
                    head += f" (delta join, {n.detail['delta_join']['consistency']})"
            elif n.kind == "lookup_join":
                head += f" {n.detail['join_type']} {n.detail['table']} (FOR SYSTEM_TIME AS OF processing time)"
            elif n.kind == "materializer":
                head += f" ON CONFLICT DO {n.detail['strategy']}"
            elif n.kind == "merge_engine":
                head += f" {n.detail['merge_engine']}"
            if n.inputs:
                head += " <- " + ", ".join(f"[{i}]" for i in n.inputs)
            if self.statement_set and n.kind not in ("sink", "materializer", "merge_engine"):
                head += self._shared_by(n)
            lines.append(head)
            lines.append(f"      mode: {n.changelog_mode}   upsert key: {format_key(n.key_names(n.upsert_key))}")
            lines.append(f"      columns: {', '.join(n.columns)}")
            for text in self._detail_lines(n):
                lines.append(f"      {text}")
        for target in self.sinks:
            lines.append(self._sink_policy_line(target))
        for first, (second, _) in fused_pairs(self).items():
            a, b = self.node(first), self.node(second)
            lines.append(f"Fused: [{a.id}] {a.kind} and [{b.id}] {b.kind} share their key and run as one keyed "
                         "operator (no shuffle between them)")
        lines.append(f"Compaction: {self.compaction_mode} (the micro-batch is the barrier)")
        if self.options:
            lines.append("Options: " + ", ".join(f"{k}={v}" for k, v in self.options.items()))
        return "\n".join(lines)

    @staticmethod
    def _insert_head(target: SinkTarget) -> str:
        return f"INSERT INTO {target.table.name}" + (
            f" ON CONFLICT DO {target.on_conflict}" if target.on_conflict else "")  # fmt: skip

    def _shared_by(self, node: Node) -> str:
        """`` (shared by a, b)`` for a node of a statement set that feeds several sinks."""
        sinks = [t.table.name for t in self.sinks if node.id in self.upstream(t.node_id)]
        return f"   (shared by {', '.join(sinks)})" if len(sinks) > 1 else ""

    def _sink_policy_line(self, target: SinkTarget) -> str:
        sink = target.table
        mat, engine = self.materializer_of(target), self.merge_engine_of(target)
        if mat is not None:
            return (
                f"Materializer: [{mat.id}] ON CONFLICT DO {mat.detail['strategy']} keyed by sink primary key "
                f"{format_key(mat.detail['primary_key'])}; because {mat.detail['reason']}"
            )
        if engine is not None:
            return (
                f"Merge engine: [{engine.id}] {engine.detail['merge_engine']} keyed by sink primary key "
                f"{format_key(list(sink.primary_key))}; {engine.detail['conflict_policy']}"
            )
        where = f" of sink '{sink.name}'" if self.statement_set else ""
        if sink.primary_key:
            return (
                f"No materializer{where}: the upsert key reaching the sink equals its primary key "
                f"{format_key(list(sink.primary_key))}"
            )
        return f"No materializer{where}: the sink has no primary key"

    @staticmethod
    def _detail_lines(n: Node) -> list[str]:
        d = n.detail
        out: list[str] = []
        if n.kind == "source":
            out.append(f"format: {d.get('format')}")
        elif n.kind in ("join", "window_join"):
            out.append("on: " + " AND ".join(d["on"]))
            if d.get("residual"):
                out.append(f"residual: {d['residual']}")
            for side, predicate in d.get("filtered_inputs", {}).items():
                out.append(f"{side} input filtered by: {predicate} (from the WHERE, moved below the join)")
            if d.get("window"):  # a window join
                out.append(f"window: {d['window']}   emits when the watermark passes window_end")
            if d.get("strategy"):
                out.append(f"strategy: {d['strategy']} join; {d.get('strategy_reason', '')}".rstrip("; "))
            if d.get("delta_join"):
                dj = d["delta_join"]
                out.append("indexes: " + ", ".join(f"{s} {ix}" for s, ix in dj["indexes"].items()))
                cache = "cache: off" if not dj["cache_enabled"] else (
                    f"cache: {dj['cache_sizes']['left']} left / {dj['cache_sizes']['right']} right join keys (LRU)")
                out.append(cache)
        elif n.kind == "window":
            clock = "clock: processing time" if d.get("proctime") else f"watermark of: {', '.join(d['watermark_of'])}"
            out.append(f"window: {d['window']}   {clock}")
        elif n.kind == "window_aggregate":
            clock = "processing time reaches" if d.get("proctime") else "watermark passes"
            out.append(f"group by: {', '.join(d['group_by'])}   emits when the {clock} window_end")
            out.append(f"aggregates: {', '.join(d['aggregates'])}")
        elif n.kind == "over_aggregate":
            out.append(f"partition by: {', '.join(d['partition_by']) or '(none: one partition)'}   order by: {d['order_by']}   "
                       f"{d['frame']}")
            out.append(f"aggregates: {', '.join(d['aggregates'])}   emits each row when the watermark passes it "
                       f"(watermark of: {', '.join(d['watermark_of'])})")
        elif n.kind == "lookup_join":
            out.append("on: " + " AND ".join(d["on"]))
            if d.get("residual"):
                out.append(f"residual: {d['residual']}")
            where = f"index {d['table']}.{d['index']} (Spark: the index service)" if d.get("index") else "state"
            out.append(f"dimension rows: {where}, as of each batch's start")
        elif n.kind == "aggregate":
            out.append(f"group by: {', '.join(d['group_by']) or '(none: one global group)'}")
            out.append(f"aggregates: {', '.join(d['aggregates']) or '(none: SELECT DISTINCT)'}")
        elif n.kind in ("rank", "window_rank"):
            out.append(f"partition by: {', '.join(d['partition_by']) or '(none: one partition)'}   "
                       f"order by: {', '.join(d['order_by'])}")
            out.append(f"rows: {d.get('range')}   row number: {d.get('row_number')}   input: {d.get('input')}")
            if d.get("deduplicate"):
                out.append(f"deduplicate: {d['deduplicate']}")
            if d.get("window"):  # a window Top-N
                out.append(f"window: {d['window']}   emits when the watermark passes window_end")
        elif n.kind == "calc" and n.stage is not None:
            spark = n.stage.to_spark_sql()
            if spark["filter"] is not None:
                out.append(f"filter: {spark['filter']}")
            if spark["columns"] is not None:
                out.append("project: " + ", ".join(f"{sql} AS {name}" for name, sql in spark["columns"]))
        elif n.kind == "materializer":
            out.append(f"primary key: {format_key(d['primary_key'])}   input upsert key: {format_key(d['upsert_key'])}")
            if d.get("ttl_ms"):
                out.append(f"state ttl: {d['ttl_ms']} ms")
        elif n.kind == "merge_engine":
            producer = d["changelog_producer"]
            if producer == "full-compaction":
                producer += f" every {d['compaction_interval_ms']} ms"
            if d.get("row_deduplicate"):
                producer += ", row-deduplicate"
            out.append(f"changelog producer: {producer}")
            if d.get("sequence_field"):
                out.append(f"sequence field: {', '.join(d['sequence_field'])} ({d['sequence_order']})")
            for seq, members in (d.get("sequence_groups") or {}).items():
                out.append(f"sequence group: {seq} -> {', '.join(members)}")
            if d.get("aggregate_functions"):
                out.append(
                    "aggregate functions: "
                    + ", ".join(f"{col}={fn}" for col, fn in d["aggregate_functions"].items())
                )
            if d.get("ignore_delete"):
                out.append("ignore delete: -U/-D are dropped")
            if d.get("remove_record_on_delete"):
                out.append("remove record on delete")
            if d.get("remove_record_on_sequence_group"):
                out.append(f"remove record on sequence group: {', '.join(d['remove_record_on_sequence_group'])}")
        elif n.kind == "sink":
            out.append(f"format: {d.get('format')}   primary key: {format_key(d.get('primary_key') or None)}")
            if d.get("on_conflict_ignored"):
                out.append(d["on_conflict_ignored"])
        return out


def compile_sql(sql: str) -> Pipeline:
    """Parse and plan a pipeline script. Raises SqlError / PlanError with a message a user
    can act on (what and where)."""
    script = parse_script(sql)
    planner = Planner(script)
    try:
        nodes = planner.plan()
    except RecursionError:
        raise too_deep() from None
    sink_nodes = {n.table: n.id for n in nodes if n.kind == "sink"}
    sinks = []
    for ins in script.inserts:
        table = script.table(ins.table)
        assert table is not None
        sinks.append(SinkTarget(table, ins.on_conflict, sink_nodes[table.name], planner.materializer_reasons[table.name]))
    return Pipeline(
        sql=sql,
        tables=dict(script.tables),
        sources=dict(planner.used_tables),
        sinks=sinks,
        options=dict(script.options),
        nodes=nodes,
        statement_set=script.statement_set,
    )
