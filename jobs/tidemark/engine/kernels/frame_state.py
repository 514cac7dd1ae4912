"""The typed state protocol (``tidemark.engine.state_codec``) for a kernel whose bucket state
is one polars frame: the frame is the stored table as it is, and an empty bucket is None, so
a bucket without rows stores nothing."""

from __future__ import annotations

import polars as pl
import pyarrow as pa


class FrameState:
    """Mixed into a kernel class that sets ``state_kind`` and ``state_version``."""

    def empty_state(self) -> pl.DataFrame | None:
        return None

    def state_to_table(self, state: pl.DataFrame | None) -> pa.Table | None:
        return None if state is None or state.height == 0 else state.to_arrow()

    def state_from_table(self, table: pa.Table) -> pl.DataFrame:
        return pl.from_arrow(table)
