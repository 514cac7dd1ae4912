"""Changing a pipeline's SQL between two runs on one checkpoint: ``tidemark run`` records
the plan's fingerprint in the checkpoint, keeps the state for a compatible change and
refuses an incompatible one (before Spark starts) naming the stage and what changed."""

from __future__ import annotations

import json

import pytest
from run_support import produce, sink_table, unique_topics
from test_run_cli import tidemark_run

from tidemark.engine.fingerprint import PLAN_FILE, fingerprint, take_over
from tidemark.engine.pipeline import compile_sql

COUNTS = """
CREATE TABLE clicks (k STRING) WITH ('topic' = 'clicks', 'format' = 'json');
CREATE TABLE counts (k STRING, n BIGINT, PRIMARY KEY (k) NOT ENFORCED)
  WITH ('topic' = 'counts', 'format' = 'upsert-json');
INSERT INTO counts SELECT k, COUNT(*) AS n FROM clicks GROUP BY k;
"""
# a filter after the last stateful stage: compatible
COUNTS_ABOVE_ONE = COUNTS.replace("SELECT k, COUNT(*) AS n FROM clicks GROUP BY k",
                                  "SELECT k, n FROM (SELECT k, COUNT(*) AS n FROM clicks GROUP BY k) WHERE n > 1")
# another aggregate function: the aggregate's state means something else
MAX_LENGTH = COUNTS.replace("COUNT(*)", "MAX(CHAR_LENGTH(k))")


def clicks(keys: str) -> list[tuple[bytes | None, bytes]]:
    return [(None, json.dumps({"k": k}).encode()) for k in keys]


def refused(tmp_path, sql: str, checkpoint) -> str:
    """``tidemark run`` of ``sql`` on ``checkpoint`` (no broker: it must stop before Spark)
    refused with exit status 2 and one line; that line."""
    (tmp_path / "pipeline.sql").write_text(sql)
    proc = tidemark_run(["pipeline.sql", "--checkpoint", str(checkpoint), "--bootstrap-servers", "127.0.0.1:1"],
                        cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1
    assert line.startswith(f"error: checkpoint {checkpoint}: the new plan cannot read the state of the old one: ")
    return line


def test_an_incompatible_change_is_refused_before_spark_naming_the_stage(tmp_path):
    checkpoint = tmp_path / "cp"
    take_over(str(checkpoint), compile_sql(COUNTS))  # what the first run recorded
    line = refused(tmp_path, MAX_LENGTH, checkpoint)
    assert "aggregate: config changed: aggregates: #0 \"COUNT_STAR(*)\" -> \"MAX(" in line
    assert json.loads((checkpoint / PLAN_FILE).read_text()) == fingerprint(compile_sql(COUNTS))  # untouched


@pytest.mark.integration
def test_a_compatible_change_keeps_the_state_and_the_offsets(kafka_bootstrap, tmp_path):
    v1, topics = unique_topics(COUNTS, "upgrade")
    v2 = COUNTS_ABOVE_ONE
    for table, topic in topics.items():
        v2 = v2.replace(f"'topic' = '{table}'", f"'topic' = '{topic}'")
    sql_file = tmp_path / "counts.sql"
    run = ["counts.sql", "--bootstrap-servers", kafka_bootstrap, "--until-idle", "--checkpoint", "cp"]

    produce(kafka_bootstrap, topics["clicks"], clicks("aab"))
    sql_file.write_text(v1)
    first = tidemark_run(run, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert sink_table(kafka_bootstrap, compile_sql(v1)) == {("a",): ("a", 2), ("b",): ("b", 1)}

    produce(kafka_bootstrap, topics["clicks"], clicks("abc"))
    sql_file.write_text(v2)
    second = tidemark_run(run, cwd=tmp_path)

    assert second.returncode == 0, second.stderr
    assert "3 records in" in second.stderr.strip().splitlines()[-1]  # only the new records: offsets kept
    # counts over both runs (the aggregate's state was kept), filtered by the new version: c (1) is not there
    assert sink_table(kafka_bootstrap, compile_sql(v2)) == {("a",): ("a", 3), ("b",): ("b", 2)}
    assert json.loads((tmp_path / "cp" / PLAN_FILE).read_text())["sql"] == v2


# a sink keyed by another column than the query's upsert key: the materializer keeps state
LATEST_BY_LEVEL = """
CREATE TABLE moves (id BIGINT, level BIGINT) WITH ('topic' = 'moves', 'format' = 'json');
CREATE TABLE by_level (level BIGINT, id BIGINT, PRIMARY KEY (level) NOT ENFORCED)
  WITH ('topic' = 'by_level', 'format' = 'upsert-json');
INSERT INTO by_level SELECT level, id FROM moves ON CONFLICT DO NOTHING;
"""


def test_a_checkpoint_of_another_state_format_is_refused_before_spark_naming_both(tmp_path):
    """A record written before state formats were recorded: its stages stored pickled state."""
    checkpoint = tmp_path / "cp"
    old = fingerprint(compile_sql(LATEST_BY_LEVEL))
    for stage in old["stateful"]:
        del stage["state_format"]
    checkpoint.mkdir()
    (checkpoint / PLAN_FILE).write_text(json.dumps(old))
    line = refused(tmp_path, LATEST_BY_LEVEL, checkpoint)
    assert ("materializer: the checkpoint holds state in format pickled-bucket/1, "
            "this version stores materializer-current-row/1") in line
    assert json.loads((checkpoint / PLAN_FILE).read_text()) == old  # untouched
