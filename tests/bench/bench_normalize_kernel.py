"""Micro-benchmark: the normalize batch kernel against the per-key path, per state bucket (not a test).

What the Spark host does for one state bucket of one batch, on the W2 shape (an upsert
source of ids, each record an update of a stored id or a new one, a tenth of them deletes):
decode the bucket's stored state (``state_codec``), run the stage on the bucket's Arrow
batch, encode the new state. By ``NormalizeKernel`` and by ``PerKeyAdapter`` around the same
stage, alternately, medians of ``--repeats`` runs each, for buckets of several sizes: W2's
20,000 ids over the host's 256 buckets hold about 80 ids each.

Run:  .venv/bin/python tests/bench/bench_normalize_kernel.py [--repeats 5]
"""

from __future__ import annotations

import random
from decimal import Decimal

from kernel_bench import parse_args, per_key_and_kernel

from tidemark.engine.changelog import Change
from tidemark.engine.kernels.normalize import NormalizeKernel
from tidemark.engine.batch_columns import row_schema
from tidemark.engine.stages.normalize import Normalize
from tidemark.engine.types import parse_type

COLUMNS = tuple(
    (name, parse_type(t))
    for name, t in (("id", "BIGINT"), ("level", "INT"), ("name", "STRING"), ("price", "DECIMAL(10, 2)"), ("ts", "BIGINT"))
)
#: (stored ids in the bucket, changes in the bucket's batch)
SHAPES = ((80, 250), (80, 1_000), (2_000, 2_000), (20_000, 60_000))


def workload(stored: int, n_changes: int, seed: int) -> tuple[list[Change], list[Change]]:
    """(records that fill the state, the measured batch)."""
    rng = random.Random(seed)
    row = lambda i, t: (i, rng.randrange(1_000), f"name-{i}", Decimal(rng.randrange(10_000)).scaleb(-2), t)  # noqa: E731
    warm = [Change("+I", row(i, 0), (0, i)) for i in range(stored)]
    batch = []
    for t in range(1, n_changes + 1):
        i = rng.randrange(stored + stored // 4 + 1)
        batch.append(Change("-D", row(i, t), (1, t)) if rng.random() < 0.1 else Change("+U", row(i, t), (1, t)))
    return warm, batch


def main() -> None:
    args = parse_args(__doc__)
    stage = Normalize((0,), len(COLUMNS), name="normalize:s", columns=COLUMNS)
    kernel = NormalizeKernel(stage)
    schema = row_schema(stage.columns)
    print(f"per state bucket: decode state, process the batch, encode state; medians of {args.repeats}")
    print(f"{'stored ids':>10} {'changes':>8} {'per-key ms':>11} {'kernel ms':>10} {'speedup':>8}")
    for n_stored, n_changes in SHAPES:
        warm, changes = workload(n_stored, n_changes, args.seed)
        pk_s, k_s = per_key_and_kernel(stage, kernel, schema, warm, changes, args.repeats)
        print(f"{n_stored:>10} {n_changes:>8} {pk_s * 1e3:>11.2f} {k_s * 1e3:>10.2f} {pk_s / k_s:>7.2f}x")


if __name__ == "__main__":
    main()
