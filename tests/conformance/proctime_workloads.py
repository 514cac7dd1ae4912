"""Random workloads for deduplication and Top-N by processing time (``ROW_NUMBER() OVER
(PARTITION BY auction ORDER BY p)``, ``p AS PROCTIME()``): append-only bids, and changelogs of
bids keyed by ``id``. Shared by the conformance test against Flink 2.3 and the Spark
integration test."""

from __future__ import annotations

import random

import generate

BATCHES = 5

SINKS = {
    "firsts": "CREATE TABLE firsts (auction BIGINT, price BIGINT, PRIMARY KEY (auction) NOT ENFORCED) "
              "WITH ('topic' = 'firsts', 'format' = 'upsert-json');",
    "top3": "CREATE TABLE top3 (auction BIGINT, rn BIGINT, price BIGINT, PRIMARY KEY (auction, rn) NOT ENFORCED) "
            "WITH ('topic' = 'top3', 'format' = 'upsert-json');",
}
QUERIES = {  # shape -> (sink, query over the source table {src})
    "keep_first": ("firsts", "SELECT auction, price FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY auction "
                             "ORDER BY p) AS rn FROM {src}) WHERE rn = 1"),
    "keep_last": ("firsts", "SELECT auction, price FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY auction "
                            "ORDER BY p DESC) AS rn FROM {src}) WHERE rn = 1"),
    "first_3": ("top3", "SELECT auction, rn, price FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY auction "
                        "ORDER BY p ASC) AS rn FROM {src}) WHERE rn <= 3"),
}


def append_workload(seed: int, shape: str) -> generate.Workload:
    """Bids arriving in ``BATCHES`` batches, few auctions so partitions see many rows."""
    rng = random.Random(f"proctime-dedup-{seed}")
    seq, batches = 0, []
    for _ in range(BATCHES):
        batch = []
        for _ in range(rng.randint(0, 12)):
            seq += 1
            batch.append({"kind": "+I", "row": {"auction": rng.randint(1, 4), "price": rng.randint(1, 50)}, "seq": seq})
        batches.append(batch)
    sink, query = QUERIES[shape]
    sql = ("CREATE TABLE bid (auction BIGINT, price BIGINT, p AS PROCTIME()) WITH ('topic' = 'bid', 'format' = 'json');\n"
           f"{SINKS[sink]}\nINSERT INTO {sink} {query.format(src='bid')};")
    return generate.Workload(f"proctime-{shape}-s{seed}", shape, "-", seed, sql, {"bid": batches}, conflicts="none")


def changelog_workload(seed: int, shape: str, fmt: str) -> generate.Workload:
    """Bids keyed by ``id``: inserts, updates (which may move a bid to another auction) and
    deletes, in ``fmt`` (``debezium-json`` with before-images, ``upsert-json`` without)."""
    rng = random.Random(f"proctime-dedup-cdc-{seed}-{fmt}")
    seq, live, next_id, batches = 0, {}, 1, []
    for _ in range(BATCHES):
        batch = []
        for _ in range(rng.randint(0, 10)):
            op = rng.random() if live else 0.0
            new = {"auction": rng.randint(1, 3), "price": rng.randint(1, 50)}
            if op < 0.5:
                key, kinds = next_id, [("+I", new)]
                next_id += 1
            else:
                key = rng.choice(sorted(live))
                old = live[key]
                if op < 0.8:
                    kinds = ([("-U", old)] if fmt == "debezium-json" else []) + [("+U", new)]
                else:
                    kinds, new = [("-D", old)], None
            for kind, row in kinds:
                seq += 1
                batch.append({"kind": kind, "row": {"id": key, **row}, "seq": seq})
            if new is None:
                del live[key]
            else:
                live[key] = new
        batches.append(batch)
    sink, query = QUERIES[shape]
    sql = ("CREATE TABLE bids (id BIGINT, auction BIGINT, price BIGINT, p AS PROCTIME(), PRIMARY KEY (id) NOT ENFORCED) "
           f"WITH ('topic' = 'bids', 'format' = '{fmt}');\n{SINKS[sink]}\nINSERT INTO {sink} {query.format(src='bids')};")
    name = f"proctime-{shape}-{fmt.split('-')[0]}-s{seed}"
    return generate.Workload(name, shape, "-", seed, sql, {"bids": batches}, conflicts="none")
