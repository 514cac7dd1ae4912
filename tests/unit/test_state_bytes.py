"""The driver's record of each keyed stage's stored bytes (``tidemark.spark.state_bytes``):
bucket sizes in, per-stage sums out, batch after batch and across restarts."""

from __future__ import annotations

import json
from pathlib import Path

from tidemark.spark.state_bytes import STATE_BYTES_FILE, StateBytes


def test_a_new_checkpoint_sums_the_latest_size_of_every_bucket(tmp_path: Path) -> None:
    sizes = StateBytes(tmp_path, resumed=False)
    assert sizes.record(0, {}) == {}
    assert sizes.record(1, {("join#2", 0): 100, ("join#2", 1): 50, ("materializer:t", 0): 7}) == {
        "join#2": 150, "materializer:t": 7}
    # a batch that writes one bucket changes that bucket only; 0 is a bucket cleared
    assert sizes.record(2, {("join#2", 1): 80, ("materializer:t", 0): 0}) == {"join#2": 180, "materializer:t": 0}


def test_a_batch_run_again_starts_from_the_batch_before_it(tmp_path: Path) -> None:
    sizes = StateBytes(tmp_path, resumed=False)
    sizes.record(0, {("s", 0): 10})
    sizes.record(1, {("s", 0): 20, ("s", 1): 5})  # then a crash before Spark committed batch 1
    again = StateBytes(tmp_path, resumed=True)  # the restart reads the record
    assert again.record(1, {("s", 0): 30}) == {"s": 30}  # bucket 1 was not written after batch 0
    assert again.record(2, {("s", 1): 1}) == {"s": 31}


def test_a_resumed_checkpoint_without_a_record_reports_no_size(tmp_path: Path) -> None:
    sizes = StateBytes(tmp_path, resumed=True)
    assert sizes.record(5, {("s", 0): 10}) is None
    # and says so after a restart too: the buckets written before the record are unknown
    assert StateBytes(tmp_path, resumed=True).record(6, {("s", 1): 10}) is None


def test_a_record_this_version_cannot_read_counts_as_none(tmp_path: Path) -> None:
    (tmp_path / STATE_BYTES_FILE).write_text(json.dumps({"format": 99, "batches": {}}))
    assert StateBytes(tmp_path, resumed=True).record(3, {("s", 0): 1}) is None
    (tmp_path / STATE_BYTES_FILE).write_text("{not json")
    assert StateBytes(tmp_path, resumed=True).record(3, {("s", 0): 1}) is None


def test_a_remote_checkpoint_is_measured_in_memory_while_its_first_process_runs(tmp_path: Path) -> None:
    sizes = StateBytes(None, resumed=False)
    assert sizes.record(0, {("s", 0): 4}) == {"s": 4}
    assert sizes.record(1, {("s", 1): 6}) == {"s": 10}
    assert not list(tmp_path.iterdir())
    assert StateBytes(None, resumed=True).record(9, {("s", 0): 4}) is None
