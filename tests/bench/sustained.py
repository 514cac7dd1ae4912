"""The sustained mode's two verdicts, as pure functions (stdlib only, no JVM): the steady-state
clock of a run that drains a large input in several micro-batches, and whether a job fed at a
fixed rate kept up.

Steady-state clock (the same rule for both systems): a run's first ``warm-up`` input records
are left out, and so is the time until the job had taken them in; throughput = the remaining
records / (that boundary -> the sink holds the last output). It removes what a long-running
job pays once (the first batch's code generation, task deployment, Python workers and state
store opening; Flink's task deployment and JIT warm-up) and measures the rate at which a warm
job drains a backlog.

- Tidemark: the warm-up is its first micro-batch (at most ``--max-records-per-trigger``
  records); the boundary is that batch's commit (its status event), when its output is in the
  sink.
- Flink has no batches. Its warm-up is the same number of records (``first_batch_rows``: what
  Tidemark's first batch takes, up to the cap from each source table);
  the boundary is the first moment its sources had emitted that share of their output
  (``write-records`` of the source vertices, sampled from the REST API every 200 ms).
  A source vertex emits changelog rows, not input records (a Debezium update is two rows, a
  chained filter drops some), so records are estimated as input x emitted / emitted at the
  end. Records emitted but still in flight at the boundary are counted as done, which
  favours Flink by at most its network buffers' worth of records.

Keep-up verdict: a job fed ``rate`` rows/s keeps up when its backlog (rows produced but not yet
visible in the sink) does not grow across the phase: the median backlog of the phase's last
third exceeds the median of its first third by less than ``GROWTH_FRACTION`` of the rows
produced between the two thirds' midpoints. A micro-batch job's backlog is a saw-tooth
(it grows during a batch and drops at each commit); the medians over thirds compare its level,
not one tooth. A job that falls behind is reported with that growth, never with a latency.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

#: the backlog may grow by at most this share of the rows produced meanwhile (see the docstring)
GROWTH_FRACTION = 0.1
#: the producer reached the asked rate when it achieved at least this share of it
RATE_FRACTION = 0.95


@dataclass(frozen=True)
class Steady:
    """Throughput on the steady part of one run."""

    warmup_rows: int  # input records left out (the first batch; Flink: estimated, see module doc)
    rows: int  # input records measured
    seconds: float  # warm-up boundary -> the sink holds the last output
    rows_per_s: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def records_per_trigger(input_rows: int, batches: int) -> int | None:
    """The per-batch cap that drains ``input_rows`` in about ``batches`` micro-batches (None:
    one batch, no cap)."""
    if batches < 1:
        raise ValueError(f"batches must be >= 1, got {batches}")
    return None if batches == 1 else math.ceil(input_rows / batches)


def first_batch_rows(cap: int, source_records: Sequence[int]) -> int:
    """The records of a capped job's first micro-batch when all input is there at its start:
    each source table takes up to ``cap`` (Tidemark's cap is per source)."""
    return sum(min(cap, n) for n in source_records)


def tidemark_steady(batches: Sequence[dict[str, Any]], input_rows: int) -> Steady | None:
    """The steady clock of a Tidemark run from its status file's ``batch`` events (``ts`` =
    commit time, ``rows_in``): from the first data batch's commit to the last's. None with
    fewer than two data batches (no steady part)."""
    data = sorted((e for e in batches if e.get("rows_in")), key=lambda e: e["ts"])
    if len(data) < 2:
        return None
    warmup = int(data[0]["rows_in"])
    seconds = data[-1]["ts"] - data[0]["ts"]
    rows = input_rows - warmup
    return Steady(warmup, rows, round(seconds, 3), rows / seconds if seconds > 0 else math.inf)


def flink_steady(timeline: Sequence[tuple[float, int]], emitted_total: int, input_rows: int,
                 warmup_rows: int, end_s: float) -> Steady | None:
    """The steady clock of a Flink run. ``timeline``: (time, rows emitted by the sources so far)
    samples; ``emitted_total``: rows they emitted over the whole job; ``end_s``: when the sink
    held the last output. The boundary is the first sample at which the sources had emitted
    ``warmup_rows`` worth of input records (see the module docstring). None when no sample
    reached it before the end (a job too short to have a steady part)."""
    if emitted_total <= 0 or warmup_rows <= 0:
        return None
    for t, emitted in sorted(timeline):
        done = input_rows * emitted / emitted_total
        if done >= warmup_rows and t < end_s:
            rows = input_rows - round(done)
            if rows <= 0:
                return None
            return Steady(round(done), rows, round(end_s - t, 3), rows / (end_s - t))
    return None


@dataclass(frozen=True)
class KeepUp:
    """Whether a job fed at a fixed rate kept up, and the figures that say so."""

    kept_up: bool
    rate_reached: bool  # the producer achieved >= RATE_FRACTION of the asked rate
    asked_rate: float
    achieved_rate: float
    backlog_start: float  # median backlog (rows) over the phase's first third
    backlog_end: float  # ... and over its last third
    allowed_growth: float  # rows the backlog could have grown by and still count as kept up

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        if self.kept_up:
            return (f"kept up (backlog {self.backlog_start:,.0f} rows in the first third, "
                    f"{self.backlog_end:,.0f} in the last)")
        return f"fell behind (backlog grew from {self.backlog_start:,.0f} to {self.backlog_end:,.0f} rows)"


def keep_up(samples: Sequence[tuple[float, int]], asked_rate: float, achieved_rate: float) -> KeepUp:
    """The verdict on a fixed-rate phase from its backlog ``samples`` (seconds since the phase
    began, rows produced and not yet visible in the sink), taken while it produced; see the
    module docstring."""
    if len(samples) < 3:
        raise ValueError(f"need at least 3 backlog samples to judge a phase, got {len(samples)}")
    ordered = sorted(samples)
    t0, t1 = ordered[0][0], ordered[-1][0]
    third = (t1 - t0) / 3
    first = [b for t, b in ordered if t <= t0 + third] or [ordered[0][1]]
    last = [b for t, b in ordered if t >= t1 - third] or [ordered[-1][1]]
    start, end = statistics.median(first), statistics.median(last)
    allowed = GROWTH_FRACTION * achieved_rate * 2 * third  # rows produced between the thirds' midpoints
    return KeepUp(kept_up=end - start < allowed, rate_reached=achieved_rate >= RATE_FRACTION * asked_rate,
                  asked_rate=asked_rate, achieved_rate=achieved_rate, backlog_start=start, backlog_end=end,
                  allowed_growth=allowed)
