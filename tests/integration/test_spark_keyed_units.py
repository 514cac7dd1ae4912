"""The Spark host's pure-Python parts, no Spark needed: the
stage-error transport, and the Java version check."""

from __future__ import annotations


import pytest

from tidemark.engine.errors import ConflictError, InputError
from tidemark.spark.keyed import StageCrash, StageFailure, stage_error_from
from tidemark.spark.session import JavaMissingError, check_java, parse_java_major


def test_stage_error_is_rebuilt_from_the_text_spark_carries():
    original = ConflictError("t1", {"id": 7})
    # what the driver sees: the worker's exception text buried in Spark's message
    spark_text = f"Job aborted ... PythonException: Traceback ...\n{StageFailure(original)}\n\tat org..."
    rebuilt = stage_error_from(RuntimeError(spark_text))
    assert type(rebuilt) is ConflictError
    assert str(rebuilt) == str(original)
    assert rebuilt.pk == {"id": 7} and rebuilt.exit_status == 3


def test_stage_error_found_in_the_exception_chain():
    try:
        try:
            raise RuntimeError(str(StageFailure(InputError("topic s1 offset 4", "bad op 'x'"))))
        except RuntimeError as inner:
            raise ValueError("wrapper") from inner
    except ValueError as outer:
        rebuilt = stage_error_from(outer)
    assert isinstance(rebuilt, InputError)
    assert str(rebuilt) == "topic s1 offset 4: bad op 'x'"


def test_no_stage_error_in_an_ordinary_failure():
    assert stage_error_from(RuntimeError("executor lost")) is None
    assert stage_error_from(RuntimeError("[tidemark-stage-error bm90IGEgcGlja2xl]")) is None


def test_stage_crash_names_stage_and_key():
    crash = StageCrash("stage 'join' failed on key (3,): KeyError: 'x'")
    assert stage_error_from(RuntimeError(str(StageFailure(crash)))).args == crash.args


@pytest.mark.parametrize(
    "text,major",
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('java version "1.8.0_392"', 8),
        ('openjdk version "21" 2023-09-19', 21),
        ("no version here", None),
    ],
)
def test_parse_java_major(text, major):
    assert parse_java_major(text) == major


def test_missing_java_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(JavaMissingError, match="Spark needs Java 17 or newer"):
        check_java()
