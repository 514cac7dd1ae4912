"""Micro-benchmark: the materializer on the stored table against its per-PK step (not a test).

One bucket of W2's sink (``id BIGINT, level BIGINT, attr STRING``, PK ``id``, no upsert key)
holding ``--changes / 2`` PKs, and one typed Arrow batch of ``--changes`` changes against it:
mostly a PK's row moving to another level (``-U``/``+U``), some deletes and new PKs. Each call
is what the Spark host does per bucket: decode the stored state, ``process_batch``, encode
the state. ``MaterializerKernel`` with its columnar path (``kernels.deduplicate``,
``kernels.current_row``) and with that path off (the per-PK step), alternately, medians of
``--repeats`` runs each, for DO DEDUPLICATE and DO NOTHING.

Run:  .venv/bin/python tests/bench/bench_materializer_columnar.py [--changes 40000] [--repeats 5]
"""

from __future__ import annotations

import random
from collections import Counter

import pyarrow as pa

from kernel_bench import alternating_medians, parse_args

from tidemark.engine import state_codec
from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change
from tidemark.engine.kernels.materializer import MaterializerKernel
from tidemark.engine.stage import BatchContext
from tidemark.engine.stages.materializer import SinkMaterializer
from tidemark.engine.types import BIGINT, STRING

COLUMNS = (("id", BIGINT), ("level", BIGINT), ("attr", STRING))
SCHEMA = pa.schema([("id", pa.int64()), ("level", pa.int64()), ("attr", pa.string())])


def workload(n_changes: int, seed: int) -> tuple[list[Change], list[Change]]:
    """(the changes that fill the bucket, the measured batch)."""
    rng = random.Random(seed)
    n_keys = n_changes // 2
    rows = {pk: (pk, rng.randint(1, 1000), f"a{pk % 997}") for pk in range(n_keys)}
    warm = [Change("+I", row, (0, pk)) for pk, row in rows.items()]
    batch: list[Change] = []
    pos = 0
    while len(batch) < n_changes:
        pos += 1
        pk = rng.randrange(n_keys + n_keys // 10)
        old = rows.get(pk)
        if old is None:
            rows[pk] = new = (pk, rng.randint(1, 1000), f"a{pk % 997}")
            batch.append(Change("+I", new, (1, pos)))
        elif rng.random() < 0.1:
            del rows[pk]
            batch.append(Change("-D", old, (1, pos)))
        else:
            rows[pk] = new = (pk, rng.randint(1, 1000), old[2])
            batch += [Change("-U", old, (1, pos)), Change("+U", new, (1, pos))]
    return warm, batch


def main() -> None:
    args = parse_args(__doc__)
    warm, changes = workload(args.changes, args.seed)
    table = ChangeBatch.from_changes(changes, SCHEMA).table()
    print(f"{len(changes)} changes against {len(warm)} stored PKs, medians of {args.repeats}")
    for strategy in ("DEDUPLICATE", "NOTHING"):
        stage = SinkMaterializer("t", (0,), ("id",), None, strategy, columns=COLUMNS)
        columnar, per_pk = MaterializerKernel(stage), MaterializerKernel(stage)
        per_pk._columnar.names = []  # the columnar path off: the per-PK step
        warm_bucket, _ = per_pk.process_batch([ChangeBatch.from_changes(warm, SCHEMA)], stage.empty_state(),
                                              BatchContext(metrics=Counter()))  # fmt: skip
        stored = state_codec.encode_state(stage, warm_bucket)
        a, b = alternating_medians(per_pk, columnar, stage, stored, lambda: ChangeBatch.from_table(table), args.repeats)
        print(f"{strategy:<12} per-PK step {a * 1e3:7.1f} ms, columnar {b * 1e3:7.1f} ms: {a / b:.2f}x")


if __name__ == "__main__":
    main()
