"""Event time where Spark runs pipelines: a table with a WATERMARK and a window aggregate
over it register (the Spark host runs them, ``tests/integration/test_spark_windows.py``);
a window aggregate behind another keyed stage, which the Spark host does not run yet, is
refused at registration (422) and by ``tidemark run`` (one line, exit 2), naming the
stage, before any job starts."""

from __future__ import annotations

import subprocess
from pathlib import Path

from control_support import TIDEMARK, register

ROOT = Path(__file__).resolve().parents[2]
WINDOWED = (ROOT / "examples" / "bids_per_window.sql").read_text(encoding="utf-8")
#: the example's window aggregate over the bids of known items (a join: a keyed stage)
BEHIND_A_JOIN = WINDOWED.replace(
    "CREATE TABLE bids_per_window",
    "CREATE TABLE items (item BIGINT) WITH ('topic' = 'items', 'format' = 'json');\n"
    "CREATE VIEW known_bids AS SELECT b.* FROM bids b JOIN items i ON b.item = i.item;\n\n"
    "CREATE TABLE bids_per_window",
).replace("TABLE(TUMBLE(TABLE bids,", "TABLE(TUMBLE(TABLE known_bids,")
REFUSAL = ("stage [5] aggregate#5: a window aggregate reading the output of the keyed stage [2] join#2 does not "
           "run on Spark yet (its watermark reaches it only from the passes that read sources); it runs in "
           "`tidemark replay`")


def test_a_window_aggregate_registers_and_one_behind_a_join_is_refused(service):
    assert register(service, "bids-per-window", sql=WINDOWED).status_code == 201
    r = register(service, "known-bids-per-window", sql=BEHIND_A_JOIN)
    assert r.status_code == 422
    assert r.json()["detail"] == REFUSAL
    plain = WINDOWED.split("INSERT INTO")[0].replace("'topic' = 'bids_per_window'", "'topic' = 'bids_copied'") + (
        "INSERT INTO bids_per_window SELECT item, ts, ts, price, price FROM bids;")
    r = register(service, "bids-copied", sql=plain)
    assert r.status_code == 201, r.text


def test_tidemark_run_refuses_a_window_aggregate_behind_a_join_in_one_line_before_spark_starts(tmp_path):
    sql = tmp_path / "known_bids_per_window.sql"
    sql.write_text(BEHIND_A_JOIN, encoding="utf-8")
    proc = subprocess.run([TIDEMARK, "run", str(sql)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: {sql}: {REFUSAL}"
