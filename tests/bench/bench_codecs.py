"""Records per second of the Kafka codecs, per record (``Decoder``/``Encoder``) against a
batch at a time (``BatchDecoder``/``BatchEncoder``), in one run (a script, not a test).

    .venv/bin/python tests/bench/bench_codecs.py [--records N] [--repeats 5]

Decoding is timed to the row tuples the Spark source pickles (the batch decoder's Arrow
columns converted back), so both sides produce the same output; "to Arrow" is the batch
decoder alone. Two row shapes: W1's (BIGINT, STRING, BIGINT) and one with a DECIMAL and a
TIMESTAMP column, whose values the batch decoder converts one by one. Medians of
``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable

from tidemark.engine.catalog import Column, TableDef
from tidemark.engine.changelog import Change
from tidemark.engine.types import parse_type
from tidemark.formats.batch_decode import BatchDecoder
from tidemark.formats.batch_encode import BatchEncoder
from tidemark.formats.codecs import Decoder, Encoder
from tidemark.formats.errors import DecodeError

SHAPES = {
    "w1": [("id", "BIGINT"), ("name", "STRING"), ("quantity", "BIGINT")],
    "typed": [("id", "BIGINT"), ("name", "STRING"), ("quantity", "BIGINT"), ("price", "DECIMAL(10, 2)"),
              ("ts", "TIMESTAMP(3)")],
}
DECODE_FORMATS = ("json", "debezium-json", "changelog-json", "upsert-json")
ENCODE_FORMATS = ("upsert-json", "changelog-json")


def table(shape: str, fmt: str) -> TableDef:
    return TableDef("t", [Column(n, parse_type(t)) for n, t in SHAPES[shape]], ("id",), {"format": fmt, "topic": "t"})


def row(shape: str, i: int, rng: random.Random) -> dict:
    obj = {"id": i, "name": f"product-{rng.randrange(10**6):06d}", "quantity": rng.randint(1, 9)}
    if shape == "typed":
        obj |= {"price": f"{rng.randrange(10**6) / 100:.2f}", "ts": f"2026-01-0{rng.randint(1, 9)} 12:{rng.randrange(60):02d}:00.125"}
    return obj


def records(shape: str, fmt: str, n: int) -> tuple[list[bytes | None], list[bytes | None]]:
    rng = random.Random(7)
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    for i in range(n):
        obj = row(shape, i, rng)
        if fmt == "debezium-json":
            obj = {"op": "u", "before": {**obj, "quantity": 0}, "after": obj, "source": {"db": "shop"}, "ts_ms": i}
        elif fmt == "changelog-json":
            obj = {"op": "+I", **obj}
        keys.append(json.dumps({"id": i}).encode() if fmt == "upsert-json" else None)
        values.append(json.dumps(obj).encode())
    return keys, values


def median_rates(n: int, runs: list[Callable[[], object]], repeats: int) -> list[float]:
    """Records/s of each run, the runs interleaved so a busy machine slows them alike."""
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(repeats):
        for run, spent in zip(runs, times):
            t = time.perf_counter()
            run()
            spent.append(time.perf_counter() - t)
    return [n / statistics.median(spent) for spent in times]


def decode_per_record(decoder: Decoder, keys: list, values: list) -> list:
    out = []
    for k, v in zip(keys, values):
        try:
            out.extend(c.row for c in decoder.decode(k, v, (), "t"))
        except DecodeError:
            pass
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    n, repeats = args.records, args.repeats
    print(f"records/s, median of {repeats}, {n} records a run")
    print(f"{'shape':6} {'format':15} {'op':7} {'per record':>11} {'batch':>11} {'speed-up':>8} {'to Arrow':>11}")
    for shape in SHAPES:
        for fmt in DECODE_FORMATS:
            t = table(shape, fmt)
            keys, values = records(shape, fmt, n)
            per, batch = Decoder(t), BatchDecoder(t)
            assert decode_per_record(per, keys, values) == batch.decode(keys, values, "t").row_tuples()
            before, after, arrow = median_rates(n, [
                lambda: decode_per_record(per, keys, values),
                lambda: batch.decode(keys, values, "t").row_tuples(),
                lambda: batch.decode(keys, values, "t"),
            ], repeats)
            print(f"{shape:6} {fmt:15} {'decode':7} {before:11,.0f} {after:11,.0f} {after / before:7.1f}x {arrow:11,.0f}")
        rows = decode_per_record(Decoder(table(shape, "json")), *records(shape, "json", n))
        changes = [Change("+U" if i % 10 else "-D", r, (i,)) for i, r in enumerate(rows)]
        for fmt in ENCODE_FORMATS:
            t = table(shape, fmt)
            per, batch = Encoder(t), BatchEncoder(t)
            assert [per.encode(c, "t") for c in changes] == batch.encode(changes, "t")
            before, after = median_rates(n, [lambda: [per.encode(c, "t") for c in changes], lambda: batch.encode(changes, "t")], repeats)
            print(f"{shape:6} {fmt:15} {'encode':7} {before:11,.0f} {after:11,.0f} {after / before:7.1f}x {'':>11}")


if __name__ == "__main__":
    main()
