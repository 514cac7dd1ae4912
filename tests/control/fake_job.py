"""Stand-in for ``tidemark run`` in supervision tests: same argv, emits the status channel.

Behaviour comes from the pipeline name (the SQL file's stem), so one service can host
pipelines that behave differently:
  fail*   -> one batch, then an error on stderr and exit status 3
  finish* -> two batches, "idle", exit 0 (like --until-idle)
  slow*   -> like other, but takes 3 s to stop after SIGTERM
  other   -> a batch every 0.1 s until SIGTERM
It records its argv in ``argv.json`` next to the SQL file so tests can check the command line,
and, when ``FAKE_JOB_LOG`` is set, appends when it started and ended there (one JSON line each)
so tests can check that two runs of one pipeline never overlapped.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path


def log_interval(event: str, name: str) -> None:
    path = os.environ.get("FAKE_JOB_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"name": name, "pid": os.getpid(), "event": event, "t": time.time()}) + "\n")


def main(argv: list[str]) -> int:
    name = Path(argv[0]).stem
    log_interval("start", name)
    try:
        return run(argv)
    finally:
        log_interval("end", name)


def run(argv: list[str]) -> int:
    sql_file = Path(argv[0])
    name = sql_file.stem
    (sql_file.parent / "argv.json").write_text(json.dumps(argv))
    status_path = os.environ["TIDEMARK_STATUS_FILE"]
    stopping = False

    def on_term(_sig, _frm):
        nonlocal stopping
        stopping = True
        if name.startswith("slow"):
            time.sleep(3)

    signal.signal(signal.SIGTERM, on_term)

    def emit(event: dict) -> None:
        with open(status_path, "a") as f:
            f.write(json.dumps({"v": 1, "ts": time.time(), **event}) + "\n")

    emit({"event": "started"})
    batch = 0
    while not stopping:
        emit({"event": "batch", "batch_id": batch, "rows_in": 10, "rows_out": 4, "dlq": 1, "conflicts": 2,
              "retractions_without_state": 0, "state_size_bytes": 1000 + batch, "lag": {"s1": {"0": 5, "1": 0}}})
        batch += 1
        if name.startswith("fail"):
            print("py4j noise", file=sys.stderr)
            print("tidemark.engine.errors.ConflictError: ON CONFLICT DO ERROR: table 't1' boom", file=sys.stderr)
            return 3
        if name.startswith("finish") and batch >= 2:
            emit({"event": "idle"})
            return 0
        time.sleep(0.1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
