"""The processor that Spark's driver-side worker unpickles at a query's start, only to learn
its state variables, imports no more than pyspark: the stage's runner travels pickled inside
it and is unpickled by the first call that processes rows."""

from __future__ import annotations

import subprocess
import sys

from pyspark import cloudpickle

from tidemark.engine.stages.normalize import Normalize
from tidemark.spark.keyed import _BucketRunner
from tidemark.spark.tws_processor import STATE_SCHEMA, stage_processor

HEAVY = ("pandas", "polars", "pyarrow", "tidemark.engine", "tidemark.spark.keyed")
UNPICKLE = f"""
import pickle, sys
processor = pickle.loads(sys.stdin.buffer.read())
print(sorted(m for m in {HEAVY!r} if m in sys.modules))
print(processor.state_names)
print(type(processor.runner).__name__, sorted(m for m in {HEAVY!r} if m in sys.modules))
"""


class _Handle:
    """The part of pyspark's processor handle that ``init`` uses."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []

    def getValueState(self, name: str, schema: str) -> object:
        self.asked.append((name, schema))
        return object()


def test_unpickling_the_processor_imports_nothing_of_the_engine_until_rows_arrive():
    runner = _BucketRunner(Normalize(pk=(0,), width=2), None, None)
    pickled = cloudpickle.dumps(stage_processor(runner, timers=False))
    out = subprocess.run([sys.executable, "-c", UNPICKLE], input=pickled, capture_output=True, check=True)
    unpickled, names, loaded = out.stdout.decode().splitlines()
    assert unpickled == "[]"
    assert names == "['stage']"
    assert loaded.startswith("_BucketRunner ") and "'tidemark.spark.keyed'" in loaded


def test_init_asks_one_value_state_per_member_under_the_names_checkpoints_hold():
    handle = _Handle()
    processor = stage_processor(_BucketRunner(Normalize(pk=(0,), width=2), None, None), timers=False)
    processor.init(handle)
    assert handle.asked == [("stage", STATE_SCHEMA)]
    assert processor.clock is None
