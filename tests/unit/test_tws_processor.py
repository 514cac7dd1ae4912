"""The processor that Spark's driver-side worker unpickles at a query's start, only to learn
its state variables, imports no more than pyspark: the stage's runner travels pickled inside
it and is unpickled by the first call that processes rows."""

from __future__ import annotations

import subprocess
import sys

from pyspark import cloudpickle

from tidemark.engine.fusion import FusedStage
from tidemark.engine.stages.normalize import Normalize
from tidemark.spark.keyed import _BucketRunner
from tidemark.spark.tws_processor import STATE_SCHEMA, stage_processor, state_schema

HEAVY = ("pandas", "polars", "pyarrow", "tidemark.engine", "tidemark.spark.keyed")
UNPICKLE = f"""
import pickle, sys
processor = pickle.loads(sys.stdin.buffer.read())
print(sorted(m for m in {HEAVY!r} if m in sys.modules))
print(processor.members)
print(type(processor.runner).__name__, sorted(m for m in {HEAVY!r} if m in sys.modules))
"""


class _Value:
    """A value state as pyspark's processor API has it: a tuple of the schema's fields, or None."""

    def __init__(self, calls: list[tuple]) -> None:
        self.value: tuple | None = None
        self.calls = calls

    def get(self) -> tuple | None:
        self.calls.append(("get",))
        return self.value

    def update(self, value: tuple) -> None:
        self.calls.append(("update", value))
        self.value = value

    def clear(self) -> None:
        self.calls.append(("clear",))
        self.value = None


class _Handle:
    """The part of pyspark's processor handle that ``init`` uses."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, object]] = []
        self.calls: list[tuple] = []

    def getValueState(self, name: str, schema: object) -> _Value:
        self.asked.append((name, schema))
        return _Value(self.calls)


def test_unpickling_the_processor_imports_nothing_of_the_engine_until_rows_arrive():
    runner = _BucketRunner(Normalize(pk=(0,), width=2), None, None)
    pickled = cloudpickle.dumps(stage_processor(runner, timers=False))
    out = subprocess.run([sys.executable, "-c", UNPICKLE], input=pickled, capture_output=True, check=True)
    unpickled, names, loaded = out.stdout.decode().splitlines()
    assert unpickled == "[]"
    assert names == "1"
    assert loaded.startswith("_BucketRunner ") and "'tidemark.spark.keyed'" in loaded


def test_init_asks_one_value_state_per_member_under_the_names_checkpoints_hold():
    handle = _Handle()
    processor = stage_processor(_BucketRunner(Normalize(pk=(0,), width=2), None, None), timers=False)
    processor.init(handle)
    assert handle.asked == [("stage", STATE_SCHEMA)]
    assert processor.clock is None


class _Stored:
    """A bucket call's result as ``StageProcessor._apply`` reads it."""

    def __init__(self, stored: list[bytes | None]) -> None:
        self.stored, self.rows, self.old_wakeup, self.new_wakeup = stored, [], None, None


def test_a_fused_operator_keeps_its_members_states_in_one_value_state_a_field_each():
    """One getValueState per task, one get and at most one update per bucket call: each is a
    JVM round trip, so two members must not pay them twice."""
    handle = _Handle()
    stage = Normalize(pk=(0,), width=2)
    processor = stage_processor(_BucketRunner(FusedStage(stage, stage, 0), None, None), timers=False)
    processor.init(handle)
    assert handle.asked == [("stage", state_schema(2))]
    assert state_schema(2).fieldNames() == ["state", "state1"] and state_schema(1) == STATE_SCHEMA

    def call(stored: list[bytes | None]) -> list[tuple]:
        handle.calls.clear()
        old = processor._stored()
        list(processor._apply(("b",), old, _Stored(stored)))
        return handle.calls

    assert call([b"a", None]) == [("get",), ("update", (b"a", None))]
    assert processor._stored() == [b"a", None]
    assert call([b"a", None]) == [("get",)]  # unchanged: not written
    assert call([b"a", b"j"]) == [("get",), ("update", (b"a", b"j"))]
    assert call([None, None]) == [("get",), ("clear",)]
    assert processor._stored() == [None, None]
