"""The ON CONFLICT examples of the proposal (seed: sink-upsert-materializer-on-conflict-
proposal) through the real ``tidemark replay``.

inventory = SUM(orders.quantity) per product JOIN products, WHERE quantity < 10, keyed by
product *name*; products 1 and 2 are both "Football". Orders: (1, 5) | (2, 6) | (2, 7),
one batch each. The third order pushes product 2 to 13, out of the filter.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from replaykit import EXAMPLES, cli, in_process, summary, table_after_batches, write_jsonl

INPUTS = {"orders": EXAMPLES / "orders.jsonl", "products": EXAMPLES / "products.jsonl"}


def football(q: int) -> dict:
    return {("Football",): {"name": "Football", "quantity": q}}


def tables_per_batch(result, n: int, pk: tuple[str, ...] = ("name",)) -> list[dict]:
    assert result.status == 0, result.stderr
    assert summary(result.stderr)["batch(es)"] == n
    return table_after_batches(result.json_lines(), pk, n)


def test_do_deduplicate_rolls_football_back_to_5_when_product_2_leaves_the_filter():
    result = cli(EXAMPLES / "inventory.sql", INPUTS)
    assert tables_per_batch(result, 3) == [football(5), football(6), football(5)]
    # the rollback is one update at the sink: -U(6) +U(5), no intermediate -D
    assert [c for c in result.json_lines() if c["batch"] == 3] == [
        {"kind": "-U", "row": {"name": "Football", "quantity": 6}, "batch": 3},
        {"kind": "+U", "row": {"name": "Football", "quantity": 5}, "batch": 3},
    ]
    final = cli(EXAMPLES / "inventory.sql", INPUTS, "--emit", "table")
    assert final.status == 0, final.stderr
    assert final.json_lines() == [{"name": "Football", "quantity": 5}]


def test_do_nothing_keeps_the_first_football_and_counts_the_dropped_row():
    result = cli(EXAMPLES / "inventory_do_nothing.sql", INPUTS)
    assert tables_per_batch(result, 3) == [football(5), football(5), football(5)]
    assert result.json_lines() == [{"kind": "+I", "row": {"name": "Football", "quantity": 5}, "batch": 1}]
    assert summary(result.stderr)["conflict(s) dropped"] == 1


def test_do_error_exits_3_naming_the_table_and_the_key_after_printing_the_good_batches():
    result = cli(EXAMPLES / "inventory_do_error.sql", INPUTS)
    assert result.status == 3
    assert result.json_lines() == [{"kind": "+I", "row": {"name": "Football", "quantity": 5}, "batch": 1}]
    err = result.stderr.strip().splitlines()
    assert len(err) == 1, result.stderr
    assert "inventory" in err[0] and "Football" in err[0]
    assert "Traceback" not in result.stderr


def test_do_error_judges_the_batch_not_its_intermediate_rows(tmp_path: Path):
    """All three orders in one batch: product 2 nets to 13 and is filtered out inside the
    batch, so only one Football row is ever active: no error."""
    orders = write_jsonl(
        tmp_path / "orders.jsonl",
        [{"kind": "+I", "row": {"product_id": p, "quantity": q}, "seq": s} for p, q, s in ((1, 5, 4), (2, 6, 5), (2, 7, 6))],
    )
    result = cli(EXAMPLES / "inventory_do_error.sql", {**INPUTS, "orders": orders}, "--emit", "table")
    assert result.status == 0, result.stderr
    assert result.json_lines() == [{"name": "Football", "quantity": 5}]


# --- the same strategies on the disorder example: why the barrier matters -----------------

JOIN_SQL = (EXAMPLES / "s1_s2_join.sql").read_text(encoding="utf-8")
CASE3 = [  # s2's rows, then +I(1,10), +U(1,20) overtaking -U(1,10)
    ("s2", {"kind": "+I", "row": {"id": 10, "attr": "a1"}, "seq": 1}),
    ("s2", {"kind": "+I", "row": {"id": 20, "attr": "b1"}, "seq": 2}),
    ("s1", {"kind": "+I", "row": {"id": 1, "level": 10}, "seq": 3}),
    ("s1", {"kind": "+U", "row": {"id": 1, "level": 20}, "seq": 4}),
    ("s1", {"kind": "-U", "row": {"id": 1, "level": 10}, "seq": 5}),
]


def join_with(tmp: Path, clause: str) -> tuple[Path, dict[str, Path]]:
    sql = tmp / f"join_{clause.split()[-1].lower()}.sql"
    sql.write_text(JOIN_SQL.replace("ON CONFLICT DO DEDUPLICATE", clause), encoding="utf-8")
    inputs = {t: write_jsonl(tmp / f"{t}.jsonl", [line for tt, line in CASE3 if tt == t]) for t in ("s1", "s2")}
    return sql, inputs


@pytest.mark.parametrize("clause", ["ON CONFLICT DO NOTHING", "ON CONFLICT DO ERROR"])
def test_nothing_and_error_are_safe_when_the_pair_shares_a_batch(tmp_path, clause):
    sql, inputs = join_with(tmp_path, clause)
    result = in_process(sql, inputs, "--emit", "table")
    assert result.status == 0, result.stderr
    assert result.json_lines() == [{"id": 1, "level": 20, "attr": "b1"}]


def test_do_error_fails_when_a_pair_is_split_across_batches(tmp_path):
    sql, inputs = join_with(tmp_path, "ON CONFLICT DO ERROR")
    result = cli(sql, inputs, "--batching", "record")
    assert result.status == 3, result.stderr
    assert "'t1'" in result.stderr and "id=1" in result.stderr
    assert "Traceback" not in result.stderr


def test_do_nothing_keeps_the_first_row_and_loses_the_key_when_a_pair_is_split(tmp_path):
    """The proposal's caveat: NOTHING keeps no history, so when the first row is
    retracted after the second was dropped, nothing is left to fall back to."""
    sql, inputs = join_with(tmp_path, "ON CONFLICT DO NOTHING")
    result = in_process(sql, inputs, "--batching", "record")
    tables = tables_per_batch(result, 5, ("id",))
    assert tables[2] == {(1,): {"id": 1, "level": 10, "attr": "a1"}}
    assert tables[3] == tables[2]  # (1, 20, 'b1') dropped ...
    assert summary(result.stderr)["conflict(s) dropped"] == 1  # ... and counted
    assert tables[4] == {}
