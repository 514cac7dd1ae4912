"""The size of a job's keyed state as Tidemark stores it: per keyed stage, the bytes of its
buckets' stored values (``tidemark.engine.state_codec``), summed.

Why Tidemark measures it rather than reading RocksDB's SST file size from Spark's progress:
with RocksDB changelog checkpointing (the embedded default, ``tidemark.spark.session``) a
commit appends to a changelog file and does not flush the memtable, so the SST files only
follow the state at a snapshot, every ``minDeltasForSnapshot`` batches.

Workers report each bucket's stored size when they write it (``StageMetrics.sizes``, per
batch id: a task that runs again reports the same values). The driver keeps every bucket's
latest size and records the sizes with the checkpoint after each batch
(``tidemark-state-bytes.json``), next to those of the batch before: a batch that runs again
after a crash starts from the sizes of the batch before it, as its state stores do.

A checkpoint on a non-local file system gets no file: the sizes are kept in memory, known
while the process that started the checkpoint runs it. A checkpoint that has committed
batches but no readable file (one written without it, or a remote one restarted) holds
buckets of unknown size: its state size is reported as unknown (None), not as the part
that was measured.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

STATE_BYTES_FILE = "tidemark-state-bytes.json"
#: the file's format; another version is read as a checkpoint without the file
FORMAT = 1

#: (stage name, bucket) -> the bytes of the bucket's stored value (0: none stored)
BucketBytes = Mapping[tuple[str, int], int]


@dataclass
class _Sizes:
    """Every bucket's stored bytes after one batch; ``complete``: no bucket's size is unknown."""

    buckets: dict[str, dict[int, int]] = field(default_factory=dict)
    complete: bool = True

    def updated(self, reported: BucketBytes) -> _Sizes:
        buckets = {stage: dict(sizes) for stage, sizes in self.buckets.items()}
        for (stage, bucket), size in reported.items():
            buckets.setdefault(stage, {})[int(bucket)] = int(size)
        return _Sizes(buckets, self.complete)

    def by_stage(self) -> dict[str, int] | None:
        if not self.complete:
            return None
        return {stage: sum(sizes.values()) for stage, sizes in sorted(self.buckets.items())}


class StateBytes:
    """The driver's record of every bucket's stored size, batch after batch."""

    def __init__(self, directory: Path | None, resumed: bool):
        """``directory``: the local checkpoint directory (None: not local, nothing is
        written); ``resumed``: the checkpoint has committed batches."""
        self.path = directory / STATE_BYTES_FILE if directory is not None else None
        self._history: dict[int, _Sizes] = {-1: _Sizes(complete=not resumed)}
        if self.path is not None and self.path.exists():
            self._history = _read(self.path) or self._history

    def record(self, batch_id: int, reported: BucketBytes) -> dict[str, int] | None:
        """The state bytes per stage after ``batch_id``, whose tasks reported ``reported``;
        None while a bucket's size is unknown."""
        before = max((b for b in self._history if b < batch_id), default=None)
        base = self._history[before] if before is not None else _Sizes(complete=False)
        after = base.updated(reported)
        self._history = {b: s for b, s in self._history.items() if b == before} | {batch_id: after}
        if self.path is not None:
            _write(self.path, self._history)
        return after.by_stage()


def _read(path: Path) -> dict[int, _Sizes] | None:
    """The recorded sizes, None for a file this version cannot read."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != FORMAT:
            return None
        return {
            int(batch): _Sizes({stage: {int(b): int(n) for b, n in sizes.items()}
                                for stage, sizes in entry["buckets"].items()}, bool(entry["complete"]))
            for batch, entry in data["batches"].items()
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _write(path: Path, history: dict[int, _Sizes]) -> None:
    """Replace the file at once: a crash leaves the old record or the new one."""
    data = {"format": FORMAT, "batches": {str(b): {"complete": s.complete, "buckets": s.buckets}
                                          for b, s in history.items()}}
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)
