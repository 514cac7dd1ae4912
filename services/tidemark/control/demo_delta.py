"""The delta-join half of ``make demo``: orders x customers with no join state.

Registered next to the seed's s1/s2 join on the same control service: the registration
answer shows the tables the service registered in its embedded index service; the CDC data
(customers append-only, orders as Debezium events: inserts, an order moving to another
customer, a deleted order) is produced before the job starts, and the job runs while the
s1/s2 part does, so it adds little to the demo's time. At the end the demo waits for its
sink table, produces one more order (a later batch that looks its customer up again), waits
for it, prints the table and the delta join's figures: the job's LRU cache hits and index
lookups (from its status), and what the index service answered (from its ``/metrics``),
then stops it.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

PIPELINE = "orders-enriched"

SQL = """\
SET 'table.optimizer.delta-join.strategy' = 'FORCE';
-- orders: a Debezium stream (orders move between customers, get deleted); customers: append-only
CREATE TABLE orders (id BIGINT, customer BIGINT, amount BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('topic' = '{orders}', 'format' = 'debezium-json', 'index.by_customer.columns' = 'customer');
CREATE TABLE customers (id BIGINT, name STRING, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('topic' = '{customers}', 'format' = 'json');
CREATE TABLE enriched (order_id BIGINT, customer_id BIGINT, name STRING, amount BIGINT,
  PRIMARY KEY (order_id, customer_id) NOT ENFORCED) WITH ('topic' = '{enriched}', 'format' = 'upsert-json');
INSERT INTO enriched SELECT o.id, c.id, c.name, o.amount FROM orders o JOIN customers c ON o.customer = c.id;
"""

CUSTOMERS = [(1, "alice"), (2, "bob")]
# (op, before, after) as (id, customer, amount)
ORDERS = [
    ("c", None, (10, 1, 100)),
    ("c", None, (11, 2, 250)),
    ("c", None, (12, 1, 75)),
    ("u", (12, 1, 75), (12, 2, 75)),  # order 12 moves from alice to bob
    ("d", (11, 2, 250), None),  # order 11 is deleted
]
EXPECTED = {(10, 1): ("alice", 100), (12, 2): ("bob", 75)}
# produced once the first batch is in the sink: a later batch looks bob up again (served by
# the job's cache when the batch runs where the previous one did; the counters tell)
LATE_ORDER = ("c", None, (13, 2, 30))
EXPECTED_FINAL = {**EXPECTED, (13, 2): ("bob", 30)}


def supported() -> bool:
    """``tidemark run`` takes ``--index-url`` (the Spark wiring of the delta join)."""
    import typer.main

    from tidemark.cli.main import app

    run = typer.main.get_command(app).commands.get("run")
    return run is not None and any("--index-url" in p.opts for p in run.params)


def topics(run: str) -> dict[str, str]:
    return {"orders": f"demo-{run}-orders", "customers": f"demo-{run}-customers", "enriched": f"demo-{run}-enriched"}


def records(t: dict[str, str], late: bool = False) -> list[tuple[str, int, bytes | None, bytes | None]]:
    """The first batch's records, or (``late``) the late order's."""
    def row(r: tuple | None) -> dict | None:
        return None if r is None else {"id": r[0], "customer": r[1], "amount": r[2]}

    out: list[tuple[str, int, bytes | None, bytes | None]] = [] if late else [
        (t["customers"], 0, None, json.dumps({"id": i, "name": n}).encode()) for i, n in CUSTOMERS]
    for op, before, after in [LATE_ORDER] if late else ORDERS:
        key = json.dumps({"id": (after or before)[0]}).encode()
        out.append((t["orders"], 0, key, json.dumps({"op": op, "before": row(before), "after": row(after)}).encode()))
    return out


def register(client: httpx.Client, url: str, t: dict[str, str], say: Any) -> str | None:
    """Register the pipeline; the index service's URL, or None (after saying why)."""
    say(f"\n$ curl -X POST {url}/v1/pipelines -d '{{\"name\": \"{PIPELINE}\", \"sql\": ...}}'"
        "     # a delta join: no join state")
    # the first delta-join pipeline starts the embedded index service: give it time
    r = client.post("/v1/pipelines", json={"name": PIPELINE, "sql": SQL.format(**t)}, timeout=120)
    if r.status_code != 201:
        say(f"{r.status_code} {r.text}")
        return None
    body = r.json()
    join = next(s for s in body["plan"]["stages"] if s["kind"] == "join")
    say(f"201 registered {PIPELINE}: {join['detail']['strategy_reason']}")
    ix = body["indexes"]
    say(f"    indexes: tables {', '.join(ix['tables'])} registered with the "
        f"{'embedded ' if ix['embedded'] else ''}index service at {ix['url']}")
    return ix["url"]


def produce(bootstrap: str, t: dict[str, str], say: Any) -> None:
    from tidemark.cli.demo import produce_records

    say(f"\nproducing {len(CUSTOMERS) + len(ORDERS)} records for {PIPELINE}:")
    say("  customers: " + ", ".join(f"+I({i}, '{n}')" for i, n in CUSTOMERS))
    say("  orders: " + ", ".join(f"{op}({(a or b)[0]}{'' if a is None else f', customer {a[1]}'})"
                                 for op, b, a in ORDERS))
    produce_records(bootstrap, records(t))


def done(status: dict[str, Any], bootstrap: str, t: dict[str, str], late: bool = False) -> bool:
    """The sink at the expected table, which only every record together gives (raises if the
    job failed)."""
    if status["state"] == "failed":
        raise RuntimeError(f"{PIPELINE} failed: {status['error']}")
    return sink_table(bootstrap, t["enriched"]) == (EXPECTED_FINAL if late else EXPECTED)


def produce_late(bootstrap: str, t: dict[str, str], say: Any) -> None:
    from tidemark.cli.demo import produce_records

    op, _before, (i, customer, amount) = LATE_ORDER
    say(f"\n{PIPELINE}'s first batch is in its sink; one more order for bob: {op}({i}, customer {customer}, "
        f"amount {amount})")
    produce_records(bootstrap, records(t, late=True))


def sink_table(bootstrap: str, topic: str) -> dict[tuple[int, int], tuple]:
    from tidemark.kafka.read import read_topic

    table: dict[tuple[int, int], tuple] = {}
    for r in read_topic(bootstrap, topic):
        key = json.loads(r.key)
        k = (key["order_id"], key["customer_id"])
        if r.value is None:
            table.pop(k, None)
        else:
            v = json.loads(r.value)
            table[k] = (v["name"], v["amount"])
    return table


def index_figures(index_url: str) -> dict[str, float]:
    """Lookup requests and keys the index service answered, per table (its /metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    text = httpx.get(index_url + "/metrics", timeout=10).text
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "tidemark_index_lookups_total" and s.labels.get("outcome") == "ok":
                out[f"{s.labels['table']} lookup requests"] = s.value
            elif s.name == "tidemark_index_lookup_keys_total":
                out[f"{s.labels['table']} keys looked up"] = s.value
            elif s.name == "tidemark_index_rows":
                out[f"{s.labels['table']} rows indexed"] = s.value
    return out


def report(status: dict[str, Any], bootstrap: str, t: dict[str, str], index_url: str, say: Any) -> bool:
    """Print the sink table and the delta join's figures; True when the table is right."""
    from tidemark.cli.demo import table_text

    table = sink_table(bootstrap, t["enriched"])
    say(f"\nsink table enriched of {PIPELINE} (state {status['state']}, rows in {status['rows_in']}, "
        f"rows out {status['rows_out']}):")
    say(table_text(["order_id", "customer_id", "name", "amount"], [(*k, *table[k]) for k in sorted(table)]))
    cache = {k: v for k, v in (status.get("metrics") or {}).items() if "delta_join" in k}
    say("\ndelta join, in the job (LRU caches in front of the index service; no join state):")
    if cache:
        for name, value in cache.items():
            say(f"  {name}: {value}")
    else:
        say("  (the job reported no delta_join counters in its status)")
    say(f"  join state size: {status.get('state_size_bytes')} bytes")
    say("delta join, in the index service:")
    for name, value in index_figures(index_url).items():
        say(f"  {name}: {value:g}")
    if table != EXPECTED_FINAL:
        say(f"\nWRONG: expected {EXPECTED_FINAL}")
        return False
    say("\norder 12 followed its move to bob, the deleted order 11 is gone and the later order 13 joined bob, "
        "with no join state.")
    return True
