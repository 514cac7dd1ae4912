"""A compiled pipeline: the stage DAG of one ``INSERT ... SELECT`` plus its tables and
options, and how to explain it. Hosts (replay, Spark) run ``nodes`` in list order, which
is a topological order."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tidemark.engine.catalog import TableDef
from tidemark.engine.planner import Node, Planner, format_key
from tidemark.engine.sql import parse_script, too_deep


@dataclass
class Pipeline:
    sql: str
    tables: dict[str, TableDef]
    sources: dict[str, TableDef]
    sink: TableDef
    options: dict[str, str]
    nodes: list[Node]
    on_conflict: str | None
    materializer_reason: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ structure

    @property
    def sink_node(self) -> Node:
        return self.nodes[-1]

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
        return next((n for n in self.nodes if n.kind == "materializer"), None)

    @property
    def merge_engine(self) -> Node | None:
        return next((n for n in self.nodes if n.kind == "merge_engine"), None)

    @property
    def compaction_mode(self) -> str:
        return self.options.get("table.exec.sink.upserts.compaction-mode", "CHECKPOINT").upper()

    # ------------------------------------------------------------------ explain

    def explain(self) -> dict[str, Any]:
        """A JSON-ready description: every stage with its upsert key and changelog mode."""
        mat = self.materializer
        return {
            "sink": self.sink.name,
            "sink_primary_key": list(self.sink.primary_key),
            "on_conflict": self.on_conflict,
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
            "merge_engine": self._explain_merge_engine(),
            "compaction_mode": self.compaction_mode,
            "options": dict(self.options),
            "stages": [self._explain_node(n) for n in self.nodes],
        }

    def _explain_merge_engine(self) -> dict[str, Any] | None:
        """The sink's merge engine as its stage describes itself (engine, changelog
        producer, sequence fields, groups, functions), and why no ON CONFLICT is needed."""
        node = self.merge_engine
        if node is None:
            return None
        return {"stage": node.name, **node.detail}

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
        lines = [f"Pipeline INSERT INTO {self.sink.name}"
                 + (f" ON CONFLICT DO {self.on_conflict}" if self.on_conflict else "")]  # fmt: skip
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
            lines.append(head)
            lines.append(f"      mode: {n.changelog_mode}   upsert key: {format_key(n.key_names(n.upsert_key))}")
            lines.append(f"      columns: {', '.join(n.columns)}")
            for text in self._detail_lines(n):
                lines.append(f"      {text}")
        mat = self.materializer
        if mat is not None:
            lines.append(
                f"Materializer: [{mat.id}] ON CONFLICT DO {mat.detail['strategy']} keyed by sink primary key "
                f"{format_key(mat.detail['primary_key'])}; because {mat.detail['reason']}"
            )
        elif self.merge_engine is not None:
            me = self.merge_engine
            lines.append(
                f"Merge engine: [{me.id}] {me.detail['merge_engine']} keyed by sink primary key "
                f"{format_key(list(self.sink.primary_key))}; {me.detail['conflict_policy']}"
            )
        elif self.sink.primary_key:
            lines.append(
                f"No materializer: the upsert key reaching the sink equals its primary key "
                f"{format_key(list(self.sink.primary_key))}"
            )
        else:
            lines.append("No materializer: the sink has no primary key")
        lines.append(f"Compaction: {self.compaction_mode} (the micro-batch is the barrier)")
        if self.options:
            lines.append("Options: " + ", ".join(f"{k}={v}" for k, v in self.options.items()))
        return "\n".join(lines)

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
            out.append(f"window: {d['window']}   watermark of: {', '.join(d['watermark_of'])}")
        elif n.kind == "window_aggregate":
            out.append(f"group by: {', '.join(d['group_by'])}   emits when the watermark passes window_end")
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
    ins = script.insert
    assert ins is not None
    sink = script.table(ins.table)
    assert sink is not None
    return Pipeline(
        sql=sql,
        tables=dict(script.tables),
        sources=dict(planner.used_tables),
        sink=sink,
        options=dict(script.options),
        nodes=nodes,
        on_conflict=ins.on_conflict,
        materializer_reason=planner.materializer_reason,
    )
