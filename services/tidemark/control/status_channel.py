"""The job -> control status channel: JSON Lines in a file named by ``TIDEMARK_STATUS_FILE``.

A file (not the job's stdout) because Spark and py4j write freely to the terminal, and a
file survives the control service restarting while the job is replaced. The job appends
one JSON object per line and flushes; the control service tails the file. The format is
written down in ``docs/control.md``; in short:

    {"v": 1, "event": "started", "ts": 1718000000.0}
    {"v": 1, "event": "batch", "ts": ..., "batch_id": 7, "rows_in": 120, "rows_out": 80,
     "lag": {"s1": {"0": 0, "1": 3}}, "dlq": 0, "conflicts": 0,
     "retractions_without_state": 0, "state_size_bytes": 12345}
    {"v": 1, "event": "idle", "ts": ...}
    {"v": 1, "event": "error", "ts": ..., "message": "..."}

Counts in a ``batch`` event are for that batch (deltas); the control service sums them,
so a job restarted from its checkpoint never needs to remember totals. ``lag`` and
``state_size_bytes`` are gauges as of the end of the batch. Unknown fields and events are
ignored and a malformed line is skipped (counted), so the job can add fields freely.
A ``batch`` event may carry ``"metrics": {"delta_join.left.cache_hits": 3, ...}``: a stage's
counters for that batch, summed per name (the status API shows them under ``metrics``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

DELTA_FIELDS = ("rows_in", "rows_out", "dlq", "conflicts", "retractions_without_state")


@dataclass
class JobProgress:
    """Totals and gauges of one pipeline, summed over every run of its job."""

    ready: bool = False  # the job said "started" or finished a batch
    last_batch_id: int | None = None
    last_batch_time: float | None = None
    totals: dict[str, int] = field(default_factory=lambda: {f: 0 for f in DELTA_FIELDS})
    lag: dict[tuple[str, int], int] = field(default_factory=dict)
    state_size_bytes: int | None = None
    error: str | None = None  # the last "error" event's message
    # counters a stage reports per batch (e.g. the delta join's "delta_join.left.cache_hits"),
    # summed like the figures above
    metrics: dict[str, int] = field(default_factory=dict)
    idle: bool = False
    bad_lines: int = 0

    def apply_line(self, line: str) -> None:
        line = line.strip()
        if not line:
            return
        try:
            event = json.loads(line)
            if not isinstance(event, dict):
                raise ValueError("not an object")
            self.apply(event)
        except (ValueError, TypeError):
            self.bad_lines += 1

    def apply(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "started":
            self.ready = True
            self.idle = False
        elif kind == "batch":
            self.ready = True
            self.idle = False
            if event.get("batch_id") is not None:
                self.last_batch_id = int(event["batch_id"])
            self.last_batch_time = float(event.get("ts") or 0.0) or self.last_batch_time
            for name in DELTA_FIELDS:
                value = int(event.get(name) or 0)
                if value < 0:
                    raise ValueError(f"{name} must not be negative")
                self.totals[name] += value
            lag = event.get("lag")
            if isinstance(lag, dict):
                self.lag = {
                    (str(topic), int(part)): int(n)
                    for topic, parts in lag.items()
                    if isinstance(parts, dict)
                    for part, n in parts.items()
                }
            if event.get("state_size_bytes") is not None:
                self.state_size_bytes = int(event["state_size_bytes"])
            metrics = event.get("metrics")
            if isinstance(metrics, dict):
                for name, value in metrics.items():
                    if isinstance(value, (int, float)) and not isinstance(value, bool):
                        self.metrics[str(name)] = self.metrics.get(str(name), 0) + int(value)
        elif kind == "idle":
            self.idle = True
        elif kind == "error":
            self.error = str(event.get("message") or "error")

    def snapshot(self) -> dict[str, Any]:
        """A JSON-able view, carried in lease renewals so every service can report it."""
        return {
            "last_batch_id": self.last_batch_id,
            "last_batch_time": self.last_batch_time,
            **self.totals,
            "lag": [{"topic": t, "partition": p, "lag": n} for (t, p), n in sorted(self.lag.items())],
            "state_size_bytes": self.state_size_bytes,
            "metrics": dict(sorted(self.metrics.items())),
        }


class FileTail:
    """Reads whole lines appended to a file since the last call (a partial last line
    waits for its newline, so a line the job is half-way through writing is never parsed)."""

    def __init__(self, path: str):
        self.path = path
        self.offset = 0
        self._partial = b""

    def read_lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        data = self._partial + data
        *lines, self._partial = data.split(b"\n")
        return [ln.decode("utf-8", errors="replace") for ln in lines]
