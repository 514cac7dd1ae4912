"""Seeded random changelog workloads for the Flink conformance suite.

A workload is one pipeline (Tidemark SQL, also fed to Flink) plus, per source table, a list
of batches of CDC records ``{"kind", "row", "seq"}``. ``seq`` is the global source position:
one counter over all tables, so it says in which order the changes happened. The two halves
of an update (``-U``/``+U`` from one Debezium message) share a ``seq`` and never straddle a
batch.

What makes the workloads hard (and what the suite is for):

- small value domains, so join keys collide and many source rows map to one sink primary
  key from different upsert keys (the conflicts ``ON CONFLICT`` is about);
- updates that change join keys (an s1 row moving from ``level`` 10 to 20 retracts one join
  row and adds another, reaching the sink by different paths), deletes and re-inserts;
- the records of a batch interleave tables in random order; Tidemark additionally gets each
  batch's records shuffled (its result must not depend on arrival order inside a batch), while
  Flink gets them in ``seq`` order (its materializer is order-sensitive by design);
- the three strategies over the two seed shapes (the s1/s2 join, the inventory aggregate) and
  plain projections that drop the source primary key.

For ``DO ERROR`` the ``unique`` variants keep the sink key unique among active source rows at
every change, so no conflict can ever be visible at a batch end; the other variants are
expected to conflict somewhere (and both systems must fail at the same batch).
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

STRATEGIES = ("DEDUPLICATE", "NOTHING", "ERROR")


@dataclass
class Column:
    name: str
    type: str
    values: Callable[[random.Random], Any] | None = None  # None for the PK column(s)


@dataclass
class TableSpec:
    name: str
    columns: list[Column]
    pk: str
    format: str  # debezium-json | upsert-json | json
    pk_values: Callable[[random.Random, set], Any]
    unique: str | None = None  # a column kept unique among active rows (ERROR-safe variants)
    weight: float = 1.0
    #: loaded whole in the first batch and never changed (a lookup join's dimension)
    static: bool = False
    #: extra schema entries after the columns (e.g. a processing-time attribute)
    extra: str = ""

    def ddl(self) -> str:
        cols = ", ".join([*(f"{c.name} {c.type}" for c in self.columns), *([self.extra] if self.extra else [])])
        return (f"CREATE TABLE {self.name} ({cols}, PRIMARY KEY ({self.pk}) NOT ENFORCED) "
                f"WITH ('topic' = '{self.name}', 'format' = '{self.format}');")


@dataclass
class Workload:
    name: str
    shape: str
    strategy: str
    seed: int
    sql: str
    inputs: dict[str, list[list[dict]]]
    #: "none": no conflict can be visible at a batch end; "possible": ERROR may fail
    conflicts: str = "possible"
    #: for the named reproductions: {"flink": the tables Flink gives after each batch,
    #: "truth": the tables the strategy's definition gives, from the source rows' identities}
    expect: dict[str, Any] | None = None
    #: Flink options for this workload (e.g. the DEDUPLICATE materializer implementation)
    options: dict[str, str] = field(default_factory=dict)
    #: PK column per keyed source table (append-only tables have none)
    pks: dict[str, str] = field(default_factory=dict)
    #: the SQL Flink runs when it differs from Tidemark's (a lookup join over a static
    #: dimension is Flink's regular join: the oracle's sources are not lookup sources)
    flink_sql: str | None = None

    def spec_case(self) -> dict[str, Any]:
        """This workload as a case of ``flink_oracle.py``'s job spec."""
        return {"id": self.name, "sql": self.flink_sql or self.sql, "inputs": self.inputs, "options": self.options}

    def n_batches(self) -> int:
        return max(len(b) for b in self.inputs.values())


# --------------------------------------------------------------------------------------------
# Source simulation
# --------------------------------------------------------------------------------------------

class _Source:
    """One CDC source table: its current rows, and the changelog records of each change."""

    def __init__(self, spec: TableSpec, rng: random.Random):
        self.spec = spec
        self.rng = rng
        self.rows: dict[Any, dict] = {}
        self.append_only = spec.format == "json"
        self.upsert = spec.format.startswith("upsert-")

    def _value(self, col: Column, pk: Any) -> Any:
        if col.name == self.spec.unique:
            taken = {r[col.name] for k, r in self.rows.items() if k != pk}
            for _ in range(20):
                v = col.values(self.rng)
                if v not in taken:
                    return v
            return None  # domain exhausted: caller skips the change
        return col.values(self.rng)

    def _new_row(self, pk: Any) -> dict | None:
        row = {}
        for c in self.spec.columns:
            row[c.name] = pk if c.name == self.spec.pk else self._value(c, pk)
            if row[c.name] is None and c.name == self.spec.unique:
                return None
        return row

    def change(self, seq: int) -> list[dict]:
        """Make one random change; returns its records (possibly none)."""
        rng, rows = self.rng, self.rows
        op = rng.random()
        if self.append_only or not rows or op < 0.35:
            pk = self.spec.pk_values(rng, set(rows))
            if pk is None or pk in rows:
                if not rows or self.append_only:
                    return []
                op = 0.5  # the key space is full: update instead
            else:
                row = self._new_row(pk)
                if row is None:
                    return []
                rows[pk] = row
                return [{"kind": "+I", "row": dict(row), "seq": seq}]
        pk = rng.choice(sorted(rows, key=repr))
        old = rows[pk]
        if op < 0.8:
            editable = [c for c in self.spec.columns if c.name != self.spec.pk]
            new = dict(old)
            for c in rng.sample(editable, rng.randint(1, len(editable))):
                v = self._value(c, pk)
                if v is None:
                    return []
                new[c.name] = v
            if new == old:
                return []
            del rows[pk]  # the dict's order is arrival order: an updated row arrives again
            rows[pk] = new
            if self.upsert:
                return [{"kind": "+U", "row": dict(new), "seq": seq}]
            return [{"kind": "-U", "row": dict(old), "seq": seq},
                    {"kind": "+U", "row": dict(new), "seq": seq}]
        del rows[pk]
        return [{"kind": "-D", "row": dict(old), "seq": seq}]


def _changelog(specs: list[TableSpec], rng: random.Random, n_batches: int, max_changes: int,
               shape: str) -> dict[str, list[list[dict]]]:
    sources = [_Source(s, rng) for s in specs]
    changing = [s for s in sources if not s.spec.static]
    weights = [s.spec.weight for s in changing]
    out: dict[str, list[list[dict]]] = {s.name: [] for s in specs}
    seq = 0
    for b in range(n_batches):
        batch: dict[str, list[dict]] = {s.name: [] for s in specs}
        for src in (s for s in sources if s.spec.static and b == 0):
            while (pk := src.spec.pk_values(rng, set(src.rows))) is not None and rng.random() < 0.85:
                row = src._new_row(pk)
                src.rows[pk] = row
                seq += 1
                batch[src.spec.name].append({"kind": "+I", "row": dict(row), "seq": seq})
        static_load = b == 0 and len(changing) < len(sources)  # the dimension alone, before the stream
        for _ in range(0 if static_load else rng.randint(1, max_changes)):
            src = rng.choices(changing, weights)[0]
            before_rows = {k: dict(v) for k, v in src.rows.items()}
            before = _query(shape, sources)
            recs = src.change(seq + 1)
            if recs and shape not in SINK_KEYED_BY_UPSERT_KEY and _ties(before, _query(shape, sources)):
                src.rows = before_rows  # undo: the result would be undefined (see _ties)
                continue
            if recs:
                seq += 1
                batch[src.spec.name].extend(recs)
        for name, recs in batch.items():
            out[name].append(recs)
    return out


def _query(shape: str, sources: list[_Source]) -> Counter:
    return Counter(EVALUATORS[shape]({s.spec.name: list(s.rows.values()) for s in sources}))


def _ties(before: Counter, after: Counter) -> bool:
    """Would one change add two or more rows for one sink key (column 0 in every shape)?
    Such rows share a source position, so which is "latest" (DEDUPLICATE) or "first"
    (NOTHING) is not defined: Flink picks by join-state hash order or by which half of an
    update it processes first, Tidemark by row order. Workloads avoid them."""
    added = Counter()
    for row, n in (after - before).items():
        added[row[0]] += n
    return any(n > 1 for n in added.values())


# --------------------------------------------------------------------------------------------
# Shapes
# --------------------------------------------------------------------------------------------

def _pick(domain: list) -> Callable[[random.Random], Any]:
    return lambda rng: rng.choice(domain)


def _fresh_or_reuse(limit: int) -> Callable[[random.Random, set], Any]:
    """Keys 1..limit: mostly new ones, sometimes a deleted key comes back."""
    def gen(rng: random.Random, active: set) -> Any:
        free = [k for k in range(1, limit + 1) if k not in active]
        return rng.choice(free) if free else None
    return gen


def _from_domain(domain: list) -> Callable[[random.Random, set], Any]:
    def gen(rng: random.Random, active: set) -> Any:
        free = [k for k in domain if k not in active]
        return rng.choice(free) if free else None
    return gen


def _s1_s2(rng: random.Random, s1_format: str, attr_domain: list[str]) -> list[TableSpec]:
    levels = [10, 20, 30]
    return [
        TableSpec("s1", [Column("id", "BIGINT"), Column("level", "BIGINT", _pick(levels))], "id",
                  s1_format, _fresh_or_reuse(6), weight=1.5),
        TableSpec("s2", [Column("id", "BIGINT"), Column("attr", "STRING", _pick(attr_domain))], "id",
                  "debezium-json", _from_domain(levels + [40])),
    ]


def shape_join_id(rng: random.Random, strategy: str) -> tuple[list[TableSpec], str, str, str]:
    """The seed's s1/s2 join: sink PK s1.id (unique; disorder but no real conflicts)."""
    tables = _s1_s2(rng, rng.choice(["debezium-json", "upsert-json"]), ["a1", "b1", "c1"])
    sink = ("CREATE TABLE t1 (id BIGINT, level BIGINT, attr STRING, PRIMARY KEY (id) NOT ENFORCED) "
            "WITH ('topic' = 't1', 'format' = 'upsert-json');")
    query = "INSERT INTO t1 SELECT s1.id, s1.level, s2.attr FROM s1 JOIN s2 ON s1.level = s2.id"
    return tables, sink, query, "none"


def shape_left_join_id(rng: random.Random, strategy: str) -> tuple[list[TableSpec], str, str, str]:
    """LEFT JOIN: right-side changes flip null-padded rows (-D/+I pairs) for the same sink PK."""
    tables = _s1_s2(rng, "debezium-json", ["a1", "b1"])
    sink = ("CREATE TABLE t1 (id BIGINT, level BIGINT, attr STRING, PRIMARY KEY (id) NOT ENFORCED) "
            "WITH ('topic' = 't1', 'format' = 'upsert-json');")
    query = "INSERT INTO t1 SELECT s1.id, s1.level, s2.attr FROM s1 LEFT JOIN s2 ON s1.level = s2.id"
    return tables, sink, query, "none"


def shape_join_attr(rng: random.Random, strategy: str) -> tuple[list[TableSpec], str, str, str]:
    """Sink PK is the joined attribute: many s1 rows conflict for one attr."""
    tables = _s1_s2(rng, "debezium-json", ["x", "y"])
    sink = ("CREATE TABLE t2 (attr STRING, id BIGINT, level BIGINT, PRIMARY KEY (attr) NOT ENFORCED) "
            "WITH ('topic' = 't2', 'format' = 'upsert-json');")
    query = "INSERT INTO t2 SELECT s2.attr, s1.id, s1.level FROM s1 JOIN s2 ON s1.level = s2.id"
    return tables, sink, query, "possible"


def shape_inventory(rng: random.Random, strategy: str) -> tuple[list[TableSpec], str, str, str]:
    """The seed's rollback example: SUM per product, joined to products, filtered, keyed by name."""
    unique = strategy == "ERROR" and rng.random() < 0.7
    orders_format = rng.choice(["debezium-json", "json"])
    names = ["Football", "Basketball", "Tennis"] + (["Golf", "Hockey"] if unique else [])
    tables = [
        TableSpec("orders", [Column("order_id", "BIGINT"),
                             Column("product_id", "BIGINT", _pick([1, 2, 3, 4])),
                             Column("quantity", "BIGINT", _pick([1, 2, 3, 5, 7]))],
                  "order_id", orders_format, _fresh_or_reuse(40), weight=2.0),
        TableSpec("products", [Column("id", "BIGINT"), Column("name", "STRING", _pick(names))], "id",
                  "debezium-json", _from_domain([1, 2, 3, 4]), unique="name" if unique else None),
    ]
    sink = ("CREATE TABLE inventory (name STRING, quantity BIGINT, PRIMARY KEY (name) NOT ENFORCED) "
            "WITH ('topic' = 'inventory', 'format' = 'upsert-json');")
    query = ("INSERT INTO inventory SELECT p.name, o.quantity FROM "
             "(SELECT product_id, SUM(quantity) AS quantity FROM orders GROUP BY product_id) o "
             "JOIN products p ON o.product_id = p.id WHERE o.quantity < 10")
    return tables, sink, query, "none" if unique else "possible"


def shape_agg_by_sub_key(rng: random.Random, strategy: str) -> tuple[list[TableSpec], str, str, str]:
    """GROUP BY (category, region) written to a sink keyed by category alone."""
    tables = [TableSpec("events", [Column("id", "BIGINT"), Column("category", "STRING", _pick(["c1", "c2"])),
                                   Column("region", "STRING", _pick(["eu", "us"])),
                                   Column("v", "BIGINT", _pick([1, 2, 3]))],
                        "id", rng.choice(["debezium-json", "upsert-json"]), _fresh_or_reuse(12))]
    sink = ("CREATE TABLE per_category (category STRING, region STRING, n BIGINT, total BIGINT, "
            "PRIMARY KEY (category) NOT ENFORCED) WITH ('topic' = 'pc', 'format' = 'upsert-json');")
    query = ("INSERT INTO per_category SELECT category, region, COUNT(*) AS n, SUM(v) AS total "
             "FROM events GROUP BY category, region")
    return tables, sink, query, "possible"


def shape_extremes(rng: random.Random, strategy: str) -> tuple[list[TableSpec], str, str, str]:
    """MIN and MAX per group over a changelog (updates and deletes retract values from each
    group's multiset, its extremes included; NULLs are skipped), with the row count."""
    tables = [TableSpec("events", [Column("id", "BIGINT"), Column("category", "STRING", _pick(["c1", "c2"])),
                                   Column("v", "BIGINT", _pick([-3, 0, 2, 5, None]))],
                        "id", rng.choice(["debezium-json", "upsert-json"]), _fresh_or_reuse(12))]
    sink = ("CREATE TABLE per_category (category STRING, lo BIGINT, hi BIGINT, n BIGINT, "
            "PRIMARY KEY (category) NOT ENFORCED) WITH ('topic' = 'pc', 'format' = 'upsert-json');")
    query = "INSERT INTO per_category SELECT category, MIN(v), MAX(v), COUNT(*) FROM events GROUP BY category"
    return tables, sink, query, "none"


def shape_last_value(rng: random.Random, strategy: str) -> tuple[list[TableSpec], str, str, str]:
    """LAST_VALUE per group over a changelog: an update or delete of the group's latest row
    rolls the result back to the row before it, and a row moving between groups leaves one
    and becomes the other's latest. ``v`` is kept unique among active rows: a retraction
    takes a value's earliest instance (Flink's ``LastValueWithRetractAggFunction``), which
    only then is the row it retracts, so the result is a function of the current rows."""
    tables = [TableSpec("events", [Column("id", "BIGINT"), Column("category", "STRING", _pick(["c1", "c2"])),
                                   Column("v", "BIGINT", _pick(list(range(1, 25))))],
                        "id", rng.choice(["debezium-json", "upsert-json"]), _fresh_or_reuse(12), unique="v")]
    sink = ("CREATE TABLE per_category (category STRING, latest BIGINT, n BIGINT, "
            "PRIMARY KEY (category) NOT ENFORCED) WITH ('topic' = 'pc', 'format' = 'upsert-json');")
    query = "INSERT INTO per_category SELECT category, LAST_VALUE(v), COUNT(*) FROM events GROUP BY category"
    return tables, sink, query, "none"


def shape_projection(rng: random.Random, strategy: str) -> tuple[list[TableSpec], str, str, str]:
    """A projection that drops the source PK: rows then match by full value at the sink."""
    unique = strategy == "ERROR" and rng.random() < 0.7
    names = ["n1", "n2", "n3"] + (["n4", "n5", "n6"] if unique else [])
    tables = [TableSpec("s", [Column("id", "BIGINT"), Column("name", "STRING", _pick(names)),
                              Column("v", "BIGINT", _pick([0, 1, 2]))],
                        "id", rng.choice(["debezium-json", "upsert-json"]), _fresh_or_reuse(6),
                        unique="name" if unique else None)]
    sink = ("CREATE TABLE t (name STRING, v BIGINT, PRIMARY KEY (name) NOT ENFORCED) "
            "WITH ('topic' = 't', 'format' = 'upsert-json');")
    query = "INSERT INTO t SELECT name, v FROM s"
    return tables, sink, query, "none" if unique else "possible"


def shape_projection_keep_id(rng: random.Random, strategy: str) -> tuple[list[TableSpec], str, str, str]:
    """The upsert key (id) survives but differs from the sink PK (name)."""
    unique = strategy == "ERROR" and rng.random() < 0.7
    names = ["n1", "n2", "n3"] + (["n4", "n5", "n6"] if unique else [])
    tables = [TableSpec("s", [Column("id", "BIGINT"), Column("name", "STRING", _pick(names)),
                              Column("v", "BIGINT", _pick([0, 1, 2]))],
                        "id", rng.choice(["debezium-json", "upsert-json"]), _fresh_or_reuse(6),
                        unique="name" if unique else None)]
    sink = ("CREATE TABLE t (name STRING, id BIGINT, v BIGINT, PRIMARY KEY (name) NOT ENFORCED) "
            "WITH ('topic' = 't', 'format' = 'upsert-json');")
    query = "INSERT INTO t SELECT name, id, v FROM s"
    return tables, sink, query, "none" if unique else "possible"


def shape_comma_join_between(rng: random.Random, strategy: str) -> tuple[list[TableSpec], str, str, str]:
    """A comma join, its equi key and a non-equi condition across the sides in WHERE."""
    tables = _s1_s2(rng, rng.choice(["debezium-json", "upsert-json"]), ["a1", "b1", "c1"])
    sink = ("CREATE TABLE t1 (id BIGINT, level BIGINT, attr STRING, PRIMARY KEY (id) NOT ENFORCED) "
            "WITH ('topic' = 't1', 'format' = 'upsert-json');")
    query = ("INSERT INTO t1 SELECT s1.id, s1.level, s2.attr FROM s1, s2 "
             "WHERE s1.level = s2.id AND s1.id * 10 BETWEEN s2.id - 20 AND s2.id + 20")
    return tables, sink, query, "none"


def _events(rng: random.Random, values: list) -> TableSpec:
    return TableSpec("events", [Column("id", "BIGINT"), Column("category", "STRING", _pick(["c1", "c2"])),
                                Column("region", "STRING", _pick(["eu", "us", "ap"])),
                                Column("v", "BIGINT", _pick(values))],
                     "id", rng.choice(["debezium-json", "upsert-json"]), _fresh_or_reuse(12))


def shape_filter_distinct_agg(rng: random.Random, strategy: str) -> tuple[list[TableSpec], str, str, str]:
    """Aggregate FILTER, COUNT(DISTINCT) and HAVING per category (upsert key = sink PK)."""
    sink = ("CREATE TABLE per_category (category STRING, big BIGINT, regions BIGINT, eu_total BIGINT, "
            "PRIMARY KEY (category) NOT ENFORCED) WITH ('topic' = 'pc', 'format' = 'upsert-json');")
    query = ("INSERT INTO per_category SELECT category, COUNT(*) FILTER (WHERE v > 1), COUNT(DISTINCT region), "
             "SUM(v) FILTER (WHERE region = 'eu') FROM events GROUP BY category HAVING COUNT(*) > 1")
    return [_events(rng, [1, 2, 3])], sink, query, "none"


def shape_cte_distinct(rng: random.Random, strategy: str) -> tuple[list[TableSpec], str, str, str]:
    """SELECT DISTINCT in a CTE: a (category, region) pair stays while any event gives it;
    the sink keyed by category alone sees conflicts."""
    sink = ("CREATE TABLE cat_region (category STRING, region STRING, PRIMARY KEY (category) NOT ENFORCED) "
            "WITH ('topic' = 'cr', 'format' = 'upsert-json');")
    query = ("INSERT INTO cat_region WITH pairs AS (SELECT DISTINCT category, region FROM events) "
             "SELECT `category`, region FROM pairs")
    return [_events(rng, [1, 2])], sink, query, "possible"


def shape_functions(rng: random.Random, strategy: str) -> tuple[list[TableSpec], str, str, str]:
    """Scalar functions over NULL, negative and empty values, keyed by the source PK."""
    tables = [TableSpec("s", [Column("id", "BIGINT"), Column("name", "STRING", _pick(["a,b", "", None, "xyz"])),
                              Column("v", "BIGINT", _pick([-3, 0, 2, None]))],
                        "id", rng.choice(["debezium-json", "upsert-json"]), _fresh_or_reuse(6))]
    sink = ("CREATE TABLE f (id BIGINT, a STRING, b STRING, c BIGINT, d BOOLEAN, e STRING, g STRING, "
            "PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 'f', 'format' = 'upsert-json');")
    query = ("INSERT INTO f SELECT id, CONCAT_WS('|', SPLIT_INDEX(name, ',', 1), LPAD(name, 4, '*'), REPLACE(name, 'a', 'A')), "
             "CASE v WHEN -3 THEN 'neg' WHEN 0 THEN 'zero' ELSE UPPER(COALESCE(NULLIF(name, ''), 'none')) END, "
             "FLOOR(v) + CEIL(v), v IS DISTINCT FROM 0, RPAD(name, 2, '-'), REGEXP_EXTRACT(name, '(\\w+),(\\w*)', 2) "
             "FROM s")
    return tables, sink, query, "none"


def _ranked(rng: random.Random, table: str, columns: str, key: str, order: str, bound: str
            ) -> tuple[list[TableSpec], str, str, str]:
    """A rank shape over ``events``: sink ``table`` with ``columns`` (typed as the query
    gives them) and primary key ``key``; the ranked query ordered by v ``order`` and cut by
    ``bound`` on rn."""
    types = {"category": "STRING", "rn": "BIGINT", "id": "BIGINT", "v": "BIGINT"}
    names = [c.strip() for c in columns.split(",")]
    sink = (f"CREATE TABLE {table} ({', '.join(f'{n} {types[n]}' for n in names)}, "
            f"PRIMARY KEY ({key}) NOT ENFORCED) WITH ('topic' = '{table}', 'format' = 'upsert-json');")
    query = (f"INSERT INTO {table} SELECT {columns} FROM (SELECT id, category, v, ROW_NUMBER() OVER "
             f"(PARTITION BY category ORDER BY v {order}) AS rn FROM events) WHERE {bound}")
    return [_events(rng, [1, 2, 3])], sink, query, "none"


def shape_topn_rank(rng: random.Random, strategy: str) -> tuple[list[TableSpec], str, str, str]:
    """Top-2 per category with the row number, over a changelog: rows retracted from the
    top let the next one in, every rank below a new row shifts; ties on v by arrival."""
    return _ranked(rng, "top2", "category, rn, id, v", "category, rn", "DESC", "rn <= 2")


def shape_dedup_first(rng: random.Random, strategy: str) -> tuple[list[TableSpec], str, str, str]:
    """Deduplication (rn = 1, the row number not read): per category the row with the
    smallest v, the earliest of equal ones; keyed by the partition key."""
    return _ranked(rng, "firsts", "category, id, v", "category", "ASC", "rn = 1")


def shape_topn_by_id(rng: random.Random, strategy: str) -> tuple[list[TableSpec], str, str, str]:
    """Top-2 without the row number into a sink keyed by the source PK: the rank has no
    upsert key there (id does not contain the partition key), so the materializer resolves
    a row that moves between categories."""
    return _ranked(rng, "tops", "id, category, v", "id", "DESC", "rn <= 2")
_UNION_BRANCHES = ("SELECT s1.level AS k, CAST(s1.id AS INT) AS n, 'lvl' AS a FROM s1 WHERE s1.id <> 3 "
                   "UNION ALL SELECT id, id, attr FROM s2")


def shape_union_all(rng: random.Random, strategy: str) -> tuple[list[TableSpec], str, str, str]:
    """UNION ALL of two CDC tables into a sink keyed by a column both branches write (s1's
    level, s2's id: the same values), so rows of either branch conflict; the branches' types
    differ (INT widens to BIGINT, a CHAR literal and STRING to STRING)."""
    tables = _s1_s2(rng, rng.choice(["debezium-json", "upsert-json"]), ["a1", "b1"])
    sink = ("CREATE TABLE tu (k BIGINT, n BIGINT, a STRING, PRIMARY KEY (k) NOT ENFORCED) "
            "WITH ('topic' = 'tu', 'format' = 'upsert-json');")
    query = f"INSERT INTO tu SELECT k, n, a FROM ({_UNION_BRANCHES}) u"
    return tables, sink, query, "possible"


def shape_union_agg(rng: random.Random, strategy: str) -> tuple[list[TableSpec], str, str, str]:
    """An aggregate over a UNION ALL in a CTE: retractions from both branches reach one group."""
    tables = _s1_s2(rng, rng.choice(["debezium-json", "upsert-json"]), ["a1", "b1"])
    sink = ("CREATE TABLE tg (k BIGINT, c BIGINT, total BIGINT, PRIMARY KEY (k) NOT ENFORCED) "
            "WITH ('topic' = 'tg', 'format' = 'upsert-json');")
    query = f"INSERT INTO tg WITH u AS ({_UNION_BRANCHES}) SELECT k, COUNT(*), SUM(n) FROM u GROUP BY k"
    return tables, sink, query, "none"


def _stream_and_dimension(rng: random.Random) -> list[TableSpec]:
    """s1 (a CDC stream with a processing-time attribute) and s2, a dimension loaded whole
    before the stream and never changed: where a lookup join equals Flink's regular join."""
    levels = [10, 20, 30]
    return [
        TableSpec("s1", [Column("id", "BIGINT"), Column("level", "BIGINT", _pick(levels))], "id",
                  rng.choice(["debezium-json", "upsert-json"]), _fresh_or_reuse(6), extra="pt AS PROCTIME()"),
        TableSpec("s2", [Column("id", "BIGINT"), Column("attr", "STRING", _pick(["a1", "b1", "c1"]))], "id",
                  rng.choice(["debezium-json", "upsert-json"]), _from_domain(levels + [40]), static=True),
    ]


def _lookup_shape(rng: random.Random, join: str) -> tuple[list[TableSpec], str, str, str]:
    """``s1 <join> s2 FOR SYSTEM_TIME AS OF s1.pt AS d ON ...`` into a sink keyed by s1.id."""
    sink = ("CREATE TABLE t1 (id BIGINT, level BIGINT, attr STRING, PRIMARY KEY (id) NOT ENFORCED) "
            "WITH ('topic' = 't1', 'format' = 'upsert-json');")
    query = f"INSERT INTO t1 SELECT s1.id, s1.level, d.attr FROM s1 {join}"
    return _stream_and_dimension(rng), sink, query, "none"


def shape_lookup_join(rng: random.Random, strategy: str) -> tuple[list[TableSpec], str, str, str]:
    """A lookup join with a condition on the dimension beside the key."""
    return _lookup_shape(rng, "JOIN s2 FOR SYSTEM_TIME AS OF s1.pt AS d ON s1.level = d.id AND d.attr <> 'c1'")


def shape_lookup_left_join(rng: random.Random, strategy: str) -> tuple[list[TableSpec], str, str, str]:
    """A LEFT lookup join on an expression of the stream: rows without a partner are padded."""
    return _lookup_shape(rng, "LEFT JOIN s2 FOR SYSTEM_TIME AS OF s1.pt AS d ON s1.level + 10 = d.id")


def shape_udf_view(rng: random.Random, strategy: str) -> tuple[list[TableSpec], str, str, str]:
    """A Python UDF (``conformance_udfs.tag``) in a view with a filter, over a changelog with
    NULLs: a retraction recomputes the function for the row it retracts."""
    tables = [TableSpec("s", [Column("id", "BIGINT"), Column("name", "STRING", _pick(["a,b", "", None, "xyz"])),
                              Column("v", "BIGINT", _pick([-3, 0, 2, None]))],
                        "id", rng.choice(["debezium-json", "upsert-json"]), _fresh_or_reuse(6))]
    sink = ("CREATE FUNCTION tag AS 'conformance_udfs.tag' LANGUAGE PYTHON;\n"
            "CREATE VIEW tagged AS SELECT id, tag(name, v) AS t, v FROM s WHERE v IS NULL OR v <> 0;\n"
            "CREATE TABLE u (id BIGINT, t STRING, v BIGINT, PRIMARY KEY (id) NOT ENFORCED) "
            "WITH ('topic' = 'u', 'format' = 'upsert-json');")
    return tables, sink, "INSERT INTO u SELECT id, t, v FROM tagged", "none"


def shape_union_distinct(rng: random.Random, strategy: str) -> tuple[list[TableSpec], str, str, str]:
    """UNION (distinct) of two CDC tables: a row stays while either branch still gives it;
    the sink keyed by the first column alone sees the rows of both branches conflict."""
    tables = _s1_s2(rng, rng.choice(["debezium-json", "upsert-json"]), ["a1", "b1"])
    sink = ("CREATE TABLE ud (k BIGINT, a STRING, PRIMARY KEY (k) NOT ENFORCED) "
            "WITH ('topic' = 'ud', 'format' = 'upsert-json');")
    query = "INSERT INTO ud SELECT level, 'lvl' FROM s1 UNION SELECT id, attr FROM s2 WHERE attr <> 'b1'"
    return tables, sink, query, "possible"


SHAPES: dict[str, Callable[[random.Random, str], tuple[list[TableSpec], str, str, str]]] = {
    "join_id": shape_join_id,
    "left_join_id": shape_left_join_id,
    "join_attr": shape_join_attr,
    "inventory": shape_inventory,
    "agg_by_sub_key": shape_agg_by_sub_key,
    "extremes": shape_extremes,
    "last_value": shape_last_value,
    "projection": shape_projection,
    "projection_keep_id": shape_projection_keep_id,
    "comma_join_between": shape_comma_join_between,
    "filter_distinct_agg": shape_filter_distinct_agg,
    "cte_distinct": shape_cte_distinct,
    "functions": shape_functions,
    "topn_rank": shape_topn_rank,
    "dedup_first": shape_dedup_first,
    "topn_by_id": shape_topn_by_id,
    "union_all": shape_union_all,
    "union_agg": shape_union_agg,
    "lookup_join": shape_lookup_join,
    "lookup_left_join": shape_lookup_left_join,
    "udf_view": shape_udf_view,
    "union_distinct": shape_union_distinct,
}

#: shapes whose upsert key is the sink's primary key: no materializer, so one change adding
#: several rows for one key (a row pushing the ranks below it down) is well defined
SINK_KEYED_BY_UPSERT_KEY = {"topn_rank", "dedup_first"}


# --------------------------------------------------------------------------------------------
# The query result, from scratch (to prove a sink row wrong without trusting either system)
# --------------------------------------------------------------------------------------------

def _join(left: list[dict], right: list[dict], lk: str, rk: str, outer: bool = False):
    for a in left:
        matched = [b for b in right if a[lk] is not None and a[lk] == b[rk]]
        for b in matched:
            yield a, b
        if outer and not matched:
            yield a, None


def _inventory(t: dict[str, list[dict]]) -> list[tuple[Any, tuple]]:
    totals: dict[Any, int] = {}
    for o in t["orders"]:
        totals[o["product_id"]] = totals.get(o["product_id"], 0) + o["quantity"]
    return [(p["id"], (p["name"], q)) for pid, q in totals.items() for p in t["products"]
            if p["id"] == pid and q < 10]


def _agg_by_sub_key(t: dict[str, list[dict]]) -> list[tuple[Any, tuple]]:
    groups: dict[tuple, list[int]] = {}
    for e in t["events"]:
        g = groups.setdefault((e["category"], e["region"]), [0, 0])
        g[0] += 1
        g[1] += e["v"]
    return [((c, r), (c, r, n, total)) for (c, r), (n, total) in groups.items()]


def _extremes(t: dict[str, list[dict]]) -> list[tuple[Any, tuple]]:
    groups: dict[str, list] = {}
    for e in t["events"]:
        groups.setdefault(e["category"], []).append(e["v"])
    out = []
    for c, vs in groups.items():
        valued = [v for v in vs if v is not None]
        out.append((c, (c, min(valued, default=None), max(valued, default=None), len(vs))))
    return out


def _last_value(t: dict[str, list[dict]]) -> list[tuple[Any, tuple]]:
    """Per category, the ``v`` of its row that arrived last, and its row count."""
    groups: dict[str, list] = {}
    for e in t["events"]:  # in arrival order
        g = groups.setdefault(e["category"], [None, 0])
        g[0], g[1] = e["v"], g[1] + 1
    return [(c, (c, v, n)) for c, (v, n) in groups.items()]


def _filter_distinct_agg(t: dict[str, list[dict]]) -> list[tuple[Any, tuple]]:
    groups: dict[str, list[dict]] = {}
    for e in t["events"]:
        groups.setdefault(e["category"], []).append(e)
    out = []
    for c, es in groups.items():
        eu = [e["v"] for e in es if e["region"] == "eu"]
        if len(es) > 1:
            out.append((c, (c, sum(1 for e in es if e["v"] > 1), len({e["region"] for e in es}), sum(eu) if eu else None)))
    return out


def _functions(r: dict) -> tuple:
    name, v = r["name"], r["v"]
    parts = name.split(",") if name is not None else []
    pieces = [parts[1] if len(parts) > 1 else None,
              None if name is None else (name[:4] if len(name) >= 4 else ("*" * 4)[: 4 - len(name)] + name),
              None if name is None else name.replace("a", "A")]
    case = {-3: "neg", 0: "zero"}.get(v) if v is not None else None
    if case is None:
        case = (name if name else "none").upper()
    rpad = None if name is None else (name[:2] if len(name) >= 2 else name + "-" * (2 - len(name)))
    found = re.search(r"(\w+),(\w*)", name) if name is not None else None
    return (r["id"], "|".join(p for p in pieces if p is not None), case,
            None if v is None else 2 * v, v != 0, rpad, found.group(2) if found else None)


def _tag(name: str | None, v: int | None) -> str | None:
    """``conformance_udfs.tag``, computed here without either engine."""
    return None if name is None else f"{name}#{'null' if v is None else v}"


def _top(events: list[dict], n: int, descending: bool) -> list[tuple[int, dict]]:
    """Per category the first ``n`` events by v, equal ones in arrival order (the list's
    order), with their rank."""
    out = []
    for c in sorted({e["category"] for e in events}):
        ranked = sorted((e for e in events if e["category"] == c), key=lambda e: -e["v"] if descending else e["v"])
        out += [(i + 1, e) for i, e in enumerate(ranked[:n])]
    return out


def _s1_s2_ids(a: dict, b: dict | None) -> tuple:
    return (a["id"], b["id"] if b else None)


def _union_branches(t: dict[str, list[dict]]) -> list[tuple[Any, tuple]]:
    return ([(("s1", a["id"]), (a["level"], a["id"], "lvl")) for a in t["s1"] if a["id"] != 3]
            + [(("s2", b["id"]), (b["id"], b["id"], b["attr"])) for b in t["s2"]])


def _union_agg(t: dict[str, list[dict]]) -> list[tuple[Any, tuple]]:
    groups: dict[Any, list[int]] = {}
    for _, (k, n, _a) in _union_branches(t):
        g = groups.setdefault(k, [0, 0])
        g[0] += 1
        g[1] += n
    return [(k, (k, c, total)) for k, (c, total) in groups.items()]


#: shape -> the query's rows with their lineage: ``(identity, row)`` where ``identity`` names
#: what the row comes from and keeps naming it across changes (the source row for a
#: projection, the (s1, s2) pair for a join, the group for an aggregate), so a row can be
#: followed through updates and retractions even when another identity produces an equal row
LINEAGE: dict[str, Callable[[dict[str, list[dict]]], list[tuple[Any, tuple]]]] = {
    "join_id": lambda t: [(_s1_s2_ids(a, b), (a["id"], a["level"], b["attr"]))
                          for a, b in _join(t["s1"], t["s2"], "level", "id")],
    "seed_s1_s2": lambda t: [(_s1_s2_ids(a, b), (a["id"], a["level"], b["attr"]))
                             for a, b in _join(t["s1"], t["s2"], "level", "id")],
    "left_join_id": lambda t: [(_s1_s2_ids(a, b), (a["id"], a["level"], b["attr"] if b else None))
                               for a, b in _join(t["s1"], t["s2"], "level", "id", outer=True)],
    "join_attr": lambda t: [(_s1_s2_ids(a, b), (b["attr"], a["id"], a["level"]))
                            for a, b in _join(t["s1"], t["s2"], "level", "id")],
    "inventory": _inventory,
    "seed_inventory": _inventory,
    "agg_by_sub_key": _agg_by_sub_key,
    "extremes": _extremes,
    "last_value": _last_value,
    "projection": lambda t: [(r["id"], (r["name"], r["v"])) for r in t["s"]],
    "projection_keep_id": lambda t: [(r["id"], (r["name"], r["id"], r["v"])) for r in t["s"]],
    "comma_join_between": lambda t: [(_s1_s2_ids(a, b), (a["id"], a["level"], b["attr"]))
                                     for a, b in _join(t["s1"], t["s2"], "level", "id")
                                     if b["id"] - 20 <= a["id"] * 10 <= b["id"] + 20],
    "filter_distinct_agg": _filter_distinct_agg,
    "cte_distinct": lambda t: [((c, r), (c, r)) for c, r in sorted({(e["category"], e["region"]) for e in t["events"]})],
    "functions": lambda t: [(r["id"], _functions(r)) for r in t["s"]],
    "topn_rank": lambda t: [((e["category"], rn), (e["category"], rn, e["id"], e["v"]))
                            for rn, e in _top(t["events"], 2, True)],
    "dedup_first": lambda t: [(e["category"], (e["category"], e["id"], e["v"])) for _, e in _top(t["events"], 1, False)],
    "topn_by_id": lambda t: [(e["id"], (e["id"], e["category"], e["v"])) for _, e in _top(t["events"], 2, True)],
    "union_all": _union_branches,
    "union_agg": _union_agg,
    "lookup_join": lambda t: [(_s1_s2_ids(a, b), (a["id"], a["level"], b["attr"]))
                              for a, b in _join(t["s1"], t["s2"], "level", "id") if b["attr"] != "c1"],
    "lookup_left_join": lambda t: [(_s1_s2_ids(a, b), (a["id"], a["level"], b["attr"] if b else None))
                                   for a, b in _join([{**a, "k": a["level"] + 10} for a in t["s1"]], t["s2"],
                                                     "k", "id", outer=True)],
    "udf_view": lambda t: [(r["id"], (r["id"], _tag(r["name"], r["v"]), r["v"]))
                           for r in t["s"] if r["v"] is None or r["v"] != 0],
    "union_distinct": lambda t: [(row, row) for row in sorted(
        {(a["level"], "lvl") for a in t["s1"]} | {(b["id"], b["attr"]) for b in t["s2"] if b["attr"] != "b1"})],
}


#: shape -> what a lineage identity is, for proof messages
LINEAGE_IDENTITY: dict[str, str] = {
    "join_id": "(s1.id, s2.id)", "seed_s1_s2": "(s1.id, s2.id)", "left_join_id": "(s1.id, s2.id)",
    "join_attr": "(s1.id, s2.id)", "inventory": "products.id", "seed_inventory": "products.id",
    "agg_by_sub_key": "group (category, region)", "extremes": "group (category)", "last_value": "group (category)",
    "projection": "s.id", "projection_keep_id": "s.id",
    "comma_join_between": "(s1.id, s2.id)", "filter_distinct_agg": "group (category)",
    "cte_distinct": "group (category, region)", "functions": "s.id",
    "topn_rank": "(category, rank)", "dedup_first": "category", "topn_by_id": "events.id",
    "union_all": "(branch table, its id)", "union_agg": "group (k)",
    "lookup_join": "(s1.id, s2.id)", "lookup_left_join": "(s1.id, s2.id)",
    "udf_view": "s.id", "union_distinct": "the distinct row (k, a)",
}


def _rows_only(f: Callable[[dict[str, list[dict]]], list[tuple[Any, tuple]]]):
    return lambda t: [row for _, row in f(t)]


#: shape -> the query's rows (a multiset), evaluated from scratch over the source tables
EVALUATORS: dict[str, Callable[[dict[str, list[dict]]], list[tuple]]] = {
    shape: _rows_only(f) for shape, f in LINEAGE.items()}


#: shape -> the source columns its query reads, where the evaluator depends on arrival order
#: (the rank shapes rank ties by arrival; LAST_VALUE takes the latest)
READS: dict[str, tuple[str, ...]] = {shape: ("id", "category", "v")
                                     for shape in ("topn_rank", "dedup_first", "topn_by_id", "last_value")}


def _apply(tables: dict[str, dict], pks: dict[str, str], table: str, r: dict,
           reads: tuple[str, ...] = (), upsert: bool = False) -> None:
    """One source record applied to ``tables``. A keyed row updated arrives again (moves to
    the end of its table's order), except an upsert record that leaves every column in
    ``reads`` as it was: Flink prunes unread columns below its ChangelogNormalize, which
    drops such a record as a duplicate, so the row keeps its place."""
    pk = pks.get(table)
    if pk is None:
        tables[table][len(tables[table])] = r["row"]  # append-only: every row stays
    elif r["kind"] in ("+I", "+U"):
        old = tables[table].get(r["row"][pk])
        if upsert and reads and old is not None and all(old[c] == r["row"][c] for c in reads):
            tables[table][r["row"][pk]] = r["row"]
            return
        tables[table].pop(r["row"][pk], None)  # keep arrival order (see _Source.change)
        tables[table][r["row"][pk]] = r["row"]
    elif r["kind"] == "-D":
        tables[table].pop(r["row"][pk], None)


def source_tables(w: "Workload", upto_batch: int) -> dict[str, list[dict]]:
    """Each source table's rows after ``upto_batch`` batches (keyed tables by their PK,
    append-only tables as every row inserted), in arrival order."""
    tables: dict[str, dict] = {table: {} for table in w.inputs}
    for b in range(upto_batch):
        for _, recs in _changes_of_batch(w, b):
            # an update of an upsert source is one +U record; a debezium update is -U and +U
            upsert = not any(r["kind"] == "-U" for _, r in recs)
            for table, r in recs:
                _apply(tables, w.pks, table, r, READS.get(w.shape, ()), upsert)
    return {table: list(rows.values()) for table, rows in tables.items()}


def _changes_of_batch(w: "Workload", b: int) -> list[tuple[int, list[tuple[str, dict]]]]:
    """Batch ``b``'s source changes in ``seq`` order: ``(seq, [(table, record), ...])``, the
    ``-U`` of an update before its ``+U``."""
    by_seq: dict[int, list[tuple[str, dict]]] = {}
    for table, batches in w.inputs.items():
        for r in (batches[b] if b < len(batches) else []):
            by_seq.setdefault(r["seq"], []).append((table, r))
    return [(seq, sorted(recs, key=lambda tr: tr[1]["kind"] in ("+I", "+U")))
            for seq, recs in sorted(by_seq.items())]


def lineage_changes(w: "Workload") -> list[list[tuple[int, list[tuple[bool, tuple, Any]]]]]:
    """Per batch, per source change (in ``seq`` order), what the query's result does: the
    records ``(is_add, row, identity)`` a sink would receive - for every identity whose row
    changed, the retraction of its old row, then the adds of the new rows. Computed from
    scratch (the query re-evaluated before and after each change), without either system's
    operators."""
    tables: dict[str, dict] = {table: {} for table in w.inputs}
    lineage = LINEAGE[w.shape]

    def result() -> dict[Any, Counter]:
        out: dict[Any, Counter] = {}
        for ident, row in lineage({t: list(rows.values()) for t, rows in tables.items()}):
            out.setdefault(ident, Counter())[row] += 1
        return out

    before = result()
    out = []
    for b in range(w.n_batches()):
        steps = []
        for seq, recs in _changes_of_batch(w, b):
            upsert = not any(r["kind"] == "-U" for _, r in recs)
            for table, r in recs:
                _apply(tables, w.pks, table, r, READS.get(w.shape, ()), upsert)
            after = result()
            rets, adds = [], []
            for ident in sorted(before.keys() | after.keys(), key=repr):
                old, new = before.get(ident, Counter()), after.get(ident, Counter())
                rets += [(False, row, ident) for row in sorted((old - new).elements(), key=repr)]
                adds += [(True, row, ident) for row in sorted((new - old).elements(), key=repr)]
            steps.append((seq, rets + adds))
            before = after
        out.append(steps)
    return out


def lineage_after(w: "Workload", upto_batch: int) -> list[tuple[Any, tuple]]:
    """``(identity, row)`` of every row the query produces after ``upto_batch`` batches."""
    return LINEAGE[w.shape](source_tables(w, upto_batch))


def evaluate(w: "Workload", upto_batch: int) -> Counter:
    """The multiset of rows the workload's query produces after ``upto_batch`` batches."""
    return Counter(EVALUATORS[w.shape](source_tables(w, upto_batch)))


def seed_examples() -> list[Workload]:
    """The seeds' own examples, under each strategy: the s1/s2 join whose update moves a row
    to another join key, and the inventory rollback (orders append-only)."""
    out = []
    s1_s2 = "\n".join([
        "CREATE TABLE s1 (id BIGINT, level BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 's1', 'format' = 'debezium-json');",
        "CREATE TABLE s2 (id BIGINT, attr STRING, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 's2', 'format' = 'debezium-json');",
        "CREATE TABLE t1 (id BIGINT, level BIGINT, attr STRING, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 't1', 'format' = 'upsert-json');",
        "INSERT INTO t1 SELECT s1.id, s1.level, s2.attr FROM s1 JOIN s2 ON s1.level = s2.id ON CONFLICT DO {strategy};",
    ])
    inventory = "\n".join([
        "CREATE TABLE orders (product_id BIGINT, quantity BIGINT) WITH ('topic' = 'orders', 'format' = 'json');",
        "CREATE TABLE products (id BIGINT, name STRING, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 'products', 'format' = 'debezium-json');",
        "CREATE TABLE inventory (name STRING, quantity BIGINT, PRIMARY KEY (name) NOT ENFORCED) WITH ('topic' = 'inventory', 'format' = 'upsert-json');",
        "INSERT INTO inventory SELECT name, quantity FROM (SELECT product_id, SUM(quantity) AS quantity FROM orders GROUP BY product_id) o",
        "  JOIN products p ON o.product_id = p.id WHERE quantity < 10 ON CONFLICT DO {strategy};",
    ])

    def rec(seq: int, kind: str, **row: Any) -> dict:
        return {"kind": kind, "row": row, "seq": seq}

    for strategy in STRATEGIES:
        out.append(Workload(
            name=f"seed-s1-s2-{strategy}", shape="seed_s1_s2", strategy=strategy, seed=0,
            sql=s1_s2.format(strategy=strategy), conflicts="none", pks={"s1": "id", "s2": "id"},
            inputs={"s2": [[rec(1, "+I", id=10, attr="a1"), rec(2, "+I", id=20, attr="b1")], []],
                    "s1": [[rec(3, "+I", id=1, level=10)],
                           [rec(4, "-U", id=1, level=10), rec(4, "+U", id=1, level=20)]]}))
        out.append(Workload(
            name=f"seed-inventory-rollback-{strategy}", shape="seed_inventory", strategy=strategy, seed=0,
            sql=inventory.format(strategy=strategy), conflicts="possible", pks={"products": "id"},
            inputs={"products": [[rec(1, "+I", id=1, name="Football"), rec(2, "+I", id=2, name="Football"),
                                  rec(3, "+I", id=3, name="Basketball")], [], [], []],
                    "orders": [[], [rec(4, "+I", product_id=1, quantity=5)],
                               [rec(5, "+I", product_id=2, quantity=6)],
                               [rec(6, "+I", product_id=2, quantity=7)]]}))
    return out


def _ev(seq: int, kind: str, id: int, category: str, region: str, v: int) -> dict:
    return {"kind": kind, "row": {"id": id, "category": category, "region": region, "v": v}, "seq": seq}


def _per_category_sql(events_format: str) -> str:
    """Events summed per (category, region) into a sink keyed by category alone, so a
    category's row moves between regions (``DO DEDUPLICATE``)."""
    return "\n".join([
        "CREATE TABLE events (id BIGINT, category STRING, region STRING, v BIGINT, PRIMARY KEY (id) NOT ENFORCED) "
        f"WITH ('topic' = 'events', 'format' = '{events_format}');",
        "CREATE TABLE per_category (category STRING, region STRING, n BIGINT, total BIGINT, PRIMARY KEY (category) NOT ENFORCED) WITH ('topic' = 'pc', 'format' = 'upsert-json');",
        "INSERT INTO per_category SELECT category, region, COUNT(*) AS n, SUM(v) AS total FROM events GROUP BY category, region ON CONFLICT DO DEDUPLICATE;"])


def reproductions() -> list[Workload]:
    """Minimal reproductions of every difference found (docs/conformance.md), by name."""
    proj = "\n".join([
        "CREATE TABLE s (id BIGINT, name STRING, v BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 's', 'format' = 'debezium-json');",
        "CREATE TABLE t (name STRING, v BIGINT, PRIMARY KEY (name) NOT ENFORCED) WITH ('topic' = 't', 'format' = 'upsert-json');",
        "INSERT INTO t SELECT name, v FROM s ON CONFLICT DO {strategy};",
    ])

    def rec(seq: int, kind: str, id: int, name: str, v: int) -> dict:
        return {"kind": kind, "row": {"id": id, "name": name, "v": v}, "seq": seq}

    upsert_events = ("CREATE TABLE events (id BIGINT, category STRING, region STRING, v BIGINT, PRIMARY KEY (id) "
                     "NOT ENFORCED) WITH ('topic' = 'events', 'format' = 'upsert-json');")

    def event(seq: int, kind: str, id: int, region: str) -> dict:
        return {"kind": kind, "row": {"id": id, "category": "c1", "region": region, "v": 3}, "seq": seq}

    rank_tie = [
        # Fixed difference: an upsert record that changes only a column the query drops. Flink
        # pushes the projection into the source, so its ChangelogNormalize sees an unchanged
        # row and drops the record; Tidemark's normalize used to emit -U/+U of the full row, and
        # the rank took the identical projected row as arriving again (behind its tie).
        Workload(name="upsert-unchanged-projected-row-rearrives-in-rank", shape="dedup_first",
                 strategy="DEDUPLICATE", seed=0, pks={"events": "id"},
                 sql="\n".join([upsert_events, shape_dedup_first(random.Random(0), "DEDUPLICATE")[1],
                                 shape_dedup_first(random.Random(0), "DEDUPLICATE")[2] + " ON CONFLICT DO DEDUPLICATE;"]),
                 inputs={"events": [[event(1, "+I", 7, "ap")], [event(2, "+I", 3, "ap"), event(3, "+U", 7, "us")]]},
                 expect={"flink": [[["c1", 7, 3]], [["c1", 7, 3]]], "truth": [[["c1", 7, 3]], [["c1", 7, 3]]]}),
    ]
    distinct = "\n".join([
        "CREATE TABLE events (id BIGINT, category STRING, region STRING, v BIGINT, PRIMARY KEY (id) NOT ENFORCED) "
        "WITH ('topic' = 'events', 'format' = 'upsert-json');",
        "CREATE TABLE cat_region (category STRING, region STRING, PRIMARY KEY (category) NOT ENFORCED) "
        "WITH ('topic' = 'cr', 'format' = 'upsert-json');",
        "INSERT INTO cat_region SELECT DISTINCT category, region FROM events ON CONFLICT DO NOTHING;"])

    def ev(seq: int, kind: str, id: int, category: str, region: str, v: int) -> dict:
        return {"kind": kind, "row": {"id": id, "category": category, "region": region, "v": v}, "seq": seq}

    return rank_tie + [
        # Fixed difference: id 5's update changes only v, which no operator reads; Flink prunes
        # v below its ChangelogNormalize, so the update is identical there and dropped, group
        # (c1, eu) keeps its +I at seq 1 and DO NOTHING keeps it. Tidemark used to pass a
        # -U/+U of (c1, eu) on at seq 3, and the sink kept (c1, ap) from seq 2.
        Workload(name="distinct-upsert-unread-column-update-dropped", shape="cte_distinct", strategy="NOTHING",
                 seed=0, sql=distinct, pks={"events": "id"},
                 inputs={"events": [[ev(1, "+I", 5, "c1", "eu", 2), ev(2, "+I", 8, "c1", "ap", 1),
                                     ev(3, "+U", 5, "c1", "eu", 1)]]},
                 expect={"flink": [[["c1", "eu"]]], "truth": [[["c1", "eu"]]]}),
        # Flink defect: the kept row is updated in the step that also adds another row for
        # the key; Flink keeps showing the retracted (a, 1).
        Workload(name="wcsm-nothing-stale-current-value", shape="projection", strategy="NOTHING",
                 seed=0, sql=proj.format(strategy="NOTHING"), pks={"s": "id"},
                 inputs={"s": [[rec(1, "+I", 1, "a", 1)],
                               [rec(2, "-U", 1, "a", 1), rec(2, "+U", 1, "a", 5), rec(3, "+I", 2, "a", 2)]]},
                 expect={"flink": [[["a", 1]], [["a", 1]]], "truth": [[["a", 1]], [["a", 5]]]}),
        # Fixed difference (Tidemark now follows Flink): the shown row ('a', 0) has an
        # identical copy that DO NOTHING dropped (id 2). A retraction of ('a', 0) cannot say
        # which copy it means; here it is the dropped one (id 2), so the shown copy (id 1) is
        # still active and Flink, keeping it, is right. Tidemark used to show ('a', 1).
        Workload(name="nothing-retracted-dropped-copy-keeps-shown-row", shape="projection",
                 strategy="NOTHING", seed=0, sql=proj.format(strategy="NOTHING"), pks={"s": "id"},
                 inputs={"s": [[rec(1, "+I", 1, "a", 0)], [rec(2, "+I", 2, "a", 0)],
                               [rec(3, "-D", 2, "a", 0), rec(4, "+I", 3, "a", 1), rec(5, "+I", 4, "a", 2)]]},
                 expect={"flink": [[["a", 0]], [["a", 0]], [["a", 0]]],
                         "truth": [[["a", 0]], [["a", 0]], [["a", 0]]]}),
        # ... and the same at the sink when the retraction meant the shown copy (id 1): Flink
        # keeps id 1's retracted row, but id 2 still produces an equal row, so the table is
        # right as far as any sink can know; Tidemark shows the same table.
        Workload(name="nothing-retracted-shown-copy-equal-copy-active", shape="projection",
                 strategy="NOTHING", seed=0, sql=proj.format(strategy="NOTHING"), pks={"s": "id"},
                 inputs={"s": [[rec(1, "+I", 1, "a", 0)], [rec(2, "+I", 2, "a", 0)],
                               [rec(3, "-D", 1, "a", 0), rec(4, "+I", 3, "a", 1), rec(5, "+I", 4, "a", 2)]]},
                 expect={"flink": [[["a", 0]], [["a", 0]], [["a", 0]]],
                         "truth": [[["a", 0]], [["a", 0]], [["a", 0]]]}),
        # Open difference: without an upsert key, when a value is held twice and one copy is
        # retracted, Flink removes the oldest copy (findFirst), Tidemark the copy added in
        # the same batch. Here the copy still active is the newer one (Flink's choice is right)...
        Workload(name="dedup-identical-copies-retract-oldest", shape="projection", strategy="DEDUPLICATE",
                 seed=0, sql=proj.format(strategy="DEDUPLICATE"), pks={"s": "id"},
                 inputs={"s": [[rec(1, "+I", 1, "a", 2)],
                               [rec(2, "+I", 2, "a", 1), rec(3, "+I", 3, "a", 2), rec(4, "-D", 1, "a", 2)]]},
                 expect={"flink": [[["a", 2]], [["a", 2]]], "truth": [[["a", 2]], [["a", 2]]]}),
        # ... and here it is the older one (Flink's convention shows a row that is not the
        # latest active one; Tidemark happens to be right). Neither can know which copy a
        # retraction means; conformance asks for Flink's convention.
        Workload(name="dedup-identical-copies-retract-newest", shape="projection", strategy="DEDUPLICATE",
                 seed=0, sql=proj.format(strategy="DEDUPLICATE"), pks={"s": "id"},
                 inputs={"s": [[rec(1, "+I", 1, "a", 2)],
                               [rec(2, "+I", 2, "a", 1), rec(3, "+I", 3, "a", 2), rec(4, "-D", 3, "a", 2)]]},
                 expect={"flink": [[["a", 2]], [["a", 2]]], "truth": [[["a", 2]], [["a", 1]]]}),
        # Open difference: a group deleted and re-created with the same value inside one batch
        # is the latest row in Flink (it emits -D then +I); Tidemark's aggregate emits no net
        # change, so the row keeps its old position and an older row wins.
        Workload(name="dedup-reinserted-same-row-keeps-old-position", shape="agg_by_sub_key",
                 strategy="DEDUPLICATE", seed=0, pks={"events": "id"},
                 sql=_per_category_sql("debezium-json"),
                 inputs={"events": [
                     [_ev(1, "+I", 1, "c", "eu", 1), _ev(2, "+I", 2, "c", "us", 1)],
                     [_ev(3, "-D", 1, "c", "eu", 1), _ev(4, "+I", 3, "c", "eu", 1)]]},
                 expect={"flink": [[["c", "us", 1, 1]], [["c", "eu", 1, 1]]],
                         "truth": [[["c", "us", 1, 1]], [["c", "eu", 1, 1]]]}),
        # Fixed (normalize): through an UPSERT source, a key inserted and deleted inside one
        # batch re-creates group (c, eu) with its old value at seq 3-4; Flink's
        # ChangelogNormalize passes +I and -D on, the aggregate emits the refresh, and the
        # group's row is the latest. Tidemark's normalize used to net the key to nothing; it
        # now passes every record's change on in position order.
        Workload(name="dedup-upsert-insert-delete-in-batch-no-refresh", shape="agg_by_sub_key",
                 strategy="DEDUPLICATE", seed=0, pks={"events": "id"},
                 sql=_per_category_sql("upsert-json"),
                 inputs={"events": [
                     [_ev(1, "+I", 1, "c", "eu", 1), _ev(2, "+I", 2, "c", "us", 1)],
                     [_ev(3, "+I", 3, "c", "eu", 1), _ev(4, "-D", 3, "c", "eu", 1)]]},
                 expect={"flink": [[["c", "us", 1, 1]], [["c", "eu", 1, 1]]],
                         "truth": [[["c", "us", 1, 1]], [["c", "eu", 1, 1]]]}),
        # The same through a join: s1 row 1 deleted and re-inserted unchanged.
        Workload(name="dedup-rejoined-same-row-keeps-old-position", shape="join_attr",
                 strategy="DEDUPLICATE", seed=0, pks={"s1": "id", "s2": "id"},
                 sql="\n".join([
                     "CREATE TABLE s1 (id BIGINT, level BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 's1', 'format' = 'debezium-json');",
                     "CREATE TABLE s2 (id BIGINT, attr STRING, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 's2', 'format' = 'debezium-json');",
                     "CREATE TABLE t2 (attr STRING, id BIGINT, level BIGINT, PRIMARY KEY (attr) NOT ENFORCED) WITH ('topic' = 't2', 'format' = 'upsert-json');",
                     "INSERT INTO t2 SELECT s2.attr, s1.id, s1.level FROM s1 JOIN s2 ON s1.level = s2.id ON CONFLICT DO DEDUPLICATE;"]),
                 inputs={"s2": [[{"kind": "+I", "row": {"id": 10, "attr": "x"}, "seq": 1},
                                 {"kind": "+I", "row": {"id": 20, "attr": "x"}, "seq": 2}], []],
                         "s1": [[{"kind": "+I", "row": {"id": 1, "level": 10}, "seq": 3},
                                 {"kind": "+I", "row": {"id": 2, "level": 20}, "seq": 4}],
                                [{"kind": "-D", "row": {"id": 1, "level": 10}, "seq": 5},
                                 {"kind": "+I", "row": {"id": 1, "level": 10}, "seq": 6}]]},
                 expect={"flink": [[["x", 2, 20]], [["x", 1, 10]]], "truth": [[["x", 2, 20]], [["x", 1, 10]]]}),
    ]


def generate(seed: int, shape: str | None = None, strategy: str | None = None,
             n_batches: int | None = None, max_changes: int = 6) -> Workload:
    """One workload, fully determined by its arguments."""
    rng = random.Random(f"tidemark-conformance-{seed}")
    shape = shape or rng.choice(sorted(SHAPES))
    strategy = strategy or rng.choice(STRATEGIES)
    specs, sink_ddl, query, conflicts = SHAPES[shape](rng, strategy)
    if strategy != "ERROR":
        conflicts = "possible" if conflicts == "possible" else "none"
    n = n_batches or rng.randint(3, 8)
    inputs = _changelog(specs, rng, n, max_changes, shape)
    sql = "\n".join([*(s.ddl() for s in specs), sink_ddl, f"{query}\n  ON CONFLICT DO {strategy};"])
    flink_sql = re.sub(r"\s+FOR SYSTEM_TIME AS OF \S+", "", sql) if "FOR SYSTEM_TIME" in sql else None
    return Workload(name=f"{shape}-{strategy}-{seed}", shape=shape, strategy=strategy, seed=seed,
                    sql=sql, inputs=inputs, conflicts=conflicts,
                    pks={s.name: s.pk for s in specs if s.format != "json"}, flink_sql=flink_sql)


#: Flink's other DEDUPLICATE implementation (SinkUpsertMaterializerV2 on a sequenced multiset)
V2_OPTIONS = {"table.exec.sink.upsert-materialize-strategy.type": "MAP"}


def suite(seeds: range | list[int], with_v2: bool = False) -> list[Workload]:
    """Every shape under every strategy, for each seed; with ``with_v2`` each DEDUPLICATE
    workload also runs against Flink's ``SinkUpsertMaterializerV2`` (``...-MAP``)."""
    out = []
    for seed in seeds:
        for shape in sorted(SHAPES):
            for strategy in STRATEGIES:
                w = generate(seed, shape, strategy)
                out.append(w)
                if with_v2 and strategy == "DEDUPLICATE":
                    out.append(Workload(**{**w.__dict__, "name": f"{w.name}-MAP", "options": V2_OPTIONS}))
    return out


if __name__ == "__main__":  # print one workload, for reproducing a failure by hand
    import json
    import sys

    args = sys.argv[1:]
    w = generate(int(args[0]), *(args[1:3] if len(args) > 1 else []))
    print(w.sql)
    print(json.dumps(w.inputs, indent=1))


# --------------------------------------------------------------------------------------------
# Event-time windows (compared on the final table: the oracle's watermark stays below every
# event until the end of input, so its windows fire only there; see flink_oracle.py)
# --------------------------------------------------------------------------------------------

#: the bids' WATERMARK delay; disorder stays below it, so no record is late on either system
WINDOW_DELAY_MS = 2000
WINDOW_QUERIES = {
    "tumble": "TUMBLE(TABLE bids, DESCRIPTOR(ts), INTERVAL '5' SECOND)",
    "hop": "HOP(TABLE bids, DESCRIPTOR(ts), INTERVAL '2' SECOND, INTERVAL '6' SECOND)",
    "cumulate": "CUMULATE(TABLE bids, DESCRIPTOR(ts), INTERVAL '2' SECOND, INTERVAL '6' SECOND)",
    "session": "SESSION(ts, INTERVAL '1' SECOND)",  # Flink's group window, in GROUP BY
}


def window_workload(seed: int, window: str | None = None, n_events: int | None = None) -> Workload:
    """Append-only bids whose event time runs ahead by 0-700 ms per record and is moved back
    by up to 1.9 s (out of order, never late), a window aggregate over them (with a computed
    column and a filter in front; ``window`` one of ``WINDOW_QUERIES``); one workload per
    seed, fully determined by it."""
    rng = random.Random(f"tidemark-window-conformance-{seed}")
    window = window or rng.choice(sorted(WINDOW_QUERIES))
    n = n_events or rng.randint(20, 80)
    n_batches = rng.randint(2, 6)
    batches = _disordered_bids(rng, n, n_batches)
    sql = "\n".join([
        "CREATE TABLE bids (item BIGINT, price BIGINT, ts TIMESTAMP(3), doubled AS price * 2, "
        f"WATERMARK FOR ts AS ts - INTERVAL '{WINDOW_DELAY_MS // 1000}' SECOND) "
        "WITH ('topic' = 'bids', 'format' = 'json');",
        "CREATE TABLE per_window (item BIGINT, ws TIMESTAMP(3), we TIMESTAMP(3), n BIGINT, priced BIGINT, "
        "total BIGINT, lo BIGINT, hi BIGINT, av BIGINT) WITH ('topic' = 'pw', 'format' = 'changelog-json');",
        _window_insert(window),
    ])
    return Workload(name=f"window-{window}-{seed}", shape=f"window_{window}", strategy="", seed=seed,
                    sql=sql, inputs={"bids": batches}, conflicts="none")


def _disordered_bids(rng: random.Random, n: int, n_batches: int, seq_column: bool = False) -> list[list[dict]]:
    """``n`` append-only bids in ``n_batches`` batches, event time running ahead by 0-700 ms
    per record and moved back by up to 1.9 s (out of order, never late); with
    ``seq_column`` each row also carries its sequence number as ``id`` (a unique column)."""
    cuts = sorted(rng.sample(range(1, n), n_batches - 1))
    clock = 1_700_000_000_000 + rng.randrange(10_000)
    rows = []
    for _ in range(n):
        clock += rng.randrange(700)
        t = clock - rng.randrange(WINDOW_DELAY_MS - 100)
        stamp = f"{_ms_text(t)}"
        rows.append({"item": rng.randint(1, 3), "price": rng.choice([None, *range(1, 50)]), "ts": stamp})
    batches: list[list[dict]] = [[] for _ in range(n_batches)]
    for seq, row in enumerate(rows, start=1):
        b = sum(1 for c in cuts if c < seq)
        batches[b].append({"kind": "+I", "row": {"id": seq, **row} if seq_column else row, "seq": seq})
    return batches


def _window_insert(window: str) -> str:
    aggs = "COUNT(*), COUNT(price), SUM(doubled), MIN(price), MAX(price), AVG(price)"
    if window == "session":
        gap = WINDOW_QUERIES[window].removeprefix("SESSION(ts, ").removesuffix(")")
        return (f"INSERT INTO per_window SELECT item, SESSION_START(ts, {gap}), SESSION_END(ts, {gap}), {aggs} "
                f"FROM bids WHERE item <> 3 OR price > 10 GROUP BY item, {WINDOW_QUERIES[window]};")
    return (f"INSERT INTO per_window SELECT item, window_start, window_end, {aggs} "
            f"FROM TABLE({WINDOW_QUERIES[window]}) WHERE item <> 3 OR price > 10 "
            "GROUP BY item, window_start, window_end;")


def _ms_text(ms: int) -> str:
    """Epoch milliseconds as the ``yyyy-MM-dd HH:mm:ss.SSS`` text both systems read."""
    from datetime import datetime, timedelta

    t = datetime(1970, 1, 1) + timedelta(milliseconds=ms)
    return t.strftime("%Y-%m-%d %H:%M:%S.") + f"{t.microsecond // 1000:03d}"


# --------------------------------------------------------------------------------------------
# Window Top-N and window join (the same disordered, never late bids; compared on the final
# table, as the window aggregates above)
# --------------------------------------------------------------------------------------------

_WINDOW_TABLE = (
    "CREATE TABLE {name} (id BIGINT, item BIGINT, price BIGINT, ts TIMESTAMP(3), "
    f"WATERMARK FOR ts AS ts - INTERVAL '{WINDOW_DELAY_MS // 1000}' SECOND) "
    "WITH ('topic' = '{name}', 'format' = 'json');"
)
_TUMBLE = "TUMBLE(TABLE {t}, DESCRIPTOR(ts), INTERVAL '5' SECOND)"
_HOP = "HOP(TABLE {t}, DESCRIPTOR(ts), INTERVAL '2' SECOND, INTERVAL '6' SECOND)"
_CUMULATE = "CUMULATE(TABLE {t}, DESCRIPTOR(ts), INTERVAL '2' SECOND, INTERVAL '6' SECOND)"
_TOPN_SINK = ("CREATE TABLE topn (ws TIMESTAMP(3), we TIMESTAMP(3), item BIGINT, id BIGINT, price BIGINT, rn BIGINT) "
              "WITH ('topic' = 'topn', 'format' = 'changelog-json');")
_JOIN_SINK = ("CREATE TABLE joined (ws TIMESTAMP(3), lid BIGINT, lprice BIGINT, rid BIGINT, rprice BIGINT) "
              "WITH ('topic' = 'joined', 'format' = 'changelog-json');")


def _topn(window: str, n: str, partition: str = "", order: str = "price DESC, id") -> str:
    return (f"INSERT INTO topn SELECT window_start, window_end, item, id, price, rn FROM (\n"
            f"  SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end{partition} ORDER BY {order}) AS rn\n"
            f"  FROM TABLE({window.format(t='bids')})) WHERE {n};")


def _window_join(kind: str, window: str = _TUMBLE, residual: str = "") -> str:
    side = "(SELECT * FROM TABLE({w}) WHERE price IS NULL OR price > 5)"
    return (f"INSERT INTO joined SELECT COALESCE(L.window_start, R.window_start), L.id, L.price, R.id, R.price\n"
            f"FROM {side.format(w=window.format(t='asks'))} L {kind} JOIN {side.format(w=window.format(t='bids'))} R\n"
            f"ON L.item = R.item AND L.window_start = R.window_start AND L.window_end = R.window_end{residual};")


#: shape -> (the sink DDL, the INSERT); the sources are ``bids`` and, for joins, ``asks``
WINDOW_OP_QUERIES: dict[str, tuple[str, str]] = {
    "topn_tumble": (_TOPN_SINK, _topn(_TUMBLE, "rn <= 3")),
    "topn_hop_per_item": (_TOPN_SINK, _topn(_HOP, "rn <= 2", partition=", item")),
    "topn_cumulate_range": (_TOPN_SINK, _topn(_CUMULATE, "rn BETWEEN 2 AND 3", order="price, id")),
    "topn_no_rn": (_TOPN_SINK.replace("rn BIGINT", "two BIGINT"),
                   _topn(_TUMBLE, "rn <= 2", order="price DESC NULLS FIRST, id DESC").replace(", rn FROM", ", 2 FROM")),
    "topn_of_window_aggregate": (
        "CREATE TABLE topn (ws TIMESTAMP(3), item BIGINT, n BIGINT, rn BIGINT) "
        "WITH ('topic' = 'topn', 'format' = 'changelog-json');",
        "INSERT INTO topn SELECT window_start, item, n, rn FROM (\n"
        "  SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end ORDER BY n DESC, item) AS rn FROM (\n"
        f"    SELECT window_start, window_end, item, COUNT(*) AS n FROM TABLE({_HOP.format(t='bids')})\n"
        "    GROUP BY window_start, window_end, item)) WHERE rn <= 2;",
    ),
    "dedup_first": (_TOPN_SINK, _topn(_TUMBLE, "rn = 1", partition=", item", order="ts")),
    "dedup_last": (_TOPN_SINK, _topn(_HOP, "rn <= 1", partition=", item", order="ts DESC")),
    "join_inner": (_JOIN_SINK, _window_join("")),
    "join_left": (_JOIN_SINK, _window_join("LEFT", residual=" AND L.price < R.price")),
    "join_right_hop": (_JOIN_SINK, _window_join("RIGHT", window=_HOP)),
    "join_full": (_JOIN_SINK, _window_join("FULL", residual=" AND L.price <> R.price")),
    "join_of_window_aggregates": (
        "CREATE TABLE joined (ws TIMESTAMP(3), item BIGINT, asks BIGINT, bids BIGINT) "
        "WITH ('topic' = 'joined', 'format' = 'changelog-json');",
        "INSERT INTO joined SELECT L.ws, L.item, L.n, R.n FROM (\n"
        f"  SELECT item, window_start AS ws, window_end AS we, COUNT(*) AS n FROM TABLE({_TUMBLE.format(t='asks')})\n"
        "  GROUP BY item, window_start, window_end) L\n"
        "JOIN (\n"
        f"  SELECT item, window_start AS ws, window_end AS we, COUNT(price) AS n FROM TABLE({_TUMBLE.format(t='bids')})\n"
        "  GROUP BY item, window_start, window_end) R\n"
        "ON L.item = R.item AND L.ws = R.ws AND L.we = R.we AND L.n <= R.n;",
    ),
    "join_of_cascaded_aggregate": (  # Nexmark q5's shape: the top count per window, by a window join
        "CREATE TABLE joined (item BIGINT, n BIGINT) WITH ('topic' = 'joined', 'format' = 'changelog-json');",
        "INSERT INTO joined SELECT C.item, C.n FROM (\n"
        f"  SELECT item, window_start AS ws, window_end AS we, COUNT(*) AS n FROM TABLE({_HOP.format(t='bids')})\n"
        "  GROUP BY item, window_start, window_end) C\n"
        "JOIN (SELECT MAX(n) AS top, ws, we FROM (\n"
        f"    SELECT item, window_start AS ws, window_end AS we, COUNT(*) AS n FROM TABLE({_HOP.format(t='bids')})\n"
        "    GROUP BY item, window_start, window_end) GROUP BY ws, we) M\n"
        "ON C.ws = M.ws AND C.we = M.we AND C.n >= M.top;",
    ),
}


def window_op_workload(seed: int, shape: str) -> Workload:
    """A window Top-N or window join (``WINDOW_OP_QUERIES``) over append-only, disordered,
    never late bids (and asks), one workload per seed and shape, fully determined by them."""
    rng = random.Random(f"tidemark-window-ops-{shape}-{seed}")
    n_batches = rng.randint(2, 6)
    sink, insert = WINDOW_OP_QUERIES[shape]
    tables = ["bids", "asks"] if "TABLE asks" in insert else ["bids"]
    inputs = {t: _disordered_bids(rng, rng.randint(20, 60), n_batches, seq_column=True) for t in tables}
    sql = "\n".join([*(_WINDOW_TABLE.format(name=t) for t in tables), sink, insert])
    return Workload(name=f"window-op-{shape}-{seed}", shape=shape, strategy="", seed=seed, sql=sql,
                    inputs=inputs, conflicts="none")


def window_op_changelog_workload(shape: str) -> Workload:
    """``window_op_workload(1, shape)`` with ``bids`` an upsert changelog (``PRIMARY KEY
    (id)``, the same rows): Flink 2.3 refuses a window Top-N or window join over it."""
    w = window_op_workload(1, shape)
    bids = _WINDOW_TABLE.format(name="bids")
    keyed = bids.replace("ts TIMESTAMP(3), ", "ts TIMESTAMP(3), PRIMARY KEY (id) NOT ENFORCED, ")
    return Workload(**{**w.__dict__, "name": f"window-op-changelog-{shape}", "pks": {"bids": "id"},
                       "sql": w.sql.replace(bids, keyed.replace("'json'", "'upsert-json'"))})
# OVER aggregation on event time (append-only input, disorder within the watermark delay)
# --------------------------------------------------------------------------------------------

#: frame name -> the OVER frame (all of them end at the current row, as Flink requires)
OVER_FRAMES = {
    "rows": "ROWS BETWEEN 2 PRECEDING AND CURRENT ROW",
    "range": "RANGE BETWEEN INTERVAL '2' SECOND PRECEDING AND CURRENT ROW",
    "rows_unbounded": "ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW",
    "range_unbounded": "RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW",
}


def over_workload(seed: int, frame: str) -> Workload:
    """The bids of ``window_workload`` (out of order, never late; equal event times happen:
    the clock moves in whole 100 ms steps) under an OVER aggregation per item with ``frame``
    (one of ``OVER_FRAMES``), a computed column and a filter in front."""
    base = window_workload(seed, "tumble")
    rng = random.Random(f"tidemark-over-conformance-{seed}")
    for batch in base.inputs["bids"]:
        for rec in batch:  # coarser times, so rows of one item share one
            rec["row"]["ts"] = rec["row"]["ts"][:-2] + "00"
            rec["row"]["item"] = rng.randint(1, 3)
    window = f"(PARTITION BY item ORDER BY ts {OVER_FRAMES[frame]})"
    calls = ", ".join(f"{call} OVER {window}" for call in
                      ("COUNT(*)", "COUNT(price)", "SUM(doubled)", "MIN(price)", "MAX(price)", "AVG(price)"))
    sql = "\n".join([
        base.sql.split("\n")[0],
        "CREATE TABLE per_row (item BIGINT, price BIGINT, ts TIMESTAMP(3), n BIGINT, priced BIGINT, "
        "total BIGINT, lo BIGINT, hi BIGINT, av BIGINT) WITH ('topic' = 'pr', 'format' = 'changelog-json');",
        f"INSERT INTO per_row SELECT item, price, ts, {calls} FROM bids WHERE item <> 3 OR price > 10;",
    ])
    return Workload(name=f"over-{frame}-{seed}", shape=f"over_{frame}", strategy="", seed=seed,
                    sql=sql, inputs=base.inputs, conflicts="none")


# --------------------------------------------------------------------------------------------
# Statement sets: several INSERTs over the same CDC sources in one job
# --------------------------------------------------------------------------------------------

#: the sinks of ``statement_set_workload``, in INSERT order
STATEMENT_SET_SINKS = ("t1", "per_level", "joined_attrs")


def statement_set_workload(seed: int, strategy: str | None = None) -> Workload:
    """The ``join_id`` workload's changelog (CDC with retractions and disorder) through a
    statement set of three INSERTs: the join into ``t1`` with the ON CONFLICT clause, an
    aggregate of one source into ``per_level``, and an aggregate of the join into
    ``joined_attrs``. The join is a view both join INSERTs read (one join stage on
    Tidemark, shared); the aggregates' upsert keys are their sinks' keys, so every sink's
    table after each batch is defined."""
    w = generate(seed, "join_id", strategy)
    tables = w.sql.split("CREATE TABLE t1")[0]
    sql = "\n".join([
        tables.rstrip(),
        "CREATE TABLE t1 (id BIGINT, level BIGINT, attr STRING, PRIMARY KEY (id) NOT ENFORCED) "
        "WITH ('topic' = 't1', 'format' = 'upsert-json');",
        "CREATE TABLE per_level (level BIGINT, n BIGINT, ids BIGINT, PRIMARY KEY (level) NOT ENFORCED) "
        "WITH ('topic' = 'per_level', 'format' = 'upsert-json');",
        "CREATE TABLE joined_attrs (attr STRING, n BIGINT, PRIMARY KEY (attr) NOT ENFORCED) "
        "WITH ('topic' = 'joined_attrs', 'format' = 'changelog-json');",
        "CREATE VIEW j AS SELECT s1.id, s1.level, s2.attr FROM s1 JOIN s2 ON s1.level = s2.id;",
        "EXECUTE STATEMENT SET BEGIN",
        f"  INSERT INTO t1 SELECT id, level, attr FROM j ON CONFLICT DO {w.strategy};",
        "  INSERT INTO per_level SELECT level, COUNT(*), SUM(id) FROM s1 GROUP BY level;",
        "  INSERT INTO joined_attrs SELECT attr, COUNT(*) FROM j GROUP BY attr;",
        "END;",
    ])
    return Workload(name=f"statement_set-{w.strategy}-{seed}", shape="statement_set", strategy=w.strategy,
                    seed=seed, sql=sql, inputs=w.inputs, conflicts=w.conflicts, pks=w.pks)
