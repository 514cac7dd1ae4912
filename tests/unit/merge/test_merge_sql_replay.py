"""``collect``, ``merge_map`` and ``nested_update`` from SQL, through ``tidemark replay``: the
composite column types (ARRAY, MAP, ROW) carry the values from JSON Lines input through the
merge engine to JSON output."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from tidemark.cli.main import app

runner = CliRunner()


def replay(tmp_path: Path, sql: str, lines: list[dict | str], *flags: str) -> list[dict]:
    (tmp_path / "p.sql").write_text(sql)
    (tmp_path / "src.jsonl").write_text(
        "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    result = runner.invoke(app, ["replay", str(tmp_path / "p.sql"), "--input",
                                 f"src={tmp_path / 'src.jsonl'}", *flags])
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


BARRIER = '{"barrier": true}'


def rec(kind: str, **row) -> dict:
    return {"kind": kind, "row": row}


COLLECT = """
CREATE TABLE src (k BIGINT, tags ARRAY<STRING>, uniq ARRAY<INT>) WITH ('format' = 'changelog-json');
CREATE TABLE dst (k BIGINT, tags ARRAY<STRING>, uniq ARRAY<INT>, PRIMARY KEY (k) NOT ENFORCED)
  WITH ('format' = 'changelog-json', 'merge-engine' = 'aggregation',
        'fields.tags.aggregate-function' = 'collect',
        'fields.uniq.aggregate-function' = 'collect', 'fields.uniq.distinct' = 'true',
        'changelog-producer' = 'lookup');
INSERT INTO dst SELECT k, tags, uniq FROM src;
"""


def test_collect_through_replay(tmp_path):
    out = replay(tmp_path, COLLECT, [
        rec("+I", k=1, tags=["a"], uniq=[1, 2]),
        BARRIER,
        rec("+I", k=1, tags=["b", "a"], uniq=[2, 3]),
        rec("+I", k=2, tags=None, uniq=[]),
        BARRIER,
        rec("-U", k=1, tags=["a"], uniq=[1, 2]),  # removes one occurrence per element
    ])
    assert [(o["kind"], o["row"], o["batch"]) for o in out] == [
        ("+I", {"k": 1, "tags": ["a"], "uniq": [1, 2]}, 1),
        ("-U", {"k": 1, "tags": ["a"], "uniq": [1, 2]}, 2),
        ("+U", {"k": 1, "tags": ["a", "b", "a"], "uniq": [1, 2, 3]}, 2),
        ("+I", {"k": 2, "tags": None, "uniq": []}, 2),
        ("-U", {"k": 1, "tags": ["a", "b", "a"], "uniq": [1, 2, 3]}, 3),
        ("+U", {"k": 1, "tags": ["b", "a"], "uniq": [3]}, 3),
    ]


MERGE_MAP = """
CREATE TABLE src (k BIGINT, attrs MAP<STRING, BIGINT>, byid MAP<INT, STRING>) WITH ('format' = 'json');
CREATE TABLE dst (k BIGINT, attrs MAP<STRING, BIGINT>, byid MAP<INT, STRING>, PRIMARY KEY (k) NOT ENFORCED)
  WITH ('format' = 'upsert-json', 'merge-engine' = 'aggregation',
        'fields.default-aggregate-function' = 'merge_map');
INSERT INTO dst SELECT k, attrs, byid FROM src;
"""


def test_merge_map_through_replay(tmp_path):
    lines = [
        rec("+I", k=1, attrs={"b": 2, "a": 1}, byid={"10": "x"}),
        BARRIER,
        rec("+I", k=1, attrs={"b": 20, "c": 3}, byid=[[2, "y"]]),  # pairs are a map too
        BARRIER,
        rec("+I", k=1, attrs=None, byid={"2": "z"}),
    ]
    out = replay(tmp_path, MERGE_MAP, lines)
    assert [(o["kind"], o["row"]) for o in out] == [
        ("+I", {"k": 1, "attrs": {"a": 1, "b": 2}, "byid": {"10": "x"}}),
        ("+U", {"k": 1, "attrs": {"a": 1, "b": 20, "c": 3}, "byid": {"2": "y", "10": "x"}}),
        ("+U", {"k": 1, "attrs": {"a": 1, "b": 20, "c": 3}, "byid": {"2": "z", "10": "x"}}),
    ]
    # one batch or three: the same merged table
    table = replay(tmp_path, MERGE_MAP, [line for line in lines if line != BARRIER], "--emit", "table")
    assert table == [{"k": 1, "attrs": {"a": 1, "b": 20, "c": 3}, "byid": {"2": "z", "10": "x"}}]


def test_merge_map_bad_key_is_an_input_error_naming_line_and_column(tmp_path):
    (tmp_path / "p.sql").write_text(MERGE_MAP)
    (tmp_path / "src.jsonl").write_text(json.dumps(rec("+I", k=1, attrs={}, byid={"ten": "x"})) + "\n")
    result = runner.invoke(app, ["replay", str(tmp_path / "p.sql"), "--input", f"src={tmp_path / 'src.jsonl'}"])
    assert result.exit_code == 2
    assert "src.jsonl:1: column 'byid': MAP<INT, STRING> key 'ten': expected INT, got 'ten'" in result.stderr
    assert "Traceback" not in result.stderr


NESTED = """
CREATE TABLE src (order_id BIGINT, user_name STRING,
  sub_orders ARRAY<ROW<sub_order_id BIGINT, product_name STRING, price BIGINT>>) WITH ('format' = 'json');
CREATE TABLE orders (order_id BIGINT, user_name STRING,
  sub_orders ARRAY<ROW<sub_order_id BIGINT, product_name STRING, price BIGINT>>,
  PRIMARY KEY (order_id) NOT ENFORCED)
  WITH ('format' = 'upsert-json', 'merge-engine' = 'aggregation',
        'fields.sub_orders.aggregate-function' = 'nested_update',
        'fields.sub_orders.nested-key' = 'sub_order_id');
INSERT INTO orders SELECT order_id, user_name, sub_orders FROM src;
"""


def test_nested_update_through_replay_the_seed_example(tmp_path):
    table = replay(tmp_path, NESTED, [
        rec("+I", order_id=1, user_name="alice", sub_orders=None),
        rec("+I", order_id=1, user_name=None, sub_orders=[{"sub_order_id": 1, "product_name": "pen", "price": 2}]),
        rec("+I", order_id=1, user_name=None, sub_orders=[{"sub_order_id": 2, "product_name": "ink", "price": 5}]),
        rec("+I", order_id=1, user_name=None, sub_orders=[{"sub_order_id": 1, "product_name": "pen", "price": 3}]),
    ], "--emit", "table")
    assert table == [{"order_id": 1, "user_name": "alice", "sub_orders": [
        {"sub_order_id": 1, "product_name": "pen", "price": 3},
        {"sub_order_id": 2, "product_name": "ink", "price": 5},
    ]}]
