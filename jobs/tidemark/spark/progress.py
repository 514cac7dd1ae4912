"""What a running job reports about each micro-batch, and where it reports it.

One ``BatchReport`` per committed micro-batch, assembled from two halves that Spark makes
available at different moments: what the sink's ``foreachBatch`` saw while writing
(changes written, dead letters, the stage counters of the batch, the keyed stages' stored
bytes) and Spark's own ``StreamingQueryProgress`` once the batch is committed (offsets,
duration, state store rows). The report goes to the terminal (one line per batch) and, when the
control service supervises the job, to the JSON Lines status file of ``docs/control.md``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

#: Offsets of the tidemark-kafka source as they appear in a progress: topic -> partition -> offset
Offsets = dict[str, dict[str, int]]


@dataclass
class BatchReport:
    batch_id: int
    rows_in: int = 0
    rows_out: int = 0
    dlq: int = 0
    conflicts: int = 0
    retractions_without_state: int = 0
    #: topic -> partition -> records not yet read after this batch
    lag: dict[str, dict[str, int]] = field(default_factory=dict)
    #: the bytes of the keyed stages' stored state (``tidemark.spark.state_bytes``); None:
    #: unknown for this checkpoint
    state_size_bytes: int | None = None
    #: the same per keyed stage
    state_bytes_by_stage: dict[str, int] | None = None
    #: rows in Spark's state stores: one per state bucket a stage keeps
    state_rows: int = 0
    duration_ms: int = 0
    #: source offsets this batch read: [start, end) per topic and partition
    start_offsets: Offsets = field(default_factory=dict)
    end_offsets: Offsets = field(default_factory=dict)
    #: every stage counter of the batch (``<stage>.<counter>``)
    counters: dict[str, int] = field(default_factory=dict)

    @property
    def total_lag(self) -> int:
        return sum(n for parts in self.lag.values() for n in parts.values())

    def status_event(self) -> dict[str, Any]:
        """The ``batch`` event of the status channel (docs/control.md)."""
        return {
            "event": "batch",
            "batch_id": self.batch_id,
            "rows_in": self.rows_in,
            "rows_out": self.rows_out,
            "dlq": self.dlq,
            "conflicts": self.conflicts,
            "retractions_without_state": self.retractions_without_state,
            "lag": self.lag,
            "state_size_bytes": self.state_size_bytes,
            "state_bytes_by_stage": self.state_bytes_by_stage,
            "duration_ms": self.duration_ms,
            "metrics": self.delta_join_metrics(),
        }

    def delta_join_metrics(self) -> dict[str, int]:
        """The batch's delta-join counters without the stage prefix
        (``delta_join.left.cache_hits``...), summed over delta joins: what the control
        service shows under a pipeline's ``metrics``."""
        out: dict[str, int] = {}
        for name, value in self.counters.items():
            _stage, sep, counter = name.partition(".")
            if sep and counter.startswith("delta_join."):
                out[counter] = out.get(counter, 0) + int(value)
        return out

    def line(self) -> str:
        """One terminal line."""
        text = (
            f"batch {self.batch_id:>4}  in {self.rows_in:>7}  out {self.rows_out:>7}  "
            f"dlq {self.dlq:>4}  lag {self.total_lag:>7}  {self.duration_ms / 1000:6.2f}s"
        )
        if self.conflicts:
            text += f"  conflicts {self.conflicts}"
        if self.retractions_without_state:
            text += f"  retractions-without-state {self.retractions_without_state}"
        return text

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SinkBatch:
    """The driver-side half of a batch, recorded by the sink's ``foreachBatch``."""

    #: the source records the batch read (its decode passes count them: Spark's
    #: ``numInputRows`` counts the blobs the scans emit)
    rows_in: int
    rows_out: int
    dlq: int
    counters: dict[str, int]
    #: the keyed stages' stored bytes after the batch (None: unknown)
    state_bytes: dict[str, int] | None = None


# ---------------------------------------------------------------------------- progress parsing


def _get(obj: Any, name: str, default: Any = None) -> Any:
    """Field access that works on pyspark's progress objects and on plain dicts."""
    if obj is None:
        return default
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    try:
        return obj[name]
    except (KeyError, TypeError, IndexError):
        return getattr(obj, name, default)


def parse_offset(value: Any) -> Any:
    """A progress's offset as parsed JSON (None: none, or not JSON)."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return None


def offsets_of(value: Any) -> Offsets:
    """A source offset from a progress (JSON text or a dict) as topic -> partition -> int."""
    value = parse_offset(value)
    if not isinstance(value, Mapping):
        return {}
    out: Offsets = {}
    for topic, parts in value.items():
        if isinstance(parts, Mapping):
            out[str(topic)] = {str(p): int(o) for p, o in parts.items()}
    return out


def lag_of(end: Offsets, latest: Offsets) -> dict[str, dict[str, int]]:
    """Per topic and partition: the end the source last saw minus the next offset to read."""
    lag: dict[str, dict[str, int]] = {}
    for topic, parts in latest.items():
        for p, hi in parts.items():
            lag.setdefault(topic, {})[p] = max(0, hi - end.get(topic, {}).get(p, 0))
    for topic, parts in end.items():  # partitions the latest offset did not list
        for p in parts:
            lag.setdefault(topic, {}).setdefault(p, 0)
    return lag


def state_rows(progress: Any) -> int:
    """Rows in the state stores of a progress's stateful operators."""
    return sum(int(_get(op, "numRowsTotal", 0) or 0) for op in _get(progress, "stateOperators", None) or [])


def ran_a_batch(progress: Any) -> bool:
    """Whether ``progress`` is the report of a batch that ran. While a query waits for data,
    Spark posts an idle progress every ``noDataProgressEventInterval`` that carries the id of
    the batch it will run next and no ``addBatch`` time: taken for that batch, it would
    stand in for the real report that follows it with the same id."""
    duration = _get(progress, "durationMs", None) or {}
    return "addBatch" in duration


def report_from(progress: Any, sink: SinkBatch | None) -> BatchReport:
    """Join Spark's progress of one batch with what the sink recorded for it."""
    sources = _get(progress, "sources", None) or []
    start: Offsets = {}
    end: Offsets = {}
    latest: Offsets = {}
    for src in sources:
        for target, name in ((start, "startOffset"), (end, "endOffset"), (latest, "latestOffset")):
            for topic, parts in offsets_of(_get(src, name)).items():
                target.setdefault(topic, {}).update(parts)
    by_stage = sink.state_bytes if sink else None
    duration = _get(progress, "durationMs", None) or {}
    counters = dict(sink.counters) if sink else {}
    return BatchReport(
        batch_id=int(_get(progress, "batchId")),
        rows_in=sink.rows_in if sink else 0,
        rows_out=sink.rows_out if sink else 0,
        dlq=sink.dlq if sink else 0,
        conflicts=sum(v for k, v in counters.items() if k.endswith(".conflicts_dropped")),
        retractions_without_state=sum(
            v for k, v in counters.items() if k.endswith(".retractions_without_state")
        ),
        lag=lag_of(end, latest),
        state_size_bytes=sum(by_stage.values()) if by_stage is not None else None,
        state_bytes_by_stage=by_stage,
        state_rows=state_rows(progress),
        duration_ms=int(_get(duration, "triggerExecution", 0) or 0),
        start_offsets=start,
        end_offsets=end,
        counters=counters,
    )


# ---------------------------------------------------------------------------- status channel


class StatusFile:
    """Appends status events (JSON Lines, flushed per event) to ``TIDEMARK_STATUS_FILE``
    for the control service; a no-op without a path. Thread-safe: the stop watcher and the
    progress loop may both write."""

    def __init__(self, path: str | None):
        self.path = path
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls) -> StatusFile:
        return cls(os.environ.get("TIDEMARK_STATUS_FILE") or None)

    def emit(self, event: str, **fields: Any) -> None:
        if not self.path:
            return
        line = json.dumps({"v": 1, "event": event, "ts": time.time(), **fields}, default=str)
        with self._lock, open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()

    def batch(self, report: BatchReport) -> None:
        if self.path:
            fields = report.status_event()
            fields.pop("event")
            self.emit("batch", **fields)


class TerminalProgress:
    """One line per batch on a terminal stream (stderr by default, so stdout stays data)."""

    def __init__(self, stream: TextIO | None):
        self.stream = stream

    def say(self, text: str) -> None:
        if self.stream is not None:
            self.stream.write(text + "\n")
            self.stream.flush()

    def batch(self, report: BatchReport) -> None:
        self.say(report.line())
