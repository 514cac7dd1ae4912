"""Micro-benchmark: how long a source's end-of-partition probe takes on a partition that is
being written (not a test).

``tidemark.kafka.admin.stable_end_offsets`` is what each Kafka source's ``latestOffset`` calls
at the start of every micro-batch. This writes ``--rate`` records a second into one partition
of the embedded broker (``linger.ms`` 5, as the latency benchmark's producer) and probes it
every 0.5 s, as a running job would, ``--probes`` times, each probe starting from the end
the one before found.

Run:  .venv/bin/python tests/bench/bench_end_probe.py [--rate 10000] [--probes 40]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

from confluent_kafka import Consumer, Producer

from tidemark.kafka.admin import END_PROBE, ensure_topics, stable_end_offsets
from tidemark.kafka.broker import EmbeddedBroker


def write(bootstrap: str, topic: str, rate: float, stop: threading.Event) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "queue.buffering.max.messages": 1_000_000})
    start, n = time.monotonic(), 0
    while not stop.is_set():
        due = int((time.monotonic() - start) * rate)
        for i in range(n, due):
            producer.produce(topic, json.dumps({"id": i, "level": i % 100}).encode(), str(i).encode())
        n = due
        producer.poll(0)
        time.sleep(0.01)
    producer.flush(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=10_000)
    ap.add_argument("--probes", type=int, default=40)
    args = ap.parse_args()
    with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap_servers
        ensure_topics(bootstrap, {"s1": 1})
        stop = threading.Event()
        writer = threading.Thread(target=write, args=(bootstrap, "s1", args.rate, stop))
        writer.start()
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe", "enable.auto.commit": False,
                             "isolation.level": "read_committed", **END_PROBE})
        known: dict = {}
        took = []
        try:
            for _ in range(args.probes):
                time.sleep(0.5)
                t0 = time.perf_counter()
                known = stable_end_offsets(consumer, [("s1", 0)], known, timeout_s=30)
                took.append(time.perf_counter() - t0)
        finally:
            stop.set()
            writer.join()
            consumer.close()
    ms = sorted(t * 1000 for t in took)
    print(f"{args.probes} probes at {args.rate:,.0f} records/s: median {statistics.median(ms):.1f} ms, "
          f"max {ms[-1]:.1f} ms, end {known[('s1', 0)]:,}")


if __name__ == "__main__":
    main()
