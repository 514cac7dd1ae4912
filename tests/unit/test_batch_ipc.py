"""Change batches as Arrow IPC bytes: what goes in comes out, typed by the planner's types."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest

from tidemark.engine import batch_ipc
from tidemark.engine.changelog import Change
from tidemark.engine.types import make_type

TYPES = [make_type("BIGINT"), make_type("STRING"), make_type("DECIMAL", (10, 2)), make_type("TIMESTAMP")]
COLUMNS = ["id", "name", "price", "at"]


def changes() -> list[Change]:
    t = dt.datetime(2026, 11, 24, 3, 45, 1, 250000)
    return [
        Change("+I", (1, "a", Decimal("1.50"), t), (7, 0, 0, 12)),
        Change("-U", (1, "a", Decimal("1.50"), t), (7, 0, 0, 13)),
        Change("+U", (1, None, None, None), (7, 0, 0, 13)),
        Change("-D", (2, "b\n\"", Decimal("-0.01"), t), ()),
    ]


def test_changes_round_trip_with_the_planners_types() -> None:
    schema = batch_ipc.schema_of(COLUMNS, TYPES)
    blob = batch_ipc.encode(batch_ipc.table_of(changes(), schema))
    table = batch_ipc.decode(blob)
    assert table.schema.names[:4] == COLUMNS
    assert table.schema.field("price").type == pa.decimal128(10, 2)
    assert table.schema.field("at").type == pa.timestamp("us")
    assert batch_ipc.decode_batch([blob]).changes() == changes()


def test_a_planner_name_for_an_expression_is_not_taken_for_a_bookkeeping_column() -> None:
    # an aggregate's FILTER flags and DISTINCT arguments are unnamed expressions ("$f1")
    schema = batch_ipc.schema_of(["$f0", "name", "$f2", "at"], TYPES)
    blob = batch_ipc.encode(batch_ipc.table_of(changes(), schema))
    assert batch_ipc.decode(blob).schema.names[:4] == ["_0", "name", "_2", "at"]
    assert batch_ipc.decode_batch([blob]).changes() == changes()


def test_unknown_type_or_values_that_do_not_fit_are_typed_by_the_values() -> None:
    assert batch_ipc.schema_of(COLUMNS, [*TYPES[:3], None]) is None
    wide = [Change("+I", (2**40, "x"), (1,))]  # a BIGINT value in a column planned as INT
    schema = batch_ipc.schema_of(["n", "s"], [make_type("INT"), make_type("STRING")])
    table = batch_ipc.table_of(wide, schema)
    assert table.column_names[:2] == ["n", "s"]
    assert batch_ipc.decode_batch([batch_ipc.encode(table)]).changes() == wide


def test_blobs_of_one_node_concatenate_in_order_even_when_inferred_types_differ() -> None:
    first = [Change("+I", (1, None), (1,))]  # the second column is all null here
    second = [Change("+I", (2, "x"), (2,)), Change("-D", (1, None), (3,))]
    blobs = [batch_ipc.encode(batch_ipc.table_of(cs, None)) for cs in (first, second)]
    assert batch_ipc.decode_batch(blobs).changes() == first + second


def test_split_keeps_each_buckets_rows_in_order() -> None:
    cs = changes()
    table = batch_ipc.table_of(cs, batch_ipc.schema_of(COLUMNS, TYPES))
    parts = batch_ipc.split(table, [3, 0, 3, 0])
    assert sorted(parts) == [0, 3]
    assert batch_ipc.decode_batch([batch_ipc.encode(parts[3])]).changes() == [cs[0], cs[2]]
    assert batch_ipc.decode_batch([batch_ipc.encode(parts[0])]).changes() == [cs[1], cs[3]]
    with pytest.raises(ValueError, match="2 buckets for a table of 4 rows"):
        batch_ipc.split(table, [0, 1])


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x80\x04pickled", "not an Arrow IPC stream"),
        (None, "in format none, expected change-batch/1"),
    ],
)
def test_foreign_bytes_are_refused_naming_what_they_are(data: bytes | None, message: str) -> None:
    if data is None:  # an Arrow stream, but not a change batch
        sink = pa.BufferOutputStream()
        table = pa.table({"x": [1]})
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        data = sink.getvalue().to_pybytes()
    with pytest.raises(batch_ipc.BatchFormatError, match=message):
        batch_ipc.decode(data)
