"""Strict planning: nothing is accepted that is not honoured. An unknown table option or
SET key, a format or connector the runtime does not implement, and constructs not
implemented yet (a WATERMARK strategy other than a bounded delay, FOR SYSTEM_TIME AS OF) are refused by name, with the table,
the position and the nearest known name; the known options live in
``tidemark.engine.options`` and docs/sql.md documents each of them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tidemark.engine import options
from tidemark.engine.errors import PlanError, SqlError, TidemarkError
from tidemark.engine.pipeline import compile_sql

ROOT = Path(__file__).resolve().parents[2]
SINK = "CREATE TABLE t (id BIGINT, v STRING, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 't', 'format' = 'upsert-json');\n"
INSERT = "INSERT INTO t SELECT id, v FROM s"


def source(with_options: str) -> str:
    return f"CREATE TABLE s (id BIGINT, v STRING, PRIMARY KEY (id) NOT ENFORCED) WITH ({with_options});\n"


def refused(sql: str, kind: type[TidemarkError] = PlanError) -> TidemarkError:
    with pytest.raises(kind) as info:
        compile_sql(sql)
    return info.value


def test_a_misspelled_option_is_refused_naming_it_its_table_and_the_option_meant():
    err = refused(source("'topic' = 's', 'fromat' = 'debezium-json'") + SINK + INSERT)
    assert str(err) == "table 's': unknown option 'fromat' (did you mean 'format'?) (line 1, column 90)"  # at the quote of 'fromat'


def test_an_unknown_option_without_a_near_name_is_refused_too():
    err = refused(source("'format' = 'debezium-json', 'compression' = 'zstd'") + SINK + INSERT)
    assert str(err).startswith("table 's': unknown option 'compression' (line 1, ")


def test_an_unknown_set_key_is_refused_with_the_known_ones():
    err = refused("SET 'table.exec.state.tl' = '1 h';\n" + source("'format' = 'debezium-json'") + SINK + INSERT)
    message = str(err)
    assert message.startswith(
        "SET 'table.exec.state.tl': unknown pipeline option (did you mean 'table.exec.state.ttl'?) (known: "
        "table.exec.state.ttl, table.exec.sink.upserts.compaction-mode, table.optimizer.delta-join.strategy, "
    )
    assert message.endswith("(line 1, column 5)")
    assert all(o.key in message for o in options.PIPELINE_OPTIONS)


@pytest.mark.parametrize("fmt", ["canal-json", "maxwell-json", "ogg-json", "csv", "raw"])
def test_flink_formats_the_runtime_does_not_implement_are_refused_at_planning(fmt):
    err = refused(source(f"'format' = '{fmt}'") + SINK + INSERT)
    assert f"table 's': unknown format '{fmt}': a Flink format Tidemark does not implement (known: json, " in str(err)


def test_a_misspelled_format_names_the_format_meant():
    err = refused(source("'format' = 'debezium-jsn'") + SINK + INSERT)
    assert "table 's': unknown format 'debezium-jsn' (did you mean 'debezium-json'?)" in str(err)


def test_an_unused_table_is_checked_too():
    sql = source("'format' = 'debezium-json'") + "CREATE TABLE spare (x BIGINT) WITH ('format' = 'csv');\n" + SINK + INSERT
    assert "table 'spare': unknown format 'csv'" in str(refused(sql))


def test_every_format_the_planner_accepts_is_one_the_kafka_codecs_implement():
    from tidemark.engine.catalog import Column, TableDef
    from tidemark.engine.types import BIGINT
    from tidemark.formats.codecs import parse_format

    for fmt in options.FORMATS:
        table = TableDef("s", [Column("id", BIGINT)], ("id",), {"format": fmt, "avro-confluent.url": "mock://x"})
        spec, _ = parse_format(table)
        assert spec.name == fmt


@pytest.mark.parametrize("connector", ["filesystem", "jdbc", "datagen"])
def test_a_connector_other_than_kafka_is_refused_by_name(connector):
    err = refused(source(f"'connector' = '{connector}', 'format' = 'debezium-json'") + SINK + INSERT)
    assert f"table 's': option 'connector': unknown value '{connector}' (expected one of kafka, upsert-kafka)" in str(err)


def test_upsert_kafka_with_a_value_format_reads_upserts():
    sql = source("'connector' = 'upsert-kafka', 'key.format' = 'json', 'value.format' = 'json'") + SINK + INSERT
    pipeline = compile_sql(sql)
    assert pipeline.sources["s"].changelog_mode == "upsert"
    assert pipeline.sources["s"].format == "upsert-json"
    assert [n.kind for n in pipeline.nodes][:2] == ["source", "normalize"]


def test_upsert_kafka_refuses_a_retracting_format_and_a_key_format_unlike_the_value():
    err = refused(source("'connector' = 'upsert-kafka', 'format' = 'debezium-json'") + SINK + INSERT)
    assert "the 'upsert-kafka' connector writes upserts, not format 'debezium-json'" in str(err)
    err = refused(source("'connector' = 'upsert-kafka', 'key.format' = 'avro', 'value.format' = 'json'") + SINK + INSERT)
    assert "'key.format' = 'avro' differs from the value's encoding 'json'" in str(err)


def test_properties_are_kafka_client_settings_and_accepted():
    sql = source("'format' = 'debezium-json', 'properties.security.protocol' = 'SASL_SSL'") + SINK + INSERT
    assert compile_sql(sql).sources["s"].options["properties.security.protocol"] == "SASL_SSL"


def test_a_table_bootstrap_server_is_refused_pointing_to_the_pipeline_one():
    err = refused(source("'format' = 'debezium-json', 'properties.bootstrap.servers' = 'k:9092'") + SINK + INSERT)
    assert "table 's': 'properties.bootstrap.servers' is not read from a table" in str(err)
    assert "--bootstrap-servers" in str(err)


@pytest.mark.parametrize("mode", ["earliest-offset", "latest-offset"])
def test_startup_modes_tidemark_implements_plan(mode):
    sql = source(f"'format' = 'debezium-json', 'scan.startup.mode' = '{mode}'") + SINK + INSERT
    assert compile_sql(sql).sources["s"].options["scan.startup.mode"] == mode


def test_timestamp_startup_needs_its_timestamp():
    ok = "'format' = 'debezium-json', 'scan.startup.mode' = 'timestamp', 'scan.startup.timestamp-millis' = '1700000000000'"
    compile_sql(source(ok) + SINK + INSERT)
    err = refused(source("'format' = 'debezium-json', 'scan.startup.mode' = 'timestamp'") + SINK + INSERT)
    assert "'scan.startup.mode' = 'timestamp' needs 'scan.startup.timestamp-millis'" in str(err)
    err = refused(source("'format' = 'debezium-json', 'scan.startup.timestamp-millis' = '5'") + SINK + INSERT)
    assert "'scan.startup.timestamp-millis' is read only with 'scan.startup.mode' = 'timestamp'" in str(err)


@pytest.mark.parametrize("mode", ["group-offsets", "specific-offsets"])
def test_startup_modes_tidemark_does_not_implement_are_refused_by_name(mode):
    err = refused(source(f"'format' = 'debezium-json', 'scan.startup.mode' = '{mode}'") + SINK + INSERT)
    assert f"table 's': option 'scan.startup.mode': '{mode}' is not supported" in str(err)


def test_a_watermark_strategy_other_than_a_bounded_delay_is_refused_by_name_with_its_position():
    sql = (
        "CREATE TABLE s (id BIGINT, v STRING, ts TIMESTAMP(3),\n"
        "  WATERMARK FOR ts AS ts + INTERVAL '5' SECOND) WITH ('format' = 'json');\n"
    ) + SINK.replace("upsert-json", "json").replace(", PRIMARY KEY (id) NOT ENFORCED", "") + INSERT
    err = refused(sql, SqlError)
    assert str(err).startswith("table 's': WATERMARK FOR ts AS ts + INTERVAL '5' SECOND is not supported: write AS ts")
    assert (err.line, err.col) == (2, 23)  # the strategy's first token: ts


def test_a_temporal_join_is_refused_not_planned_as_a_regular_join():
    sql = (
        "CREATE TABLE o (id BIGINT, cid BIGINT, ts TIMESTAMP(3)) WITH ('format' = 'json');\n"
        "CREATE TABLE c (id BIGINT, v STRING, PRIMARY KEY (id) NOT ENFORCED) WITH ('format' = 'debezium-json');\n"
        + SINK
        + "INSERT INTO t SELECT o.id, c.v FROM o\n  JOIN c FOR SYSTEM_TIME AS OF o.ts ON o.cid = c.id"
        + " ON CONFLICT DO DEDUPLICATE"
    )
    err = refused(sql, SqlError)
    assert str(err).startswith("c FOR SYSTEM_TIME AS OF ... (a temporal join) is not supported yet")
    assert err.line == 5


#: examples that show a refusal (docs/replay.md shows its message)
REFUSED_EXAMPLES = {"no_clause.sql": "no upsert key"}


def test_shipped_examples_still_plan(monkeypatch: pytest.MonkeyPatch):
    # the examples' UDF module sits beside them, as a job's PYTHONPATH would hold it
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    for path in sorted((ROOT / "examples").glob("*.sql")):
        if path.name in REFUSED_EXAMPLES:
            with pytest.raises(PlanError, match=REFUSED_EXAMPLES[path.name]):
                compile_sql(path.read_text(encoding="utf-8"))
        else:
            compile_sql(path.read_text(encoding="utf-8"))


def test_every_known_option_is_documented_in_docs_sql_md():
    doc = ROOT / "docs" / "sql.md"
    if not doc.exists():
        pytest.skip("docs/sql.md is not written yet (the docs helper writes it)")
    text = doc.read_text(encoding="utf-8")
    keys = [o.key for o in (*options.TABLE_OPTIONS, *options.PIPELINE_OPTIONS)]
    keys += [f"{prefix}" for prefix, _ in options.TABLE_OPTION_PATTERNS]
    missing = [k for k in keys if not re.search(re.escape(k), text)]
    assert not missing, f"docs/sql.md does not mention: {', '.join(missing)}"


def test_options_of_the_other_role_are_refused_rather_than_ignored():
    err = refused(source("'format' = 'debezium-json', 'merge-engine' = 'aggregation'") + SINK + INSERT)
    assert str(err) == "table 's': option(s) 'merge-engine' are merge options of the sink, and table 's' is read"
    sink = SINK.replace("'upsert-json'", "'upsert-json', 'scan.startup.mode' = 'latest-offset'")
    err = refused(source("'format' = 'debezium-json'") + sink + INSERT)
    assert str(err) == (
        "table 't': option(s) 'scan.startup.mode' are read by a source, and table 't' is the sink"
    )
