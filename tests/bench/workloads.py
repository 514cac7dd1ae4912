"""Seeded benchmark workloads for Tidemark vs Flink 2.3 (issue 7). Stdlib only: imported by
both the Tidemark venv (the suite, the Tidemark runner) and the Flink venv (flink_runner.py).

``generate(name, scale, seed, out_dir)`` writes one JSON file per source table (one Kafka
record value per line, in the order the lines must be produced) and returns a ``Workload``
with both systems' SQL. Names: ``W1``, ``W2-DEDUPLICATE``, ``W2-NOTHING``, ``W2-ERROR``,
``W3``, ``W4``. ``scale`` multiplies the base sizes below (``QUICK_SCALE`` is the smoke size).

Every workload is built so that its final sink table does NOT depend on how the tables'
records interleave, nor on how parallel subtasks reorder them: the two systems read the
tables through different sources (Kafka topics vs. one file source per table at parallelism
2), so only an order-independent final table can be compared exactly. That is why:
- W1 ends with at most one product per name below the ``quantity < 10`` filter (the rollback
  happens on the way, many times; the end has one active row per sink key);
- W2's sink key is ``s1.id``, and one Debezium envelope carries a row's move between join keys,
  so at every envelope there is at most one row per sink key (conflict-free for ``DO ERROR``);
- W3 retracts all upsert keys but one (the survivor's row is the final table);
- W4's sink key is the pair of input primary keys.
``Workload.expected`` is that final table, computed from the generated data alone: a third
opinion when Flink and Tidemark disagree.

Formats: a table is ``debezium-json`` (lines are ``{"before","after","op","ts_ms"}``
envelopes) or, for the append-only inputs the issue names (W1 ``orders``, W4
``customers``), ``json`` (lines are plain rows); ``Workload.formats`` says which, and both
systems declare the same format, so both know the input is append-only.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

QUICK_SCALE = 0.05
NAMES = ("W1", "W2-DEDUPLICATE", "W2-NOTHING", "W2-ERROR", "W3", "W4")

# base sizes at scale 1.0 (input_rows: W1 ~55k, W2 ~61k, W3 100k, W4 ~45k)
W1_PRODUCTS = 5_000
W1_PER_NAME = 4
W1_ORDERS = 50_000
W2_LEVELS = 1_000
W2_IDS = 20_000
W2_EVENTS = 60_000
W3_KEYS = 50_000
W4_CUSTOMERS = 5_000
W4_ORDERS = 20_000
W4_CHANGES = 25_000

FLINK_STRATEGY_OPTION = "table.exec.sink.upsert-materialize-strategy.type"
DELTA_STRATEGY_OPTION = "table.optimizer.delta-join.strategy"


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # SQL type, same spelling for both systems


@dataclass(frozen=True)
class TableSpec:
    name: str
    columns: tuple[Column, ...]
    pk: tuple[str, ...]
    format: str  # "debezium-json" | "json"; for the sink: unused
    tidemark_options: tuple[tuple[str, str], ...] = ()  # extra WITH options (indexes)

    def columns_ddl(self) -> str:
        cols = ", ".join(f"{c.name} {c.type}" for c in self.columns)
        pk = f", PRIMARY KEY ({', '.join(self.pk)}) NOT ENFORCED" if self.pk else ""
        return cols + pk

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]


@dataclass
class Workload:
    """One generated workload. ``tables`` is in production order (dimension tables first)."""

    name: str
    tables: dict[str, Path]
    formats: dict[str, str]
    input_rows: int  # lines (records) over all tables; a Debezium update is one record
    sink: str
    sink_columns: list[str]
    sink_pk: list[str]
    expected: dict[tuple, tuple]  # final sink table, sink PK -> row, from the data alone
    strategy: str | None  # ON CONFLICT strategy, None without a clause
    # variant name -> Tidemark SQL (W4: "delta" and "regular"; others: "default")
    tidemark_variants: dict[str, str]
    # variant name -> Flink configuration (W3: LEGACY / ADAPTIVE; others: "default")
    flink_variants: dict[str, dict[str, str]]
    select: str  # the INSERT's query + ON CONFLICT clause, shared by both systems
    specs: dict[str, TableSpec] = field(repr=False)
    params: dict[str, Any] = field(default_factory=dict)
    #: partitions of each source topic on Tidemark's side (Flink reads each file in order)
    source_partitions: int = 2

    @property
    def tidemark_sql(self) -> str:
        """The first (default) Tidemark variant."""
        return next(iter(self.tidemark_variants.values()))

    def flink_sql(self, paths: dict[str, Path] | None = None,
                  sink_options: dict[str, str] | None = None) -> str:
        """Flink DDL + INSERT reading ``paths`` (default: ``tables``) with the filesystem
        connector. ``sink_options`` replace the sink's WITH clause (default blackhole).

        ``DO NOTHING``/``DO ERROR`` need watermarks on every source in Flink 2.3; each source
        gets a constant rowtime with ``WATERMARK FOR rt AS rt``. The runner disables
        periodic watermarks, so the only watermark is end-of-input's: Flink compacts the
        whole input in one step (no watermark ever splits a Debezium update's -U/+U that
        the parallel join sent down different channels; see flink_runner.py)."""
        paths = paths or self.tables
        sink_options = sink_options or {"connector": "blackhole"}
        needs_wm = self.strategy in ("NOTHING", "ERROR")
        stmts = []
        for table in self.tables:
            spec = self.specs[table]
            cols = spec.columns_ddl()
            if needs_wm:
                cols += (", rt AS CAST(TO_TIMESTAMP_LTZ(0, 3) AS TIMESTAMP_LTZ(3)), "
                         "WATERMARK FOR rt AS rt")
            opts = {"connector": "filesystem", "path": str(Path(paths[table]).resolve()),
                    "format": spec.format}
            stmts.append(f"CREATE TABLE {table} ({cols}) WITH ({_with(opts)})")
        sink = self.specs[self.sink]
        stmts.append(f"CREATE TABLE {self.sink} ({sink.columns_ddl()}) WITH ({_with(sink_options)})")
        stmts.append(f"INSERT INTO {self.sink} {self.select}")
        return ";\n".join(stmts) + ";\n"


def _with(opts: dict[str, str]) -> str:
    return ", ".join(f"'{k}' = '{v}'" for k, v in opts.items())


def _tidemark_sql(specs: dict[str, TableSpec], sources: list[str], sink: str, select: str,
                  sets: dict[str, str] | None = None) -> str:
    stmts = [f"SET '{k}' = '{v}'" for k, v in (sets or {}).items()]
    for table in sources:
        spec = specs[table]
        opts = {"topic": table, "format": spec.format, **dict(spec.tidemark_options)}
        stmts.append(f"CREATE TABLE {table} ({spec.columns_ddl()}) WITH ({_with(opts)})")
    stmts.append(f"CREATE TABLE {sink} ({specs[sink].columns_ddl()}) "
                 f"WITH ({_with({'topic': sink, 'format': 'upsert-json'})})")
    stmts.append(f"INSERT INTO {sink} {select}")
    return ";\n".join(stmts) + ";\n"


class _Writer:
    """Writes one table's lines; counts them."""

    def __init__(self, path: Path, fmt: str):
        self.path, self.fmt, self.lines = path, fmt, 0
        self._f = path.open("w", encoding="utf-8")
        self._ts = 0

    def insert(self, row: dict) -> None:
        if self.fmt == "json":
            self._write(row)
        else:
            self._write({"before": None, "after": row, "op": "c"})

    def update(self, before: dict, after: dict) -> None:
        self._write({"before": before, "after": after, "op": "u"})

    def delete(self, before: dict) -> None:
        self._write({"before": before, "after": None, "op": "d"})

    def _write(self, obj: dict) -> None:
        if self.fmt != "json":
            self._ts += 1
            obj["ts_ms"] = self._ts
        self._f.write(json.dumps(obj, separators=(",", ":")) + "\n")
        self.lines += 1

    def close(self) -> None:
        self._f.close()


def _n(base: int, scale: float, minimum: int) -> int:
    return max(minimum, int(round(base * scale)))


# ------------------------------------------------------------------------------------ W1

def _w1(scale: float, rng: random.Random, out: Path) -> Workload:
    """The seed's inventory rollback: SUM(quantity) per product, joined to products, kept
    while < 10, sink keyed by name (several products share a name)."""
    n_products = _n(W1_PRODUCTS, scale, 8)
    n_orders = _n(W1_ORDERS, scale, 40)
    specs = {
        "products": TableSpec("products", (Column("id", "BIGINT"), Column("name", "STRING")), ("id",),
                              "debezium-json"),
        "orders": TableSpec("orders", (Column("product_id", "BIGINT"), Column("quantity", "BIGINT")), (),
                            "json"),
        "inventory": TableSpec("inventory", (Column("name", "STRING"), Column("quantity", "BIGINT")),
                               ("name",), "upsert-json"),
    }
    ids = list(range(1, n_products + 1))
    rng.shuffle(ids)
    name_of: dict[int, str] = {}
    groups: list[list[int]] = []
    for g in range(0, n_products, W1_PER_NAME):
        members = ids[g:g + W1_PER_NAME]
        groups.append(members)
        for pid in members:
            name_of[pid] = f"product-{g // W1_PER_NAME:06d}"
    # one survivor (total < 10 at the end) in 80% of the names, none in the others
    survivors = {rng.choice(m) for m in groups if rng.random() < 0.8}
    orders: list[tuple[int, int]] = []
    total: dict[int, int] = {}
    for pid in sorted(name_of):
        if pid in survivors:
            budget = rng.randint(1, 9)
            while budget > 0:
                q = rng.randint(1, budget)
                orders.append((pid, q))
                budget -= q
        else:  # cross 10 on the way: active first, then retracted by the filter
            t = 0
            while t < 10:
                q = rng.randint(1, 5)
                orders.append((pid, q))
                t += q
    losers = [p for p in sorted(name_of) if p not in survivors]
    while len(orders) < n_orders and losers:
        orders.append((rng.choice(losers), rng.randint(1, 5)))
    rng.shuffle(orders)
    for pid, q in orders:
        total[pid] = total.get(pid, 0) + q
    w_products = _Writer(out / "products.jsonl", "debezium-json")
    for pid in sorted(name_of):
        w_products.insert({"id": pid, "name": name_of[pid]})
    w_products.close()
    w_orders = _Writer(out / "orders.jsonl", "json")
    for pid, q in orders:
        w_orders.insert({"product_id": pid, "quantity": q})
    w_orders.close()
    expected = {(name_of[p],): (name_of[p], total[p]) for p in survivors}
    assert all(total[p] < 10 for p in survivors) and all(total[p] >= 10 for p in losers)
    select = ("SELECT name, quantity FROM (SELECT product_id, SUM(quantity) AS quantity FROM orders "
              "GROUP BY product_id) o JOIN products p ON o.product_id = p.id WHERE quantity < 10 "
              "ON CONFLICT DO DEDUPLICATE")
    sources = ["products", "orders"]
    return Workload(
        name="W1", tables={t: out / f"{t}.jsonl" for t in sources},
        formats={t: specs[t].format for t in sources},
        input_rows=w_products.lines + w_orders.lines, sink="inventory",
        sink_columns=specs["inventory"].column_names, sink_pk=["name"], expected=expected,
        strategy="DEDUPLICATE",
        tidemark_variants={"default": _tidemark_sql(specs, sources, "inventory", select)},
        flink_variants={"default": {}}, select=select, specs=specs,
        params={"products": n_products, "orders": len(orders), "names": len(groups),
                "survivors": len(survivors)},
    )


# ------------------------------------------------------------------------------------ W2

def _w2(strategy: str, scale: float, rng: random.Random, out: Path) -> Workload:
    """The seed's s1/s2 join on s1.level = s2.id, sink keyed by s1.id; s1 rows move between
    join keys (Debezium updates), are deleted and re-inserted; s2's attr changes a little."""
    n_levels = _n(W2_LEVELS, scale, 10)
    n_ids = _n(W2_IDS, scale, 20)
    n_events = max(_n(W2_EVENTS, scale, 60), n_ids)
    specs = {
        "s2": TableSpec("s2", (Column("id", "BIGINT"), Column("attr", "STRING")), ("id",), "debezium-json"),
        "s1": TableSpec("s1", (Column("id", "BIGINT"), Column("level", "BIGINT")), ("id",), "debezium-json"),
        "t1": TableSpec("t1", (Column("id", "BIGINT"), Column("level", "BIGINT"), Column("attr", "STRING")),
                        ("id",), "upsert-json"),
    }
    w2 = _Writer(out / "s2.jsonl", "debezium-json")
    attr = {}
    for lv in range(1, n_levels + 1):
        attr[lv] = f"a{lv}"
        w2.insert({"id": lv, "attr": attr[lv]})
    for lv in rng.sample(range(1, n_levels + 1), max(1, n_levels // 10)):
        new = f"{attr[lv]}'"
        w2.update({"id": lv, "attr": attr[lv]}, {"id": lv, "attr": new})
        attr[lv] = new
    w2.close()
    w1 = _Writer(out / "s1.jsonl", "debezium-json")
    level: dict[int, int] = {}
    order = list(range(1, n_ids + 1))
    rng.shuffle(order)
    for i in order:
        level[i] = rng.randint(1, n_levels)
        w1.insert({"id": i, "level": level[i]})
    deleted: list[int] = []
    for _ in range(n_events - n_ids):
        r = rng.random()
        if deleted and r < 0.05:  # re-insert a deleted id
            i = deleted.pop(rng.randrange(len(deleted)))
            level[i] = rng.randint(1, n_levels)
            w1.insert({"id": i, "level": level[i]})
            continue
        i = rng.randint(1, n_ids)
        if i not in level:
            continue
        if r < 0.15:
            w1.delete({"id": i, "level": level.pop(i)})
            deleted.append(i)
        else:  # move to another join key
            new = rng.randint(1, n_levels - 1)
            new += new >= level[i]
            w1.update({"id": i, "level": level[i]}, {"id": i, "level": new})
            level[i] = new
    w1.close()
    expected = {(i,): (i, lv, attr[lv]) for i, lv in level.items()}
    select = f"SELECT s1.id, s1.level, s2.attr FROM s1 JOIN s2 ON s1.level = s2.id ON CONFLICT DO {strategy}"
    sources = ["s2", "s1"]
    return Workload(
        name=f"W2-{strategy}", tables={t: out / f"{t}.jsonl" for t in sources},
        formats={t: "debezium-json" for t in sources}, input_rows=w1.lines + w2.lines, sink="t1",
        sink_columns=specs["t1"].column_names, sink_pk=["id"], expected=expected, strategy=strategy,
        tidemark_variants={"default": _tidemark_sql(specs, sources, "t1", select)},
        flink_variants={"default": {}}, select=select, specs=specs,
        params={"levels": n_levels, "ids": n_ids, "s1_records": w1.lines, "s2_records": w2.lines},
    )


# ------------------------------------------------------------------------------------ W3

def _w3(scale: float, rng: random.Random, out: Path) -> Workload:
    """One sink PK (grp = 1) gets rows from N distinct upsert keys (id), then all but one are
    deleted in random order: the history a list-based materializer scans on every retraction."""
    n_keys = _n(W3_KEYS, scale, 10)
    specs = {
        "s": TableSpec("s", (Column("id", "BIGINT"), Column("grp", "BIGINT"), Column("v", "BIGINT")), ("id",),
                       "debezium-json"),
        "t": TableSpec("t", (Column("grp", "BIGINT"), Column("id", "BIGINT"), Column("v", "BIGINT")), ("grp",),
                       "upsert-json"),
    }
    w = _Writer(out / "s.jsonl", "debezium-json")
    rows = {i: {"id": i, "grp": 1, "v": rng.randint(0, 1_000_000)} for i in range(1, n_keys + 1)}
    for i in range(1, n_keys + 1):
        w.insert(rows[i])
    survivor = rng.randint(1, n_keys)
    doomed = [i for i in range(1, n_keys + 1) if i != survivor]
    rng.shuffle(doomed)
    for i in doomed:
        w.delete(rows[i])
    w.close()
    r = rows[survivor]
    select = "SELECT grp, id, v FROM s ON CONFLICT DO DEDUPLICATE"
    return Workload(
        name="W3", tables={"s": out / "s.jsonl"}, formats={"s": "debezium-json"}, input_rows=w.lines,
        sink="t", sink_columns=specs["t"].column_names, sink_pk=["grp"],
        expected={(1,): (1, survivor, r["v"])}, strategy="DEDUPLICATE",
        tidemark_variants={"default": _tidemark_sql(specs, ["s"], "t", select)},
        flink_variants={"LEGACY": {FLINK_STRATEGY_OPTION: "LEGACY"},
                        "ADAPTIVE": {FLINK_STRATEGY_OPTION: "ADAPTIVE"}},
        select=select, specs=specs, params={"keys": n_keys, "survivor": survivor},
    )


# ------------------------------------------------------------------------------------ W4

def _w4(scale: float, rng: random.Random, out: Path) -> Workload:
    """orders (Debezium: inserts, amount updates, moves between customers, deletes) JOIN
    customers (append-only) ON customer = customers.id: qualifies for an eventual delta join
    (docs/delta-join.md rule 4); the sink key is the pair of input primary keys."""
    n_customers = _n(W4_CUSTOMERS, scale, 10)
    n_orders = _n(W4_ORDERS, scale, 20)
    n_changes = _n(W4_CHANGES, scale, 20)
    specs = {
        "customers": TableSpec("customers", (Column("id", "BIGINT"), Column("name", "STRING")), ("id",), "json"),
        "orders": TableSpec("orders", (Column("id", "BIGINT"), Column("customer", "BIGINT"),
                                       Column("amount", "BIGINT")), ("id",), "debezium-json",
                            (("index.by_customer.columns", "customer"),)),
        "enriched": TableSpec("enriched", (Column("order_id", "BIGINT"), Column("customer_id", "BIGINT"),
                                           Column("amount", "BIGINT"), Column("customer_name", "STRING")),
                              ("order_id", "customer_id"), "upsert-json"),
    }
    wc = _Writer(out / "customers.jsonl", "json")
    cname = {}
    for c in range(1, n_customers + 1):
        cname[c] = f"customer-{c}"
        wc.insert({"id": c, "name": cname[c]})
    wc.close()
    wo = _Writer(out / "orders.jsonl", "debezium-json")
    live: dict[int, dict] = {}
    for o in range(1, n_orders + 1):
        live[o] = {"id": o, "customer": rng.randint(1, n_customers), "amount": rng.randint(1, 1000)}
        wo.insert(live[o])
    next_id = n_orders + 1
    for _ in range(n_changes):
        r = rng.random()
        if r < 0.1 or not live:
            live[next_id] = {"id": next_id, "customer": rng.randint(1, n_customers), "amount": rng.randint(1, 1000)}
            wo.insert(live[next_id])
            next_id += 1
            continue
        o = rng.choice(list(live)) if len(live) < 64 else _pick(rng, live, next_id)
        before = live[o]
        if r < 0.2:
            wo.delete(live.pop(o))
        elif r < 0.5:  # move to another customer
            after = {**before, "customer": rng.randint(1, n_customers)}
            wo.update(before, after)
            live[o] = after
        else:
            after = {**before, "amount": rng.randint(1, 1000)}
            wo.update(before, after)
            live[o] = after
    wo.close()
    expected = {(o["id"], o["customer"]): (o["id"], o["customer"], o["amount"], cname[o["customer"]])
                for o in live.values()}
    # Tidemark's regular join keeps no upsert key, so it needs a materializer and a clause;
    # every variant (and Flink) gets the same one, so all run the same query
    select = ("SELECT o.id, o.customer, o.amount, c.name FROM orders o JOIN customers c ON o.customer = c.id "
              "ON CONFLICT DO DEDUPLICATE")
    sources = ["customers", "orders"]
    variants = {
        "delta": _tidemark_sql(specs, sources, "enriched", select, {DELTA_STRATEGY_OPTION: "FORCE"}),
        "regular": _tidemark_sql(specs, sources, "enriched", select, {DELTA_STRATEGY_OPTION: "NONE"}),
    }
    return Workload(
        name="W4", tables={t: out / f"{t}.jsonl" for t in sources},
        formats={t: specs[t].format for t in sources}, input_rows=wc.lines + wo.lines, sink="enriched",
        sink_columns=specs["enriched"].column_names, sink_pk=["order_id", "customer_id"], expected=expected,
        strategy="DEDUPLICATE", tidemark_variants=variants, flink_variants={"default": {}}, select=select, specs=specs,
        params={"customers": n_customers, "orders_records": wo.lines},
    )


def _pick(rng: random.Random, live: dict[int, dict], next_id: int) -> int:
    """A random live order id without materializing the key list each time."""
    while True:
        o = rng.randint(1, next_id - 1)
        if o in live:
            return o


# ------------------------------------------------------------------------------------ API

def generate(name: str, scale: float, seed: int, out_dir: Path) -> Workload:
    """Write workload ``name`` at ``scale`` into ``out_dir`` (created) and describe it. Same
    (name, scale, seed) -> byte-identical files."""
    if name not in NAMES:
        raise ValueError(f"unknown workload {name!r} (expected one of {', '.join(NAMES)})")
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(f"{name}:{seed}")
    if name == "W1":
        return _w1(scale, rng, out)
    if name.startswith("W2-"):
        return _w2(name[3:], scale, random.Random(f"W2:{seed}"), out)
    if name == "W3":
        return _w3(scale, rng, out)
    return _w4(scale, rng, out)


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", default=list(NAMES))
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("/tmp/tidemark-bench-workloads"))
    a = ap.parse_args()
    for n in a.names:
        wl = generate(n, a.scale, a.seed, a.out / n)
        print(f"{n}: {wl.input_rows} records, final table {len(wl.expected)} rows, {wl.params}")


if __name__ == "__main__":
    main()
