"""``tidemark dlq``, run as the command a user types, against the embedded broker: dead letters
made by the real decoder from bad records and written by the job's own dead-letter writer
(transactional, JSON or Avro) are printed with their reason and source coordinate, as JSON
Lines with ``--json``, and as they arrive with ``--follow``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tidemark.engine.sql import parse_script
from tidemark.formats import DecodeError, decoder_for
from tidemark.formats.dead_letter import DeadLetter
from tidemark.spark.sink import DeadLetterSink

pytestmark = pytest.mark.integration
TIDEMARK = [str(Path(sys.executable).parent / "tidemark")]

TABLE = parse_script(
    "CREATE TABLE s1 (id BIGINT, level BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ('format' = 'debezium-json');"
    "CREATE TABLE t (id BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ('format' = 'upsert-json');"
    "INSERT INTO t SELECT id FROM s1;"
).tables["s1"]

BAD = [
    b'{"op": "c", "after": {"id": 1, "level": "high"}}',
    b'{"op": "c", "after": {"id": 2, "level": ',
    b'{"op": "x", "after": {"id": 3, "level": 1}}',
]


def letter_for(pipeline: str, offset: int, value: bytes) -> DeadLetter:
    """What the job makes of a bad record: the decoder's own error, at a source coordinate."""
    try:
        decoder_for(TABLE).decode(b'{"id": 1}', value)
    except DecodeError as err:
        return DeadLetter(pipeline, "s1", "debezium-json", "s1", 0, offset, None, err.kind, str(err),
                          b'{"id": 1}', value, batch_id=offset)
    raise AssertionError(f"{value!r} decoded")


def write(bootstrap: str, pipeline: str, letters: list[DeadLetter], encoding: str = "json") -> None:
    sink = DeadLetterSink(bootstrap, pipeline, encoding=encoding, writer_id=f"{pipeline}.dlq.{uuid.uuid4().hex}")
    try:
        for letter in letters:
            sink.write_letters([letter], letter.batch_id)
    finally:
        sink.close()


def tidemark_dlq(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([*TIDEMARK, "dlq", *args], capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize("encoding", ["json", "avro"])
def test_prints_every_dead_letter_with_reason_and_coordinate(kafka_bootstrap: str, encoding: str) -> None:
    pipeline = f"dlq-cmd-{uuid.uuid4().hex[:8]}"
    letters = [letter_for(pipeline, i, v) for i, v in enumerate(BAD)]
    write(kafka_bootstrap, pipeline, letters, encoding)

    done = tidemark_dlq(pipeline, "--bootstrap-servers", kafka_bootstrap)
    assert done.returncode == 0, done.stderr
    for letter in letters:
        assert f"s1/0/{letter.source_offset}  table s1 (debezium-json)" in done.stdout
        assert f"  {letter.error_kind}: {letter.reason}\n" in done.stdout
    assert [line.split()[0] for line in done.stdout.splitlines() if line.startswith("s1/")] == [
        "s1/0/0", "s1/0/1", "s1/0/2"]
    assert "value: {\"op\": \"c\", \"after\": {\"id\": 1, \"level\": \"high\"}}" in done.stdout
    assert {letter.error_kind for letter in letters} == {"wrong_type", "undecodable", "unknown_op"}
    assert done.stderr.strip().endswith(f"3 dead letter(s) in {pipeline}.dlq")

    as_json = tidemark_dlq(f"{pipeline}.dlq", "--bootstrap-servers", kafka_bootstrap, "--json")
    rows = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [(r["source_offset"], r["error_kind"], r["reason"]) for r in rows] == [
        (d.source_offset, d.error_kind, d.reason) for d in letters]


def test_follow_prints_letters_as_they_arrive(kafka_bootstrap: str, tmp_path: Path) -> None:
    pipeline = f"dlq-follow-{uuid.uuid4().hex[:8]}"
    write(kafka_bootstrap, pipeline, [letter_for(pipeline, 0, BAD[0])])
    out = tmp_path / "out.txt"
    with out.open("w") as sink:
        proc = subprocess.Popen([*TIDEMARK, "dlq", pipeline, "--bootstrap-servers", kafka_bootstrap, "--follow"],
                                stdout=sink, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: "s1/0/0" in out.read_text(), "the first letter")
        write(kafka_bootstrap, pipeline, [letter_for(pipeline, 1, BAD[2])])
        wait_until(lambda: "s1/0/1" in out.read_text(), "a letter written while following")
        assert proc.poll() is None, "--follow stopped at the end of the topic"
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "unknown_op" in out.read_text()


def test_a_pipeline_without_a_dlq_topic_is_one_line_and_status_2(kafka_bootstrap: str) -> None:
    done = tidemark_dlq("never-ran", "--bootstrap-servers", kafka_bootstrap)
    assert done.returncode == 2
    assert done.stderr == (f"error: topic 'never-ran.dlq' does not exist on {kafka_bootstrap}: "
                           "has the pipeline run against this broker?\n")


def wait_until(cond, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
