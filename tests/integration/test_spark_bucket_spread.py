"""Spark itself places each state bucket's grouping value: the hash the values were chosen
by is Spark's, and a shuffle by ``bucket`` (the distribution a keyed stage's state store
asks for) gives each of the 2 partitions 8 of 16 buckets."""

from __future__ import annotations

from collections import Counter

from tidemark.spark.partitioning import grouping_values, spark_hash


def test_sparks_hash_is_the_one_the_values_were_chosen_by(spark):
    values = list(range(-50, 200)) + [2**31 - 1, -(2**31)]
    rows = spark.createDataFrame([(v,) for v in values], "v int").selectExpr("v", "hash(v) AS h").collect()
    assert {r["v"]: r["h"] for r in rows} == {v: spark_hash(v) for v in values}


def test_a_shuffle_by_bucket_spreads_the_buckets_evenly(spark):
    values = [int(v) for v in grouping_values(16)]
    df = spark.createDataFrame([(v,) for v in values], "bucket int").repartition("bucket")
    held = Counter(r["p"] for r in df.selectExpr("spark_partition_id() AS p").collect())
    assert int(spark.conf.get("spark.sql.shuffle.partitions")) == 2
    assert held == {0: 8, 1: 8}
    by_index = spark.createDataFrame([(b,) for b in range(16)], "bucket int").repartition("bucket")
    assert Counter(r["p"] for r in by_index.selectExpr("spark_partition_id() AS p").collect()) == {0: 7, 1: 9}
