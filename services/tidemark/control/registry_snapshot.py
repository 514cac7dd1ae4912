"""A copy of the registry's pipelines in the state dir, for a registry that does not survive.

The embedded broker keeps its topics in memory: without a copy, a restarted control service
would list no pipelines while their checkpoints stay on disk. The control service writes
this file after every change it makes (atomically: a crash leaves the old or the new copy)
and, on an empty registry, writes the records back into the fresh broker on start, uids
included, so every pipeline finds its checkpoint again. Leases are not kept: a restarted
service claims its pipelines anew.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tidemark.control.registry_log import PipelineRecord

class RegistrySnapshot:
    def __init__(self, path: Path):
        self.path = path
        self._saved: bytes | None = None

    def load(self) -> list[PipelineRecord]:
        """The pipelines of the last copy; none when there is no copy. A copy that cannot be
        read is not guessed at: it is named in the error and left for the operator."""
        if not self.path.exists():
            return []
        try:
            values = json.loads(self.path.read_bytes())
            return [PipelineRecord.from_value(json.dumps(v).encode()) for v in values]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"registry copy {self.path} is not readable ({exc}); move it away to start empty") from exc

    def save(self, records: list[PipelineRecord]) -> None:
        """Replace the copy with ``records`` (skipped when nothing changed since the last save).
        Callers serialize their calls, reading ``records`` under the same lock, so that the
        last copy written is of the newest registry."""
        data = json.dumps([json.loads(r.to_value()) for r in sorted(records, key=lambda r: r.name)],
                          indent=1, sort_keys=True).encode()
        if data == self._saved:
            return
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self._saved = data


def orphaned_checkpoints(root: Path, expected: set[str]) -> list[Path]:
    """Checkpoint directories under ``root`` whose names are not ``expected``."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name not in expected)
