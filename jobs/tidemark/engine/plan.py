"""The planner: one INSERT ... SELECT becomes a DAG of stages, each with its upsert key and
changelog mode, and the sink gets a materializer exactly when it needs one.

Upsert keys follow Flink's ``FlinkRelMdUpsertKeys`` (checked against Flink 2.3's
``EXPLAIN`` on the same queries):

- source: its PRIMARY KEY (none without one); normalize keeps it;
- calc: a filter keeps every key; a projection keeps a key only when each of its columns
  is projected unchanged (renaming is fine, ``k + 0`` is not);
- group aggregate: its group-by columns (a global aggregate has the empty key: one row);
- join: a side's keys are first kept only if they contain that side's join columns (the
  join repartitions by the join key; a key that does not contain it can see its changes
  reordered, which is exactly the seed's s1/s2 disorder). Then, like Flink's
  ``getJoinUniqueKeys``: every (left key + right key) union survives; the left keys
  survive if the right side is unique on its join columns and the join does not pad the
  left side with NULLs (inner/left); symmetrically for the right (inner/right).

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
from dataclasses import dataclass, field
from itertools import product
from typing import Any

from sqlglot import exp

from tidemark.engine import limits, options
from tidemark.engine.catalog import TableDef
from tidemark.engine.errors import PlanError, SqlError
from tidemark.engine.expressions import (
    RowPredicate,
    check_supported,
    col_index,
    col_ref,
    infer_type,
    to_spark_sql,
)
from tidemark.engine.sql import InsertStatement, Script, Tidemark, describe, position_of, sql_error
from tidemark.engine.types import SqlType, assignable, make_type

Key = frozenset  # frozenset[int]: one upsert key, as column positions

ON_CONFLICT_CLAUSES = ("ON CONFLICT DO NOTHING", "ON CONFLICT DO ERROR", "ON CONFLICT DO DEDUPLICATE")
COMPACTION_MODES = ("CHECKPOINT", "WATERMARK")
CONFLICT_POLICY_NOTE = (
    "the merge engine is the sink's conflict policy: rows with one primary key merge as the "
    "engine says, so no ON CONFLICT clause and no materializer are needed"
)


@dataclass
class Node:
    """One stage of the plan. ``stage`` is the runtime object (None for source/sink);
    ``upsert_keys`` are all keys that stay unique and ordered at this point."""

    id: int
    kind: str  # source | normalize | calc | join | aggregate | materializer | merge_engine | sink
    name: str
    inputs: list[int]
    columns: list[str]
    types: list[SqlType | None]
    upsert_keys: frozenset = frozenset()
    changelog_mode: str = "retract"
    stage: Any = None
    table: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def width(self) -> int:
        return len(self.columns)

    @property
    def upsert_key(self) -> tuple[int, ...] | None:
        """The key shown and used downstream: the smallest one (ties: earliest columns)."""
        return choose_key(self.upsert_keys)

    def key_names(self, key: tuple[int, ...] | None) -> list[str] | None:
        return None if key is None else [self.columns[i] for i in key]


def choose_key(keys: frozenset, prefer: frozenset | None = None) -> tuple[int, ...] | None:
    if not keys:
        return None
    if prefer is not None and prefer in keys:
        return tuple(sorted(prefer))
    return min((tuple(sorted(k)) for k in keys), key=lambda k: (len(k), k))


def format_key(names: list[str] | None) -> str:
    return "(none)" if names is None else "(" + ", ".join(names) + ")"


# --------------------------------------------------------------------------- upsert keys


def project_keys(keys: frozenset, projections: list[exp.Expr] | None) -> frozenset:
    """Keys that survive a projection: all their columns projected unchanged."""
    if projections is None:
        return keys
    outputs: dict[int, list[int]] = {}
    for out_pos, e in enumerate(projections):
        i = col_index(e)
        if i is not None:
            outputs.setdefault(i, []).append(out_pos)
    result = set()
    for k in keys:
        if all(c in outputs for c in k):
            # every way of picking one output per key column is a key (as Flink enumerates)
            for combo in product(*(outputs[c] for c in sorted(k))):
                result.add(Key(combo))
    return frozenset(result)


def join_keys(
    join_type: str,
    left_keys: frozenset,
    right_keys: frozenset,
    left_join_cols: frozenset,
    right_join_cols: frozenset,
    left_width: int,
) -> frozenset:
    """Flink's getJoinUpsertKeys: see the module docstring."""
    left_kept = {k for k in left_keys if left_join_cols <= k}
    right_kept = {Key(c + left_width for c in k) for k in right_keys if right_join_cols <= k}
    left_unique = any(k <= left_join_cols for k in left_keys)
    right_unique = any(k <= right_join_cols for k in right_keys)
    result = {lk | rk for lk in left_kept for rk in right_kept}
    if right_unique and join_type in ("inner", "left"):
        result |= left_kept
    if left_unique and join_type in ("inner", "right"):
        result |= right_kept
    return frozenset(result)


# --------------------------------------------------------------------------- name scopes


@dataclass
class Relation:
    alias: str
    columns: list[str]
    types: list[SqlType | None]
    offset: int

    def __post_init__(self) -> None:
        # case-folded name -> positions: a reference is resolved once per use, so a scan
        # of the columns per reference made a wide SELECT quadratic
        self.by_folded: dict[str, list[int]] = {}
        for i, c in enumerate(self.columns):
            self.by_folded.setdefault(c.lower(), []).append(i)


class Scope:
    """The relations visible in one SELECT, laid side by side in one row (join order)."""

    def __init__(self) -> None:
        self.relations: list[Relation] = []

    @property
    def width(self) -> int:
        return sum(len(r.columns) for r in self.relations)

    def add(self, alias: str, columns: list[str], types: list[SqlType | None], where: exp.Expr) -> Relation:
        if alias and any(r.alias.lower() == alias.lower() for r in self.relations):
            raise sql_error(f"table alias '{alias}' is used twice in one FROM clause", where)
        rel = Relation(alias, list(columns), list(types), self.width)
        self.relations.append(rel)
        return rel

    @property
    def names(self) -> list[str]:
        return [c for r in self.relations for c in r.columns]

    @property
    def types(self) -> list[SqlType | None]:
        return [t for r in self.relations for t in r.types]

    def resolve(self, col: exp.Column) -> int:
        name, qualifier = col.name, col.table
        if col.args.get("db") or col.args.get("catalog"):
            raise sql_error(f"column reference {col.sql()} is not supported (use alias.column)", col)
        if qualifier:
            rels = [r for r in self.relations if r.alias.lower() == qualifier.lower()]
            if not rels:
                raise sql_error(f"unknown table or alias '{qualifier}' in {col.sql()}", col)
            candidates = rels
        else:
            candidates = self.relations
        folded = name.lower()
        hits = [(r, i) for r in candidates for i in r.by_folded.get(folded, ())]
        exact = [(r, i) for r, i in hits if r.columns[i] == name]
        if len(hits) > 1 and len(exact) == 1:
            hits = exact
        if not hits:
            where = f" in '{qualifier}'" if qualifier else ""
            raise sql_error(f"unknown column '{name}'{where}", col)
        if len(hits) > 1:
            owners = ", ".join(sorted({r.alias or '(subquery)' for r, _ in hits}))
            raise sql_error(f"column '{name}' is ambiguous (in {owners}); qualify it", col)
        r, i = hits[0]
        return r.offset + i

    def star(self, qualifier: str | None, where: exp.Expr) -> list[tuple[str, int]]:
        rels = self.relations
        if qualifier:
            rels = [r for r in rels if r.alias.lower() == qualifier.lower()]
            if not rels:
                raise sql_error(f"unknown table or alias '{qualifier}' in {qualifier}.*", where)
        return [(c, r.offset + i) for r in rels for i, c in enumerate(r.columns)]


# --------------------------------------------------------------------------- planner

_AGG_FUNCS = {exp.Sum: "SUM", exp.Min: "MIN", exp.Max: "MAX", exp.Avg: "AVG", exp.LastValue: "LAST_VALUE"}
_UNSUPPORTED_SELECT_ARGS = {
    "distinct": "SELECT DISTINCT",
    "order": "ORDER BY in a streaming query",
    "limit": "LIMIT in a streaming query",
    "offset": "OFFSET",
    "with_": "WITH (common table expressions)",
    "windows": "WINDOW clauses",
    "qualify": "QUALIFY",
    "laterals": "LATERAL",
    "sample": "TABLESAMPLE",
    "connect": "CONNECT BY",
    "into": "SELECT INTO",
    "exclude": "SELECT * EXCLUDE",
    "prewhere": "PREWHERE",
    "cluster": "CLUSTER BY",
    "distribute": "DISTRIBUTE BY",
    "sort": "SORT BY",
    "settings": "SETTINGS",
    "format": "FORMAT",
    "locks": "locking clauses",
    "kind": "SELECT AS STRUCT/VALUE",
    "hint": "query hints",
    "operation_modifiers": "select modifiers",
}


def _conjuncts(e: exp.Expr | None) -> list[exp.Expr]:
    if e is None:
        return []
    if isinstance(e, exp.Paren):
        return _conjuncts(e.this)
    if isinstance(e, exp.And):
        return _conjuncts(e.this) + _conjuncts(e.expression)
    return [e]


def _and(parts: list[exp.Expr]) -> exp.Expr | None:
    if not parts:
        return None
    out = parts[0]
    for p in parts[1:]:
        out = exp.And(this=out, expression=p)
    return out


def _substitute(expr: exp.Expr, replacements: list[exp.Expr]) -> exp.Expr:
    """Replace positional column i in ``expr`` by ``replacements[i]`` (composes calcs)."""

    def sub(node: exp.Expr) -> exp.Expr:
        i = col_index(node)
        return replacements[i].copy() if i is not None else node

    return expr.transform(sub, copy=True)


def parse_duration_ms(text: str, what: str) -> int:
    """Flink-style durations: '3600000', '10 s', '5 min', '1 h', '2 d', '500 ms'."""
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    units = {"": 1, "ms": 1, "s": 1000, "sec": 1000, "second": 1000, "seconds": 1000, "min": 60000,
             "minute": 60000, "minutes": 60000, "h": 3600000, "hour": 3600000, "hours": 3600000,
             "d": 86400000, "day": 86400000, "days": 86400000}  # fmt: skip
    if not m or m.group(2).lower() not in units:
        raise PlanError(f"{what}: cannot read duration {text!r} (e.g. '3600000', '30 s', '10 min', '1 h', '1 d')")
    return int(m.group(1)) * units[m.group(2).lower()]


class Planner:
    def __init__(self, script: Script) -> None:
        self.script = script
        self.nodes: list[Node] = []
        self._sources: dict[str, int] = {}  # table name -> node id feeding queries (after normalize)
        self.used_tables: dict[str, TableDef] = {}
        self.materializer_reason: str | None = None
        self.sink_sources: dict[int, str] = {}  # sink position -> query column name
        # eventual delta joins: join node id -> (regular join stage, mode, upsert keys) to fall back to
        self._delta_fallback: dict[int, tuple[Any, str, frozenset]] = {}

    # ------------------------------------------------------------------ node helpers

    def _add(self, kind: str, name: str, inputs: list[int], columns: list[str], types: list, **kw: Any) -> Node:
        node = Node(len(self.nodes), kind, name, inputs, list(columns), list(types), **kw)
        self.nodes.append(node)
        return node

    def _stage_name(self, kind: str) -> str:
        return f"{kind}#{len(self.nodes)}"

    def node(self, node_id: int) -> Node:
        return self.nodes[node_id]

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
                stage=Normalize(table.pk_indexes, len(table.columns), name=name),
                detail={"primary_key": list(table.primary_key)},
            )  # fmt: skip
        self._sources[table.name] = out.id
        self.used_tables[table.name] = table
        return out.id

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
                if inp.kind not in ("source", "normalize") and inp.id == len(self.nodes) - 1:
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
            and self._fold_within_limits(inp.stage, projections, predicate)
        ):
            # fold into the previous calc: substitute its projections into ours
            prev = inp.stage
            base = prev.projections if prev.projections is not None else [col_ref(i) for i in range(len(prev.input_names))]
            new_proj = [_substitute(e, base) for e in projections] if projections is not None else list(base)
            new_pred = _and([p for p in (prev.predicate, _substitute(predicate, base) if predicate is not None else None) if p is not None])
            self.nodes.pop()
            return self.calc(inp.inputs[0], new_proj, new_pred, names if projections is not None else (names or inp.columns), purpose or inp.detail.get("purpose", ""))
        from tidemark.engine.stages.calc import Calc

        out_names = list(names) if names is not None else (inp.columns if projections is None else [f"EXPR${i}" for i in range(len(projections))])
        out_types = inp.types if projections is None else [infer_type(e, inp.types) for e in projections]
        name = self._stage_name("calc")
        stage = Calc(projections, predicate, inp.columns, out_names, name=name)
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

    # ------------------------------------------------------------------ queries

    def query(self, q: exp.Expr) -> int:
        """Plan a query; returns the node producing its rows (columns named as the query)."""
        if isinstance(q, exp.Subquery):
            return self.query(q.this)
        if isinstance(q, exp.SetOperation):
            op = {exp.Union: "UNION", exp.Intersect: "INTERSECT", exp.Except: "EXCEPT"}.get(type(q), "set operation")
            raise sql_error(f"{op} is not supported", q)
        if not isinstance(q, exp.Select):
            raise sql_error(f"unsupported query {describe(q)}", q)
        return self.select(q)

    def select(self, sel: exp.Select) -> int:
        for arg, what in _UNSUPPORTED_SELECT_ARGS.items():
            value = sel.args.get(arg)
            if value:
                where = value if isinstance(value, exp.Expr) and position_of(value)[0] is not None else sel
                raise sql_error(f"{what} is not supported", where)
        for node in sel.walk():
            if isinstance(node, exp.Window):
                raise sql_error(f"window function {describe(node)} is not supported", node)
            if isinstance(node, (exp.Subquery, exp.Exists)) and node is not sel and not self._is_from_item(node, sel):
                raise sql_error(f"subquery in an expression ({describe(node)}) is not supported; use a join", node)
        scope, node_id = self.from_clause(sel)

        where = sel.args.get("where")
        predicate = None
        if where is not None:
            for agg in where.this.find_all(exp.AggFunc):
                raise sql_error(f"aggregate {describe(agg)} is not allowed in WHERE; use HAVING", agg)
            predicate = self.resolve(where.this, scope)

        group = sel.args.get("group")
        has_aggs = any(self._find_aggs(e) for e in sel.expressions) or sel.args.get("having") is not None
        if group is not None or has_aggs:
            return self.aggregate(sel, scope, node_id, predicate)

        projections, names = self.projections(sel, scope)
        return self.calc(node_id, projections, predicate, names, purpose="select")

    @staticmethod
    def _is_from_item(node: exp.Expr, sel: exp.Select) -> bool:
        parent = node.parent
        while parent is not None and parent is not sel:
            if isinstance(parent, (exp.From, exp.Join)):
                return True
            if isinstance(parent, exp.Select):
                return False
            parent = parent.parent
        return False

    def from_clause(self, sel: exp.Select) -> tuple[Scope, int]:
        from_ = sel.args.get("from_")
        if from_ is None:
            raise sql_error("SELECT without FROM is not supported: a pipeline reads tables", sel)
        scope = Scope()
        node_id = self.relation(from_.this, scope)
        for join in sel.args.get("joins") or []:
            node_id = self.join(join, scope, node_id)
        return scope, node_id

    def relation(self, item: exp.Expr, scope: Scope) -> int:
        if isinstance(item, exp.Table):
            if item.args.get("db") or item.args.get("catalog"):
                raise sql_error(f"qualified table names ({item.sql()}) are not supported", item)
            if isinstance(item.this, exp.Func) or not isinstance(item.this, exp.Identifier):
                raise sql_error(f"table function {describe(item)} is not supported", item)
            if item.args.get("version") is not None:
                raise sql_error(
                    f"{item.name} FOR SYSTEM_TIME AS OF ... (a temporal join) is not supported yet; "
                    "a regular join would compute something else, so it is refused",
                    item.args["version"],
                )
            table = self.script.table(item.name)
            if table is None:
                raise sql_error(f"unknown table '{item.name}' (declare it with CREATE TABLE)", item)
            node_id = self.source(table)
            alias = item.alias or table.name
            scope.add(alias, table.column_names, table.types, item)
            return node_id
        if isinstance(item, exp.Subquery):
            node_id = self.query(item.this)
            n = self.node(node_id)
            scope.add(item.alias, n.columns, n.types, item)
            return node_id
        raise sql_error(f"unsupported FROM item {describe(item)}", item)

    def join(self, join: exp.Join, scope: Scope, left_id: int) -> int:
        side = (join.text("side") or "").upper()
        kind = (join.text("kind") or "").upper()
        if join.args.get("method"):
            raise sql_error(f"{join.text('method').upper()} JOIN is not supported", join)
        if kind in ("SEMI", "ANTI", "CROSS") or kind not in ("", "INNER", "OUTER"):
            raise sql_error(f"{kind} JOIN is not supported", join)
        if join.args.get("using"):
            raise sql_error("JOIN ... USING is not supported; write ON a.col = b.col", join)
        on = join.args.get("on")
        if on is None:
            raise sql_error(
                "a join without ON (cross join or comma join) is not supported; equi-joins only", join.this
            )
        join_type = {"": "inner", "LEFT": "left", "RIGHT": "right", "FULL": "full"}.get(side)
        if join_type is None:
            raise sql_error(f"{side} JOIN is not supported", join)
        left_width = scope.width
        right_id = self.relation(join.this, scope)
        if scope.width > limits.COLUMNS.value:
            raise limits.COLUMNS.refuse(f"the join is {scope.width} columns wide", *position_of(join.this))
        condition = self.resolve(on, scope)
        lkeys: list[int] = []
        rkeys: list[int] = []
        residual: list[exp.Expr] = []
        for conj in _conjuncts(condition):
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
        left, right = self.node(left_id), self.node(right_id)
        res_expr = _and(residual)
        if res_expr is not None:
            check_supported(res_expr)
        from tidemark.engine.stages.join import Join

        name = self._stage_name("join")
        stage = Join(
            join_type, tuple(lkeys), tuple(rkeys), left.width, right.width,
            residual=RowPredicate(res_expr) if res_expr is not None else None, name=name,
        )  # fmt: skip
        keys = join_keys(
            join_type, left.upsert_keys, right.upsert_keys, Key(lkeys), Key(rkeys), left.width
        )
        appendish = left.changelog_mode == "append" and right.changelog_mode == "append" and join_type == "inner"
        names = self._unique_names(scope.names)
        types = scope.types
        node = self._add(
            "join", name, [left_id, right_id], names, types,
            upsert_keys=keys, changelog_mode="append" if appendish else "retract", stage=stage,
            detail={
                "join_type": join_type,
                "on": [f"{names[a]} = {names[left.width + b]}" for a, b in zip(lkeys, rkeys)],
                "residual": to_spark_sql(res_expr, names) if res_expr is not None else None,
            },
        )  # fmt: skip
        self._choose_delta_join(node, left, right, lkeys, rkeys)
        return node.id

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
            same = {left.width + r: l for l, r in zip(lkeys, rkeys)}
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

    @staticmethod
    def _unique_names(names: list[str]) -> list[str]:
        seen: dict[str, int] = {}
        out = []
        for n in names:
            k = n.lower()
            if k in seen:
                seen[k] += 1
                out.append(f"{n}{seen[k] - 1}")
            else:
                seen[k] = 1
                out.append(n)
        return out

    # ------------------------------------------------------------------ expressions

    def resolve(self, e: exp.Expr, scope: Scope) -> exp.Expr:
        """Rewrite column references into positional references over the scope's row."""

        def sub(node: exp.Expr) -> exp.Expr:
            if isinstance(node, exp.Column):
                if isinstance(node.this, exp.Star):
                    raise sql_error("* is only allowed as a whole select item", node)
                return col_ref(scope.resolve(node))
            return node

        return e.transform(sub, copy=True)

    def projections(self, sel: exp.Select, scope: Scope) -> tuple[list[exp.Expr], list[str]]:
        projections: list[exp.Expr] = []
        names: list[str] = []
        for i, item in enumerate(sel.expressions):
            if isinstance(item, exp.Star):
                for n, pos in scope.star(None, item):
                    projections.append(col_ref(pos))
                    names.append(n)
                continue
            if isinstance(item, exp.Column) and isinstance(item.this, exp.Star):
                for n, pos in scope.star(item.table, item):
                    projections.append(col_ref(pos))
                    names.append(n)
                continue
            inner = item.this if isinstance(item, exp.Alias) else item
            projections.append(self.resolve(inner, scope))
            names.append(self._item_name(item, i))
        return projections, self._unique_names(names)

    @staticmethod
    def _item_name(item: exp.Expr, i: int) -> str:
        if isinstance(item, exp.Alias):
            return item.alias
        if isinstance(item, exp.Column):
            return item.name
        return f"EXPR${i}"

    @staticmethod
    def _find_aggs(e: exp.Expr) -> list[exp.Expr]:
        return [n for n in e.walk() if isinstance(n, exp.AggFunc)]

    # ------------------------------------------------------------------ aggregate

    def aggregate(self, sel: exp.Select, scope: Scope, input_id: int, predicate: exp.Expr | None) -> int:
        from tidemark.engine.stages.aggregate import AggCall, GroupAggregate

        group = sel.args.get("group")
        group_exprs: list[exp.Expr] = []
        if group is not None:
            for arg in ("grouping_sets", "cube", "rollup", "totals"):
                if group.args.get(arg):
                    raise sql_error(f"GROUP BY {arg.upper().replace('_', ' ')} is not supported", group)
            for g in group.expressions:
                if isinstance(g, (exp.Rollup, exp.Cube, exp.GroupingSets)):
                    what = {exp.Rollup: "ROLLUP", exp.Cube: "CUBE", exp.GroupingSets: "GROUPING SETS"}[type(g)]
                    raise sql_error(f"GROUP BY {what} is not supported", g)
                if isinstance(g, exp.Literal):
                    raise sql_error("GROUP BY position numbers are not supported; name the column", g)
                group_exprs.append(self.resolve(g, scope))
        # pre-projection: group expressions, then distinct aggregate arguments
        pre: list[exp.Expr] = list(group_exprs)
        calls: list[tuple[str, int | None, bool]] = []
        call_nodes: list[exp.Expr] = []

        def agg_slot(node: exp.Expr) -> int:
            func, arg_expr, distinct = self._agg_call(node)
            arg_pos = None
            if arg_expr is not None:
                resolved = self.resolve(arg_expr, scope)
                for agg in self._find_aggs(resolved):
                    raise sql_error(f"nested aggregate {describe(agg)} is not supported", agg)
                if resolved in pre:
                    arg_pos = pre.index(resolved)
                else:
                    pre.append(resolved)
                    arg_pos = len(pre) - 1
            call = (func, arg_pos, distinct)
            if call not in calls:
                calls.append(call)
                call_nodes.append(node)
            return calls.index(call)

        k = len(group_exprs)

        def rewrite(e: exp.Expr) -> exp.Expr:
            """Map a select/having expression onto the aggregate's output row."""

            def sub(node: exp.Expr) -> exp.Expr:
                if isinstance(node, exp.AggFunc):
                    return exp.Column(this=exp.Identifier(this=f"__a{k + agg_slot(node)}"))
                if not isinstance(node, exp.Star) and not (isinstance(node, exp.Column) and isinstance(node.this, exp.Star)):
                    try:
                        resolved = self.resolve(node, scope) if not isinstance(node, exp.Literal) else None
                    except SqlError:
                        resolved = None
                    if resolved is not None and resolved in group_exprs and (isinstance(node, exp.Column) or node.find(exp.Column)):
                        return exp.Column(this=exp.Identifier(this=f"__a{group_exprs.index(resolved)}"))
                if isinstance(node, exp.Column):
                    if isinstance(node.this, exp.Star):
                        raise sql_error("SELECT * cannot be used with GROUP BY", node)
                    scope.resolve(node)  # unknown columns: report as such first
                    raise sql_error(
                        f"column {node.sql()} must appear in GROUP BY or inside an aggregate function", node
                    )
                return node

            out = e.transform(sub, copy=True)

            def finish(node: exp.Expr) -> exp.Expr:
                if isinstance(node, exp.Column) and node.name.startswith("__a"):
                    return col_ref(int(node.name[3:]))
                return node

            return out.transform(finish, copy=False)

        post: list[exp.Expr] = []
        names: list[str] = []
        for i, item in enumerate(sel.expressions):
            if isinstance(item, exp.Star) or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star)):
                raise sql_error("SELECT * cannot be used with GROUP BY or aggregates", item)
            inner = item.this if isinstance(item, exp.Alias) else item
            post.append(rewrite(inner))
            names.append(self._item_name(item, i))
        having = sel.args.get("having")
        having_pred = rewrite(having.this) if having is not None else None

        inp = self.node(input_id)
        if all(col_index(e) is not None for e in pre) and predicate is None:
            agg_input = input_id
            group_by = tuple(col_index(e) for e in group_exprs)
            agg_calls = [AggCall(f, col_index(pre[a]) if a is not None else None, d) for f, a, d in calls]
        else:
            pre_names = [inp.columns[col_index(e)] if col_index(e) is not None else f"$f{i}" for i, e in enumerate(pre)]
            agg_input = self.calc(input_id, pre, predicate, self._unique_names(pre_names), purpose="aggregate input")
            group_by = tuple(range(k))
            agg_calls = [AggCall(f, a, d) for f, a, d in calls]
        src = self.node(agg_input)
        name = self._stage_name("aggregate")
        group_names = [src.columns[i] for i in group_by]
        agg_names = [
            f"{c.func}({'DISTINCT ' if c.distinct else ''}{src.columns[c.arg] if c.arg is not None else '*'})"
            for c in agg_calls
        ]
        agg_types = [self._agg_type(c, src.types) for c in agg_calls]
        node = self._add(
            "aggregate", name, [agg_input], self._unique_names(group_names + [f"$agg{i}" for i in range(len(agg_calls))]),
            [src.types[i] for i in group_by] + agg_types,
            upsert_keys=frozenset({Key(range(k))}), changelog_mode="retract",
            stage=GroupAggregate(group_by, agg_calls, name=name),
            detail={"group_by": group_names, "aggregates": agg_names},
        )  # fmt: skip
        return self.calc(node.id, post, having_pred, self._unique_names(names), purpose="select")

    def _agg_call(self, node: exp.Expr) -> tuple[str, exp.Expr | None, bool]:
        if isinstance(node, exp.Count):
            arg = node.this
            if isinstance(arg, exp.Star) or arg is None:
                return "COUNT_STAR", None, False
            if isinstance(arg, exp.Distinct):
                if len(arg.expressions) != 1:
                    raise sql_error("COUNT(DISTINCT ...) over several columns is not supported", node)
                return "COUNT", arg.expressions[0], True
            return "COUNT", arg, False
        func = _AGG_FUNCS.get(type(node))
        if func is None:
            raise sql_error(
                f"aggregate function {node.sql_name()} is not supported (SUM, COUNT, MIN, MAX, AVG, LAST_VALUE are)",
                node,
            )
        arg = node.this
        distinct = False
        if isinstance(arg, exp.Distinct):
            if len(arg.expressions) != 1:
                raise sql_error(f"{func}(DISTINCT ...) over several columns is not supported", node)
            arg, distinct = arg.expressions[0], True
        if arg is None or len([a for a in node.args.values() if isinstance(a, exp.Expr)]) > 1:
            raise sql_error(f"{func} takes exactly one argument", node)
        return func, arg, distinct

    @staticmethod
    def _agg_type(call: Any, types: list[SqlType | None]) -> SqlType | None:
        if call.func in ("COUNT", "COUNT_STAR"):
            return make_type("BIGINT")
        t = types[call.arg] if call.arg is not None else None
        if t is None:
            return None
        if call.func == "SUM" and t.name == "DECIMAL":
            return make_type("DECIMAL", (38, t.params[1]))
        if call.func == "AVG" and t.name == "DECIMAL":
            return make_type("DECIMAL", (38, max(6, t.params[1])))
        return t

    # ------------------------------------------------------------------ sink

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

    def _read_tables(self, q: exp.Expr) -> set[str]:
        return {t.name for t in q.find_all(exp.Table)}

    def finish(self, ins: InsertStatement, input_id: int) -> None:
        """Plan what sits between the query and the sink: nothing, a materializer, or a
        merge engine; then the sink node."""
        sink = self.script.table(ins.table)
        assert sink is not None
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
                    strategy, ttl_ms=ttl_ms or None, name=name,
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

    def plan(self) -> list[Node]:
        ins = self.script.insert
        assert ins is not None
        mode = self.script.options.get("table.exec.sink.upserts.compaction-mode")
        if mode is not None and mode.upper() not in COMPACTION_MODES:
            raise PlanError(
                f"SET 'table.exec.sink.upserts.compaction-mode' = '{mode}': expected one of {', '.join(COMPACTION_MODES)}"
            )
        body = self.insert(ins)
        self.finish(ins, body)
        for n in self.nodes:
            n.detail.pop("composable", None)
        return self.nodes
