"""``Runs``: window arithmetic over a frame sorted by its group column, checked against
polars' own window functions (``over``) on literal and random frames."""

from __future__ import annotations

import random

import polars as pl
import pytest

from tidemark.engine.kernels.runs import Runs


def _both(frame: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    runs = Runs("g")
    x = pl.col("x")
    ours = frame.select(runs.step().alias("step"), runs.cum_sum(x).alias("sum"), runs.previous(x).alias("prev"))
    over = frame.select(
        pl.int_range(pl.len()).over("g").alias("step"),
        x.cum_sum().over("g").alias("sum"),
        x.shift(1).over("g").alias("prev"),
    )
    return ours, over


def test_a_literal_frame():
    frame = pl.DataFrame({"g": [3, 3, 3, 7, 9, 9], "x": [1, -1, 5, 2, 4, 4]})
    ours, _ = _both(frame)
    assert ours.to_dict(as_series=False) == {
        "step": [0, 1, 2, 0, 0, 1],
        "sum": [1, 0, 5, 2, 4, 8],
        "prev": [None, 1, -1, None, None, 4],
    }


@pytest.mark.parametrize("seed", range(20))
def test_random_frames_equal_polars_windows(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 300)
    groups = sorted(rng.randint(0, rng.randint(1, 40)) for _ in range(n))
    frame = pl.DataFrame({"g": groups, "x": [rng.randint(-5, 5) for _ in range(n)]})
    ours, over = _both(frame)
    assert ours.equals(over)


def test_sums_wrap_as_the_groups_own_sums_do():
    """Integers only: the whole column's running sum may overflow, the group's difference
    stays exact."""
    big = 2**62
    frame = pl.DataFrame({"g": [1, 1, 2, 2, 2], "x": [big, big, big, big, -big]}, schema={"g": pl.Int64, "x": pl.Int64})
    ours, over = _both(frame)
    assert ours.equals(over)
    assert ours["sum"][4] == big  # after the column's running sum overflowed twice
