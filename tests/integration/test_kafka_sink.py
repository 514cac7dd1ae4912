"""Kafka sinks and the dead-letter topic on a real Spark session and the session broker:
replaying a batch leaves the upsert table unchanged and writes no changelog record twice;
bad records land in <pipeline>.dlq with their bytes and reason, exactly once."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from confluent_kafka import Producer
from pyspark.errors import StreamingQueryException

from tidemark.engine.batch import ChangeBatch
from tidemark.engine.catalog import Column, TableDef
from tidemark.engine.changelog import Change
from tidemark.engine.types import parse_type
from tidemark.formats import dead_letter, decoder_for
from tidemark.kafka.read import materialize_upsert, read_topic
from tidemark.kafka.transactional import read_exactly_once
from tidemark.spark.keyed import BLOB_SCHEMA, encode_changes
from tidemark.engine.kernels.upsert import net_upsert
from tidemark.kafka.transactional import SinkWriteError
from tidemark.spark.sink import ChangelogSink, DeadLetterSink, UpsertSink
from tidemark.spark.source import SourceTable, bad_records, decode_row, decode_stream, good_changes, read_stream

pytestmark = pytest.mark.integration


def t1(fmt: str, topic: str) -> TableDef:
    cols = [("id", "BIGINT"), ("level", "BIGINT"), ("attr", "STRING")]
    return TableDef("t1", [Column(n, parse_type(t)) for n, t in cols], ("id",), {"format": fmt, "topic": topic})


def frame(spark, changes: list[Change]):
    """The changes as the sink receives them: blobs, here three (a batch spans several rows)."""
    thirds = [changes[i::3] for i in range(3)]
    return spark.createDataFrame([(0, 0, encode_changes(cs)) for cs in thirds if cs], BLOB_SCHEMA)


# ---------------------------------------------------------------- consolidation (no Spark)

def test_net_upsert_is_order_free_and_follows_source_position():
    a1, a2 = (1, 1, "a1"), (1, 1, "a2")
    # the DESIGN example: the pair on a1 cancels, a2 stays
    assert net_upsert([Change("+I", a1, (1,)), Change("+U", a2, (2,)), Change("-U", a1, (2,))]) == Change("+U", a2, (2,))
    assert net_upsert([Change("-U", a1, (2,)), Change("+U", a2, (2,)), Change("+I", a1, (1,))]) == Change("+U", a2, (2,))
    # retraction before add at one position; a later retraction deletes
    assert net_upsert([Change("+U", a2, (3,)), Change("-U", a1, (3,))]) == Change("+U", a2, (3,))
    assert net_upsert([Change("-D", a1, (4,))]) == Change("-D", a1, (4,))
    assert net_upsert([Change("+I", a1, (1,)), Change("-D", a1, (2,))]) is None


# ---------------------------------------------------------------- upsert sink

SEED_BATCH = [  # the seed's s1/s2 join result, disordered inside one batch
    Change("+I", (1, 10, "a1"), (0, 0, 0, 0)),
    Change("-U", (1, 10, "a1"), (0, 0, 0, 1)),
    Change("+U", (1, 20, "b1"), (0, 0, 0, 1)),
    Change("+I", (2, 5, "x"), (0, 1, 1, 0)),
    Change("-D", (2, 5, "x"), (0, 1, 1, 3)),
    Change("+I", (3, 7, "y"), (0, 1, 0, 4)),
]


def decoded_table(bootstrap: str, table: TableDef) -> dict:
    dec = decoder_for(table)
    out = {}
    for key, value in materialize_upsert(read_topic(bootstrap, table.options["topic"])).items():
        (c,) = dec.decode(key, value)
        out[c.row[0]] = c.row
    return out


def test_upsert_sink_replay_leaves_the_materialized_table_unchanged(spark, kafka_bootstrap, make_topic):
    topic = make_topic(partitions=2, compacted=True)
    table = t1("upsert-json", topic)
    sink = UpsertSink(kafka_bootstrap, table)
    # id 1: the a1 pair cancels, b1 stays; id 2: +I/-D of one row cancel, nothing written
    assert sink.write_batch(frame(spark, SEED_BATCH), 0) == 2
    first = decoded_table(kafka_bootstrap, table)
    assert first == {1: (1, 20, "b1"), 3: (3, 7, "y")}

    # the driver died before Spark committed batch 0: a new sink replays it, rows reshuffled
    replay = UpsertSink(kafka_bootstrap, table)
    replay.write_batch(frame(spark, list(reversed(SEED_BATCH))).repartition(3), 0)
    assert decoded_table(kafka_bootstrap, table) == first

    replay.write_batch(frame(spark, [Change("-D", (3, 7, "y"), (1, 0, 0, 9))]), 1)
    assert decoded_table(kafka_bootstrap, table) == {1: (1, 20, "b1")}
    records = read_topic(kafka_bootstrap, topic)
    assert b'{"id":2}' not in {r.key for r in records}
    assert [r.value for r in records if r.key == b'{"id":3}'][-1] is None  # tombstone
    # an update pair becomes one record: the -U half is never written
    replay.write_batch(frame(spark, [Change("-U", (1, 20, "b1"), (2, 0, 0, 1)), Change("+U", (1, 30, "c1"), (2, 0, 0, 1))]), 2)
    assert [json.loads(r.value)["level"] for r in read_topic(kafka_bootstrap, topic) if r.key == b'{"id":1}'][-2:] == [20, 30]


def test_a_record_not_delivered_fails_the_upsert_write_naming_the_sink_and_why():
    # nothing listens on the port: every record's delivery times out, and the producer, which
    # reports failed deliveries only, must still report those
    producer = UpsertSink("127.0.0.1:9", t1("upsert-json", "nowhere")).producer()
    producer.conf["message.timeout.ms"] = 500
    with pytest.raises(SinkWriteError, match=r"upsert sink 'nowhere': .*timed out"):
        producer.write(ChangeBatch.from_changes(SEED_BATCH))


def _stages_of(spark, group: str, write) -> int:
    """The Spark stages the jobs of ``write()`` ran (its job group ``group``)."""
    sc = spark.sparkContext
    sc.setJobGroup(group, group)
    try:
        write()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    tracker = sc.statusTracker()
    return sum(len(tracker.getJobInfo(j).stageIds) for j in tracker.getJobIdsForGroup(group))


def test_a_frame_keyed_by_the_pk_is_produced_without_a_shuffle_and_gives_the_same_table(
        spark, kafka_bootstrap, make_topic):
    # every change of one id in one blob, and each blob's partition chosen by its id: what a
    # keyed stage on the sink PK hands the sink (``query.keyed_by_sink_pk``)
    by_id: dict[int, list[Change]] = {}
    for c in SEED_BATCH:
        by_id.setdefault(c.row[0], []).append(c)
    keyed = spark.createDataFrame([(k, 0, encode_changes(cs)) for k, cs in by_id.items()], BLOB_SCHEMA)
    keyed = keyed.repartition(2, "bucket")
    tables, stages = [], []
    for flag in (False, True):
        table = t1("upsert-json", make_topic(partitions=2, compacted=True))
        sink = UpsertSink(kafka_bootstrap, table)
        stages.append(_stages_of(spark, f"keyed-{flag}", lambda: sink.write_batch(keyed, 0, keyed=flag)))
        tables.append(decoded_table(kafka_bootstrap, table))
    assert tables[0] == tables[1] == {1: (1, 20, "b1"), 3: (3, 7, "y")}
    # the frame's own shuffle is one stage; the unkeyed write adds its split-and-shuffle stage
    assert stages[1] < stages[0], stages


# ---------------------------------------------------------------- changelog sink

def test_changelog_sink_writes_each_batch_once_in_source_position_order(spark, kafka_bootstrap, make_topic):
    topic = make_topic(partitions=1)
    table = t1("changelog-json", topic)
    writer_id = f"{topic}.t1"
    sink = ChangelogSink(kafka_bootstrap, table, writer_id)
    assert sink.write_batch(frame(spark, SEED_BATCH).repartition(3), 0).written == 6
    later = [Change("-U", (1, 20, "b1"), (1, 0, 0, 0)), Change("+U", (1, 30, "c1"), (1, 0, 0, 0))]
    sink.write_batch(frame(spark, later), 1)
    sink.close()

    restarted = ChangelogSink(kafka_bootstrap, table, writer_id)
    assert restarted.write_batch(frame(spark, later), 1).skipped  # replayed batch 1
    assert restarted.metrics["batches_skipped"] == 1

    dec = decoder_for(table)
    for records in (read_topic(kafka_bootstrap, topic), read_exactly_once(kafka_bootstrap, topic, writer_id)):
        got = [dec.decode(r.key, r.value)[0] for r in records]
        assert [(c.kind, c.row) for c in got] == [
            ("+I", (1, 10, "a1")),
            ("-U", (1, 10, "a1")),
            ("+U", (1, 20, "b1")),
            ("+I", (3, 7, "y")),  # pos (0, 1, 0, 4) sorts before (0, 1, 1, 0)
            ("+I", (2, 5, "x")),
            ("-D", (2, 5, "x")),
            ("-U", (1, 20, "b1")),
            ("+U", (1, 30, "c1")),
        ]


# ---------------------------------------------------------------- dead letters

def s1(topic: str) -> TableDef:
    cols = [("id", "BIGINT"), ("level", "BIGINT")]
    return TableDef("s1", [Column(n, parse_type(t)) for n, t in cols], ("id",), {"format": "debezium-json", "topic": topic})


BAD = {
    "undecodable": b"\xff{not json",
    "missing_pk": json.dumps({"op": "c", "after": {"level": 1}}).encode(),
    "wrong_type": json.dumps({"op": "c", "after": {"id": "seven", "level": 1}}).encode(),
    "unknown_op": json.dumps({"op": "z", "after": {"id": 9, "level": 1}}).encode(),
}


def test_bad_records_go_to_the_dead_letter_topic_exactly_once_and_good_ones_flow(
    spark, kafka_bootstrap, make_topic, checkpoint_dir
):
    topic = make_topic("s1", partitions=2)
    pipeline = topic.replace("-s1-", "-p-")
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    expected_bad = {}
    for i in range(12):
        kind = list(BAD)[i % 4] if i % 3 == 1 else None
        value = BAD[kind] if kind else json.dumps({"op": "c", "after": {"id": i, "level": i * 10}}).encode()
        p.produce(topic, key=b"k%d" % i, value=value, partition=i % 2)
        p.flush()
        if kind:
            expected_bad[(i % 2, b"k%d" % i)] = (kind, value)
    assert set(k for k, _ in expected_bad.values()) == set(BAD)

    good: list[Change] = []
    sinks = [DeadLetterSink(kafka_bootstrap, pipeline)]
    crash = {"armed": True}

    def on_batch(df, batch_id):
        df.persist()
        sinks[-1].write_batch(bad_records(df), batch_id)
        if crash.pop("armed", False):
            raise RuntimeError("crash after the dead letters of the batch were written")
        good.extend(Change(r.kind, decode_row(r.row), tuple(r.pos)) for r in good_changes(df, "s1").collect())
        df.unpersist()

    def run():
        decoded = decode_stream(read_stream(spark, topic, kafka_bootstrap, max_records_per_trigger=8), [SourceTable(s1(topic), 0)])
        q = decoded.writeStream.foreachBatch(on_batch).option("checkpointLocation", checkpoint_dir).trigger(availableNow=True).start()
        q.awaitTermination()

    with pytest.raises(StreamingQueryException, match="crash after the dead letters"):
        run()
    sinks.append(DeadLetterSink(kafka_bootstrap, pipeline))  # the restarted driver's writer
    run()

    assert sorted(c.row for c in good) == sorted((i, i * 10) for i in range(12) if i % 3 != 1)
    assert all(c.kind == "+I" and c.pos[1] == 0 for c in good)
    records = read_topic(kafka_bootstrap, dead_letter.dlq_topic(pipeline))
    letters = [dead_letter.decode(r.value) for r in records]
    assert len(letters) == len(expected_bad)  # the replayed batch added no second copy
    for r, d in zip(records, letters):
        kind, value = expected_bad[(d.source_partition, d.key)]
        assert (d.error_kind, d.value, d.source_topic, d.table, d.format) == (kind, value, topic, "s1", "debezium-json")
        assert r.key == f"{topic}/{d.source_partition}/{d.source_offset}".encode()
        assert d.reason.startswith(f"s1 @ {topic}/{d.source_partition}/{d.source_offset}: ")
    counted = sum((s.metrics for s in sinks), start=Counter())
    assert counted["dlq_records"] == len(expected_bad)
    assert {k: counted[f"dlq_records.{k}"] for k in BAD} == {
        k: sum(1 for kind, _ in expected_bad.values() if kind == k) for k in BAD
    }
