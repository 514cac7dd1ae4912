"""Event time where Spark runs pipelines: a table with a WATERMARK registers (nothing in a
pipeline without windows depends on it); a window aggregate, which the Spark host does not
run yet, is refused at registration (422) and by ``tidemark run`` (one line, exit 2),
naming the stage, before any job starts."""

from __future__ import annotations

import subprocess
from pathlib import Path

from control_support import TIDEMARK, register

ROOT = Path(__file__).resolve().parents[2]
WINDOWED = (ROOT / "examples" / "bids_per_window.sql").read_text(encoding="utf-8")
REFUSAL = ("stage [2] aggregate#2: window aggregation does not run on Spark yet (it runs in `tidemark replay`); "
           'see docs/sql.md, "Event time and windows"')


def test_a_window_aggregate_is_refused_at_registration_and_a_watermark_alone_is_not(service):
    r = register(service, "bids-per-window", sql=WINDOWED)
    assert r.status_code == 422
    assert r.json()["detail"] == REFUSAL
    plain = WINDOWED.split("INSERT INTO")[0] + (
        "INSERT INTO bids_per_window SELECT item, ts, ts, price, price FROM bids;")
    assert register(service, "bids-copied", sql=plain).status_code == 201


def test_tidemark_run_refuses_a_window_aggregate_in_one_line_before_spark_starts(tmp_path):
    proc = subprocess.run([TIDEMARK, "run", str(ROOT / "examples" / "bids_per_window.sql")],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: {ROOT / 'examples' / 'bids_per_window.sql'}: {REFUSAL}"
