"""Micro-benchmark: the calc's vectorized path against its per-row reference (not a test).

One 60,000-change batch of W2's projection (``SELECT s1.id, s1.level, s2.attr`` over the
join's rows ``s1.id, s1.level, s2.id, s2.attr``; inserts and ``-U``/``+U`` pairs), and the
same batch through the ``functions`` conformance shape's expressions (CONCAT_WS,
SPLIT_INDEX, LPAD, REPLACE, CASE, COALESCE, NULLIF, FLOOR, CEIL, IS DISTINCT FROM, RPAD,
REGEXP_EXTRACT) with a filter. Each calc runs ``process`` (per row) and ``process_batch``
alternately, medians of ``--repeats`` runs; ``process_batch`` is timed on a batch built from
``Change`` tuples (what the replay host passes; Arrow conversion included) and on one built
from Arrow columns (what a columnar source or the previous kernel passes).

Run:  .venv/bin/python tests/bench/bench_calc.py [--changes 60000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

import sqlglot
from sqlglot import exp

from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change
from tidemark.engine.expressions import col_ref, infer_type
from tidemark.engine.sql import Tidemark
from tidemark.engine.stages.calc import Calc
from tidemark.engine.types import make_type

JOIN_ROW = ["s1_id", "s1_level", "s2_id", "s2_attr"]
TYPES = [make_type("BIGINT"), make_type("BIGINT"), make_type("BIGINT"), make_type("STRING")]
W2_PROJECTION = ["s1_id", "s1_level", "s2_attr"]
FUNCTIONS = [
    "s1_id",
    "CONCAT_WS('|', SPLIT_INDEX(s2_attr, ',', 1), LPAD(s2_attr, 4, '*'), REPLACE(s2_attr, 'a', 'A'))",
    "CASE s1_level WHEN -3 THEN 'neg' WHEN 0 THEN 'zero' ELSE UPPER(COALESCE(NULLIF(s2_attr, ''), 'none')) END",
    "FLOOR(s1_level) + CEIL(s1_level)",
    "s1_level IS DISTINCT FROM 0",
    "RPAD(s2_attr, 2, '-')",
    "REGEXP_EXTRACT(s2_attr, '(\\w+),(\\w*)', 2)",
]
FUNCTIONS_FILTER = "s1_level % 7 <> 3 AND s2_attr IS NOT NULL"


def _positional(sql: str) -> exp.Expr:
    tree = sqlglot.parse_one(sql, read=Tidemark)
    return tree.transform(lambda n: col_ref(JOIN_ROW.index(n.name)) if isinstance(n, exp.Column) and n.name in JOIN_ROW else n)


def calc(projections: list[str], predicate: str | None = None) -> Calc:
    exprs = [_positional(p) for p in projections]
    return Calc(exprs, _positional(predicate) if predicate else None, JOIN_ROW, [f"o{i}" for i in range(len(exprs))],
                input_types=TYPES, output_types=[infer_type(e, TYPES) for e in exprs])  # fmt: skip


def workload(n_changes: int, seed: int) -> list[Change]:
    """Join output rows: inserts, then ``-U``/``+U`` moves of an id to another level."""
    rng = random.Random(seed)
    n_ids, n_levels = n_changes // 3, 1_000
    level = {i: rng.randint(1, n_levels) for i in range(n_ids)}
    attr = [f"a{lv},{lv % 7}" if lv % 5 else "" for lv in range(n_levels + 1)]
    out = [Change("+I", (i, lv, lv, attr[lv]), (0, i)) for i, lv in level.items()]
    pos = 0
    while len(out) < n_changes:
        i = rng.randrange(n_ids)
        new = rng.randint(1, n_levels)
        pos += 1
        out.append(Change("-U", (i, level[i], level[i], attr[level[i]]), (1, pos)))
        out.append(Change("+U", (i, new, new, attr[new]), (1, pos)))
        level[i] = new
    return out[:n_changes]


def _median(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=60_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    changes = workload(args.changes, seed=1)
    for name, stage in (("W2 projection", calc(W2_PROJECTION)), ("functions + filter", calc(FUNCTIONS, FUNCTIONS_FILTER))):
        schema = stage.input_schema()
        columnar = ChangeBatch.from_changes(changes, schema=schema).table()
        expected = stage.process(changes)
        got = stage.process_batch(ChangeBatch.from_changes(changes, schema=schema)).changes()
        assert got == expected, f"{name}: the vectorized path differs from the reference"
        per_row = _median(lambda: stage.process(changes), args.repeats)
        from_changes = _median(lambda: stage.process_batch(ChangeBatch.from_changes(changes, schema=schema)), args.repeats)
        from_arrow = _median(lambda: stage.process_batch(ChangeBatch.from_table(columnar)), args.repeats)
        print(
            f"{name:20s} {len(changes)} changes, {len(expected)} out: per row {per_row * 1000:8.1f} ms | "
            f"process_batch from changes {from_changes * 1000:8.1f} ms ({per_row / from_changes:4.1f}x) | "
            f"from Arrow {from_arrow * 1000:8.1f} ms ({per_row / from_arrow:5.1f}x)"
        )


if __name__ == "__main__":
    main()
