"""Kafka client settings: ``--kafka-config FILE`` for the commands and ``properties.*`` table
options, merged by one function, checked by confluent-kafka with errors naming the file or
the table, and reaching the clients (a setting that breaks the connection breaks it)."""

from __future__ import annotations

import pytest
from run_support import unique_topics
from test_run_cli import tidemark_run

from tidemark.engine.pipeline import compile_sql
from tidemark.kafka.config import (
    KafkaConfigError, client_config, read_config_file, table_properties,
)
from tidemark.kafka.transactional import producer_config
from tidemark.spark.source import client_options

SQL = """
CREATE TABLE clicks (k STRING) WITH ('topic' = 'clicks', 'format' = 'json', 'properties.client.id' = 'reader');
CREATE TABLE counts (k STRING, n BIGINT, PRIMARY KEY (k) NOT ENFORCED)
  WITH ('topic' = 'counts', 'format' = 'upsert-json', 'properties.security.protocol' = 'SASL_SSL');
INSERT INTO counts SELECT k, COUNT(*) AS n FROM clicks GROUP BY k;
"""


def test_the_file_and_the_table_settings_reach_each_client(tmp_path, monkeypatch):
    conf = tmp_path / "client.properties"
    conf.write_text("# SASL over TLS\nsecurity.protocol=SASL_SSL\nsasl.mechanism = PLAIN\n"
                    "sasl.username=app\nsasl.password=secret\nclient.id=from-file\n")
    monkeypatch.setenv("TIDEMARK_KAFKA_CONFIG", str(conf))  # what --kafka-config does (use_config_file)
    tables = compile_sql(SQL).tables

    sasl = {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "app",
            "sasl.password": "secret"}
    assert client_config("b:9092") == {"bootstrap.servers": "b:9092", **sasl, "client.id": "from-file"}
    # the source: the file's settings, the table's on top, as the reader's kafka.* options
    assert client_options(tables["clicks"]) == {**{f"kafka.{k}": v for k, v in sasl.items()},
                                                "kafka.client.id": "reader"}
    # the sink's producer keeps the settings its delivery guarantees need
    sink = producer_config("b:9092", table_properties(tables["counts"].options))
    assert sink["security.protocol"] == "SASL_SSL" and sink["client.id"] == "from-file"
    assert sink["enable.idempotence"] is True and sink["acks"] == "all"
    assert table_properties({"properties.bootstrap.servers": "elsewhere:1", "format": "json"}) == {}


@pytest.mark.parametrize(("text", "message"), [
    ("security.protocol=bogus\n", 'Invalid value "bogus" for configuration property "security.protocol"'),
    ("sasl.mechanisms=PLAIN\nno.such.key=1\n", 'No such configuration property: "no.such.key"'),
    ("ok=1\njust words\n", "2: expected key=value, got 'just words\\n'"),
])
def test_a_bad_file_is_an_error_naming_it(tmp_path, text, message):
    path = tmp_path / "bad.properties"
    path.write_text(text)
    with pytest.raises(KafkaConfigError) as err:
        read_config_file(str(path))
    assert str(err.value).startswith(f"--kafka-config {path}")
    assert message in str(err.value)


def test_run_refuses_a_bad_file_and_a_bad_table_property_in_one_line(tmp_path):
    (tmp_path / "bad.properties").write_text("no.such.key=1\n")
    (tmp_path / "counts.sql").write_text(SQL)
    proc = tidemark_run(["counts.sql", "--kafka-config", "bad.properties", "--bootstrap-servers", "127.0.0.1:1"],
                        cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"error: --kafka-config {tmp_path / 'bad.properties'}: "
                                   'No such configuration property: "no.such.key"')

    (tmp_path / "counts.sql").write_text(SQL.replace("'SASL_SSL'", "'SASL_WHAT'"))
    proc = tidemark_run(["counts.sql", "--bootstrap-servers", "127.0.0.1:1"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("error: counts.sql: table 'counts': 'properties.*' options: "
                                   'Invalid value "SASL_WHAT" for configuration property "security.protocol"')


@pytest.mark.integration
def test_run_connects_with_the_file_settings(kafka_bootstrap, tmp_path):
    sql, _ = unique_topics(SQL.replace(", 'properties.security.protocol' = 'SASL_SSL'", ""), "kcfg")
    (tmp_path / "counts.sql").write_text(sql)
    (tmp_path / "tls.properties").write_text("security.protocol=SSL\n")  # the test broker speaks plaintext
    proc = tidemark_run(["counts.sql", "--kafka-config", "tls.properties", "--bootstrap-servers", kafka_bootstrap,
                         "--until-idle"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 5, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"error: no Kafka broker answers at {kafka_bootstrap} (check --bootstrap-servers)"
