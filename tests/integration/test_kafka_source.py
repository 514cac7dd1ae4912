"""The confluent-kafka streaming source on a real Spark session and the session broker:
rate-limited batches, exact re-read of the uncommitted batch after a restart, and
read_committed planning."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer
from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming.datasource import ReadMaxRows
from pyspark.sql.types import StructType

from tidemark.spark.source import (
    FETCH_MAX_BYTES,
    KafkaStreamReader,
    consumer_config,
    plan_limit,
    range_consumer_config,
    read_range,
    read_stream,
)

pytestmark = pytest.mark.integration


def produce(bootstrap: str, topic: str, n: int, partitions: int, start: int = 0) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i in range(start, start + n):
        p.produce(topic, key=str(i).encode(), value=f"v{i}".encode(), partition=i % partitions)
    p.flush()


def run(spark, df, checkpoint: str, on_batch) -> None:
    """Run the query until everything available now is read (or a batch raises)."""
    query = df.writeStream.foreachBatch(on_batch).option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    query.awaitTermination()


def test_plan_limit_shares_the_budget_by_backlog_and_always_progresses():
    start = {"t": {"0": 0, "1": 10, "2": 5}}
    end = {"t": {"0": 100, "1": 20, "2": 5}}
    limited = plan_limit(start, end, 11)
    spans = {p: limited["t"][p] - start["t"][p] for p in limited["t"]}
    assert sum(spans.values()) == 11 and spans["2"] == 0 and spans["0"] > spans["1"] >= 1
    assert plan_limit(start, end, 1000) == end
    assert sum(plan_limit(start, end, 1)["t"][p] - start["t"][p] for p in end["t"]) == 1


def test_a_fetch_is_bounded_unless_a_client_setting_needs_more():
    options = {"bootstrap.servers": "b:9092"}
    assert consumer_config(options)["fetch.max.bytes"] == FETCH_MAX_BYTES
    # librdkafka refuses a consumer whose fetch is smaller than its largest message
    bigger = consumer_config({**options, "kafka.message.max.bytes": "5000000"})
    assert bigger["fetch.max.bytes"] == 5_000_000 and bigger["message.max.bytes"] == "5000000"
    assert consumer_config({**options, "kafka.fetch.max.bytes": "2097152"})["fetch.max.bytes"] == "2097152"


def test_a_range_consumer_queues_no_more_than_its_range():
    conf = consumer_config({"bootstrap.servers": "b:9092"})
    assert range_consumer_config(conf, 22_000)["queued.min.messages"] == 22_000
    assert range_consumer_config(conf, 10**8)["queued.min.messages"] == 100_000  # librdkafka's default
    assert range_consumer_config(conf, 0)["queued.min.messages"] == 1
    mine = {**conf, "queued.min.messages": 7}
    assert range_consumer_config(mine, 22_000)["queued.min.messages"] == 7


@pytest.mark.parametrize("client", [{}, {"kafka.message.max.bytes": "5000000"}])
def test_a_range_in_the_middle_of_a_partition_is_read_exactly(kafka_bootstrap, make_topic, client):
    """Records on both sides of the range, fetches smaller than the range: every record of
    the range once, in offset order, and none outside it."""
    topic = make_topic()
    p = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5, "batch.size": 16_384})
    for i in range(30_000):
        p.produce(topic, value=b"x" * 60 + str(i).encode(), partition=0)
    p.flush()
    conf = consumer_config({"bootstrap.servers": kafka_bootstrap, **client})
    offsets = [record[2] for record in read_range(conf, topic, 0, 5_000, 25_000)]
    assert offsets == list(range(5_000, 25_000))


def test_a_backlog_of_full_batches_is_planned_without_asking_the_broker_again(kafka_bootstrap, make_topic):
    """The reader alone, as Spark's driver calls it: while the end seen last still holds a
    full batch, the next one is planned from it; below a full batch the broker is asked
    again, and records produced meanwhile are planned."""
    topic = make_topic(partitions=2)
    produce(kafka_bootstrap, topic, 100, 2)
    reader = KafkaStreamReader(StructType(), {"topics": topic, "bootstrap.servers": kafka_bootstrap})
    asked: list[dict] = []
    end_of = reader._end
    reader._end = lambda start=None: asked.append(start) or end_of(start)
    limit = ReadMaxRows(30)

    def spans(start: dict) -> tuple[dict, int]:
        end = reader.latestOffset(start, limit)
        return end, sum(end[topic][p] - start.get(topic, {}).get(p, 0) for p in end[topic])

    offset = reader.initialOffset()
    planned = []
    try:
        for _ in range(4):
            offset, n = spans(offset)
            planned.append(n)
        assert planned == [30, 30, 30, 10]
        assert len(asked) == 2  # the first batch and the one that drains the backlog
        produce(kafka_bootstrap, topic, 50, 2, start=100)
        offset, n = spans(offset)
        assert n == 30 and len(asked) == 3  # nothing left of the old end: asked again
        offset, n = spans(offset)
        assert n == 20 and len(asked) == 4
        assert offset[topic] == {"0": 75, "1": 75}
    finally:
        reader.stop()


def test_rate_limited_batches_and_a_restart_rereads_exactly_the_uncommitted_batch(
    spark, kafka_bootstrap, make_topic, checkpoint_dir
):
    topic = make_topic(partitions=3)
    produce(kafka_bootstrap, topic, 90, 3)
    seen: list[tuple[int, list[tuple[int, int, bytes]]]] = []

    def crash_in_batch_1(df, batch_id):
        rows = sorted((r.partition, r.offset, bytes(r.value)) for r in df.collect())
        seen.append((batch_id, rows))
        if batch_id == 1:
            raise RuntimeError("driver dies before batch 1 is committed")

    df = read_stream(spark, topic, kafka_bootstrap, max_records_per_trigger=30)
    with pytest.raises(StreamingQueryException, match="driver dies"):
        run(spark, df, checkpoint_dir, crash_in_batch_1)
    assert [b for b, _ in seen] == [0, 1]
    failed_batch = seen[1][1]

    resumed: list[tuple[int, list[tuple[int, int, bytes]]]] = []
    run(spark, read_stream(spark, topic, kafka_bootstrap, max_records_per_trigger=30), checkpoint_dir,
        lambda df, b: resumed.append((b, sorted((r.partition, r.offset, bytes(r.value)) for r in df.collect()))))

    assert resumed[0] == (1, failed_batch)  # the uncommitted batch, record for record
    committed = seen[0][1] + [r for _, rows in resumed for r in rows]
    assert sorted(v for _, _, v in committed) == sorted(f"v{i}".encode() for i in range(90))
    assert len(committed) == 90  # nothing read twice across committed batches
    assert all(0 < len(rows) <= 30 for _, rows in seen + resumed)
    assert [b for b, _ in resumed] == [1, 2]


def test_only_committed_transactions_are_planned(spark, kafka_bootstrap, make_topic, checkpoint_dir):
    topic = make_topic(partitions=1)
    committed = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"{topic}-a"})
    committed.init_transactions(30)
    committed.begin_transaction()
    for i in range(5):
        committed.produce(topic, value=b"c%d" % i)
    committed.commit_transaction(30)
    pending = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"{topic}-b"})
    pending.init_transactions(30)
    pending.begin_transaction()
    for i in range(3):
        pending.produce(topic, value=b"open%d" % i)
    pending.flush(30)

    values: list[bytes] = []
    rows_of = lambda df, b: values.extend(bytes(r.value) for r in df.collect())  # noqa: E731
    run(spark, read_stream(spark, topic, kafka_bootstrap), checkpoint_dir, rows_of)
    assert values == [b"c0", b"c1", b"c2", b"c3", b"c4"]

    pending.commit_transaction(30)
    run(spark, read_stream(spark, topic, kafka_bootstrap), checkpoint_dir, rows_of)
    assert values[5:] == [b"open0", b"open1", b"open2"]


def test_source_columns_carry_coordinates_and_raw_bytes(spark, kafka_bootstrap, make_topic, checkpoint_dir):
    topic = make_topic(partitions=2)
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    p.produce(topic, key=None, value=b"\xff\x00raw", partition=1, timestamp=1_700_000_000_123)
    p.flush()
    got = []
    run(spark, read_stream(spark, topic, kafka_bootstrap), checkpoint_dir, lambda df, b: got.extend(df.collect()))
    (row,) = got
    assert (row.topic, row.partition, row.offset, row.key, bytes(row.value)) == (topic, 1, 0, None, b"\xff\x00raw")
    assert int(row.timestamp.timestamp() * 1000) == 1_700_000_000_123
