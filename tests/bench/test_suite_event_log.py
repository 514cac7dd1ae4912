"""``suite.py --event-log DIR``: Spark's event log turned on for the measured Spark session
through ``$TIDEMARK_SPARK_CONF`` (over what the variable already says), and each query's
progress per batch kept next to the log."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import suite

from tidemark.spark.session import CONF_ENV, session_conf

FIXTURE = Path(__file__).resolve().parents[1] / "unit" / "fixtures" / "spark-event-log-w1-batch.jsonl"


def test_the_event_log_is_turned_on_over_the_settings_already_asked_for(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv(CONF_ENV, '{"spark.driver.memory": "2g", "spark.eventLog.compress": true}')
    suite.enable_event_log(tmp_path / "logs")
    conf = session_conf("local[2]", 2)
    assert (tmp_path / "logs").is_dir()
    assert conf["spark.driver.memory"] == "2g"
    assert conf["spark.eventLog.enabled"] == "true"
    assert conf["spark.eventLog.dir"] == (tmp_path / "logs").resolve().as_uri()
    assert conf["spark.eventLog.compress"] == "false"  # event_log.py reads plain JSON lines


def test_each_logs_progress_is_kept_next_to_it(tmp_path: Path) -> None:
    log = tmp_path / "local-1"
    shutil.copy(FIXTURE, log)
    assert suite.keep_progress(tmp_path) == [str(log)]
    lines = (tmp_path / "local-1.progress.jsonl").read_text(encoding="utf-8").splitlines()
    assert [(p["name"], p["batchId"], p["durationMs"]["addBatch"]) for p in map(json.loads, lines)] == [
        ("tidemark_bench_w1_default_efb2c4", 1, 1733)]
    assert suite.keep_progress(tmp_path) == [str(log)]  # a second call does not read its own output
