"""Flink SQL as pasted, through the real ``tidemark replay``: a comma join with its key and
a non-equi condition in WHERE gives the same changes as the JOIN ... ON it stands for, and
what is still refused is one line naming the construct and where, exit status 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from replaykit import cli, write_jsonl

DDL = """CREATE TABLE s1 (id BIGINT, `level` BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 's1', 'format' = 'debezium-json');
CREATE TABLE s2 (id BIGINT, attr STRING, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 's2', 'format' = 'debezium-json');
CREATE TABLE t1 (id BIGINT, `level` BIGINT, attr STRING, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 't1', 'format' = 'upsert-json');
"""
S1 = [{"kind": "+I", "row": {"id": 1, "level": 10}}, {"kind": "+I", "row": {"id": 2, "level": 20}},
      {"barrier": True},
      {"kind": "-U", "row": {"id": 1, "level": 10}}, {"kind": "+U", "row": {"id": 1, "level": 20}}]
S2 = [{"kind": "+I", "row": {"id": 10, "attr": "a"}}, {"kind": "+I", "row": {"id": 20, "attr": "b"}}]


def test_comma_join_replays_like_join_on(tmp_path: Path):
    inputs = {"s1": write_jsonl(tmp_path / "s1.jsonl", S1), "s2": write_jsonl(tmp_path / "s2.jsonl", S2)}
    comma = tmp_path / "comma.sql"
    comma.write_text(DDL + "INSERT INTO t1 SELECT s1.id, s1.`level`, s2.attr FROM s1, s2 "
                     "WHERE s1.`level` = s2.id AND s1.id * 10 <= s2.id ON CONFLICT DO DEDUPLICATE;\n", encoding="utf-8")
    on = tmp_path / "on.sql"
    on.write_text(DDL + "INSERT INTO t1 SELECT s1.id, s1.`level`, s2.attr FROM s1 JOIN s2 "
                  "ON s1.`level` = s2.id AND s1.id * 10 <= s2.id ON CONFLICT DO DEDUPLICATE;\n", encoding="utf-8")
    a, b = cli(comma, inputs), cli(on, inputs)
    assert a.status == b.status == 0, a.stderr + b.stderr
    assert a.json_lines() == b.json_lines()
    assert [c["row"] for c in a.json_lines() if c["kind"] in ("+I", "+U")][-1] == {"id": 1, "level": 20, "attr": "b"}


@pytest.mark.parametrize(
    "query, message",
    [
        ("INSERT INTO t1 SELECT s1.id, s1.`level`, s2.attr FROM s1, s2", "comma join with s2 has no join condition in WHERE (a cross join)"),
        ("INSERT INTO t1 SELECT id, `level`, attr FROM (SELECT * FROM s1 EXCEPT SELECT id, id, attr FROM s2) u", "EXCEPT is not supported"),
        ("INSERT INTO t1 SELECT id, `level`, 'x' FROM s1 INTERSECT SELECT id, id, attr FROM s2", "INTERSECT is not supported"),
        ("INSERT INTO t1 SELECT s1.id, s1.`level`, s2.attr FROM s1 JOIN s2 FOR SYSTEM_TIME AS OF s1.`level` ON s1.`level` = s2.id",
         "s2 FOR SYSTEM_TIME AS OF ... (a temporal join) is not supported yet on event time"),
        ("INSERT INTO t1 WITH c AS (SELECT * FROM c) SELECT id, `level`, 'x' FROM c", "'c' refers to itself"),
    ],
)
def test_refused_dialect_is_one_line_with_position(tmp_path: Path, query: str, message: str):
    sql = tmp_path / "bad.sql"
    sql.write_text(DDL + query + ";\n", encoding="utf-8")
    r = cli(sql, {"s1": write_jsonl(tmp_path / "s1.jsonl", S1)})
    assert r.status == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "(line 4, column" in lines[0], r.stderr
