"""When a join may be a delta join (the seed's qualifying rules), and the options that
steer it. The planner asks ``qualify`` for every join unless the strategy is NONE; a
``NotQualified`` carries the reason EXPLAIN shows (AUTO) or the PlanError gives (FORCE).

Rules (``docs/delta-join.md`` explains each):
1. each input is a source table reached through calc stages only (projection/filter: the
   whitelist); normalize (upsert formats), aggregates and joins (cascading) are not;
2. the join key columns reach the join unchanged from source columns (a calc may not
   compute them), and the table has a PRIMARY KEY (the index keeps the latest row per key);
3. the join key columns of each input include one of its table's indexes: the primary
   key or an ``'index.<name>.columns'`` declaration;
4. eventual consistency: INNER joins only; at most one input may delete rows or move them
   between join keys, i.e. the other input must be append-only; each input keeps its
   table's primary key (the output is applied by the pair of primary keys); between the
   join and the sink only calc stages, and the sink has a primary key and no merge engine
   (checked by ``check_downstream`` once the whole query is planned);
5. strong consistency: any join type and changelog (the result is exact).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tidemark.engine.catalog import TableDef
from tidemark.engine.errors import PlanError
from tidemark.engine.expressions import col_index
from tidemark.engine.stages.delta_join import CONSISTENCY, DeltaSide
from tidemark.index_client.store import PRIMARY

STRATEGY = "table.optimizer.delta-join.strategy"
CONSISTENCY_OPT = "table.exec.delta-join.consistency"
CACHE_ENABLED = "table.exec.delta-join.cache-enabled"
CACHE_SIZE = ("table.exec.delta-join.left.cache-size", "table.exec.delta-join.right.cache-size")
# the seed's spellings are accepted too
ALIASES = {
    "table.exec.delta-join.cache-enable": CACHE_ENABLED,
    "table.exec.delta-join.left-cache-size": CACHE_SIZE[0],
    "table.exec.delta-join.right-cache-size": CACHE_SIZE[1],
}
STRATEGIES = ("AUTO", "FORCE", "NONE")


def _a(word: str) -> str:
    return ("an " if word[:1] in "aeiou" else "a ") + word


class NotQualified(Exception):
    """The join cannot be a delta join; ``str(e)`` says why."""


@dataclass(frozen=True)
class DeltaOptions:
    strategy: str = "AUTO"
    consistency: str = "eventual"
    cache_enabled: bool = True
    cache_sizes: tuple[int, int] = (10000, 10000)


def read_options(options: dict[str, str]) -> DeltaOptions:
    opts = {ALIASES.get(k, k): v for k, v in options.items()}
    strategy = opts.get(STRATEGY, "AUTO").strip().upper()
    if strategy not in STRATEGIES:
        raise PlanError(f"SET '{STRATEGY}' = '{opts[STRATEGY]}': expected one of {', '.join(STRATEGIES)}")
    consistency = opts.get(CONSISTENCY_OPT, "eventual").strip().lower()
    if consistency not in CONSISTENCY:
        raise PlanError(f"SET '{CONSISTENCY_OPT}' = '{opts[CONSISTENCY_OPT]}': expected one of {', '.join(CONSISTENCY)}")
    enabled_text = opts.get(CACHE_ENABLED, "true").strip().lower()
    if enabled_text not in ("true", "false"):
        raise PlanError(f"SET '{CACHE_ENABLED}' = '{opts[CACHE_ENABLED]}': expected true or false")
    sizes = []
    for opt in CACHE_SIZE:
        text = opts.get(opt, "10000").strip().rstrip("Ll")
        if not text.isdigit():
            raise PlanError(f"SET '{opt}' = '{opts[opt]}': expected a number of join keys, e.g. '10000'")
        sizes.append(int(text))
    return DeltaOptions(strategy, consistency, enabled_text == "true", (sizes[0], sizes[1]))


def declared_indexes(table: TableDef) -> dict[str, tuple[str, ...]]:
    """PRIMARY (the primary key) and every ``'index.<name>.columns'`` of the table, with
    column names as declared. An index naming an unknown column is a PlanError."""
    out: dict[str, tuple[str, ...]] = {}
    if table.primary_key:
        out[PRIMARY] = tuple(table.column_names[i] for i in table.pk_indexes)
    for opt, value in table.options.items():
        if not (opt.startswith("index.") and opt.endswith(".columns")):
            continue
        name = opt[len("index.") : -len(".columns")]
        cols = [c.strip() for c in value.split(",") if c.strip()]
        if not name or not cols:
            raise PlanError(f"table '{table.name}': option '{opt}' = '{value}' needs an index name and column list")
        names = []
        for c in cols:
            try:
                names.append(table.column_names[table.index_of(c)])
            except KeyError:
                raise PlanError(f"table '{table.name}': index '{name}' ('{opt}') names unknown column '{c}'") from None
        out[name] = tuple(names)
    return out


@dataclass
class SideTrace:
    side: DeltaSide
    table: TableDef
    source_mode: str  # append | retract
    pk_positions: tuple[int, ...] | None  # where the table's PK sits in the join input, if kept


def trace_side(planner: Any, node_id: int, join_cols: list[int], which: str) -> SideTrace:
    """Walk from a join input back to its source through calc stages (rules 1-3)."""
    n = planner.node(node_id)
    cols: list[int | None] = list(join_cols)
    all_cols: list[int | None] = list(range(n.width))  # join input column -> column of node n
    calcs = []
    while n.kind == "calc":
        proj = n.stage.projections
        if proj is not None:
            cols = [col_index(proj[c]) if c is not None else None for c in cols]
            all_cols = [col_index(proj[c]) if c is not None else None for c in all_cols]
        calcs.append(n.stage)
        n = planner.node(n.inputs[0])
    if n.kind == "normalize":
        t = planner.used_tables[n.detail.get("table") or n.name.split(":", 1)[1]]
        raise NotQualified(
            f"the {which} input reads table '{t.name}' with the upsert format '{t.format}', which is normalized by a "
            "stateful stage (it keeps every row of the table in state); only calc stages may sit between a source "
            "and a delta join"
        )
    if n.kind == "join":
        raise NotQualified(f"the {which} input is the output of join [{n.id}]: cascading joins are not supported")
    if n.kind != "source":
        raise NotQualified(
            f"the {which} input comes from {_a(n.kind)} stage [{n.id}]; only calc stages (projection/filter) may sit "
            "between a source and a delta join"
        )
    table: TableDef = planner.used_tables[n.table]
    names = table.column_names
    jk_src: list[int] = []
    for c, src in zip(join_cols, cols):
        if src is None:
            raise NotQualified(
                f"the {which} join key column '{planner.node(node_id).columns[c]}' is computed by a calc stage; "
                f"delta join keys must be columns of table '{table.name}'"
            )
        jk_src.append(src)
    if not table.primary_key:
        raise NotQualified(f"table '{table.name}' has no PRIMARY KEY; its index keeps the latest row per primary key")
    indexes = declared_indexes(table)
    jk_names = {names[i] for i in jk_src}
    fitting = [(name, icols) for name, icols in indexes.items() if set(icols) <= jk_names]
    if not fitting:
        shown = ", ".join(f"{n}({', '.join(c)})" for n, c in indexes.items())
        raise NotQualified(
            f"the join key ({', '.join(names[i] for i in jk_src)}) of table '{table.name}' includes none of its "
            f"indexes ({shown}); declare one with 'index.<name>.columns' = '<columns>'"
        )
    name, icols = min(fitting, key=lambda f: (f[0] != PRIMARY, len(f[1]), f[0]))
    index_key = tuple(next(j for j, src in enumerate(jk_src) if names[src] == c) for c in icols)
    pk_positions = (
        tuple(all_cols.index(p) for p in table.pk_indexes) if all(p in all_cols for p in table.pk_indexes) else None
    )
    return SideTrace(
        DeltaSide(table.name, name, icols, index_key, list(reversed(calcs))), table, n.changelog_mode, pk_positions
    )


@dataclass
class Qualified:
    left: SideTrace
    right: SideTrace
    why: str


def qualify(
    planner: Any, join_type: str, left_id: int, right_id: int, lkeys: list[int], rkeys: list[int], opts: DeltaOptions
) -> Qualified:
    """The two sides of a delta join and why it qualifies, or NotQualified."""
    left = trace_side(planner, left_id, lkeys, "left")
    right = trace_side(planner, right_id, rkeys, "right")
    why = (
        f"join keys include index {left.side.table}.{left.side.index}({', '.join(left.side.index_columns)}) and "
        f"{right.side.table}.{right.side.index}({', '.join(right.side.index_columns)}); only calc stages between "
        "the sources and the join"
    )
    if opts.consistency == "eventual":
        if join_type != "inner":
            raise NotQualified(
                f"an eventually consistent delta join supports INNER joins only (this is a {join_type.upper()} join); "
                f"SET '{CONSISTENCY_OPT}' = 'strong' for an exact delta join of any type"
            )
        if left.source_mode != "append" and right.source_mode != "append":
            raise NotQualified(
                f"both inputs may delete rows or move them between join keys ('{left.table.name}' is "
                f"{left.table.format}, '{right.table.name}' is {right.table.format}); an eventually consistent delta "
                f"join allows that on one input only, the other must be append-only; SET '{CONSISTENCY_OPT}' = "
                "'strong' for an exact delta join"
            )
        for t in (left, right):
            if t.pk_positions is None:
                raise NotQualified(
                    f"the input from table '{t.table.name}' drops primary key column(s) "
                    f"({', '.join(t.table.primary_key)}); an eventually consistent delta join's output is applied by "
                    "the pair of primary keys, so both must reach the join"
                )
        why += "; eventual consistency: one input is append-only"
    else:
        why += "; strong consistency (exact: the index answers as of the batch's start offsets)"
    return Qualified(left, right, why)


def check_downstream(planner: Any, join_id: int, query_out: int, sink: TableDef) -> None:
    """Rule 4, downstream half: an eventual delta join's output reaches the sink through
    calc stages only, and the sink can apply it by key."""
    n = planner.node(query_out)
    while n.id != join_id:
        if n.kind != "calc":
            raise NotQualified(
                f"its output feeds {_a(n.kind)} stage [{n.id}]; an eventually consistent delta join emits duplicates "
                "and deletes by key, which only the sink may absorb (calc stages may sit in between)"
            )
        n = planner.node(n.inputs[0])
    if not sink.primary_key:
        raise NotQualified(f"sink '{sink.name}' has no PRIMARY KEY to apply an eventually consistent delta join by key")
    if sink.merge_engine is not None:
        raise NotQualified(f"sink '{sink.name}' uses a merge engine; an eventually consistent delta join needs a materializer")
    if not planner.node(query_out).upsert_keys:
        raise NotQualified("no upsert key reaches the sink, so duplicates could not be applied by key")
