"""State stores commit a changelog per batch by default (``CHANGELOG_CHECKPOINTING``), and a
checkpoint carries on across the setting in both directions: one written with snapshots only
keeps its state when the changelog takes over, and a user who turns it off keeps the state
the changelogs hold. Three ``tidemark run`` processes on one checkpoint, each counting what
the ones before it counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from run_support import produce, sink_table, unique_topics
from test_run_cli import tidemark_run

from tidemark.engine.pipeline import compile_sql
from tidemark.spark.session import CHANGELOG_CHECKPOINTING, CONF_ENV

pytestmark = pytest.mark.integration

COUNTS = """
CREATE TABLE clicks (k STRING) WITH ('topic' = 'clicks', 'format' = 'json');
CREATE TABLE counts (k STRING, n BIGINT, PRIMARY KEY (k) NOT ENFORCED)
  WITH ('topic' = 'counts', 'format' = 'upsert-json');
INSERT INTO counts SELECT k, COUNT(*) AS n FROM clicks GROUP BY k;
"""


def _state_files(checkpoint: Path, suffix: str) -> set[str]:
    return {str(p.relative_to(checkpoint)) for p in (checkpoint / "state").rglob(f"*{suffix}") if not p.name.startswith(".")}


def test_a_checkpoint_keeps_its_state_when_changelog_checkpointing_is_turned_on_and_off(kafka_bootstrap, tmp_path):
    sql, topics = unique_topics(COUNTS, "changelog")
    (tmp_path / "counts.sql").write_text(sql)
    pipeline = compile_sql(sql)
    checkpoint = tmp_path / "cp"
    run = ["counts.sql", "--bootstrap-servers", kafka_bootstrap, "--until-idle", "--checkpoint", "cp"]
    off = {CONF_ENV: json.dumps({CHANGELOG_CHECKPOINTING: "false"})}

    def run_on(keys: str, env: dict[str, str]) -> None:
        produce(kafka_bootstrap, topics["clicks"], [(None, json.dumps({"k": k}).encode()) for k in keys])
        done = tidemark_run(run, cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stderr

    run_on("aab", off)  # snapshots only
    assert _state_files(checkpoint, ".changelog") == set()
    assert sink_table(kafka_bootstrap, pipeline) == {("a",): ("a", 2), ("b",): ("b", 1)}

    run_on("abc", {CONF_ENV: "{}"})  # the default
    changelogs = _state_files(checkpoint, ".changelog")
    assert changelogs, "the default commits changelogs"
    assert sink_table(kafka_bootstrap, pipeline) == {("a",): ("a", 3), ("b",): ("b", 2), ("c",): ("c", 1)}

    run_on("ca", off)  # turned off again: the state the changelogs hold is read back
    assert _state_files(checkpoint, ".changelog") == changelogs  # no new ones
    assert sink_table(kafka_bootstrap, pipeline) == {("a",): ("a", 4), ("b",): ("b", 2), ("c",): ("c", 2)}
