"""Bytes a key of the sink materializer's stored state on the W2 shape: the pickled bucket
format (before typed state), the typed table as an Arrow IPC stream (zstd), and the same
table as ``state_codec`` stores it (Parquet with delta encodings, zstd).

W2's final sink table at scale 4: 72,604 of 80,000 ids, rows (id, level, attr), levels
1..4,000, positions (batch, source, partition, offset), upsert key (id, level), 16 state
buckets (the default). Run: ``.venv/bin/python tests/bench/bench_state_bytes.py``.
"""

from __future__ import annotations

import pickle
import random

import pyarrow as pa

from tidemark.engine import state_codec
from tidemark.engine.driver import Bucket
from tidemark.engine.stages.materializer import ActiveRows, CurrentRow, SinkMaterializer
from tidemark.engine.types import parse_type
from tidemark.engine.bucketing import bucket_of_key

BUCKETS = 16
COLUMNS = tuple(zip(("id", "level", "attr"), (parse_type("BIGINT"), parse_type("BIGINT"), parse_type("STRING"))))
NOW_MS = 1_795_000_000_000


def main() -> None:
    rng = random.Random(1)
    ids = rng.sample(range(1, 80_001), 72_604)
    for strategy in ("NOTHING", "DEDUPLICATE"):
        mat = SinkMaterializer("t1", (0,), ("id",), (0, 1), strategy, columns=COLUMNS)
        typed = [Bucket() for _ in range(BUCKETS)]
        pickled: list[dict] = [{} for _ in range(BUCKETS)]
        for i in ids:
            lv = rng.randint(1, 4_000)
            row = (i, lv, f"a{lv}" + ("'" if rng.random() < 0.1 else ""))
            pos = (rng.randint(0, 4), 1, 0, rng.randint(0, 232_651))
            key_bytes = repr((i,)).encode()  # the pickled format's key bytes
            b = bucket_of_key((i,), BUCKETS)
            ident = mat.identity(row)
            if strategy == "NOTHING":
                typed[b].states[(i,)] = CurrentRow(row, NOW_MS, 0)
                pickled[b][key_bytes] = (row, pos, NOW_MS, 0)  # the 4-tuple the pickled format held
            else:
                st = ActiveRows()
                st.add(ident, row, pos, True)
                typed[b].states[(i,)] = st
                # ActiveRows as pickled before: list nodes [row, pos, prev, next, copies]
                pickled[b][key_bytes] = {"nodes": {ident: [row, pos, None, None, None]}, "head": ident,
                                         "tail": ident, "touched_ms": NOW_MS}
        before = sum(len(b"TMPB1\n" + pickle.dumps(p, pickle.HIGHEST_PROTOCOL)) for p in pickled)
        ipc = sum(len(_ipc_bytes(mat.state_to_table(b))) for b in typed)
        stored = sum(len(state_codec.encode_state(mat, b)) for b in typed)
        n = len(ids)
        print(f"{strategy}: {n:,} keys, {BUCKETS} buckets: pickled {before:,} B ({before / n:.1f} B/key), "
              f"Arrow IPC {ipc:,} B ({ipc / n:.1f} B/key), stored (Parquet) {stored:,} B ({stored / n:.1f} B/key)")


def _ipc_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=pa.Codec("zstd", compression_level=3))
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


if __name__ == "__main__":
    main()
