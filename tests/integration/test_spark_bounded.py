"""A bounded source on the Spark job (``'scan.bounded.mode' = 'latest-offset'``): the windows
still open at the end of the topic fire, as ``tidemark replay`` fires them at the end of its
input, and only then.

The same bids (two partitions, several micro-batches) run through a TUMBLE window aggregate
twice: bounded, every window fires, the last ones in one more batch that reads no record
(replay's ``finish``), batch for batch what replay gives; unbounded, the windows the
watermark has not passed stay open. The bounded job is then restarted on its checkpoint
with more bids in the topic: it reads none of them (they came after the offsets it stopped
at) and fires nothing twice. A job kept running by processing-time timers stops under
``until_idle`` only after the batch that ends its bounded source; ``tidemark run`` refuses
the bounded modes it does not implement.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime, timedelta

import pytest
from run_support import PartRunner, replay_batches, sink_changes, sink_records, unique_topics

from tidemark.engine.pipeline import compile_sql
from tidemark.engine.replay import ReplayHost
from tidemark.kafka.transactional import BATCH_HEADER
from tidemark.spark.source import ENDED_KEY

pytestmark = pytest.mark.integration

SQL = """
CREATE TABLE bids (item BIGINT, price BIGINT, ts TIMESTAMP(3), WATERMARK FOR ts AS ts - INTERVAL '2' SECOND)
  WITH ('topic' = 'bids', 'format' = 'json'{bounded});
CREATE TABLE out (item BIGINT, window_start TIMESTAMP(3), bids BIGINT, top BIGINT)
  WITH ('topic' = 'out', 'format' = 'changelog-json');
INSERT INTO out SELECT item, window_start, COUNT(*), MAX(price)
FROM TABLE(TUMBLE(TABLE bids, DESCRIPTOR(ts), INTERVAL '10' SECOND)) GROUP BY item, window_start, window_end;
"""
START = datetime(2026, 11, 24, 10, 0, 0)
#: bids from 0 to 29 s, a little out of order: the last watermark is 27 s, so the windows
#: [20 s, 30 s) are still open at the end of the topic
BIDS = [{"kind": "+I", "row": {"item": i % 3, "price": i, "ts": str(START + timedelta(milliseconds=1000 * i - 700 * (i % 2)))}}
        for i in range(30)]


def _batches(pipeline, bootstrap: str, result) -> dict[int, Counter]:
    got: dict[int, Counter] = {r.batch_id: Counter() for r in result.reports}
    for rec in sink_records(bootstrap, pipeline, result.sink_writer_id):
        got.setdefault(int(rec.header(BATCH_HEADER)), Counter()).update((c.kind, c.row) for c in sink_changes(pipeline, [rec]))
    return got


def _job(spark, bootstrap: str, tmp_path, bounded: bool) -> tuple:
    option = ", 'scan.bounded.mode' = 'latest-offset'" if bounded else ""
    sql, _ = unique_topics(SQL.format(bounded=option), "bounded" if bounded else "unbounded")
    pipeline = compile_sql(sql)
    return pipeline, PartRunner(spark, bootstrap, pipeline, str(tmp_path / "checkpoint"), "bounded-windows")


def test_a_bounded_source_fires_the_open_windows_at_its_end_as_replay_does_and_only_once(spark, kafka_bootstrap, tmp_path):
    pipeline, parts = _job(spark, kafka_bootstrap, tmp_path, bounded=True)
    first = parts.run({"bids": BIDS})
    assert len(first.reports) >= 3 and sum(r.rows_in for r in first.reports) == len(BIDS)
    assert first.reports[-1].rows_in == 0, "the batch that ends the source reads no record"

    host = ReplayHost(pipeline, clock=lambda: 0)
    inputs = replay_batches(kafka_bootstrap, pipeline, first.reports)
    expected = {r.batch_id: Counter((c.kind, c.row) for c in host.run_batch(b))
                for r, b in zip(first.reports[:-1], inputs[:-1])}
    expected[first.reports[-1].batch_id] = Counter((c.kind, c.row) for c in host.finish())
    assert _batches(pipeline, kafka_bootstrap, first) == expected
    last = expected[first.reports[-1].batch_id]
    assert {row[1] for _, row in last} == {START + timedelta(seconds=20)} and last.total() == 3, \
        "the end fires the three items' windows [20 s, 30 s)"

    # restarted after the end, with bids past its stop in the topic: nothing read, nothing fired
    later = [{"kind": "+I", "row": {"item": 0, "price": 1, "ts": str(START + timedelta(seconds=s))}} for s in (5, 25, 60)]
    again = parts.run({"bids": later})
    assert sum(r.rows_in for r in again.reports) == 0 and sum(r.rows_out for r in again.reports) == 0
    assert sum(c.total() for c in _batches(pipeline, kafka_bootstrap, again).values()) == sum(
        c.total() for c in expected.values()), "the sink holds every window once"


def test_an_unbounded_source_leaves_the_windows_its_watermark_has_not_passed_open(spark, kafka_bootstrap, tmp_path):
    pipeline, parts = _job(spark, kafka_bootstrap, tmp_path, bounded=False)
    result = parts.run({"bids": BIDS})
    fired = Counter()
    for c in _batches(pipeline, kafka_bootstrap, result).values():
        fired.update(c)
    assert sorted({row[1] for _, row in fired}) == [START, START + timedelta(seconds=10)]
    assert fired.total() == 6


@pytest.mark.parametrize("mode", ["timestamp", "latest"])
def test_tidemark_run_refuses_a_bounded_mode_it_does_not_implement_in_one_line_with_status_2(tmp_path, mode):
    from test_run_cli import tidemark_run

    (tmp_path / "bad.sql").write_text(SQL.format(bounded=f", 'scan.bounded.mode' = '{mode}'"))
    proc = tidemark_run(["bad.sql", "--bootstrap-servers", "127.0.0.1:1", "--until-idle"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: bad.sql: table 'bids': option 'scan.bounded.mode': ")
    assert f"'{mode}'" in proc.stderr and "latest-offset" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


PROCTIME_SQL = """
CREATE TABLE bid (auction BIGINT, bidder BIGINT) WITH ('topic' = 'bid', 'format' = 'json', 'scan.bounded.mode' = 'latest-offset');
CREATE TABLE per_bidder (bidder BIGINT, n BIGINT, starttime TIMESTAMP(3)) WITH ('topic' = 'per_bidder', 'format' = 'changelog-json');
CREATE VIEW B AS SELECT *, PROCTIME() AS p_time FROM bid;
INSERT INTO per_bidder SELECT bidder, COUNT(*), window_start
FROM TABLE(TUMBLE(TABLE B, DESCRIPTOR(p_time), INTERVAL '1' HOUR)) GROUP BY bidder, window_start, window_end;
"""


def test_until_idle_waits_for_the_end_of_a_bounded_source_also_with_timers(spark, kafka_bootstrap, tmp_path):
    """A processing-time window keeps the query running by itself (its timers), so
    ``--until-idle`` stops it, and not before the batch that ends the bounded source."""
    sql, _ = unique_topics(PROCTIME_SQL, "bounded-timers")
    pipeline = compile_sql(sql)
    parts = PartRunner(spark, kafka_bootstrap, pipeline, str(tmp_path / "checkpoint"), "bounded-timers")
    result = parts.run({"bid": [{"kind": "+I", "row": {"auction": i, "bidder": i % 2}} for i in range(9)]})
    assert sum(r.rows_in for r in result.reports) == 9
    last = max(r.batch_id for r in result.reports)
    logged = (tmp_path / "checkpoint" / "offsets" / str(last)).read_text(encoding="utf-8").splitlines()
    assert json.loads(logged[-1])[ENDED_KEY] is True, f"the last batch did not end the source: {logged[-1]}"
    assert sum(r.rows_out for r in result.reports) == 0, "the hour-long windows never fire at the end"
