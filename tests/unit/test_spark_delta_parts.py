"""The Spark-free parts of the delta join's Spark host (``tidemark.spark.delta``): offset
fences read from Spark's offset log, their trip through a local property, and one
partition of one batch through a bound stage (harness style: feed rows, assert what the
stage emits)."""

from __future__ import annotations

import json
import pickle
from collections import Counter
from pathlib import Path

import pytest

from tests.unit.delta_workload import sql
from tidemark.engine.changelog import Change
from tidemark.engine.pipeline import compile_sql
from tidemark.engine.stages.delta_join import DeltaJoin
from tidemark.index_client.local import LocalLookup, index_for
from tidemark.spark.delta import batch_fences, decode_fences, encode_fences, process_partition, read_offset_log
from tidemark.spark.keyed import StageFailure, stage_error_from

META = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {"spark.sql.shuffle.partitions": "2"}})


def write_log(checkpoint: Path, batch: int, *sources: dict | None) -> None:
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    lines = ["v1", META, *(json.dumps(s) if s is not None else "-" for s in sources)]
    (checkpoint / "offsets" / str(batch)).write_text("\n".join(lines))


def test_offset_log_merges_every_source_line(tmp_path: Path) -> None:
    write_log(tmp_path, 3, {"ta": {"0": 4, "1": 2}}, None, {"tb": {"0": 9}})
    assert read_offset_log(str(tmp_path), 3) == {"ta": {0: 4, 1: 2}, "tb": {0: 9}}
    assert read_offset_log(str(tmp_path), 4) is None
    assert read_offset_log(str(tmp_path), -1) is None


def test_fences_are_previous_end_and_this_end(tmp_path: Path) -> None:
    write_log(tmp_path, 0, {"ta": {"0": 2}}, {"tb": {"0": 1}})
    write_log(tmp_path, 1, {"ta": {"0": 5, "1": 3}}, {"tb": {"0": 1}})
    topics = {"a": "ta", "b": "tb"}
    assert batch_fences(str(tmp_path), 0, topics) == {"a": ({}, {0: 2}), "b": ({}, {0: 1})}
    # a partition new in this batch starts from nothing
    assert batch_fences(str(tmp_path), 1, topics) == {"a": ({0: 2}, {0: 5, 1: 3}), "b": ({0: 1}, {0: 1})}
    with pytest.raises(RuntimeError, match="no offset log entry for batch 2"):
        batch_fences(str(tmp_path), 2, topics)


def test_fences_survive_the_local_property_text() -> None:
    fences = {"a": ({0: 2, 1: 0}, {0: 5, 1: 3}), "b": ({}, {0: 1})}
    assert decode_fences(encode_fences(fences)) == fences
    assert decode_fences(None) is None and decode_fences("") is None


def bound_stage(consistency: str):
    p = compile_sql(sql("FORCE", consistency, b_format="json" if consistency == "eventual" else "debezium-json"))
    node = next(n for n in p.nodes if n.kind == "join")
    assert isinstance(node.stage, DeltaJoin)
    stage = pickle.loads(pickle.dumps(node.stage))  # as a Spark task gets it
    lookup = LocalLookup({name: index_for(t) for name, t in p.sources.items()})
    return stage.bind(lookup), lookup


def rows_of(changes: list[tuple[int, Change]]) -> list[list[Change]]:
    """Each join side's changes."""
    return [[c for i, c in changes if i == side] for side in (0, 1)]


def test_one_partition_looks_the_other_side_up_and_counts_per_stage() -> None:
    stage, lookup = bound_stage("eventual")
    old_b = Change("+I", (1000, 10, 7), (1,))
    end_b = lookup.feed("b", [old_b])  # b's row came in an earlier batch
    new_a = Change("+I", (1, 10, 5), (2,))
    end_a = lookup.feed("a", [new_a])  # the index service follows a's topic too
    counts: Counter = Counter()
    fences = {"a": ({}, end_a), "b": (end_b, end_b)}
    out = process_partition(stage, rows_of([(0, new_a)]), 1, fences, counts)
    assert [(c.kind, c.row) for c in out] == [("+I", (1, 10, 5, 1000, 10, 7))]
    assert counts[f"{stage.name}.delta_join.right.lookup_keys"] == 1
    assert counts[f"{stage.name}.delta_join.right.lookup_requests"] == 1
    # next batch: another row of a on the key is joined with b's cached rows: no lookup
    new_a2 = Change("+I", (2, 10, 6), (3,))
    end_a2 = lookup.feed("a", [new_a2])
    calls = lookup.calls
    out = process_partition(stage, rows_of([(0, new_a2)]), 2, {"a": (end_a, end_a2), "b": (end_b, end_b)}, counts)
    assert [(c.kind, c.row) for c in out] == [("+I", (2, 10, 6, 1000, 10, 7))]
    assert lookup.calls == calls
    assert counts[f"{stage.name}.delta_join.right.cache_hits"] == 1
    # a batch that is not the next one (a retry, a partition back from another worker)
    # starts with empty caches: the rows are looked up again
    process_partition(stage, rows_of([(0, new_a2)]), 2, {"a": (end_a, end_a2), "b": (end_b, end_b)}, counts)
    assert lookup.calls == calls + 1


def test_strong_without_fences_fails_naming_the_stage() -> None:
    stage, _lookup = bound_stage("strong")
    with pytest.raises(StageFailure) as err:
        process_partition(stage, rows_of([(0, Change("+I", (1, 10, 5), (1,)))]), 0, None, Counter())
    rebuilt = stage_error_from(err.value)
    assert rebuilt is not None and stage.name in str(rebuilt) and "start offsets" in str(rebuilt)


def test_status_event_carries_the_batch_delta_join_counters() -> None:
    from tidemark.spark.progress import BatchReport

    report = BatchReport(batch_id=3, counters={"join#2.delta_join.left.cache_hits": 4, "join#2.delta_join.right.lookup_keys": 2,
                                               "materializer#4.conflicts": 1})
    assert report.status_event()["metrics"] == {"delta_join.left.cache_hits": 4, "delta_join.right.lookup_keys": 2}
