"""Event time on the Spark host: what it runs today.

A table's WATERMARK is honoured where nothing depends on it (a pipeline without windows
computes the same rows whatever the watermark). A window aggregate needs more of the host
than one bucket's state per batch: the watermark must be kept across batches and restarts,
and a bucket's windows must fire when the watermark moves even in a batch that brings the
bucket no record. Until the Spark host has that, a pipeline with a window aggregate is
refused before the job starts, naming the stage, and runs in ``tidemark replay``.
"""

from __future__ import annotations

from typing import Any

from tidemark.engine.errors import PlanError


def check_supported(pipeline: Any) -> None:
    """Refuse what the Spark host cannot run with event time (module docstring)."""
    for node in pipeline.nodes:
        if node.kind in ("window_aggregate", "window_rank", "window_join"):
            raise PlanError(
                f"stage [{node.id}] {node.name}: window aggregation does not run on Spark yet "
                "(it runs in `tidemark replay`); see docs/sql.md, \"Event time and windows\""
            )
