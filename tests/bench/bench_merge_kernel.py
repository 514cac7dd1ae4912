"""Micro-benchmark: the merge engine batch kernel against the per-key path, per state bucket (not a test).

What the Spark host does for one state bucket of one batch of a merge engine sink: decode the
bucket's stored state (``state_codec``), run the stage on the bucket's Arrow batch, encode the
new state. By ``MergeKernel`` and by ``PerKeyAdapter`` around the same stage, alternately,
medians of ``--repeats`` runs each, for buckets of several sizes. The records are upserts of a
stored key or a new one, a tenth of them deletes, into a table of five columns; the engines
and producers are those the kernel computes (``sequence.field`` on a random column, so that
records arrive out of sequence and deletes leave tombstones; ``aggregation`` with a function
of each kind, the deletes retractions; ``listagg``, plain and ``distinct``; the ``full-compaction`` producer, whose
default interval makes every batch a barrier).

Run:  .venv/bin/python tests/bench/bench_merge_kernel.py [--repeats 5]
"""

from __future__ import annotations

import random

from kernel_bench import parse_args, per_key_and_kernel

from tidemark.engine.changelog import Change
from tidemark.engine.kernels.merge import MergeKernel, schema_of
from tidemark.engine.stages.merge_engine import build_merge_engine
from tidemark.engine.types import parse_type

NAMES = ["id", "level", "name", "qty", "ts"]
TYPES = [parse_type(t) for t in ("BIGINT", "INT", "STRING", "BIGINT", "BIGINT")]
#: (stored keys in the bucket, changes in the bucket's batch)
SHAPES = ((80, 250), (500, 1_000), (2_000, 2_000), (5_000, 5_000), (20_000, 60_000))
CONFIGS = (
    ("deduplicate", {"changelog-producer": "lookup"}, True),
    ("deduplicate", {"changelog-producer": "none", "ignore-delete": "true"}, True),
    ("deduplicate", {"changelog-producer": "lookup", "sequence.field": "level"}, True),
    ("partial-update", {"changelog-producer": "lookup", "partial-update.remove-record-on-delete": "true"}, True),
    ("first-row", {"changelog-producer": "lookup", "ignore-delete": "true"}, False),
    ("partial-update", {"changelog-producer": "lookup", "fields.level.sequence-group": "name", "ignore-delete": "true"}, True),
    ("partial-update", {"changelog-producer": "lookup", "fields.level.sequence-group": "name,qty", "ignore-delete": "true",
                        "fields.qty.aggregate-function": "sum"}, True),
    ("aggregation", {"changelog-producer": "lookup", "fields.qty.aggregate-function": "sum",
                     "fields.level.aggregate-function": "max", "fields.level.ignore-retract": "true",
                     "fields.name.aggregate-function": "last_non_null_value", "fields.ts.aggregate-function": "count"}, True),
    ("aggregation", {"changelog-producer": "lookup", "ignore-delete": "true", "fields.name.aggregate-function": "listagg",
                     "fields.level.aggregate-function": "min"}, True),
    ("aggregation", {"changelog-producer": "lookup", "ignore-delete": "true", "fields.name.aggregate-function": "listagg",
                     "fields.name.distinct": "true", "fields.level.aggregate-function": "min"}, True),
    ("deduplicate", {"changelog-producer": "full-compaction"}, True),
)


def workload(stored: int, n_changes: int, seed: int) -> tuple[list[Change], list[Change]]:
    """(records that fill the state, the measured batch)."""
    rng = random.Random(seed)
    row = lambda i, t: (i, rng.randrange(1_000), f"name-{i}", rng.randrange(10_000), t)  # noqa: E731
    warm = [Change("+I", row(i, 0), (0, i)) for i in range(stored)]
    batch = []
    for t in range(1, n_changes + 1):
        i = rng.randrange(stored + stored // 4 + 1)
        batch.append(Change("-D", row(i, t), (1, t)) if rng.random() < 0.1 else Change("+I", row(i, t), (1, t)))
    return warm, batch


def main() -> None:
    args = parse_args(__doc__)
    print(f"per state bucket: decode state, process the batch, encode state; medians of {args.repeats}")
    print(f"{'engine, options':<50} {'stored':>7} {'changes':>8} {'per-key ms':>11} {'kernel ms':>10} {'speedup':>8}")
    for engine, options, retracts in CONFIGS:
        stage = build_merge_engine("t", NAMES, (0,), {"merge-engine": engine, **options}, retracts, types=TYPES)
        kernel = MergeKernel(stage)
        schema = schema_of(stage)
        label = f"{engine} {', '.join(f'{k}={v}' for k, v in options.items())}"
        label = label.replace("fields.", "").replace(".aggregate-function", "")
        for n_stored, n_changes in SHAPES:
            warm, changes = workload(n_stored, n_changes, args.seed)
            pk_s, k_s = per_key_and_kernel(stage, kernel, schema, warm, changes, args.repeats)
            print(f"{label:<50} {n_stored:>7} {n_changes:>8} {pk_s * 1e3:>11.2f} {k_s * 1e3:>10.2f} {pk_s / k_s:>7.2f}x")


if __name__ == "__main__":
    main()
