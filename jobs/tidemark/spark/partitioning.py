"""Which value of a ``BLOB_SCHEMA`` row's ``bucket`` column carries a state bucket.

Spark places a grouping value in shuffle partition ``pmod(murmur3(value, 42), P)``, and a
keyed stage's task works through every bucket its partition holds, so a stage's wall time is
that of its busiest partition. With the bucket index itself as the value, Spark's hash puts
9 of 16 buckets in one of two partitions, and both of the upsert sink's 2 buckets in the
same one: a core idles while the other does the stage.

So bucket ``b`` of ``n`` travels as the smallest non-negative int whose Spark hash is ``b``
modulo ``n``. For any partition count ``P`` that divides ``n`` (e.g. 16 buckets over
2, 4, 8 or 16 partitions) the partition of bucket ``b`` is then ``b mod P``: every partition
holds exactly ``n / P`` buckets. Other counts spread as evenly as a hash does.

The values depend only on ``n`` and Spark's hash, which Spark keeps stable because its own
state store is partitioned by it, so a restarted query finds each bucket's state under the
value it was written with. ``mmh3`` computes Spark's ``Murmur3_x86_32.hashInt``: the 32-bit
MurmurHash3 of the int's four little-endian bytes with Spark's seed, 42.
"""

from __future__ import annotations

from functools import lru_cache

import mmh3
import numpy as np

#: the seed of Spark's ``hash()`` and of its hash partitioning
SPARK_HASH_SEED = 42


def spark_hash(value: int) -> int:
    """Spark's ``hash(CAST(value AS INT))``."""
    return mmh3.hash(int(value).to_bytes(4, "little", signed=True), SPARK_HASH_SEED, signed=True)


def spark_partition(value: int, partitions: int) -> int:
    """The shuffle partition Spark's hash partitioning sends the int ``value`` to."""
    return spark_hash(value) % partitions  # Python's % of a positive modulus is Spark's pmod


@lru_cache(maxsize=64)
def grouping_values(buckets: int) -> np.ndarray:
    """Per bucket index ``b`` of ``buckets``, the int32 grouping value that carries it
    (module docstring)."""
    if buckets < 1:
        raise ValueError(f"state buckets must be >= 1, got {buckets}")
    values = np.full(buckets, -1, dtype=np.int32)
    missing = buckets
    candidate = 0
    while missing:
        b = spark_hash(candidate) % buckets
        if values[b] < 0:
            values[b] = candidate
            missing -= 1
        candidate += 1
    values.flags.writeable = False
    return values
