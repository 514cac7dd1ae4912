"""The vectorized bucket function: equal SQL keys share a bucket whatever types carry
them, the column route and the ``key_of`` route agree, and buckets are stable."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import numpy as np
import pyarrow as pa

from tidemark.engine import bucketing
from tidemark.engine.stages.join import Join

B = 64


def _table(**columns: pa.Array) -> pa.Table:
    return pa.table(columns)


def test_equal_numbers_share_a_bucket_whatever_their_type() -> None:
    values = [0, 1, 7, -3, 250, 1_000_000]
    tables = [
        _table(k=pa.array(values, t)) for t in (pa.int32(), pa.int64(), pa.float64(), pa.decimal128(12, 2))
    ]
    got = [bucketing.buckets_of_table(t, [0], B).tolist() for t in tables]
    assert got[0] == got[1] == got[2] == got[3]
    assert bucketing.buckets_of_keys([(v,) for v in values], B).tolist() == got[0]
    assert bucketing.bucket_of_key((1,), B) == bucketing.bucket_of_key((1.0,), B) \
        == bucketing.bucket_of_key((Decimal("1.00"),), B) == bucketing.bucket_of_key((True,), B)
    assert bucketing.bucket_of_key((Decimal("2.50"),), B) == bucketing.bucket_of_key((2.5,), B)
    assert bucketing.bucket_of_key((-0.0,), B) == bucketing.bucket_of_key((0,), B)


def test_timestamps_of_any_precision_and_text_share_a_bucket_with_their_python_values() -> None:
    ts = [dt.datetime(2024, 1, 1, 12, 0, 0, 123000), dt.datetime(1999, 12, 31), None]
    for unit in ("ms", "us", "ns"):
        table = _table(t=pa.array(ts, pa.timestamp(unit)), s=pa.array(["a", None, "ü"], pa.large_string()))
        assert bucketing.buckets_of_table(table, [0, 1], B).tolist() == \
            bucketing.buckets_of_keys(list(zip(ts, ["a", None, "ü"])), B).tolist()
    days = [dt.date(2024, 2, 29), dt.date(1970, 1, 1)]
    assert bucketing.buckets_of_table(_table(d=pa.array(days, pa.date32())), [0], B).tolist() == \
        bucketing.buckets_of_keys([(d,) for d in days], B).tolist()


def test_key_columns_pick_the_key_and_different_keys_spread() -> None:
    table = _table(x=pa.array(range(1000)), k=pa.array([i % 10 for i in range(1000)]))
    by_key = bucketing.buckets_of_table(table, [1], B)
    assert len(set(by_key.tolist())) == len(set(bucketing.buckets_of_keys([(i,) for i in range(10)], B).tolist()))
    assert all(by_key[i] == by_key[i % 10] for i in range(1000))
    assert len(set(bucketing.buckets_of_table(table, [0], B).tolist())) > B // 2
    assert set(bucketing.buckets_of_table(table, [], B).tolist()) == {0}
    assert set(bucketing.buckets_of_table(table, [0], 1).tolist()) == {0}


def test_buckets_are_stable_across_runs() -> None:
    # a checkpoint's state is found again only if these never change (DATA_PATH says which)
    assert [bucketing.bucket_of_key(k, 256) for k in [(1,), ("a",), (None,), (1, "a")]] == [38, 208, 21, 194]


def test_a_null_key_shares_a_bucket_whatever_column_carries_it() -> None:
    # an all-NULL column typed by its values has Arrow's null type
    null = bucketing.bucket_of_key((None,), B)
    for column in (pa.array(["a", None]), pa.array([1, None]), pa.array([None, None]), pa.array([b"x", None])):
        assert bucketing.buckets_of_table(_table(k=column), [0], B)[1] == null


def test_a_joins_two_sides_bucket_alike_by_their_key_columns() -> None:
    join = Join("inner", left_key=(1,), right_key=(0,), left_width=2, right_width=2)
    left = _table(a=pa.array(["x", "y"]), k=pa.array([5, 6], pa.int32()))
    right = _table(k=pa.array([5.0, 6.0]), b=pa.array(["p", "q"]))
    assert bucketing.key_columns(join, 0) == (1,) and bucketing.key_columns(join, 1) == (0,)
    assert np.array_equal(bucketing.buckets_of_table(left, join.key_columns(0), B),
                          bucketing.buckets_of_table(right, join.key_columns(1), B))


def test_a_stage_without_key_columns_is_bucketed_through_key_of() -> None:
    class Computed:
        def key_of(self, change, input_index):
            return (change.row[0] % 10,)

    rows = [(i, "v") for i in range(30)]
    assert bucketing.key_columns(Computed(), 0) is None
    assert bucketing.buckets_of_rows(rows, Computed(), 0, B).tolist() == \
        bucketing.buckets_of_keys([(i % 10,) for i in range(30)], B).tolist()
