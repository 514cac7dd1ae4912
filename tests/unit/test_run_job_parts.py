"""The Spark-free parts of ``tidemark run``: reading Spark's progress into a batch report
(records, lag per partition, state size), the status channel lines, routing decoded and
bad records, and the run id that ties transactional writers to a checkpoint."""

from __future__ import annotations

import json

import pytest

from tidemark.cli.run import QuietBatches
from tidemark.engine.pipeline import compile_sql
from tidemark.formats import decoder_for
from tidemark.spark.job import DATA_PATH, JobError, RunInfo, run_id_of, run_info_of
from tidemark.spark.keyed import DEFAULT_STATE_BUCKETS
from tidemark.spark.progress import BatchReport, SinkBatch, StatusFile, lag_of, report_from
from tidemark.spark.query import decode_batch, source_tables

SQL = """
CREATE TABLE s1 (id BIGINT, level BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 'a', 'format' = 'debezium-json');
CREATE TABLE s2 (id BIGINT, attr STRING, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 'b', 'format' = 'upsert-json');
CREATE TABLE t1 (id BIGINT, level BIGINT, attr STRING, PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 't', 'format' = 'upsert-json');
INSERT INTO t1 SELECT s1.id, s1.level, s2.attr FROM s1 JOIN s2 ON s1.level = s2.id ON CONFLICT DO DEDUPLICATE;
"""


def progress(batch_id: int, rows: int, start: dict | None, end: dict, latest: dict, state=()) -> dict:
    return {
        "batchId": batch_id,
        "numInputRows": rows,
        "durationMs": {"triggerExecution": 1234},
        "sources": [{"description": "KafkaV2[Assign[a-0, a-1]]", "numInputRows": rows,
                     "startOffset": json.dumps(start) if start else None, "endOffset": json.dumps(end),
                     "latestOffset": json.dumps(latest)}],
        "stateOperators": list(state),
    }


def test_report_joins_spark_progress_with_what_the_sink_saw():
    p = progress(7, 12, {"a": {"0": 3, "1": 0}}, {"a": {"0": 10, "1": 2}}, {"a": {"0": 15, "1": 2}},
                 state=[{"numRowsTotal": 4, "customMetrics": {"stateOnCurrentVersionSizeBytes": 1000}},
                        {"numRowsTotal": 1, "memoryUsedBytes": 24}])
    sink = SinkBatch(rows_in=12, rows_out=5, dlq=2, counters={"materializer.conflicts_dropped": 3,
                                                  "join.retractions_without_state": 1, "x.other": 9},
                     state_bytes={"join#2": 1000, "materializer:t": 24})
    r = report_from(p, sink)
    assert (r.batch_id, r.rows_in, r.rows_out, r.dlq, r.duration_ms) == (7, 12, 5, 2, 1234)
    assert (r.conflicts, r.retractions_without_state) == (3, 1)
    assert r.lag == {"a": {"0": 5, "1": 0}} and r.total_lag == 5
    # the bytes are the stages' own measure; the rows are the stores' (one per bucket)
    assert (r.state_size_bytes, r.state_bytes_by_stage, r.state_rows) == (1024, {"join#2": 1000, "materializer:t": 24}, 5)
    assert report_from(p, SinkBatch(1, 1, 0, {}, state_bytes=None)).state_size_bytes is None
    assert r.start_offsets == {"a": {"0": 3, "1": 0}} and r.end_offsets == {"a": {"0": 10, "1": 2}}


def test_first_batch_has_no_start_and_lag_never_goes_negative():
    r = report_from(progress(0, 1, None, {"a": {"0": 4}}, {"a": {"0": 3}}), None)
    assert r.start_offsets == {} and r.lag == {"a": {"0": 0}} and r.rows_out == 0
    # a partition the latest offset did not list still shows, with lag 0
    assert lag_of({"a": {"0": 1, "1": 5}}, {"a": {"0": 4}}) == {"a": {"0": 3, "1": 0}}


def test_status_file_lines_follow_the_control_format(tmp_path):
    path = tmp_path / "status.jsonl"
    status = StatusFile(str(path))
    status.emit("started")
    status.batch(BatchReport(batch_id=3, rows_in=4, rows_out=1, dlq=1, lag={"a": {"0": 2}}, state_size_bytes=9))
    status.emit("error", message="boom")
    started, batch, error = (json.loads(ln) for ln in path.read_text().splitlines())
    assert started["v"] == 1 and started["event"] == "started" and isinstance(started["ts"], float)
    assert {k: batch[k] for k in ("event", "batch_id", "rows_in", "rows_out", "dlq", "conflicts",
                                  "retractions_without_state", "lag", "state_size_bytes")} == {
        "event": "batch", "batch_id": 3, "rows_in": 4, "rows_out": 1, "dlq": 1, "conflicts": 0,
        "retractions_without_state": 0, "lag": {"a": {"0": 2}}, "state_size_bytes": 9}
    assert error["message"] == "boom"
    StatusFile(None).emit("started")  # no file: nothing happens, nothing raised


def test_decode_routes_good_changes_with_positions_and_bad_records_by_coordinate():
    pipeline = compile_sql(SQL)
    s1, s2 = source_tables(pipeline)
    assert (s1.table.name, s1.source_index, s2.source_index) == ("s1", 0, 1)

    def rec(offset, value, key=b'{"id": 1}', partition=1):
        return {"topic": "a", "partition": partition, "offset": offset, "timestamp": None, "key": key, "value": value}

    records = [
        rec(5, json.dumps({"before": {"id": 1, "level": 1}, "after": {"id": 1, "level": 2}, "op": "u"}).encode()),
        rec(6, b"{nope"),
        rec(7, json.dumps({"before": None, "after": {"id": 2, "level": 3}, "op": "c"}).encode()),
    ]
    changes, bad = decode_batch(records, s1, decoder_for(s1.table), batch_id=9)
    assert [(c.kind, c.row, c.pos) for c in changes] == [
        ("-U", (1, 1), (9, 0, 1, 5)), ("+U", (1, 2), (9, 0, 1, 5)), ("+I", (2, 3), (9, 0, 1, 7))]
    assert list(bad) == [("a", 1, 6)]
    letter = bad[("a", 1, 6)]
    assert letter["error_kind"] == "undecodable" and letter["value"] == b"{nope" and letter["table"] == "s1"
    assert letter["reason"].startswith("s1 @ a/1/6: value: malformed JSON")


def test_two_tables_on_one_topic_are_refused():

    from tidemark.engine.errors import PlanError

    sql = SQL.replace("'topic' = 'b'", "'topic' = 'a'")
    with pytest.raises(PlanError, match="both read topic 'a'"):
        source_tables(compile_sql(sql))


def test_run_id_is_made_with_the_checkpoint_and_kept(tmp_path):
    first = run_id_of(str(tmp_path / "cp"))
    assert run_id_of(str(tmp_path / "cp")) == first  # a restart continues the same writers
    assert run_id_of(str(tmp_path / "other")) != first  # a fresh checkpoint gets fresh writers


def test_state_buckets_are_fixed_when_the_checkpoint_is_created(tmp_path):
    cp = str(tmp_path / "cp")
    assert run_info_of(cp, 64).state_buckets == 64
    assert run_info_of(cp).state_buckets == 64  # a restart without the option keeps them
    assert run_info_of(cp, 64).state_buckets == 64
    with pytest.raises(JobError, match=r"keeps keyed state in 64 buckets; --state-buckets 128 would not find it"):
        run_info_of(cp, 128)
    assert run_info_of(str(tmp_path / "new")).state_buckets == DEFAULT_STATE_BUCKETS


def test_a_checkpoint_with_per_key_state_is_refused_by_name(tmp_path):
    """Checkpoints written before state buckets record only a run id. With state in them
    they cannot be read; without (the job never ran a batch) they simply get buckets."""
    old = tmp_path / "old"
    (old / "state").mkdir(parents=True)
    (old / "tidemark-run.json").write_text(json.dumps({"run_id": "abc"}), encoding="utf-8")
    with pytest.raises(JobError, match=f"checkpoint {old} was written by an older Tidemark"):
        run_info_of(str(old))
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "tidemark-run.json").write_text(json.dumps({"run_id": "abc"}), encoding="utf-8")
    assert run_info_of(str(empty)) == run_info_of(str(empty), DEFAULT_STATE_BUCKETS)
    assert run_info_of(str(empty)).run_id == "abc"


@pytest.mark.parametrize("previous", ["arrow-ipc-blobs/1", "arrow-ipc-blobs/2"])
def test_a_checkpoint_bucketed_by_a_previous_data_path_is_refused_naming_both(tmp_path, previous):
    """arrow-ipc-blobs/1 put a key in bucket crc32(repr(key)) mod N; /2 hashed the key
    columns (tidemark.engine.bucketing) but grouped by the bucket index itself; this version
    groups by each bucket's grouping value (tidemark.spark.partitioning), so that state
    would not be found."""
    old = tmp_path / "old"
    (old / "state").mkdir(parents=True)
    record = {"run_id": "abc", "state_buckets": 64, "data_path": previous}
    (old / "tidemark-run.json").write_text(json.dumps(record), encoding="utf-8")
    assert DATA_PATH == "arrow-ipc-blobs/3"
    with pytest.raises(JobError, match=f"checkpoint {old} holds keyed state of the data path {previous}; "
                                       "this version runs arrow-ipc-blobs/3"):
        run_info_of(str(old))


def test_a_checkpoint_of_the_pickled_row_data_path_is_refused_naming_both(tmp_path):
    """Its state is keyed by what pickled rows handed the stages; read by this version it
    would silently miss every key. Without state it is simply recorded anew."""
    old = tmp_path / "old"
    (old / "state").mkdir(parents=True)
    (old / "tidemark-run.json").write_text(json.dumps({"run_id": "abc", "state_buckets": 64}), encoding="utf-8")
    with pytest.raises(JobError, match=f"checkpoint {old} holds keyed state of the data path pickled-rows/1; "
                                       f"this version runs {DATA_PATH}"):
        run_info_of(str(old))
    (old / "state").rmdir()
    assert run_info_of(str(old)) == RunInfo("abc", 64)
    assert json.loads((old / "tidemark-run.json").read_text())["data_path"] == DATA_PATH


def test_empty_batches_are_shown_only_as_a_heartbeat():
    now = [0.0]
    quiet = QuietBatches(clock=lambda: now[0])
    lag = {"a": {"0": 0}}
    assert quiet.show(BatchReport(batch_id=0, rows_in=3, lag=lag))
    assert not quiet.show(BatchReport(batch_id=1, lag=lag))  # nothing happened
    assert quiet.show(BatchReport(batch_id=2, lag={"a": {"0": 4}}))  # lag moved
    now[0] = 61.0
    assert quiet.show(BatchReport(batch_id=3, lag={"a": {"0": 4}}))  # heartbeat
