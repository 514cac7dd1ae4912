"""Replay input reading: validation per changelog mode, ordering, positions, batching."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from tidemark.engine.catalog import Column, TableDef
from tidemark.engine.changelog import Change
from tidemark.engine.errors import InputError
from tidemark.engine.records import (
    MAX_ERRORS,
    InputErrors,
    InputSpec,
    batch_by_table,
    batches,
    read_inputs,
)
from tidemark.engine.types import BIGINT, STRING, make_type

S1 = TableDef("s1", [Column("id", BIGINT), Column("level", BIGINT)], ("id",), {"format": "debezium-json"})
S2 = TableDef("s2", [Column("id", BIGINT), Column("attr", STRING)], ("id",), {"format": "debezium-json"})
ORDERS = TableDef(
    "orders",
    [Column("product_id", BIGINT), Column("quantity", BIGINT), Column("price", make_type("DECIMAL", (10, 2)))],
    (),
    {"format": "json"},
)
UPS = TableDef("u", [Column("k", BIGINT), Column("v", STRING)], ("k",), {"format": "upsert-json"})


def write(tmp_path: Path, name: str, *lines: str) -> Path:
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def spec(table: TableDef, path: Path) -> InputSpec:
    return InputSpec(table, path, path.name)


def read_one(tmp_path: Path, table: TableDef, *lines: str):
    return read_inputs([spec(table, write(tmp_path, f"{table.name}.jsonl", *lines))])


def error_of(tmp_path: Path, table: TableDef, *lines: str) -> str:
    with pytest.raises(InputError) as e:
        read_one(tmp_path, table, *lines)
    return str(e.value)


# --- valid input -------------------------------------------------------------------------


def test_rows_become_tuples_in_column_order_with_line_positions(tmp_path):
    recs = read_one(
        tmp_path,
        S1,
        '{"kind": "+I", "row": {"level": 10, "id": 1}}',
        "",
        '{"kind": "-U", "row": {"id": 1, "level": 10}}',
        '{"barrier": true}',
        '{"kind": "+U", "row": {"id": 1, "level": 20}}',
    )
    changes = [r.change for r in recs if not r.is_barrier]
    assert changes == [
        Change("+I", (1, 10), (1,)),
        Change("-U", (1, 10), (3,)),
        Change("+U", (1, 20), (5,)),
    ]
    assert [r.is_barrier for r in recs] == [False, False, True, False]


def test_values_are_coerced_to_the_column_type(tmp_path):
    recs = read_one(tmp_path, ORDERS, '{"kind": "+I", "row": {"product_id": 1, "quantity": 5.0, "price": "9.5"}}')
    assert recs[0].change.row == (1, 5, Decimal("9.50"))


def test_upsert_delete_may_carry_only_the_key(tmp_path):
    recs = read_one(tmp_path, UPS, '{"kind": "-D", "row": {"k": 7}}')
    assert recs[0].change == Change("-D", (7, None), (1,))


def test_explicit_null_is_a_null_value(tmp_path):
    recs = read_one(tmp_path, S2, '{"kind": "+I", "row": {"id": 1, "attr": null}}')
    assert recs[0].change.row == (1, None)


# --- bad input: one line each, naming file and line ---------------------------------------


@pytest.mark.parametrize(
    ("table", "line", "expected"),
    [
        (S1, '{"kind": "+I", "row": {"id": 1, "level": 10}', "s1.jsonl:2: malformed JSON"),
        (S1, "[1, 2]", "s1.jsonl:2: expected a JSON object, got [1, 2]"),
        (S1, '{"kind": "+X", "row": {"id": 1, "level": 10}}', 's1.jsonl:2: unknown kind "+X"'),
        (S1, '{"row": {"id": 1, "level": 10}}', 's1.jsonl:2: missing "kind"'),
        (S1, '{"kind": "+I"}', 's1.jsonl:2: missing "row"'),
        (S1, '{"kind": "+I", "row": {"level": 10}}', "s1.jsonl:2: missing primary key column 'id'"),
        (S1, '{"kind": "+I", "row": {"id": null, "level": 10}}', "s1.jsonl:2: primary key column 'id' is null"),
        (S1, '{"kind": "+I", "row": {"id": 1}}', "s1.jsonl:2: missing column(s) 'level'"),
        (S1, '{"kind": "+I", "row": {"id": 1, "level": 10, "lvl": 3}}', "s1.jsonl:2: unknown column 'lvl'"),
        (S1, '{"kind": "+I", "row": {"id": 1, "level": "x"}}', "s1.jsonl:2: column 'level': expected BIGINT, got 'x'"),
        (S1, '{"kind": "+I", "row": {"id": 1.5, "level": 1}}', "s1.jsonl:2: column 'id': expected BIGINT, got 1.5"),
        (S1, '{"kind": "+I", "row": {"id": 1, "level": 1}, "sequence": 3}', "s1.jsonl:2: unexpected key(s) 'sequence'"),
        (S1, '{"kind": "+I", "row": {"id": 1, "level": 1}, "seq": "3"}', 's1.jsonl:2: "seq" must be a number'),
        (S1, '{"barrier": false}', 's1.jsonl:2: "barrier" must be true'),
        (ORDERS, '{"kind": "+U", "row": {"product_id": 1, "quantity": 1, "price": 1}}',
         "orders.jsonl:2: kind +U not allowed: source 'orders' is append (json) and takes +I"),
        (ORDERS, '{"kind": "-D", "row": {"product_id": 1, "quantity": 1, "price": 1}}',
         "orders.jsonl:2: kind -D not allowed"),
        (UPS, '{"kind": "-U", "row": {"k": 1, "v": "a"}}',
         "u.jsonl:2: kind -U not allowed: source 'u' is upsert (upsert-json) and takes +I, +U, -D"),
        (UPS, '{"kind": "+U", "row": {"k": 1}}', "u.jsonl:2: missing column(s) 'v'"),
    ],
)
def test_bad_line_is_one_error_line_naming_file_and_line(tmp_path, table, line, expected):
    good = {
        "s1": '{"kind": "+I", "row": {"id": 9, "level": 9}}',
        "orders": '{"kind": "+I", "row": {"product_id": 9, "quantity": 9, "price": 9}}',
        "u": '{"kind": "+I", "row": {"k": 9, "v": "z"}}',
    }[table.name]
    message = error_of(tmp_path, table, good, line)
    assert message.startswith(expected), message
    assert "\n" not in message


def test_all_errors_are_reported_each_on_its_own_line(tmp_path):
    with pytest.raises(InputErrors) as e:
        read_one(tmp_path, S1, "nope", '{"kind": "+I", "row": {"id": 1, "level": 1}}', '{"kind": "??"}')
    lines = str(e.value).splitlines()
    assert [ln.split(": ")[0] for ln in lines] == ["s1.jsonl:1", "s1.jsonl:3"]


def test_error_count_is_capped_and_the_rest_is_counted(tmp_path):
    with pytest.raises(InputErrors) as e:
        read_one(tmp_path, S1, *(["nope"] * (MAX_ERRORS + 5)))
    lines = str(e.value).splitlines()
    assert len(lines) == MAX_ERRORS + 1
    assert lines[-1] == "... and 5 more input error(s) not shown"


def test_unreadable_file_names_the_file(tmp_path):
    with pytest.raises(InputError) as e:
        read_inputs([InputSpec(S1, tmp_path / "missing.jsonl", "missing.jsonl")])
    assert str(e.value).startswith("missing.jsonl: cannot read input for table 's1'")


# --- ordering and positions ---------------------------------------------------------------


def test_without_seq_inputs_run_one_after_another_with_global_line_positions(tmp_path):
    a = write(tmp_path, "a.jsonl", '{"kind": "+I", "row": {"id": 1, "level": 10}}', '{"kind": "+I", "row": {"id": 2, "level": 20}}')
    b = write(tmp_path, "b.jsonl", '{"kind": "+I", "row": {"id": 10, "attr": "a1"}}')
    recs = read_inputs([spec(S1, a), spec(S2, b)])
    assert [(r.table, r.change.pos) for r in recs] == [("s1", (1,)), ("s1", (2,)), ("s2", (3,))]


def test_with_seq_inputs_are_merged_by_seq_and_pos_is_seq(tmp_path):
    a = write(tmp_path, "a.jsonl",
              '{"kind": "+I", "row": {"id": 1, "level": 10}, "seq": 2}',
              '{"kind": "-U", "row": {"id": 1, "level": 10}, "seq": 5}')
    b = write(tmp_path, "b.jsonl",
              '{"kind": "+I", "row": {"id": 10, "attr": "a1"}, "seq": 1}',
              '{"kind": "+I", "row": {"id": 20, "attr": "b1"}, "seq": 3}')
    recs = read_inputs([spec(S1, a), spec(S2, b)])
    assert [(r.table, r.change.pos) for r in recs] == [("s2", (1,)), ("s1", (2,)), ("s2", (3,)), ("s1", (5,))]


def test_equal_seq_keeps_input_flag_order_then_line_order(tmp_path):
    a = write(tmp_path, "a.jsonl", '{"kind": "+I", "row": {"id": 1, "level": 10}, "seq": 1}')
    b = write(tmp_path, "b.jsonl", '{"kind": "+I", "row": {"id": 10, "attr": "a1"}, "seq": 1}')
    assert [r.table for r in read_inputs([spec(S2, b), spec(S1, a)])] == ["s2", "s1"]


def test_seq_is_all_or_nothing(tmp_path):
    a = write(tmp_path, "a.jsonl", '{"kind": "+I", "row": {"id": 1, "level": 10}, "seq": 1}')
    b = write(tmp_path, "b.jsonl", '{"kind": "+I", "row": {"id": 10, "attr": "a1"}}')
    with pytest.raises(InputError) as e:
        read_inputs([spec(S1, a), spec(S2, b)])
    assert str(e.value).startswith('b.jsonl:1: no "seq", but a.jsonl:1 has one')


def test_seq_must_not_decrease_within_an_input(tmp_path):
    message = error_of(
        tmp_path, S1,
        '{"kind": "+I", "row": {"id": 1, "level": 10}, "seq": 4}',
        '{"kind": "-U", "row": {"id": 1, "level": 10}, "seq": 3}',
    )
    assert message.startswith('s1.jsonl:2: "seq" 3 is smaller than the previous seq 4')


def test_a_barrier_without_seq_stays_after_the_record_before_it(tmp_path):
    a = write(tmp_path, "a.jsonl",
              '{"kind": "+I", "row": {"id": 1, "level": 10}, "seq": 2}',
              '{"barrier": true}',
              '{"kind": "-U", "row": {"id": 1, "level": 10}, "seq": 4}')
    b = write(tmp_path, "b.jsonl",
              '{"kind": "+I", "row": {"id": 10, "attr": "a1"}, "seq": 1}',
              '{"kind": "+I", "row": {"id": 20, "attr": "b1"}, "seq": 3}')
    bs = batches(read_inputs([spec(S1, a), spec(S2, b)]), "barrier")
    assert [[r.change.pos for r in batch] for batch in bs] == [[(1,), (2,)], [(3,), (4,)]]


# --- batching -------------------------------------------------------------------------------


def test_barrier_batching_drops_empty_batches_and_record_batching_ignores_barriers(tmp_path):
    recs = read_one(
        tmp_path, S1,
        '{"barrier": true}',
        '{"kind": "+I", "row": {"id": 1, "level": 10}}',
        '{"kind": "+I", "row": {"id": 2, "level": 10}}',
        '{"barrier": true}',
        '{"barrier": true}',
        '{"kind": "+I", "row": {"id": 3, "level": 10}}',
    )
    assert [[r.change.row[0] for r in b] for b in batches(recs, "barrier")] == [[1, 2], [3]]
    assert [[r.change.row[0] for r in b] for b in batches(recs, "record")] == [[1], [2], [3]]


def test_batch_by_table_lists_every_source(tmp_path):
    recs = read_one(tmp_path, S1, '{"kind": "+I", "row": {"id": 1, "level": 10}}')
    assert batch_by_table(recs, ["s1", "s2"]) == {"s1": [Change("+I", (1, 10), (1,))], "s2": []}
