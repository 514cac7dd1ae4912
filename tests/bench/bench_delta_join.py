"""Delta join vs regular join on the same workload, and the index service's lookup latency.

    .venv/bin/python tests/bench/bench_delta_join.py [--batches 200] [--per-batch 500]

1. Replay host, one workload (``a`` debezium with inserts/updates/deletes, ``b`` append-
   only, join on ``k``): the regular join, the eventual delta join and the strong delta
   join. Reports join state (rows the host keeps for the join), throughput (source changes
   per second), cache hit rate per side.
2. Index service (uvicorn on loopback, embedded broker, 100k rows): ``POST /v1/lookup``
   latency p50/p99 for batches of 1, 100, 1000 keys, and the wire format: JSON response
   encode+decode vs fastavro for the same 1000 rows.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.unit.delta_workload import sql, workload  # noqa: E402
from tidemark.engine.pipeline import compile_sql  # noqa: E402
from tidemark.engine.replay import ReplayHost  # noqa: E402


def replay_bench(batches: int, per_batch: int, keys: int) -> None:
    wl = workload(1, batches=batches, per_batch=per_batch, keys=keys, b_append=True)
    n_changes = sum(len(b["a"]) + len(b["b"]) for b in wl)
    print(f"workload: {batches} batches, {n_changes} source changes, {keys} join keys")
    print(f"{'join':<22}{'changes/s':>12}{'join state rows':>17}{'left hit':>10}{'right hit':>10}")
    for label, strategy, consistency in (("regular", "NONE", "eventual"), ("delta eventual", "FORCE", "eventual"),
                                         ("delta strong", "FORCE", "strong")):
        p = compile_sql(sql(strategy, consistency, b_format="json", cache_size=1000))
        node = next(n for n in p.nodes if n.kind == "join")
        host = ReplayHost(p)
        t0 = time.perf_counter()
        for b in wl:
            host.run_batch(b, now_ms=0)
        dt = time.perf_counter() - t0
        st = host.state[node.id]
        rows = sum(len(s[0]) + len(s[1]) for s in st.values())
        m = host.metrics

        def rate(side: str) -> str:
            h, mi = m[f"delta_join.{side}.cache_hits"], m[f"delta_join.{side}.cache_misses"]
            return f"{h / (h + mi):.1%}" if h + mi else "-"

        print(f"{label:<22}{n_changes / dt:>12,.0f}{rows:>17,}{rate('left'):>10}{rate('right'):>10}")


def service_bench(rows: int, rounds: int) -> None:
    import uvicorn
    from confluent_kafka import Producer

    from tidemark.engine.pipeline import compile_sql as _c  # noqa: F401
    from tidemark.index.app import IndexService, TableRegistration, create_app
    from tidemark.index_client.http import HttpLookup
    from tidemark.kafka.admin import ensure_topics
    from tidemark.kafka.broker import embedded_broker, free_port

    ddl = ("CREATE TABLE b (id BIGINT, k BIGINT, w STRING, PRIMARY KEY (id) NOT ENFORCED) "
           "WITH ('topic' = 'bench-b', 'format' = 'upsert-json', 'index.by_k.columns' = 'k')")
    with embedded_broker() as bootstrap:
        ensure_topics(bootstrap, {"bench-b": 2})
        prod = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
        for i in range(rows):
            prod.produce("bench-b", key=json.dumps({"id": i}).encode(),
                         value=json.dumps({"id": i, "k": i % (rows // 2), "w": f"w{i}"}).encode())
        prod.flush(60)
        service = IndexService(bootstrap)
        service.register(TableRegistration(ddl=ddl))
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(create_app(service, None), host="127.0.0.1", port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        feed = service.feeds["b"]
        while not feed.ready:
            time.sleep(0.1)
        from tidemark.engine.sql import _table_def, parse_statements

        table = _table_def(parse_statements(ddl)[0])
        lookup = HttpLookup(f"http://127.0.0.1:{port}", {"b": table})
        print(f"\nindex service: {rows:,} rows, lookups by index by_k (2 rows per key), {rounds} requests per size")
        print(f"{'keys/request':>12}{'p50 ms':>10}{'p99 ms':>10}{'keys/s':>12}")
        for size in (1, 100, 1000):
            lat = []
            for r in range(rounds):
                keys = [((r * size + j) % (rows // 2),) for j in range(size)]
                t0 = time.perf_counter()
                got = lookup("b", "by_k", keys, min_offsets=dict(feed.index.applied))
                lat.append(time.perf_counter() - t0)
                assert all(len(g) == 2 for g in got)
            lat.sort()
            p50, p99 = statistics.median(lat), lat[int(len(lat) * 0.99) - 1]
            print(f"{size:>12}{p50 * 1000:>10.2f}{p99 * 1000:>10.2f}{size / p50:>12,.0f}")
        wire_bench(feed.index.lookup("by_k", [(k,) for k in range(1000)]), table)
        server.should_exit = True
        thread.join(10)
        service.close()


def wire_bench(found: list, table) -> None:
    """Encode+decode of one 1000-key response (2000 rows): JSON vs fastavro."""
    import fastavro

    schema = fastavro.parse_schema({
        "type": "record", "name": "LookupResponse", "fields": [{"name": "rows", "type": {"type": "array", "items": {
            "type": "array", "items": {"type": "record", "name": "Row", "fields": [
                {"name": c.name, "type": ["null", "long" if c.type.name == "BIGINT" else "string"]}
                for c in table.columns]}}}}]})  # fmt: skip
    names = table.column_names
    payload = [[list(r) for r, _ in per_key] for per_key in found]
    avro_payload = {"rows": [[dict(zip(names, r)) for r in per_key] for per_key in payload]}
    n = 50
    t0 = time.perf_counter()
    for _ in range(n):
        data = json.dumps({"rows": payload}).encode()
        json.loads(data)
    t_json = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for _ in range(n):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, schema, avro_payload)
        buf.seek(0)
        fastavro.schemaless_reader(buf, schema)
    t_avro = (time.perf_counter() - t0) / n
    print(f"\nwire, 1000 keys / 2000 rows: JSON {len(data):,} B {t_json * 1000:.2f} ms encode+decode; "
          f"fastavro {len(buf.getvalue()):,} B {t_avro * 1000:.2f} ms encode+decode")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--per-batch", type=int, default=500)
    ap.add_argument("--keys", type=int, default=2000)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--skip-service", action="store_true")
    args = ap.parse_args()
    replay_bench(args.batches, args.per_batch, args.keys)
    if not args.skip_service:
        service_bench(args.rows, args.rounds)


if __name__ == "__main__":
    main()
