"""``Pipeline.explain()`` / ``explain_text()`` and the ``tidemark explain`` command."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from tidemark.cli.main import app
from tidemark.engine.pipeline import compile_sql

SEED_JOIN = """
CREATE TABLE s1 (id BIGINT, level BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 's1', 'format' = 'debezium-json');
CREATE TABLE s2 (id BIGINT, attr STRING, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 's2', 'format' = 'debezium-json');
CREATE TABLE t1 (id BIGINT, level BIGINT, attr STRING, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 't1', 'format' = 'upsert-json');
INSERT INTO t1 SELECT s1.id, s1.level, s2.attr FROM s1 JOIN s2 ON s1.level = s2.id
"""

runner = CliRunner()


def test_explain_dict_lists_every_stage_with_key_and_mode():
    p = compile_sql("SET 'table.exec.state.ttl' = '10 min';\n" + SEED_JOIN + " ON CONFLICT DO DEDUPLICATE")
    e = p.explain()
    assert [s["kind"] for s in e["stages"]] == ["source", "source", "join", "calc", "materializer", "sink"]
    src, _, join, calc, mat, sink = e["stages"]
    assert (src["table"], src["changelog_mode"], src["upsert_key"]) == ("s1", "retract", ["id"])
    assert (join["changelog_mode"], join["upsert_key"], join["upsert_keys"]) == ("retract", None, [])
    assert join["detail"]["on"] == ["level = id1"]
    assert join["inputs"] == [0, 1]
    assert calc["detail"]["projections"] == ["`id` AS id", "`level` AS level", "`attr` AS attr"]
    assert (mat["upsert_key"], mat["inputs"]) == (["id"], [3])
    assert (sink["changelog_mode"], sink["table"]) == ("upsert", "t1")
    assert e["materializer"]["strategy"] == "DEDUPLICATE"
    assert e["materializer"]["upsert_key"] is None
    assert e["materializer"]["ttl_ms"] == 600_000
    assert "no upsert key" in e["materializer"]["reason"]
    assert e["options"] == {"table.exec.state.ttl": "10 min"}
    json.dumps(e)  # JSON-ready


def test_explain_text_shows_graph_keys_modes_and_materializer():
    text = compile_sql(SEED_JOIN + " ON CONFLICT DO NOTHING").explain_text()
    assert "[2] join inner <- [0], [1]" in text
    assert "mode: retract   upsert key: (none)" in text
    assert "[4] materializer ON CONFLICT DO NOTHING <- [3]" in text
    assert "Materializer: [4] ON CONFLICT DO NOTHING keyed by sink primary key (id)" in text


def test_explain_text_without_materializer_says_why():
    sql = SEED_JOIN.replace("ON s1.level = s2.id", "ON s1.id = s2.id")
    text = compile_sql(sql).explain_text()
    assert "No materializer: the upsert key reaching the sink equals its primary key (id)" in text
    assert "materializer" not in text.split("No materializer")[0].lower()


def test_cli_explain_human_and_json(tmp_path):
    path = tmp_path / "p.sql"
    path.write_text(SEED_JOIN + " ON CONFLICT DO ERROR;\n")
    result = runner.invoke(app, ["explain", str(path)])
    assert result.exit_code == 0, result.output
    assert "materializer ON CONFLICT DO ERROR" in result.stdout
    result = runner.invoke(app, ["explain", str(path), "--json"])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["materializer"]["strategy"] == "ERROR"


def test_cli_explain_missing_on_conflict_exits_2_with_the_reason(tmp_path):
    path = tmp_path / "p.sql"
    path.write_text(SEED_JOIN)
    result = runner.invoke(app, ["explain", str(path)])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "ON CONFLICT DO NOTHING, ON CONFLICT DO ERROR, ON CONFLICT DO DEDUPLICATE" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith(f"{path}: ")


def test_cli_explain_bad_sql_names_position(tmp_path):
    path = tmp_path / "p.sql"
    path.write_text(SEED_JOIN + "\n  ORDER BY id")
    result = runner.invoke(app, ["explain", str(path)])
    assert result.exit_code == 2
    assert "ORDER BY in a streaming query is not supported (line 7, column" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_explain_unreadable_file(tmp_path):
    result = runner.invoke(app, ["explain", str(tmp_path / "missing.sql")])
    assert result.exit_code == 2
    assert "cannot read" in result.stderr


def test_explain_shows_distinct_in_a_distinct_aggregate():
    """COUNT(DISTINCT product) counts distinct values: explain must not show COUNT(product)."""
    p = compile_sql(
        "CREATE TABLE orders (customer BIGINT, product STRING) WITH ('topic' = 'o', 'format' = 'json');\n"
        "CREATE TABLE counts (customer BIGINT, products BIGINT, n BIGINT, PRIMARY KEY (customer) NOT ENFORCED)"
        " WITH ('topic' = 'c', 'format' = 'upsert-json');\n"
        "INSERT INTO counts SELECT customer, COUNT(DISTINCT product), COUNT(product) FROM orders GROUP BY customer"
    )
    agg = next(s for s in p.explain()["stages"] if s["kind"] == "aggregate")
    assert agg["detail"]["aggregates"] == ["COUNT(DISTINCT product)", "COUNT(product)"]
    assert "aggregates: COUNT(DISTINCT product), COUNT(product)" in p.explain_text()
