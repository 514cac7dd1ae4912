"""The grouping value of each state bucket: Spark's hash gives bucket ``b`` of ``n`` the
remainder ``b``, so any partition count dividing ``n`` holds the same number of buckets.
Spark itself checks the hash in ``tests/integration/test_spark_bucket_spread.py``."""

from __future__ import annotations

from collections import Counter

import pytest

from tidemark.spark.partitioning import grouping_values, spark_hash, spark_partition


def test_spark_hash_of_small_ints_is_sparks():
    """Values read off Spark 4.3: ``SELECT hash(CAST(id AS INT)) FROM range(3)`` and of -1."""
    assert [spark_hash(v) for v in (0, 1, 2, -1)] == [933211791, -559580957, 1765031574, -1604776387]


@pytest.mark.parametrize("buckets", [1, 2, 3, 16, 64, 256])
def test_bucket_b_hashes_to_b_modulo_the_bucket_count(buckets):
    values = grouping_values(buckets)
    assert len(set(values.tolist())) == buckets
    assert [spark_hash(int(v)) % buckets for v in values] == list(range(buckets))
    assert values.min() >= 0


@pytest.mark.parametrize(("buckets", "partitions"), [(16, 2), (16, 4), (16, 16), (64, 8), (2, 2)])
def test_every_partition_dividing_the_bucket_count_holds_as_many_buckets(buckets, partitions):
    held = Counter(spark_partition(int(v), partitions) for v in grouping_values(buckets))
    assert held == dict.fromkeys(range(partitions), buckets // partitions)


def test_the_bucket_index_itself_would_not_spread():
    """Why the values exist: by index, 9 of 16 buckets share one of 2 partitions, and both of
    2 buckets land in the same one."""
    assert Counter(spark_partition(b, 2) for b in range(16)) == {1: 9, 0: 7}
    assert {spark_partition(b, 2) for b in range(2)} == {1}


def test_the_values_are_fixed_for_a_checkpoints_life():
    """A restarted query looks a bucket's state up under the value it was written with."""
    assert grouping_values(16).tolist() == [12, 16, 5, 1, 37, 20, 2, 35, 13, 6, 49, 7, 25, 15, 4, 0]
    with pytest.raises(ValueError, match="state buckets must be >= 1, got 0"):
        grouping_values(0)
