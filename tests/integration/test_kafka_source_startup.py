"""A table's ``scan.startup.mode`` on a real Spark session and the session broker: where a
new query starts reading (``latest-offset``: only what arrives after it starts;
``timestamp``: the first record at or after ``scan.startup.timestamp-millis``), and that a
restarted query resumes from its checkpoint whatever the mode."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from tidemark.engine.pipeline import compile_sql
from tidemark.spark.source import read_stream, startup_options

pytestmark = pytest.mark.integration


def source_table(topic: str, startup: str):
    sql = (
        f"CREATE TABLE s (v STRING) WITH ('topic' = '{topic}', 'format' = 'json', {startup});\n"
        "CREATE TABLE t (v STRING) WITH ('format' = 'json');\n"
        "INSERT INTO t SELECT v FROM s"
    )
    return compile_sql(sql).sources["s"]


def produce(bootstrap: str, topic: str, values: list[str], timestamps: list[int] | None = None, partitions: int = 1):
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i, v in enumerate(values):
        kwargs = {"timestamp": timestamps[i]} if timestamps else {}
        p.produce(topic, value=v.encode(), partition=i % partitions, **kwargs)
    p.flush()


def read_available(spark, table, bootstrap: str, checkpoint: str) -> list[str]:
    """Run the table's source until everything available now is read; the values seen."""
    got: list[str] = []
    df = read_stream(spark, [table.options["topic"]], bootstrap, **startup_options(table))
    query = (
        df.writeStream.foreachBatch(lambda d, _: got.extend(bytes(r.value).decode() for r in d.collect()))
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return sorted(got)


def test_earliest_offset_is_the_default_and_reads_everything(spark, kafka_bootstrap, make_topic, checkpoint_dir):
    topic = make_topic()
    produce(kafka_bootstrap, topic, ["a", "b"])
    table = source_table(topic, "'json.fail-on-missing-field' = 'false'")
    assert startup_options(table) == {"startingOffsets": "earliest"}
    assert read_available(spark, table, kafka_bootstrap, checkpoint_dir) == ["a", "b"]


def test_latest_offset_reads_only_what_arrives_after_the_query_started(
    spark, kafka_bootstrap, make_topic, checkpoint_dir
):
    topic = make_topic(partitions=2)
    produce(kafka_bootstrap, topic, ["old1", "old2", "old3"], partitions=2)
    table = source_table(topic, "'scan.startup.mode' = 'latest-offset'")
    assert read_available(spark, table, kafka_bootstrap, checkpoint_dir) == []
    produce(kafka_bootstrap, topic, ["new1", "new2"], partitions=2)
    # the restart resumes from the checkpoint: the new records, none of the old ones
    assert read_available(spark, table, kafka_bootstrap, checkpoint_dir) == ["new1", "new2"]


def test_timestamp_starts_at_the_first_record_at_or_after_it(spark, kafka_bootstrap, make_topic, checkpoint_dir):
    topic = make_topic(partitions=2)
    base = 1_700_000_000_000
    produce(kafka_bootstrap, topic, ["t0", "t1", "t2", "t3"], [base, base + 1000, base + 2000, base + 3000], partitions=2)
    table = source_table(
        topic, f"'scan.startup.mode' = 'timestamp', 'scan.startup.timestamp-millis' = '{base + 1000}'"
    )
    assert startup_options(table) == {"startingOffsets": "timestamp", "startingTimestamp": str(base + 1000)}
    assert read_available(spark, table, kafka_bootstrap, checkpoint_dir) == ["t1", "t2", "t3"]


def test_a_timestamp_after_every_record_starts_at_the_end(spark, kafka_bootstrap, make_topic, checkpoint_dir):
    topic = make_topic()
    base = 1_700_000_000_000
    produce(kafka_bootstrap, topic, ["early"], [base])
    table = source_table(topic, f"'scan.startup.mode' = 'timestamp', 'scan.startup.timestamp-millis' = '{base + 60_000}'")
    assert read_available(spark, table, kafka_bootstrap, checkpoint_dir) == []
    produce(kafka_bootstrap, topic, ["later"], [base + 120_000])
    assert read_available(spark, table, kafka_bootstrap, checkpoint_dir) == ["later"]


def test_tidemark_run_honours_latest_offset_end_to_end(kafka_bootstrap, tmp_path):
    """The table option reaches the running job: a pipeline started with 'latest-offset'
    never writes the records that were in the topic before it started."""
    from run_support import sink_table, unique_topics
    from test_run_cli import tidemark_run

    from tidemark.kafka.admin import ensure_topics

    sql, topics = unique_topics(
        "CREATE TABLE s (id BIGINT, v STRING, PRIMARY KEY (id) NOT ENFORCED)\n"
        "  WITH ('topic' = 's', 'format' = 'json', 'scan.startup.mode' = 'latest-offset');\n"
        "CREATE TABLE t (id BIGINT, v STRING, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 't', 'format' = 'upsert-json');\n"
        "INSERT INTO t SELECT id, v FROM s;\n",
        "latest",
    )
    (tmp_path / "latest.sql").write_text(sql)
    ensure_topics(kafka_bootstrap, {topics["s"]: 1, topics["t"]: 1})
    produce(kafka_bootstrap, topics["s"], ['{"id": 1, "v": "old"}'])
    args = ["latest.sql", "--bootstrap-servers", kafka_bootstrap, "--until-idle", "--name", f"latest-{topics['s'][-8:]}"]

    first = tidemark_run(args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    produce(kafka_bootstrap, topics["s"], ['{"id": 2, "v": "new"}'])
    second = tidemark_run(args, cwd=tmp_path)  # same name: resumes from the checkpoint
    assert second.returncode == 0, second.stderr

    assert sink_table(kafka_bootstrap, compile_sql(sql)) == {(2,): (2, "new")}
