"""The stored form of a keyed stage's bucket state (``tidemark.engine.state_codec``): typed,
versioned tables for the materializer, normalize and the merge engine, typed by the planner's
column types, in a Parquet file (an Arrow IPC stream where Parquet cannot hold the table); a
stored value of another format is refused naming both formats."""

from __future__ import annotations

import pickle
from datetime import datetime
from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tidemark.engine import state_codec
from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change
from tidemark.engine.driver import Bucket, PerKeyAdapter
from tidemark.engine.pipeline import compile_sql
from tidemark.engine.stage import BatchContext
from tidemark.engine.stages.materializer import CurrentRow, SinkMaterializer
from tidemark.engine.stages.merge.stage import MergeState
from tidemark.engine.stages.merge_engine import build_merge_engine
from tidemark.engine.stages.normalize import Normalize
from tidemark.engine.types import parse_type

SQL = """
CREATE TABLE s1 (id BIGINT, level BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 's1', 'format' = 'upsert-json');
CREATE TABLE s2 (id BIGINT, attr STRING, price DECIMAL(10, 2), PRIMARY KEY (id) NOT ENFORCED)
  WITH ('topic' = 's2', 'format' = 'debezium-json');
CREATE TABLE t1 (id BIGINT, level BIGINT, attr STRING, price DECIMAL(10, 2), PRIMARY KEY (id) NOT ENFORCED)
  WITH ('topic' = 't1', 'format' = 'upsert-json');
INSERT INTO t1 SELECT s1.id, s1.level, s2.attr, s2.price FROM s1 JOIN s2 ON s1.level = s2.id ON CONFLICT DO NOTHING;
"""


def run(stage, bucket: Bucket, changes: list[Change], now_ms: int = 0) -> Bucket:
    bucket, _ = PerKeyAdapter(stage).process_batch([ChangeBatch(changes=changes)], bucket, BatchContext(now_ms=now_ms))
    return bucket


def stored_table(stage, bucket: Bucket) -> pa.Table:
    return state_codec.read_table(state_codec.encode_state(stage, bucket))


def test_the_planner_types_the_materializer_and_normalize_state():
    stages = {n.kind: n.stage for n in compile_sql(SQL).nodes if n.stage is not None and hasattr(n.stage, "state_kind")}
    mat, norm = stages["materializer"], stages["normalize"]
    bucket = run(mat, Bucket(), [Change("+I", (1, 10, "a", Decimal("1.50")), (0, 7))])
    table = stored_table(mat, bucket)
    assert table.schema.metadata[b"tidemark.state.kind"] == b"materializer-current-row"
    assert table.schema.metadata[b"tidemark.state.version"] == b"1"
    assert table.schema.field("row").type == pa.struct(
        [("id", pa.int64()), ("level", pa.int64()), ("attr", pa.string()), ("price", pa.decimal128(10, 2))]
    )
    assert table.column_names == ["row"]  # no touched_ms without a TTL, no dropped copies
    assert state_codec.decode_state(mat, state_codec.encode_state(mat, bucket)).states == {
        (1,): CurrentRow((1, 10, "a", Decimal("1.50")), 0, 0)
    }
    nb = run(norm, Bucket(), [Change("+I", (1, 10), (3,))])
    assert stored_table(norm, nb).schema.field("row").type == pa.struct([("id", pa.int64()), ("level", pa.int64())])
    assert state_codec.decode_state(norm, state_codec.encode_state(norm, nb)).states == {(1,): (1, 10)}


def test_rows_are_stored_by_key_and_dropped_copies_only_where_there_are_some():
    cols = (("id", parse_type("INT")), ("v", parse_type("STRING")))
    mat = SinkMaterializer("t", (0,), ("id",), None, "NOTHING", columns=cols)
    bucket = run(mat, Bucket(), [Change("+I", (k, "x"), (k,)) for k in (3, 1, 2)] + [Change("+I", (2, "x"), (9,))])
    table = stored_table(mat, bucket)
    assert table.column("row").combine_chunks().field(0).to_pylist() == [1, 2, 3]
    assert table.column("dropped").to_pylist() == [0, 1, 0]
    assert state_codec.decode_state(mat, state_codec.encode_state(mat, bucket)).states == bucket.states


def test_ttl_stores_the_touch_time():
    mat = SinkMaterializer("t", (0,), ("id",), (1,), "NOTHING", ttl_ms=1000)
    bucket = run(mat, Bucket(), [Change("+I", (1, 2, "x"), (1,))], now_ms=500)
    assert stored_table(mat, bucket).column("touched_ms").to_pylist() == [500]
    assert state_codec.decode_state(mat, state_codec.encode_state(mat, bucket)).states[(1,)].touched_ms == 500


def test_full_compaction_timers_are_rebuilt_from_the_stored_state():
    types = [parse_type("BIGINT"), parse_type("TIMESTAMP(3)")]
    stage = build_merge_engine(
        "t", ["k", "ts"], (0,), {"changelog-producer": "full-compaction",
                                 "changelog-producer.compaction-interval": "10 s"},
        input_retracts=False, types=types,
    )
    bucket = run(stage, Bucket(), [Change("+I", (1, datetime(2026, 1, 1, 12)), (1,))], now_ms=12_000)
    assert bucket.next_wakeup() == 20_000
    stored = state_codec.encode_state(stage, bucket)
    assert state_codec.format_of(stage) == "merge-engine/1"
    back = state_codec.decode_state(stage, stored)
    assert back.states == bucket.states == {(1,): MergeState((1, datetime(2026, 1, 1, 12)), (1,), None, None, 12_000)}
    assert back.next_wakeup() == 20_000


def test_a_pickled_bucket_is_refused_naming_both_formats():
    stage = Normalize((0,), 2, name="normalize:s1")
    old = b"TMPB1\n" + pickle.dumps({b"(1,)": (1, 10)})  # what the pickled format stored
    with pytest.raises(state_codec.StateFormatError) as err:
        state_codec.decode_state(stage, old)
    assert str(err.value) == (
        "stage 'normalize:s1': the checkpoint holds state in format pickled-bucket/1, this version reads "
        "normalize-last-row/1; start a new checkpoint (or run the version that wrote it)"
    )
    assert err.value.exit_status == 2
    with pytest.raises(state_codec.StateFormatError, match="unversioned pickle"):
        state_codec.decode_state(stage, pickle.dumps({(1,): (1, 10)}))


def test_another_version_of_a_kind_is_refused_naming_both_versions():
    mat = SinkMaterializer("t", (0,), ("id",), None, "DEDUPLICATE", name="materializer:t")
    stored = state_codec.encode_state(mat, run(mat, Bucket(), [Change("+I", (1, 2), (1,))]))
    table = state_codec.read_table(stored)
    meta = {**table.schema.metadata, b"tidemark.state.version": b"0"}
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema.with_metadata(meta)) as writer:
        writer.write_table(table.replace_schema_metadata(meta))
    with pytest.raises(state_codec.StateFormatError, match="format materializer-active-rows/0, this version reads materializer-active-rows/1"):
        state_codec.decode_state(mat, sink.getvalue().to_pybytes())


def test_values_of_a_column_without_an_arrow_type_come_back_as_they_were():
    """A stage built without column types (tests, hand-built stages) stores them pickled."""
    norm = Normalize((0,), 2)
    row = (1, [{"a": 1}, {"a": 2}])
    bucket = run(norm, Bucket(), [Change("+I", row, (1,))])
    assert state_codec.decode_state(norm, state_codec.encode_state(norm, bucket)).states == {(1,): row}


def test_a_key_of_a_nested_type_is_stored_unsorted_and_read_back():
    cols = (("tags", parse_type("ARRAY<STRING>")), ("v", parse_type("INT")))
    mat = SinkMaterializer("t", (0,), ("tags",), None, "NOTHING", columns=cols)
    bucket = run(mat, Bucket(), [Change("+I", (("b",), 1), (1,)), Change("+I", (("a",), 2), (2,))])
    assert state_codec.decode_state(mat, state_codec.encode_state(mat, bucket)).states == bucket.states


def test_a_value_arrow_would_not_give_back_as_it_was_is_stored_pickled():
    """A DECIMAL of another scale than its column's would come back rescaled (a sink writes
    ``1.50`` for ``1.5``); a value of another type would not convert at all."""
    cols = (("id", parse_type("INT")), ("price", parse_type("DECIMAL(10, 2)")), ("n", parse_type("INT")))
    norm = Normalize((0,), 3, columns=cols)
    bucket = run(norm, Bucket(), [Change("+I", (1, Decimal("1.5"), "x"), (1,)), Change("+I", (2, Decimal("2.25"), 3), (1,))])
    back = state_codec.decode_state(norm, state_codec.encode_state(norm, bucket)).states
    assert back == bucket.states
    assert str(back[(1,)][1]) == "1.5" and back[(1,)][2] == "x"


def _parquet_encodings(stored: bytes) -> dict[str, tuple[str, ...]]:
    meta = pq.ParquetFile(pa.BufferReader(stored)).metadata.row_group(0)
    return {meta.column(i).path_in_schema: meta.column(i).encodings for i in range(meta.num_columns)}


def test_a_bucket_is_stored_as_parquet_with_delta_encodings():
    """Sorted keys are small differences, neighbouring strings share prefixes: what the delta
    encodings store in a few bits. A position's fields, interleaved in one list, are not."""
    cols = (("id", parse_type("BIGINT")), ("name", parse_type("STRING")), ("price", parse_type("DECIMAL(10, 2)")),
            ("score", parse_type("DOUBLE")), ("ok", parse_type("BOOLEAN")))
    mat = SinkMaterializer("t", (0,), ("id",), None, "DEDUPLICATE", columns=cols)
    bucket = run(mat, Bucket(), [Change("+I", (k, f"n{k}", Decimal("1.25"), 0.5, True), (k,)) for k in range(50)])
    stored = state_codec.encode_state(mat, bucket)
    assert stored.startswith(b"PAR1")
    back = state_codec.decode_state(mat, stored).states
    assert {k: [(n.row, n.pos) for n in st.in_order()] for k, st in back.items()} == {
        (k,): [((k, f"n{k}", Decimal("1.25"), 0.5, True), (k,))] for k in range(50)
    }
    encodings = _parquet_encodings(stored)
    assert "DELTA_BINARY_PACKED" in encodings["row.id"] and "BYTE_STREAM_SPLIT" in encodings["pos.list.element"]
    assert "DELTA_BYTE_ARRAY" in encodings["row.name"] and "DELTA_BYTE_ARRAY" in encodings["row.price"]
    assert "BYTE_STREAM_SPLIT" in encodings["row.score"]
    assert "PLAIN" in encodings["row.ok"]


def test_strings_that_repeat_are_stored_as_a_dictionary_and_read_back_as_strings():
    """A joined dimension's attribute repeats across sink keys that are not neighbours: a
    dictionary stores each value once. Distinct strings stay delta-encoded."""
    cols = (("id", parse_type("BIGINT")), ("name", parse_type("STRING")), ("attr", parse_type("STRING")))
    mat = SinkMaterializer("t", (0,), ("id",), None, "DEDUPLICATE", columns=cols)
    bucket = run(mat, Bucket(), [Change("+I", (k, f"n{k}", f"a{k * 7 % 5}" if k % 3 else None), (k,)) for k in range(60)])
    stored = state_codec.encode_state(mat, bucket)
    encodings = _parquet_encodings(stored)
    assert "RLE_DICTIONARY" in encodings["row.attr"] and "DELTA_BYTE_ARRAY" not in encodings["row.attr"]
    assert "DELTA_BYTE_ARRAY" in encodings["row.name"] and "RLE_DICTIONARY" not in encodings["row.name"]
    table = state_codec.read_table(stored)
    assert table.schema.field("row").type.field("attr").type == pa.string()
    rows = lambda states: {k: [(n.row, n.pos) for n in st.in_order()] for k, st in states.items()}  # noqa: E731
    assert rows(state_codec.decode_state(mat, stored).states) == rows(bucket.states)


def test_a_table_parquet_cannot_hold_is_stored_as_arrow_ipc_and_both_read_back():
    mat = SinkMaterializer("t", (0,), ("id",), None, "NOTHING", columns=(("id", parse_type("INT")), ("v", parse_type("STRING"))))
    bucket = run(mat, Bucket(), [Change("+I", (1, "x"), (1,)), Change("+I", (2, "y"), (2,))])
    table = stored_table(mat, bucket)
    for unfit in (
        table.append_column("empty", pa.array([{}, {}], pa.struct([]))),  # a struct without fields
        table.append_column("dict", pa.array(["a", "b"]).dictionary_encode()),  # delta cannot decode to it
    ):
        stored = state_codec._table_bytes(unfit)
        assert not stored.startswith(b"PAR1")
        assert state_codec.read_table(stored).equals(unfit)
    ipc = pa.BufferOutputStream()  # what every checkpoint before Parquet holds
    with pa.ipc.new_stream(ipc, table.schema) as writer:
        writer.write_table(table)
    assert state_codec.decode_state(mat, ipc.getvalue().to_pybytes()).states == bucket.states


def test_the_same_table_is_stored_as_the_same_bytes():
    """The materializer writes a bucket's unread rows back unchanged; equal bytes are what
    its partial read is tested against."""
    mat = SinkMaterializer("t", (0,), ("id",), None, "NOTHING", columns=(("id", parse_type("INT")), ("v", parse_type("STRING"))))
    bucket = run(mat, Bucket(), [Change("+I", (k, str(k)), (k,)) for k in range(20)])
    stored = state_codec.encode_state(mat, bucket)
    assert state_codec.encode_state(mat, state_codec.decode_state(mat, stored)) == stored


def test_list_and_map_types_read_back_exactly_as_written():
    """Parquet's reader names a list's items ``element`` and a map's entries after the column;
    a bucket read back must keep Arrow's names, or it would not concatenate with a table
    built in memory (the materializer's partial read) nor store the same bytes."""
    table = pa.table({
        "pos": pa.array([[1, 2], None]),
        "tags": pa.array([{"k": 1}, None], pa.map_(pa.string(), pa.int64())),
        "row": pa.array([{"ids": [1]}, {"ids": None}], pa.struct([("ids", pa.list_(pa.int64()))])),
    }).replace_schema_metadata({"tidemark.state.kind": "k", "tidemark.state.version": "1"})
    stored = state_codec._table_bytes(table)
    back = state_codec.read_table(stored)
    assert str(back.schema) == str(table.schema) and back.equals(table)
    assert state_codec._table_bytes(back) == stored
