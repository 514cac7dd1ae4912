"""Where a checkpoint is: a directory on this machine, or a remote file system's URL.

In a local checkpoint Tidemark keeps its own small files beside Spark's (the run record,
the plan's fingerprint) and reads Spark's offset log directly; a remote one (``scheme://``
other than ``file://``) is reached through Spark only."""

from __future__ import annotations

from pathlib import Path


def local_dir(checkpoint: str) -> Path | None:
    """The directory of a checkpoint on this machine; None for a remote one."""
    if "://" in checkpoint and not checkpoint.startswith("file://"):
        return None
    return Path(checkpoint.removeprefix("file://"))
