"""What Flink 2.3 gives for a processing-time window on a bounded input (Nexmark q12's
shape): nothing. Its windows close on the wall clock, and at the end of a bounded input
the job finishes without firing the windows still open; the oracle's run takes less than
one 10 s window, so every bid is in an open window and the sink never sees a row. This
minimal reproduction is why q12 has no Flink reference (``docs/conformance.md``,
"Processing-time windows")."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "nexmark"))
import harness  # noqa: E402  (the oracle runner the Nexmark suite uses)

pytestmark = pytest.mark.conformance

Q12_SHAPE = """
CREATE TABLE bid (auction BIGINT, bidder BIGINT, price BIGINT, PRIMARY KEY (auction) NOT ENFORCED)
  WITH ('format' = 'json');
CREATE TABLE q12 (bidder BIGINT, bid_count BIGINT, starttime TIMESTAMP(3), endtime TIMESTAMP(3))
  WITH ('format' = 'changelog-json');
CREATE VIEW B AS SELECT *, PROCTIME() AS p_time FROM bid;
INSERT INTO q12 SELECT bidder, COUNT(*), window_start, window_end
FROM TABLE(TUMBLE(TABLE B, DESCRIPTOR(p_time), INTERVAL '10' SECOND))
GROUP BY bidder, window_start, window_end;
"""
BIDS = {"bid": [[{"kind": "+I", "row": {"auction": i, "bidder": i % 3, "price": i}, "seq": i}
                 for i in range(5 * b, 5 * b + 5)] for b in range(3)]}


def test_flink_fires_no_open_processing_time_window_at_end_of_input():
    result = harness.flink_results([{"id": "proctime-tumble-end-of-input", "sql": Q12_SHAPE, "inputs": BIDS}],
                                   slots=1)["proctime-tumble-end-of-input"]
    assert result["ok"], result["error"]  # Flink plans and runs it to the end of input ...
    assert len(result["steps"]) == 3
    assert result["steps"] == [[], [], []] and result["final"] == []  # ... and writes nothing
    assert result["changelog"] == []
