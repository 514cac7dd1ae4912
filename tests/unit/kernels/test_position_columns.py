"""The column helpers the kernels share for positions and pair cancelling, on literal frames
and against plain references (Python's tuple order; polars' windows over every row)."""

from __future__ import annotations

import random

import polars as pl
import pytest

from tidemark.engine.batch_columns import position_ranks, positions_as_lists
from tidemark.engine.kernels.current_row import survives_pair_cancelling


def _positions(rows: list[tuple[int | None, ...]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema={"$pos0": pl.Int64, "$pos1": pl.Int64}, orient="row")


def test_ranks_of_literal_positions_a_shorter_one_first():
    positions = _positions([(1, 5), (0, None), (1, 5), (0, 3), (1, None)])
    ranks, by_rank = position_ranks(positions)
    assert ranks.to_list() == [3, 0, 3, 1, 2]
    assert by_rank.rows() == [(0, None), (0, 3), (1, None), (1, 5)]


@pytest.mark.parametrize("seed", range(10))
def test_ranks_compare_as_python_tuples(seed):
    rng = random.Random(seed)
    rows = []
    for _ in range(rng.randint(1, 200)):
        first = rng.randint(0, 5)
        rows.append((first, None) if rng.random() < 0.3 else (first, rng.randint(0, 5)))
    ranks, by_rank = position_ranks(_positions(rows))

    def key(row: tuple[int | None, ...]) -> tuple[int, ...]:
        return tuple(v for v in row if v is not None)

    distinct = sorted({key(r) for r in rows})
    assert ranks.to_list() == [distinct.index(key(r)) for r in rows]
    assert [key(r) for r in by_rank.rows()] == distinct


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("span", [3, 10**6, 2**40])  # 2**40: the fields' ranges do not pack into one integer
def test_ranks_of_wide_negative_and_null_fields_compare_as_python_tuples(seed, span):
    rng = random.Random(seed)
    depth = rng.randint(1, 4)
    rows = []
    for _ in range(rng.randint(0, 300)):
        length = rng.randint(1, depth)
        rows.append(tuple(rng.randint(-span, span) for _ in range(length)) + (None,) * (depth - length))
    frame = pl.DataFrame(rows, schema={f"$pos{i}": pl.Int64 for i in range(depth)}, orient="row")
    ranks, by_rank = position_ranks(frame)

    def key(row: tuple[int | None, ...]) -> tuple[int, ...]:
        return tuple(v for v in row if v is not None)

    distinct = sorted({key(r) for r in rows})
    assert ranks.to_list() == [distinct.index(key(r)) for r in rows]
    assert [key(r) for r in by_rank.rows()] == distinct
    assert ranks.dtype == pl.Int64 and by_rank.columns == frame.columns


def test_ranks_of_positions_without_a_value():
    ranks, by_rank = position_ranks(_positions([(None, None), (None, None)]))
    assert ranks.to_list() == [0, 0] and by_rank.rows() == [(None, None)]
    ranks, by_rank = position_ranks(_positions([]))
    assert ranks.to_list() == [] and by_rank.height == 0


def test_positions_as_lists_drop_what_a_shorter_position_lacks():
    assert positions_as_lists(_positions([(1, 5), (0, None), (2, 7)])).to_list() == [[1, 5], [0], [2, 7]]
    assert positions_as_lists(_positions([(1, 5), (0, 3)])).to_list() == [[1, 5], [0, 3]]
    assert positions_as_lists(_positions([])).to_list() == []


def _batch(changes: list[tuple[str, bool]]) -> pl.DataFrame:
    return pl.DataFrame(changes, schema={"v": pl.String, "$add": pl.Boolean}, orient="row")


def _every_row_windows(frame: pl.DataFrame) -> list[bool]:
    """The rule with a rank for every row: the reference."""
    add = pl.col("$add")
    n_ret = (~add).sum().over("v")
    k = pl.min_horizontal(add.sum().over("v"), n_ret)
    rank = pl.int_range(pl.len()).over(["v", "$add"])
    return frame.select(pl.when(add).then(rank >= k).otherwise(rank < n_ret - k)).to_series().to_list()


def test_pair_cancelling_on_a_literal_batch():
    # x: two adds, one retraction -> one pair cancels (the first add, the retraction); y: alone
    batch = _batch([("x", True), ("x", False), ("y", True), ("x", True)])
    assert survives_pair_cancelling(batch, ["v"]).to_list() == [False, False, True, True]
    # no pairs at all: everything survives
    assert survives_pair_cancelling(_batch([("x", True), ("y", False)]), ["v"]).to_list() == [True, True]


@pytest.mark.parametrize("seed", range(20))
def test_pair_cancelling_equals_the_rank_of_every_row(seed):
    rng = random.Random(seed)
    batch = _batch([(rng.choice("abcdefgh"), rng.random() < 0.6) for _ in range(rng.randint(0, 120))])
    assert survives_pair_cancelling(batch, ["v"]).to_list() == _every_row_windows(batch)
