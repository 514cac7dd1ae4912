"""The Spark host's fused stateless stages and blob encoding on columnar batches, without a
session: a batch that arrives as columns leaves as columns (no ``Change`` tuples built),
and a calc's error still crosses the worker boundary as itself."""

from __future__ import annotations

import datetime

import pyarrow as pa
import pytest
import sqlglot
from sqlglot import exp

from tidemark.engine import batch_columns, batch_ipc
from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change
from tidemark.engine.errors import InputError
from tidemark.engine.expressions import col_ref
from tidemark.engine.sql import Tidemark
from tidemark.engine.stages.calc import Calc
from tidemark.engine.types import make_type
from tidemark.spark.keyed import StageFailure, blob_rows, run_stateless, stage_error_from
from tidemark.spark.query import GuardedStage
from tidemark.spark.source import raw_arrow_schema

NAMES = ["a", "s"]
TYPES = [make_type("BIGINT"), make_type("STRING")]
CHANGES = [Change("+I", (1, "x"), (0, 0, 0, 1)), Change("-U", (1, "x"), (0, 0, 0, 2)), Change("+U", (7, "y"), (0, 0, 0, 2))]
OUT_SCHEMA = pa.schema([("n", pa.int64()), ("u", pa.string())])


def expr(sql: str) -> exp.Expr:
    tree = sqlglot.parse_one(sql, read=Tidemark)
    return tree.transform(lambda n: col_ref(NAMES.index(n.name)) if isinstance(n, exp.Column) else n)


def calc(projections: list[str], predicate: str | None = None) -> Calc:
    return Calc([expr(p) for p in projections], expr(predicate) if predicate else None, NAMES, ["n", "u"],
                input_types=TYPES, output_types=TYPES)


def columnar(changes: list[Change]) -> ChangeBatch:
    schema = pa.schema([("a", pa.int64()), ("s", pa.string())])
    return ChangeBatch.from_table(ChangeBatch.from_changes(changes, schema).table())


@pytest.fixture
def no_changes(monkeypatch):
    """Fails the test if anything converts a batch table to ``Change`` tuples."""

    def refuse(table):
        raise AssertionError("a columnar batch was converted to Change tuples")

    monkeypatch.setattr(batch_columns, "to_changes", refuse)


def test_fused_calc_runs_on_columns_and_agrees_with_the_row_path(no_changes):
    stages = [GuardedStage(calc(["a * 2", "UPPER(s)"], "a > 0"))]
    out = run_stateless(stages, columnar(CHANGES))
    assert out.is_columnar
    rows = blob_rows(out, OUT_SCHEMA, None, 1)
    assert len(rows) == 1
    table = batch_ipc.decode(rows[0][2])
    assert table.schema.names[:2] == ["n", "u"]
    assert table.column("n").to_pylist() == [2, 2, 14]
    assert table.column("u").to_pylist() == ["X", "X", "Y"]
    assert table.column("$kind").to_pylist() == ["+I", "-U", "+U"]


def test_row_path_batch_stays_on_the_row_path():
    out = run_stateless([GuardedStage(calc(["a * 2", "UPPER(s)"], "a > 1"))], ChangeBatch.from_changes(CHANGES))
    assert not out.is_columnar
    assert out.changes() == [Change("+U", (14, "Y"), (0, 0, 0, 2))]


def test_empty_columnar_batch_makes_no_blob(no_changes):
    out = run_stateless([GuardedStage(calc(["a", "s"], "a > 100"))], columnar(CHANGES))
    assert blob_rows(out, OUT_SCHEMA, None, 1) == []


def test_columnar_calc_error_crosses_the_worker_boundary_as_itself():
    bad = Calc([expr("CAST(s AS BIGINT)"), expr("s")], None, NAMES, ["n", "u"], name="calc#3",
               input_types=TYPES, output_types=TYPES)
    with pytest.raises(StageFailure) as info:
        run_stateless([GuardedStage(bad)], columnar(CHANGES))
    error = stage_error_from(info.value)
    assert isinstance(error, InputError)
    assert "calc#3" in str(error)


def test_blob_keeps_the_values_types_when_they_do_not_fit_the_schema(no_changes):
    narrow = pa.schema([("n", pa.int8()), ("u", pa.string())])
    big = ChangeBatch.from_table(ChangeBatch.from_changes([Change("+I", (1000, "x"), ())], OUT_SCHEMA).table())
    table = batch_ipc.decode(blob_rows(big, narrow, None, 1)[0][2])
    assert table.schema.names[:2] == ["n", "u"]
    assert table.column("n").type == pa.int64()
    assert table.column("n").to_pylist() == [1000]


#: the Kafka source's columns (``tidemark.spark.source.SCHEMA``) as the decode pass gets them
RAW_SCHEMA = raw_arrow_schema()


def raw_batch(records: dict) -> pa.RecordBatch:
    """Raw records as the Kafka source hands them to the decode pass: one Arrow batch."""
    return pa.RecordBatch.from_pydict(records, schema=RAW_SCHEMA)


def test_decode_pass_builds_columns_straight_from_the_batch_decoder_and_letters_record_by_record(no_changes):
    import json

    from tidemark.engine.pipeline import compile_sql
    from tidemark.spark.query import split_decoded
    from tidemark.spark.source import decode_columnar, decode_records

    sql = """
    CREATE TABLE s1 (id BIGINT, level BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 'a', 'format' = 'debezium-json');
    CREATE TABLE t1 (id BIGINT, level BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 't', 'format' = 'upsert-json');
    INSERT INTO t1 SELECT id, level FROM s1;
    """
    from tidemark.spark.query import source_tables

    (src,) = source_tables(compile_sql(sql))
    values = [
        json.dumps({"before": {"id": 1, "level": 1}, "after": {"id": 1, "level": 2}, "op": "u"}).encode(),
        b"{nope",
        json.dumps({"before": None, "after": {"id": 2, "level": 3}, "op": "c"}).encode(),
    ]
    stamp = datetime.datetime(2026, 11, 24, 12, 0, tzinfo=datetime.timezone.utc)
    records = {"topic": ["a"] * 3, "partition": [1, 1, 2], "offset": [5, 6, 7], "timestamp": [None, stamp, None],
               "key": [b'{"id": 1}', None, None], "value": values}
    batch, letters = decode_columnar(raw_batch(records), src, 9, {})
    assert batch.is_columnar
    table = batch.table()
    assert table.column("$kind").to_pylist() == ["-U", "+U", "+I"]
    assert [table.column(c).to_pylist() for c in ("$pos0", "$pos1", "$pos2", "$pos3")] == [
        [9, 9, 9], [0, 0, 0], [1, 1, 2], [5, 5, 7]]
    assert table.column(0).to_pylist() == [1, 1, 2] and table.column(1).to_pylist() == [1, 2, 3]
    _, bad = split_decoded(letters)
    _, expected_bad = split_decoded(decode_records(records, {"a": src}, 9, {}))
    assert bad == expected_bad and list(bad) == [("a", 1, 6)]
    assert bad[("a", 1, 6)]["reason"].startswith("s1 @ a/1/6: value: malformed JSON")
    assert bad[("a", 1, 6)]["timestamp"] == stamp


def test_decode_columnar_leaves_per_record_formats_to_the_row_path():
    from tidemark.engine.pipeline import compile_sql
    from tidemark.spark.query import source_tables
    from tidemark.spark.source import decode_columnar

    sql = """
    CREATE TABLE s1 (id BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 'a', 'format' = 'avro');
    CREATE TABLE t1 (id BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 't', 'format' = 'upsert-json');
    INSERT INTO t1 SELECT id FROM s1;
    """
    (src,) = source_tables(compile_sql(sql))
    records = {"topic": ["a"], "partition": [0], "offset": [1], "timestamp": [None], "key": [None], "value": [b"1"]}
    assert decode_columnar(raw_batch(records), src, 1, {}) is None
