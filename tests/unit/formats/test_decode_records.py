"""The Spark source's decode step (Spark-free): records of several topics decoded a batch
per topic, each record's outputs in record order, bad records with today's reason text."""

from __future__ import annotations

import json

from tidemark.engine.catalog import Column, TableDef
from tidemark.engine.types import parse_type
from tidemark.spark.source import SourceTable, decode_records


def table(name: str, fmt: str) -> TableDef:
    cols = [("id", "BIGINT"), ("amount", "DECIMAL(10, 2)")]
    return TableDef(name, [Column(n, parse_type(t)) for n, t in cols], ("id",), {"format": fmt, "topic": name})


def test_records_of_several_topics_decode_in_record_order():
    sources = [SourceTable(table("a", "debezium-json"), 0), SourceTable(table("b", "json"), 1)]
    by_topic = {s.topic: s for s in sources}
    raw = [
        ("a", json.dumps({"op": "u", "before": {"id": 1, "amount": "1"}, "after": {"id": 1, "amount": "2.5"}})),
        ("b", json.dumps({"id": 7, "amount": 3})),
        ("a", '{"op": "c", "after": {"id": "x"}}'),
        ("zzz", "{}"),
        ("b", json.dumps({"id": 8})),
    ]
    records = {
        "topic": [t for t, _ in raw], "partition": [0] * 5, "offset": list(range(10, 15)), "timestamp": [None] * 5,
        "key": [None] * 5, "value": [v.encode() for _, v in raw],
    }
    out = decode_records(records, by_topic, 4, {})
    rows = out["row"]
    assert out["offset"] == [10, 10, 11, 12, 13, 14]
    assert out["kind"] == ["-U", "+U", "+I", None, None, "+I"]
    assert [str(r) if r else None for r in rows] == [
        "(1, Decimal('1.00'))", "(1, Decimal('2.50'))", "(7, Decimal('3.00'))", None, None, "(8, None)",
    ]
    assert out["pos"][:3] == [[4, 0, 0, 10], [4, 0, 0, 10], [4, 1, 0, 11]]
    assert out["error_kind"] == [None, None, None, "wrong_type", "bad_envelope", None]
    assert out["reason"][3] == "a @ a/0/12: after: column 'id': expected BIGINT, got 'x'"
    assert out["reason"][4] == "no source table reads topic 'zzz'"
    assert out["table"] == ["a", "a", "b", "a", None, "b"] and out["format"][2] == "json"
