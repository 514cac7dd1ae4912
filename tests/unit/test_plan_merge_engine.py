"""How the planner hosts a sink that declares merge options: which sinks get the merge-engine
stage, how that stage relates to ON CONFLICT, the column types it is given, and what EXPLAIN
says about it. Behaviour is checked by running the compiled pipeline in the replay host."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tidemark.cli.main import app
from tidemark.engine.changelog import Change
from tidemark.engine.errors import InputError, PlanError
from tidemark.engine.pipeline import compile_sql
from tidemark.engine.replay import ReplayHost

runner = CliRunner()


def pipeline_sql(sink_options: str, cols: str = "k BIGINT, v STRING, s BIGINT",
                 src_format: str = "changelog-json", sink_format: str = "upsert-json",
                 pk: str = ", PRIMARY KEY (k) NOT ENFORCED", tail: str = "") -> str:
    names = ", ".join(c.split()[0] for c in cols.split(", "))
    extra = f", {sink_options}" if sink_options else ""
    return (
        f"CREATE TABLE src ({cols}) WITH ('topic' = 'src', 'format' = '{src_format}');\n"
        f"CREATE TABLE dst ({cols}{pk}) WITH ('topic' = 'dst', 'format' = '{sink_format}'{extra});\n"
        f"INSERT INTO dst SELECT {names} FROM src{tail}"
    )


def kinds(changes):
    return [(c.kind, c.row) for c in changes]


# -- routing -------------------------------------------------------------------------------


def test_deduplicate_with_sequence_field_gets_the_merge_engine_and_needs_no_on_conflict():
    p = compile_sql(pipeline_sql("'sequence.field' = 's'"))
    assert p.materializer is None
    me = p.merge_engine
    assert me is not None and me.stage.cfg.engine == "deduplicate"
    assert me.stage.cfg.sequence_fields == (2,)
    host = ReplayHost(p)
    host.run_batch({"src": [Change("+I", (1, "new", 5), (1,))]})
    # an older sequence arriving later does not win (the materializer would take it)
    host.run_batch({"src": [Change("+I", (1, "old", 3), (2,))]})
    assert host.table() == {(1,): (1, "new", 5)}


def test_explicit_deduplicate_engine_with_sequence_field_is_routed_too():
    p = compile_sql(pipeline_sql("'merge-engine' = 'deduplicate', 'sequence.field' = 's'"))
    assert p.merge_engine is not None and p.materializer is None


def test_changelog_producer_alone_routes_a_deduplicate_sink_to_the_merge_engine():
    p = compile_sql(pipeline_sql("'changelog-producer' = 'lookup'", src_format="json"))
    assert p.merge_engine is not None
    host = ReplayHost(p)
    assert kinds(host.run_batch({"src": [Change("+I", (1, "a", 1), (1,))]})) == [("+I", (1, "a", 1))]
    out = host.run_batch({"src": [Change("+I", (1, "b", 2), (2,))]})
    assert kinds(out) == [("-U", (1, "a", 1)), ("+U", (1, "b", 2))]


def test_plain_deduplicate_sink_keeps_the_on_conflict_rule():
    with pytest.raises(PlanError, match="ON CONFLICT DO NOTHING, ON CONFLICT DO ERROR"):
        compile_sql(pipeline_sql("'merge-engine' = 'deduplicate'"))
    p = compile_sql(pipeline_sql("'merge-engine' = 'deduplicate'", tail=" ON CONFLICT DO DEDUPLICATE"))
    assert p.merge_engine is None and p.materializer is not None


@pytest.mark.parametrize("options,named", [
    ("'sequence.field' = 's'", "'sequence.field'"),
    ("'changelog-producer' = 'input'", "'changelog-producer'"),
    ("'merge-engine' = 'partial-update', 'ignore-delete' = 'true'", "merge-engine 'partial-update'"),
])
def test_on_conflict_next_to_merge_options_names_both(options, named):
    with pytest.raises(PlanError) as err:
        compile_sql(pipeline_sql(options, tail=" ON CONFLICT DO DEDUPLICATE"))
    message = str(err.value)
    assert named in message
    assert "remove ON CONFLICT DO DEDUPLICATE" in message


@pytest.mark.parametrize("key,meant", [
    ("sequence_field", "sequence.field"),
    ("Sequence.Field", "sequence.field"),
    ("changelog.producer", "changelog-producer"),
    ("merge_engine", "merge-engine"),
    ("fields_v_aggregate-function", "fields.<...>"),
])
def test_misspelled_merge_options_are_refused_not_ignored(key, meant):
    with pytest.raises(PlanError, match=f"option '{key}' looks like the merge option '{meant}'"):
        compile_sql(pipeline_sql(f"'{key}' = 's'", tail=" ON CONFLICT DO DEDUPLICATE"))


def test_unknown_options_under_merge_prefixes_are_refused():
    with pytest.raises(PlanError, match="option 'changelog-producer.row-dedup': unknown merge option"):
        compile_sql(pipeline_sql("'changelog-producer.row-dedup' = 'true'"))
    with pytest.raises(PlanError, match="option 'fields.v.agregate-function': unknown field option"):
        compile_sql(pipeline_sql("'fields.v.agregate-function' = 'sum'"))


def test_connector_and_format_options_are_not_mistaken_for_merge_options():
    sql = pipeline_sql("'properties.client.id' = 'x', 'json.fail-on-missing-field' = 'true'",
                       tail=" ON CONFLICT DO DEDUPLICATE")
    p = compile_sql(sql)
    assert p.merge_engine is None and p.materializer is not None


def test_merge_options_need_a_primary_key_and_an_updating_sink_format():
    with pytest.raises(PlanError, match=r"sink 'dst': merge-engine 'deduplicate' \(options 'sequence.field'\) needs a PRIMARY KEY"):
        compile_sql(pipeline_sql("'sequence.field' = 's'", pk="", sink_format="changelog-json"))
    with pytest.raises(PlanError, match="append-only format 'json' but merge-engine 'aggregation' emits updates"):
        compile_sql(pipeline_sql("'merge-engine' = 'aggregation'", src_format="json", sink_format="json"))
    p = compile_sql(pipeline_sql("'merge-engine' = 'first-row'", src_format="json", sink_format="json"))
    assert p.merge_engine is not None  # first-row is insert-only: an append sink takes it


# -- column types reach the merge engine ---------------------------------------------------


def test_column_types_are_checked_against_aggregate_functions():
    with pytest.raises(PlanError, match="aggregate function 'sum' does not support column 'v' of type STRING"):
        compile_sql(pipeline_sql("'merge-engine' = 'aggregation', 'fields.v.aggregate-function' = 'sum'",
                                 src_format="json"))
    with pytest.raises(PlanError, match="'bool_and' does not support column 's' of type BIGINT"):
        compile_sql(pipeline_sql("'merge-engine' = 'aggregation', 'fields.s.aggregate-function' = 'bool_and'",
                                 src_format="json"))


def test_integral_overflow_of_the_declared_type_stops_the_pipeline():
    p = compile_sql(pipeline_sql("'merge-engine' = 'aggregation', 'fields.v.aggregate-function' = 'sum'",
                                 cols="k BIGINT, v INT", src_format="json"))
    host = ReplayHost(p)
    host.run_batch({"src": [Change("+I", (1, 2**31 - 1), (1,))]})
    with pytest.raises(InputError, match=r"table 'dst'.*primary key \(k=1\).*INT overflow in 'sum'"):
        host.run_batch({"src": [Change("+I", (1, 1), (2,))]})


# -- EXPLAIN -------------------------------------------------------------------------------

GROUPS = pipeline_sql(
    "'merge-engine' = 'partial-update', 'fields.g.sequence-group' = 'a,b', "
    "'fields.b.aggregate-function' = 'sum', 'changelog-producer' = 'full-compaction', "
    "'changelog-producer.compaction-interval' = '10 s', 'ignore-delete' = 'true'",
    cols="k BIGINT, a STRING, b BIGINT, g BIGINT",
)


def test_explain_json_describes_the_engine_and_says_it_is_the_conflict_policy():
    e = compile_sql(GROUPS).explain()
    me = e["merge_engine"]
    assert me["stage"] == "merge_engine:dst"
    assert me["merge_engine"] == "partial-update"
    assert me["changelog_producer"] == "full-compaction"
    assert me["compaction_interval_ms"] == 10_000
    assert me["sequence_groups"] == {"g": ["a", "b"]}
    assert me["aggregate_functions"] == {"b": "sum"}
    assert me["ignore_delete"] is True
    assert "no ON CONFLICT clause" in me["conflict_policy"]
    assert e["materializer"] is None and e["on_conflict"] is None
    stage = next(s for s in e["stages"] if s["kind"] == "merge_engine")
    assert stage["detail"]["sequence_groups"] == {"g": ["a", "b"]}
    assert stage["upsert_key"] == ["k"]
    json.dumps(e)


def test_explain_text_describes_the_engine_and_says_it_is_the_conflict_policy():
    text = compile_sql(GROUPS).explain_text()
    assert "[1] merge_engine partial-update <- [0]" in text
    assert "changelog producer: full-compaction every 10000 ms" in text
    assert "sequence group: g -> a, b" in text
    assert "aggregate functions: b=sum" in text
    assert "ignore delete: -U/-D are dropped" in text
    assert "Merge engine: [1] partial-update keyed by sink primary key (k);" in text
    assert "no ON CONFLICT clause and no materializer are needed" in text


def test_explain_text_shows_sequence_fields():
    text = compile_sql(pipeline_sql("'sequence.field' = 's', 'sequence.field.sort-order' = 'descending'")).explain_text()
    assert "[1] merge_engine deduplicate <- [0]" in text
    assert "sequence field: s (descending)" in text
    assert "changelog producer: none" in text


def test_cli_explain_shows_the_merge_engine_in_both_forms(tmp_path):
    path = tmp_path / "p.sql"
    path.write_text(GROUPS + ";\n")
    result = runner.invoke(app, ["explain", str(path)])
    assert result.exit_code == 0, result.output
    assert "sequence group: g -> a, b" in result.stdout
    assert "no ON CONFLICT clause" in result.stdout
    result = runner.invoke(app, ["explain", str(path), "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["merge_engine"]["aggregate_functions"] == {"b": "sum"}
    assert "no ON CONFLICT clause" in plan["merge_engine"]["conflict_policy"]
