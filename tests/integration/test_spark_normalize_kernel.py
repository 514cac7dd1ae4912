"""The normalize batch kernel on a real Spark session: batches big enough for it (one state
bucket, so every call gets the whole batch), its state stored by Spark between batches, the
output equal to the per-key stage's in plain Python."""

from __future__ import annotations

import random
from collections import Counter

import pyarrow as pa
import pytest

from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change
from tidemark.engine.driver import Bucket, PerKeyAdapter
from tidemark.engine.kernels.normalize import KERNEL_MIN_CHANGES
from tidemark.engine.stage import BatchContext
from tidemark.engine.stages.normalize import Normalize
from tidemark.engine.types import parse_type
from tidemark.spark import keyed as K


pytestmark = pytest.mark.integration

COLUMNS = (("id", parse_type("BIGINT")), ("grp", parse_type("STRING")), ("v", parse_type("BIGINT")))
SCHEMA = pa.schema([("id", pa.int64()), ("grp", pa.string()), ("v", pa.int64())])  # the blobs typed as the stage's columns


def upserts(rng: random.Random, n: int, first_pos: int) -> list[Change]:
    out = []
    for p in range(first_pos, first_pos + n):
        i = rng.randrange(400)
        if rng.random() < 0.1:
            out.append(Change("-D", (i, None, None), (p,)))
        else:
            out.append(Change("+U", (i, rng.choice("ab"), rng.randrange(3)), (p,)))
    return out


def test_the_kernel_on_spark_equals_the_per_key_stage(spark_stream):
    norm = Normalize(pk=(0,), width=3, name="normalize:t", columns=COLUMNS)
    stream = spark_stream(lambda source: K.run_keyed_stage([K.keyed_input(source, norm, buckets=1, schema=SCHEMA)], norm, buckets=1))
    reference, bucket = PerKeyAdapter(norm), Bucket()
    rng = random.Random(3)
    for i in range(2):
        changes = upserts(rng, KERNEL_MIN_CHANGES + 200, 1 + i * 10_000)
        bucket, want = reference.process_batch([ChangeBatch(changes=list(changes))], bucket, BatchContext())
        got = stream.run_batch([changes])
        assert Counter(got) == Counter(want.changes()), f"batch {i}"
        assert any(c.kind == "-U" for c in got) and any(c.kind == "-D" for c in got)
