"""Planning time against the width of a pipeline (not a test).

Why: planning runs on SQL handed to the control service, so its cost must grow linearly
with the text. A table of N columns copied through ``SELECT c0 + 1 AS c0, ...`` is
planned and explained for each N; the seconds per 1,000 columns should stay flat as N
doubles (a quadratic step would double them). N stops at the column limit
(``tidemark.engine.limits.COLUMNS``); wider SQL is refused before planning.

Run:  .venv/bin/python tests/bench/bench_planning.py [--sizes 500,1000,2000,4096]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.unit.test_plan_limits import wide_sql  # noqa: E402
from tidemark.engine.limits import COLUMNS  # noqa: E402
from tidemark.engine.pipeline import compile_sql  # noqa: E402


def plan_seconds(n: int, repeat: int) -> float:
    sql = wide_sql(n)
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        compile_sql(sql).explain_text()
        best = min(best, time.process_time() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=f"500,1000,2000,{COLUMNS.value}")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"{'columns':>8} {'cpu s':>8} {'s per 1k cols':>14}")
    for n in (int(s) for s in args.sizes.split(",")):
        secs = plan_seconds(n, args.repeat)
        print(f"{n:>8} {secs:>8.3f} {secs / n * 1000:>14.3f}")


if __name__ == "__main__":
    main()
