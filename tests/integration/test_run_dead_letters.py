"""Bad input never stops the pipeline and is never lost: every kind of bad record goes to
``<pipeline>.dlq`` with its original bytes, source coordinates and the reason, and the
good records around it are processed as if it were not there."""

from __future__ import annotations

import json

import pytest
from run_support import produce, replay_reference, sink_table, unique_topics

from tidemark.engine.pipeline import compile_sql
from tidemark.formats import dead_letter
from tidemark.kafka.admin import ensure_topics
from tidemark.kafka.transactional import read_exactly_once
from tidemark.spark.job import run_pipeline

pytestmark = pytest.mark.integration

SQL = """
CREATE TABLE s1 (id BIGINT, level BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('topic' = 's1', 'format' = 'debezium-json');
CREATE TABLE s2 (id BIGINT, attr STRING, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('topic' = 's2', 'format' = 'upsert-json');
CREATE TABLE t1 (id BIGINT, level BIGINT, attr STRING, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('topic' = 't1', 'format' = 'upsert-json');
INSERT INTO t1 SELECT s1.id, s1.level, s2.attr FROM s1 JOIN s2 ON s1.level = s2.id
  ON CONFLICT DO DEDUPLICATE;
"""


def dbz(op: str, before: dict | None, after: dict | None) -> bytes:
    return json.dumps({"before": before, "after": after, "op": op}).encode()


def k(id_: int) -> bytes:
    return json.dumps({"id": id_}).encode()


#: (topic, key, value, error kind or None for a good record), in produce order
def records(s1: str, s2: str) -> list[tuple[str, bytes | None, bytes | None, str | None]]:
    return [
        (s2, k(10), json.dumps({"id": 10, "attr": "a1"}).encode(), None),
        (s2, None, None, "missing_pk"),  # an upsert tombstone without a key
        (s2, k(20), json.dumps({"id": 20, "attr": "b1"}).encode(), None),
        (s2, k(30), json.dumps({"id": "thirty", "attr": "c1"}).encode(), "wrong_type"),
        (s1, k(1), dbz("c", None, {"id": 1, "level": 10}), None),
        (s1, k(2), b'{"before": null, "after": {"id": 2, "level": ', "undecodable"),  # cut-off JSON
        (s1, k(3), dbz("c", None, {"level": 20}), "missing_pk"),
        (s1, k(4), dbz("c", None, {"id": 4, "level": "high"}), "wrong_type"),
        (s1, k(5), dbz("x", None, {"id": 5, "level": 20}), "unknown_op"),
        (s1, k(6), b"\xff\xfe not utf-8", "undecodable"),
        (s1, k(1), dbz("u", {"id": 1, "level": 10}, {"id": 1, "level": 20}), None),
        (s1, k(7), dbz("c", None, {"id": 7, "level": 10}), None),
    ]


def test_every_kind_of_bad_record_goes_to_the_dlq_and_the_good_ones_through(spark, kafka_bootstrap, tmp_path):
    sql, topics = unique_topics(SQL, "dlq")
    pipeline = compile_sql(sql)
    s1, s2 = topics["s1"], topics["s2"]
    ensure_topics(kafka_bootstrap, {s1: 1, s2: 1})
    recs = records(s1, s2)
    for topic in (s2, s1):
        produce(kafka_bootstrap, topic, [(key, value) for t, key, value, _ in recs if t == topic])
    name = f"dlq-{s1[-8:]}"
    result = run_pipeline(spark, pipeline, kafka_bootstrap, str(tmp_path / "checkpoint"), name=name)

    # the good records are processed as if the bad ones were not there
    expected = {(1,): (1, 20, "b1"), (7,): (7, 10, "a1")}
    assert sink_table(kafka_bootstrap, pipeline) == expected
    assert replay_reference(kafka_bootstrap, pipeline, result.reports).table() == expected

    # every bad record, exactly once, with its bytes, coordinates and reason
    letters = [dead_letter.decode(r.value) for r in read_exactly_once(kafka_bootstrap, f"{name}.dlq", result.dlq_writer_id)]
    offsets = {topic: 0 for topic in (s1, s2)}
    want = []
    for topic, key, value, kind in recs:
        if kind is not None:
            want.append((topic, offsets[topic], key, value, kind))
        offsets[topic] += 1
    got = sorted((d.source_topic, d.source_offset, d.key, d.value, d.error_kind) for d in letters)
    assert got == sorted(want)
    by_offset = {(d.source_topic, d.source_offset): d for d in letters}
    assert "malformed JSON" in by_offset[(s1, 1)].reason
    assert "missing primary key column 'id'" in by_offset[(s1, 2)].reason
    assert "column 'level'" in by_offset[(s1, 3)].reason
    assert "unknown Debezium op 'x'" in by_offset[(s1, 4)].reason
    assert "malformed JSON" in by_offset[(s1, 5)].reason  # bytes that are not JSON text at all
    assert "without a key" in by_offset[(s2, 1)].reason
    assert "column 'id'" in by_offset[(s2, 3)].reason
    for d in letters:
        assert d.pipeline == name and d.table == ("s1" if d.source_topic == s1 else "s2")
        assert d.reason.startswith(f"{d.table} @ {d.source_topic}/0/{d.source_offset}: ")
        assert d.source_partition == 0 and d.batch_id == 0
    # counted per batch, and the records read include the bad ones
    assert result.dlq == len(want) == 7
    assert result.rows_in == len(recs)

