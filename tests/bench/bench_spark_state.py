"""Spark state hosting: which keyed stateful operator should host a Tidemark KeyedStage?

Runs toy keyed stages through ``tidemark.spark.keyed`` on each candidate operator and
prints rows/s per (operator, stage, workload shape), plus the cost of the row codec.
Not a test: numbers depend on the machine. Results go to docs/benchmarks.md
("Spark state hosting").

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python tests/bench/bench_spark_state.py \
        [--rows 20000] [--batches 3] [--operators applyInPandasWithState,transformWithStateInPandas]

Each configuration is a fresh streaming query over a parquet directory: one warm-up batch
(JIT, worker start, state store creation), then ``--batches`` timed batches of ``--rows``
change rows each. Time per batch = wall time of ``processAllAvailable`` after the batch's
file appears (source listing + shuffle + stage + state commit + a no-op sink).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import statistics
import sys
import tempfile
import time

import pyarrow as pa
import pyarrow.parquet as pq

from tidemark.engine.changelog import Change, zset
from tidemark.spark import keyed as K
from tidemark.spark.session import build_session

PARQUET_SCHEMA = pa.schema([("bucket", pa.int32()), ("input", pa.int32()), ("batch", pa.binary())])


class CountStage:
    """State = an int per key; emits the count's -U/+U: the cheapest possible stage."""

    name = "count"
    n_inputs = 1

    def key_of(self, change: Change, input_index: int) -> tuple:
        return (change.row[0],)

    def process_key(self, key, inputs, state, ctx):
        old = state or 0
        new = old + sum(c.weight for c in inputs[0])
        out = [] if old == new else [Change("+U", (key[0], new), ())]
        return new, out


class MaterializerLike:
    """State = active rows per upsert key for one PK (a dict, as the real materializer
    keeps); emits the net change of the latest active row."""

    name = "materializer_like"
    n_inputs = 1

    def key_of(self, change: Change, input_index: int) -> tuple:
        return (change.row[0],)

    def process_key(self, key, inputs, state, ctx):
        active: dict = dict(state or {})
        before = max(active.values(), key=lambda rp: rp[1])[0] if active else None
        poses = {c.row: c.pos for c in inputs[0]}
        for row, w in zset(inputs[0]).items():
            uk = row[1]
            if w > 0:
                active[uk] = (row, poses[row])
            else:
                active.pop(uk, None)
        after = max(active.values(), key=lambda rp: rp[1])[0] if active else None
        ctx.metrics["keys"] += 1
        if before == after:
            return (active or None), []
        if before is None:
            return active, [Change("+I", after, ())]
        if after is None:
            return None, [Change("-D", before, ())]
        return active, [Change("-U", before, ()), Change("+U", after, ())]


def workload(shape: str, rows: int, batch: int) -> list[Change]:
    """``one_key``: every row hits one key (a hot key; 100 upsert keys under it).
    ``many_keys``: every row its own key (the same keys each batch, so state is read
    back). ``ten_per_key``: rows/10 keys, 10 rows each."""
    base = batch * rows
    if shape == "one_key":
        return [Change("+I", (0, i % 100, base + i), (base + i,)) for i in range(rows)]
    if shape == "many_keys":
        return [Change("+I", (i, batch, base + i), (base + i,)) for i in range(rows)]
    if shape == "ten_per_key":
        return [Change("+I", (i // 10, i % 10, base + i), (base + i,)) for i in range(rows)]
    raise ValueError(shape)


def write_batch(directory: str, index: int, changes: list[Change]) -> None:
    table = pa.table({"bucket": [0], "input": [0], "batch": [K.encode_changes(changes)]}, schema=PARQUET_SCHEMA)
    tmp = os.path.join(directory, f".b{index:05d}.tmp")
    pq.write_table(table, tmp)
    os.rename(tmp, os.path.join(directory, f"b{index:05d}.parquet"))


def run_config(spark, operator: str, stage, shape: str, rows: int, batches: int) -> dict:
    work = tempfile.mkdtemp(prefix="tm-bench-")
    src_dir = os.path.join(work, "in")
    os.makedirs(src_dir)
    try:
        metrics = K.StageMetrics(spark)
        src = spark.readStream.schema(K.BLOB_SCHEMA).option("maxFilesPerTrigger", 1)
        keyed_df = K.keyed_input(src.parquet(src_dir), stage)
        out = K.run_keyed_stage([keyed_df], stage, metrics=metrics, operator=operator)
        query = (
            out.writeStream.format("noop")
            .option("checkpointLocation", os.path.join(work, "ck"))
            .start()
        )
        times = []
        try:
            for b in range(batches + 1):
                write_batch(src_dir, b, workload(shape, rows, b))
                t0 = time.perf_counter()
                K.process_all_available(query)
                if b > 0:
                    times.append(time.perf_counter() - t0)
            state_rows = K.state_rows_total(query)
        finally:
            query.stop()
        med = statistics.median(times)
        return {
            "operator": operator, "stage": stage.name, "shape": shape, "rows": rows,
            "batch_s": [round(t, 2) for t in times], "rows_per_s": round(rows / med),
            "state_rows": state_rows,
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def codec_costs(n: int = 50_000) -> dict:
    """Encode+decode cost per row of the payload codecs considered (pure Python)."""
    rows = [(i, f"name-{i}", i * 1.5, None, "x" * 20) for i in range(n)]
    out = {}
    for name, enc, dec in (
        ("pickle", lambda r: pickle.dumps(r, pickle.HIGHEST_PROTOCOL), pickle.loads),
        ("json", lambda r: json.dumps(r).encode(), lambda b: tuple(json.loads(b))),
    ):
        t0 = time.perf_counter()
        blobs = [enc(r) for r in rows]
        back = [dec(b) for b in blobs]
        dt = time.perf_counter() - t0
        assert back == rows
        out[name] = {"us_per_row": round(dt / n * 1e6, 2),
                     "bytes_per_row": round(sum(map(len, blobs)) / n, 1)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument(
        "--operators",
        default=",".join(K.OPERATORS),
    )
    ap.add_argument("--shapes", default="one_key,many_keys,ten_per_key")
    ap.add_argument("--stages", default="count,materializer_like")
    args = ap.parse_args(argv)

    print(json.dumps({"codec": codec_costs()}), flush=True)
    spark = build_session(app_name="bench-spark-state", shuffle_partitions=2)
    stages = {"count": CountStage(), "materializer_like": MaterializerLike()}
    results = []
    for stage_name in args.stages.split(","):
        for shape in args.shapes.split(","):
            for operator in args.operators.split(","):
                r = run_config(spark, operator, stages[stage_name], shape, args.rows, args.batches)
                results.append(r)
                print(json.dumps(r), flush=True)
    print("\n| stage | shape | " + " | ".join(args.operators.split(",")) + " |")
    print("|---|---|" + "---|" * len(args.operators.split(",")))
    for stage_name in args.stages.split(","):
        for shape in args.shapes.split(","):
            cells = [
                f"{r['rows_per_s']:,}"
                for op in args.operators.split(",")
                for r in results
                if r["stage"] == stage_name and r["shape"] == shape and r["operator"] == op
            ]
            print(f"| {stage_name} | {shape} | " + " | ".join(cells) + " |")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
