"""Replay host cost per change: the benchmark workloads through ``ReplayHost``, decoding
done before the clock starts, so only the host and its stages are timed.

    .venv/bin/python tests/bench/bench_replay_host.py [--workloads W1,W2-DEDUPLICATE]
        [--scale 1] [--batch-size 5000] [--repeats 3]

Prints one JSON line per workload with the median microseconds per source record over
``--repeats`` runs (a fresh host each run), in CPU time of this process: on a shared
machine wall time mostly measures the neighbours. To compare two versions of the engine in one
run, alternate ``PYTHONPATH=<other checkout>/jobs`` and the working tree between
invocations and compare medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tidemark.engine.changelog import Change
from tidemark.engine.pipeline import compile_sql
from tidemark.engine.replay import ReplayHost

sys.path.insert(0, str(Path(__file__).resolve().parent))
from replay_reference import decoded_batches  # noqa: E402
from workloads import Workload, generate  # noqa: E402


def time_replay(workload: Workload, batches: list[dict[str, list[Change]]]) -> float:
    host = ReplayHost(compile_sql(workload.tidemark_sql))
    t0 = time.process_time()
    for b in batches:
        host.run_batch(b, now_ms=0)
    return time.process_time() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="W1,W2-DEDUPLICATE")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--batch-size", type=int, default=5_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tm-bench-replay-") as tmp:
        for name in args.workloads.split(","):
            wl = generate(name, args.scale, 1, Path(tmp) / name)
            batches = decoded_batches(wl, args.batch_size)
            times = [time_replay(wl, batches) for _ in range(args.repeats)]
            med = statistics.median(times)
            print(json.dumps({"workload": name, "records": wl.input_rows, "batches": len(batches),
                              "us_per_record": round(med / wl.input_rows * 1e6, 2),
                              "runs_s": [round(t, 3) for t in times]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
