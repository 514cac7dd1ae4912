"""The ``tidemark replay`` command's own logic (argument checks, batching, output format,
exit statuses) with a stand-in pipeline, so it is tested apart from the planner and the
stages: the host here copies source changes to the sink unchanged and raises a
ConflictError on a row whose value is "boom". The real pipeline is exercised by
tests/acceptance/."""

from __future__ import annotations

import io
import json
import sys
import types
from collections import Counter
from pathlib import Path

import pytest

from tidemark.cli.replay import run
from tidemark.engine.catalog import Column, TableDef
from tidemark.engine.changelog import Change
from tidemark.engine.errors import ConflictError, SqlError
from tidemark.engine.types import BIGINT, STRING, make_type

SRC = TableDef("src", [Column("k", BIGINT), Column("v", STRING)], ("k",), {"format": "debezium-json"})
SINK = TableDef("snk", [Column("k", BIGINT), Column("v", STRING), Column("d", make_type("DECIMAL", (5, 2)))], ("k",), {"format": "upsert-json"})


class FakePipeline:
    sources = {"src": SRC}
    sink = SINK
    sinks = [types.SimpleNamespace(table=SINK)]
    statement_set = False
    watermark_delays: dict[str, int] = {}  # no event time: no end-of-input batch


class FakeHost:
    def __init__(self, pipeline):
        self.batches: list[dict] = []
        self.rows: dict[tuple, tuple] = {}
        self.metrics: Counter = Counter()

    def run_batch(self, changes_by_table):
        self.batches.append(changes_by_table)
        out = []
        for c in changes_by_table["src"]:
            if c.row[1] == "boom":
                raise ConflictError("snk", {"k": c.row[0]})
            row = (*c.row, "1.50")
            if c.is_add:
                self.rows[(c.row[0],)] = row
            else:
                self.rows.pop((c.row[0],), None)
                self.metrics["retractions_without_state"] += 1
            out.append(Change(c.kind, row, c.pos))
        self.last_changes = {"snk": out}
        return out

    def table(self, sink=None):
        return dict(self.rows)


@pytest.fixture
def fake(monkeypatch):
    hosts: list[FakeHost] = []

    def compile_sql(sql: str):
        if "SELECT" not in sql:
            raise SqlError("not a pipeline", 1, 1)
        return FakePipeline()

    def make_host(p):
        hosts.append(FakeHost(p))
        return hosts[-1]

    monkeypatch.setitem(sys.modules, "tidemark.engine.pipeline", types.SimpleNamespace(compile_sql=compile_sql))
    monkeypatch.setitem(sys.modules, "tidemark.engine.replay", types.SimpleNamespace(ReplayHost=make_host))
    return hosts


def go(tmp_path: Path, lines: list[str], *, inputs=None, sql="INSERT INTO snk SELECT * FROM src", **kw):
    (tmp_path / "p.sql").write_text(sql, encoding="utf-8")
    (tmp_path / "src.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    pairs = inputs if inputs is not None else [f"src={tmp_path / 'src.jsonl'}"]
    status = run(tmp_path / "p.sql", pairs, out=out, err=err, **kw)
    return status, out.getvalue(), err.getvalue()


I1 = '{"kind": "+I", "row": {"k": 1, "v": "a"}}'
I2 = '{"kind": "+I", "row": {"k": 2, "v": "b"}}'
D1 = '{"kind": "-D", "row": {"k": 1, "v": "a"}}'
BAR = '{"barrier": true}'


def test_changelog_output_has_kind_row_by_column_name_and_batch(fake, tmp_path):
    status, out, err = go(tmp_path, [I1, I2, BAR, D1])
    assert status == 0, err
    assert [json.loads(x) for x in out.splitlines()] == [
        {"kind": "+I", "row": {"k": 1, "v": "a", "d": "1.50"}, "batch": 1},
        {"kind": "+I", "row": {"k": 2, "v": "b", "d": "1.50"}, "batch": 1},
        {"kind": "-D", "row": {"k": 1, "v": "a", "d": "1.50"}, "batch": 2},
    ]
    assert err == (
        "replay: 2 batch(es), 3 record(s) in, 3 change(s) out, 0 conflict(s) dropped, "
        "1 retraction(s) without state\n"
    )
    # every source table is passed to the host, with positions = line numbers
    assert [b["src"] for b in fake[0].batches] == [
        [Change("+I", (1, "a"), (1,)), Change("+I", (2, "b"), (2,))],
        [Change("-D", (1, "a"), (4,))],
    ]


def test_record_batching_runs_one_record_per_batch(fake, tmp_path):
    status, out, _ = go(tmp_path, [I1, I2, BAR, D1], batching="record")
    assert status == 0
    assert [json.loads(x)["batch"] for x in out.splitlines()] == [1, 2, 3]


def test_table_output_is_sorted_by_primary_key(fake, tmp_path):
    status, out, _ = go(tmp_path, [I2, I1], emit="table")
    assert status == 0
    assert out.splitlines() == ['{"k": 1, "v": "a", "d": "1.50"}', '{"k": 2, "v": "b", "d": "1.50"}']


def test_conflict_error_exits_3_after_printing_earlier_batches(fake, tmp_path):
    boom = '{"kind": "+I", "row": {"k": 3, "v": "boom"}}'
    status, out, err = go(tmp_path, [I1, BAR, boom])
    assert status == 3
    assert len(out.splitlines()) == 1
    assert err == "ON CONFLICT DO ERROR: table 'snk' received two active rows with different upsert keys for primary key (k=3)\n"


def test_input_errors_exit_2_before_any_batch_runs(fake, tmp_path):
    status, out, err = go(tmp_path, [I1, BAR, '{"kind": "+I", "row": {"k": "x", "v": "a"}}'])
    assert status == 2
    assert out == "" and not fake[0:1]  # no host was even built
    assert err.endswith("src.jsonl:3: column 'k': expected BIGINT, got 'x'\n")


def test_sql_error_exits_2(fake, tmp_path):
    status, out, err = go(tmp_path, [I1], sql="nonsense")
    assert (status, out, err) == (2, "", "not a pipeline (line 1, column 1)\n")


def test_input_table_names_match_case_insensitively(fake, tmp_path):
    status, _, err = go(tmp_path, [I1], inputs=[f"SRC={tmp_path / 'src.jsonl'}"])
    assert status == 0, err


def test_a_table_given_twice_is_an_error(fake, tmp_path):
    p = tmp_path / "src.jsonl"
    status, _, err = go(tmp_path, [I1], inputs=[f"src={p}", f"src={p}"])
    assert status == 2
    assert err == f"--input 'src={p}': table 'src' already has an input ({p})\n"
