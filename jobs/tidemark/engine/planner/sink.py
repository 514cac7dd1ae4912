"""Sink policy: mapping the query onto the sink's columns, then nothing, a materializer
(with the ON CONFLICT strategy) or a merge engine in front of the sink.

At the sink: the upsert key equals the sink's PRIMARY KEY (as a set) -> nothing to do.
Equality, not containment: then a ``-U``/``+U`` pair always concerns one sink row, so an
upsert sink may write ``+U`` and drop ``-U`` safely. Otherwise a SinkMaterializer is
planned, and without ``ON CONFLICT`` planning fails (Flink 2.3's
``table.exec.sink.require-on-conflict``). A sink whose ``merge-engine`` is set and is not
``deduplicate``, or that sets any merge option (``sequence.field``, ``changelog-producer``...,
also with ``deduplicate``), resolves conflicts itself and gets a merge-engine stage instead;
an ON CONFLICT clause next to it is refused (two competing policies), and an option that
looks like a merge option but is misspelled is refused rather than ignored.
"""

from __future__ import annotations

import re
from typing import Any

from sqlglot import exp

from tidemark.engine import options
from tidemark.engine.catalog import TableDef
from tidemark.engine.errors import PlanError
from tidemark.engine.expressions import col_index, col_ref
from tidemark.engine.planner.graph import PlanGraph
from tidemark.engine.planner.node import Key, Node, choose_key, format_key
from tidemark.engine.sql import InsertStatement, Tidemark, sql_error
from tidemark.engine.types import assignable

ON_CONFLICT_CLAUSES = ("ON CONFLICT DO NOTHING", "ON CONFLICT DO ERROR", "ON CONFLICT DO DEDUPLICATE")
COMPACTION_MODES = ("CHECKPOINT", "WATERMARK")
CONFLICT_POLICY_NOTE = (
    "the merge engine is the sink's conflict policy: rows with one primary key merge as the "
    "engine says, so no ON CONFLICT clause and no materializer are needed"
)



def parse_duration_ms(text: str, what: str) -> int:
    """Flink-style durations: '3600000', '10 s', '5 min', '1 h', '2 d', '500 ms'."""
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    units = {"": 1, "ms": 1, "s": 1000, "sec": 1000, "second": 1000, "seconds": 1000, "min": 60000,
             "minute": 60000, "minutes": 60000, "h": 3600000, "hour": 3600000, "hours": 3600000,
             "d": 86400000, "day": 86400000, "days": 86400000}  # fmt: skip
    if not m or m.group(2).lower() not in units:
        raise PlanError(f"{what}: cannot read duration {text!r} (e.g. '3600000', '30 s', '10 min', '1 h', '1 d')")
    return int(m.group(1)) * units[m.group(2).lower()]


class SinkPlanner(PlanGraph):
    """The INSERT: column mapping and the sink policy of the module docstring."""

    def check_statement_set(self) -> None:
        """The INSERTs of a statement set write different tables, none of which another
        INSERT reads: one job cannot read back what it writes within a batch, and two
        INSERTs into one table would be two writers of one topic (Flink unions them;
        here that is written as one INSERT with UNION ALL)."""
        written: dict[str, InsertStatement] = {}
        for ins in self.script.inserts:
            sink = self.script.table(ins.table)
            key = (sink.name if sink is not None else ins.table).lower()
            if key in written:
                raise sql_error(
                    f"table '{ins.table}' is written by two INSERTs of the statement set; write one "
                    "INSERT INTO it with UNION ALL of the two queries",
                    ins.node.this,
                )
            written[key] = ins
        topics: dict[str, str] = {}
        for ins in self.script.inserts:
            sink = self.script.table(ins.table)
            topic = sink.options.get("topic", sink.name) if sink is not None else ins.table
            if topic in topics:
                raise sql_error(
                    f"tables '{topics[topic]}' and '{ins.table}' of the statement set both write topic "
                    f"'{topic}'; a topic has one writer",
                    ins.node.this,
                )
            topics[topic] = ins.table
        for ins in self.script.inserts:
            for name in self._read_tables(ins.query):
                other = written.get(name.lower())
                if other is not None and other is not ins:
                    raise sql_error(
                        f"table '{other.table}' is written by one INSERT of the statement set and read by "
                        "another; a pipeline cannot read its own sink (run the reader as its own pipeline)",
                        ins.node.this,
                    )

    def insert(self, ins: InsertStatement) -> int:
        sink = self.script.table(ins.table)
        if sink is None:
            raise sql_error(f"unknown sink table '{ins.table}' (declare it with CREATE TABLE)", ins.node.this)
        if self.script.table(ins.table) is not None and ins.table in self._read_tables(ins.query):
            raise sql_error(f"table '{sink.name}' is both read and written by the pipeline", ins.node.this)
        body_id = self.query(ins.query)
        body = self.node(body_id)
        # map query columns onto sink columns
        if ins.columns is not None:
            targets = []
            listed: set[int] = set()
            for c in ins.columns:
                if not sink.has_column(c):
                    raise sql_error(f"sink table '{sink.name}' has no column '{c}'", ins.node.this)
                j = sink.index_of(c)
                if j in listed:
                    raise sql_error(f"column '{c}' is listed twice in INSERT INTO {sink.name} (...)", ins.node.this)
                targets.append(j)
                listed.add(j)
        else:
            targets = list(range(len(sink.columns)))
        if len(targets) != body.width:
            raise sql_error(
                f"INSERT INTO {sink.name}: the query produces {body.width} columns "
                f"({', '.join(body.columns)}) but {len(targets)} are expected "
                f"({', '.join(sink.columns[j].name for j in targets)})",
                ins.query,
            )
        source_of = {j: i for i, j in enumerate(targets)}
        for pk_name in sink.primary_key:
            if sink.index_of(pk_name) not in source_of:
                raise PlanError(
                    f"INSERT INTO {sink.name}: primary key column '{pk_name}' must be written (add it to the column list)"
                )
        projections: list[exp.Expr] = []
        for j, col in enumerate(sink.columns):
            if j not in source_of:
                projections.append(exp.Cast(this=exp.Null(), to=exp.DataType.build(str(col.type), dialect=Tidemark)))
                continue
            i = source_of[j]
            src_t = body.types[i]
            if src_t is not None and src_t.name != "NULL" and not assignable(src_t, col.type):
                raise PlanError(
                    f"INSERT INTO {sink.name}: column '{col.name}' is {col.type} but the query gives "
                    f"{src_t} (query column {i + 1}, '{body.columns[i]}'); add a CAST"
                )
            ref: exp.Expr = col_ref(i)
            if src_t is not None and src_t != col.type and not (src_t.is_string and col.type.is_string):
                if not (src_t.is_integral and col.type.is_integral):
                    ref = exp.Cast(this=ref, to=exp.DataType.build(str(col.type), dialect=Tidemark))
            projections.append(ref)
        self.sink_sources = {j: body.columns[i] for j, i in source_of.items()}
        if len(projections) == body.width and all(col_index(e) == i for i, e in enumerate(projections)):
            return body_id  # positions already match; the sink names the columns itself
        return self.calc(body_id, projections, None, sink.column_names, purpose="sink mapping")

    def _query_names(self, sink: TableDef, key: tuple[int, ...] | None) -> list[str] | None:
        """Key columns as the query names them ("v AS k" where the INSERT maps v to k)."""
        if key is None:
            return None
        out = []
        for j in key:
            q, name = self.sink_sources.get(j), sink.columns[j].name
            out.append(name if q is None or q == name else f"{q} AS {name}")
        return out

    def _read_tables(self, q: exp.Expr, seen: frozenset[str] = frozenset()) -> set[str]:
        """Names read by ``q``, through the views it reads (a cycle is reported when planned)."""
        names = {t.name for t in q.find_all(exp.Table)}
        for name in list(names):
            view = self.script.view(name)
            if view is not None and name.lower() not in seen:
                names |= self._read_tables(view.query, seen | {name.lower()})
        return names

    def finish(self, ins: InsertStatement, input_id: int) -> None:
        """Plan what sits between the query and the sink: nothing, a materializer, or a
        merge engine; then the sink node."""
        sink = self.script.table(ins.table)
        assert sink is not None
        self.materializer_reason = None
        misplaced = options.misplaced(sink.name, sink.options, "sink")
        if misplaced is not None:
            raise PlanError(misplaced)
        inp = self.node(input_id)
        pk = Key(sink.pk_indexes)
        sink_mode = sink.changelog_mode
        # an eventual delta join emits duplicates and deletes by key: unless the sink writes
        # upserts by its key, a materializer applies them by the upsert key
        eventual_delta = self._check_eventual_delta(input_id, sink)
        force_mat = eventual_delta and sink_mode != "upsert"
        engine = sink.merge_engine
        detail: dict[str, Any] = {"format": sink.format, "primary_key": list(sink.primary_key)}
        if sink_mode == "upsert" and not sink.primary_key:
            raise PlanError(f"sink '{sink.name}': format '{sink.format}' writes upserts and needs a PRIMARY KEY")
        if sink_mode == "append" and inp.changelog_mode != "append":
            raise PlanError(
                f"sink '{sink.name}' has the append-only format '{sink.format}' but the query produces "
                f"updates ({inp.changelog_mode} changelog); use an upsert-* or changelog-* format"
            )
        from tidemark.engine.stages.merge.options import routing_options

        merge_keys = routing_options(sink.name, sink.options)
        if (engine is not None and engine != "deduplicate") or merge_keys:
            input_id = self._merge_engine(ins, sink, inp, engine or "deduplicate", merge_keys)
            detail["merge_engine"] = engine or "deduplicate"
        elif sink.primary_key:
            if pk in inp.upsert_keys and not force_mat:
                self.materializer_reason = None
                if ins.on_conflict is not None:
                    detail["on_conflict_ignored"] = (
                        f"ON CONFLICT DO {ins.on_conflict} has no effect: the upsert key equals the primary key"
                    )
            else:
                ukey = choose_key(inp.upsert_keys, prefer=pk)
                key_names = format_key(self._query_names(sink, ukey))
                pk_names = format_key(list(sink.primary_key))
                why = (
                    f"an eventually consistent delta join emits duplicates and deletes by key, which the "
                    f"materializer applies by the upsert key {key_names} before the {sink_mode} sink '{sink.name}'"
                    if pk in inp.upsert_keys
                    else
                    f"the upsert key {key_names} of the query differs from the primary key {pk_names} "
                    f"of sink table '{sink.name}'"
                    if ukey is not None
                    else f"the query has no upsert key (its changes are not unique by any key), "
                    f"but sink table '{sink.name}' has primary key {pk_names}"
                )
                if inp.changelog_mode == "append" and ukey is None:
                    why += " (append-only input)"
                self.materializer_reason = why
                strategy = ins.on_conflict or ("DEDUPLICATE" if pk in inp.upsert_keys else None)
                if strategy is None:
                    raise PlanError(
                        f"{why}: several rows may map to one primary key, so a sink upsert materializer is "
                        "needed and the query must say how conflicts are resolved. Add one of: "
                        + ", ".join(ON_CONFLICT_CLAUSES)
                        + " (NOTHING keeps the first row, ERROR fails the pipeline, DEDUPLICATE keeps the "
                        "latest active row and rolls back on retraction)"
                    )
                from tidemark.engine.stages.materializer import SinkMaterializer

                ttl = self.script.options.get("table.exec.state.ttl")
                ttl_ms = parse_duration_ms(ttl, "SET 'table.exec.state.ttl'") if ttl else None
                name = f"materializer:{sink.name}"
                stage = SinkMaterializer(
                    sink.name, sink.pk_indexes, tuple(sink.primary_key), ukey if ukey else None,
                    strategy, ttl_ms=ttl_ms or None, name=name, columns=tuple(zip(sink.column_names, sink.types)),
                )  # fmt: skip
                node = self._add(
                    "materializer", name, [input_id], sink.column_names, sink.types,
                    upsert_keys=frozenset({pk}), changelog_mode="retract", stage=stage,
                    detail={
                        "strategy": strategy, "primary_key": list(sink.primary_key),
                        "upsert_key": inp.key_names(ukey), "reason": why, "ttl_ms": ttl_ms,
                    },
                )  # fmt: skip
                input_id = node.id
        elif ins.on_conflict is not None:
            raise PlanError(f"ON CONFLICT needs a sink with a PRIMARY KEY; '{sink.name}' has none")
        self.materializer_reasons[sink.name] = self.materializer_reason
        last = self.node(input_id)
        self._add(
            "sink", f"sink:{sink.name}", [input_id], sink.column_names, sink.types,
            upsert_keys=last.upsert_keys, changelog_mode=sink_mode, table=sink.name, detail=detail,
        )  # fmt: skip

    def _merge_engine(
        self, ins: InsertStatement, sink: TableDef, inp: Node, engine: str, merge_keys: list[str]
    ) -> int:
        """Host the sink with its merge engine. The engine is the conflict policy (Paimon's
        model: how rows with one primary key merge is a property of the table), so it takes
        the place of the materializer and an ON CONFLICT clause would be a second, competing
        policy: refused, naming both. This holds for ``deduplicate`` too once a merge option
        such as ``sequence.field`` is set: "the largest sequence wins" is a conflict policy."""
        what = f"merge-engine '{engine}'" + (
            f" (options {', '.join(repr(k) for k in merge_keys)})" if merge_keys else ""
        )
        if not sink.primary_key:
            raise PlanError(f"sink '{sink.name}': {what} needs a PRIMARY KEY")
        if ins.on_conflict is not None:
            raise PlanError(
                f"sink '{sink.name}' resolves conflicts with {what}; remove ON CONFLICT DO "
                f"{ins.on_conflict}, or remove the merge options to resolve conflicts with "
                "ON CONFLICT instead"
            )
        if sink.changelog_mode == "append" and engine != "first-row":
            raise PlanError(
                f"sink '{sink.name}' has the append-only format '{sink.format}' but {what} emits "
                "updates; use an upsert-* or changelog-* format"
            )
        from tidemark.engine.stages.merge_engine import build_merge_engine

        stage = build_merge_engine(
            sink.name, sink.column_names, sink.pk_indexes, dict(sink.options),
            inp.changelog_mode != "append", types=sink.types, name=f"merge_engine:{sink.name}",
        )  # fmt: skip
        detail: dict[str, Any] = dict(stage.describe())
        detail["options"] = merge_keys
        detail["conflict_policy"] = CONFLICT_POLICY_NOTE
        node = self._add(
            "merge_engine", stage.name, [inp.id], sink.column_names, sink.types,
            upsert_keys=frozenset({Key(sink.pk_indexes)}), changelog_mode="retract",
            stage=stage, detail=detail,
        )  # fmt: skip
        return node.id
