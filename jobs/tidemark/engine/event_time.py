"""Event time: what a table's ``WATERMARK`` clause means, and the watermark a host computes.

Flink's rule, per micro-batch: a source's watermark is the greatest event time it has read so
far minus its declared delay (``WATERMARK FOR ts AS ts - INTERVAL '4' SECOND``; ``AS ts``
is a delay of 0), and it never moves back; a stage sees the least watermark of the sources
upstream of it, so one slow source holds every stage that reads it. A source that has read
nothing has no watermark yet (Flink's ``Long.MIN_VALUE``), and neither has any stage it
feeds. At the end of a bounded input the watermark is ``END_OF_INPUT`` (Flink's
``Long.MAX_VALUE``), which fires every window still open.

A host keeps ``Watermarks`` for the run: ``advance`` folds each source's event times into it
per batch, and the batch's ``BatchContext`` gets the watermarks before and after the batch
(a record is late if its window had already fired before the batch that carries it).
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sqlglot import exp

from tidemark.engine.catalog import WatermarkDef
from tidemark.engine.intervals import interval_ms
from tidemark.engine.sql import describe, sql_error

END_OF_INPUT = 2**63 - 1
_EPOCH = _dt.datetime(1970, 1, 1)
_MS = _dt.timedelta(milliseconds=1)


def watermark_def(table: str, node: exp.WatermarkColumnConstraint, columns: list[str]) -> WatermarkDef:
    """``WATERMARK FOR col AS col [- INTERVAL ...]`` -> WatermarkDef; any other strategy is
    refused by name (Tidemark would compute another watermark than Flink's)."""
    col = node.this
    if not isinstance(col, exp.Column):
        raise sql_error(f"table '{table}': WATERMARK FOR needs a column name", node)
    folded = {c.lower(): c for c in columns}
    if col.name.lower() not in folded:
        raise sql_error(f"table '{table}': WATERMARK FOR '{col.name}': the table has no such column", col)
    name = folded[col.name.lower()]
    strategy = node.expression
    delay = None
    if isinstance(strategy, exp.Column) and strategy.name.lower() == name.lower():
        delay = 0
    elif (
        isinstance(strategy, exp.Sub)
        and isinstance(strategy.this, exp.Column)
        and strategy.this.name.lower() == name.lower()
        and isinstance(strategy.expression, exp.Interval)
    ):
        delay = interval_ms(strategy.expression, f"table '{table}': WATERMARK delay")
    if delay is None:
        raise sql_error(
            f"table '{table}': WATERMARK FOR {name} AS {describe(strategy) if strategy is not None else '(nothing)'} "
            f"is not supported: write AS {name} (ascending) or AS {name} - INTERVAL 'n' unit "
            "(bounded out-of-orderness)",
            strategy if strategy is not None else node,
        )
    return WatermarkDef(name, delay)


def epoch_ms(value: _dt.datetime) -> int:
    """A TIMESTAMP value (naive, UTC wall clock) as milliseconds since the epoch."""
    return (value - _EPOCH) // _MS


def from_epoch_ms(ms: int) -> _dt.datetime:
    """The inverse of ``epoch_ms``."""
    return _EPOCH + _dt.timedelta(milliseconds=ms)


def greatest_ms(event_times: Iterable[_dt.datetime | None]) -> int | None:
    """The latest of some event times, in epoch milliseconds (NULLs do not count; None: none left)."""
    return max((epoch_ms(t) for t in event_times if t is not None), default=None)


@dataclass
class Watermarks:
    """The greatest event time read per source table, and each table's delay."""

    delays: Mapping[str, int]
    max_event_ms: dict[str, int] = field(default_factory=dict)
    ended: bool = False

    def advance(self, table: str, event_times: Iterable[_dt.datetime | None]) -> None:
        """Fold one batch's event times of ``table`` in (NULL event times do not count)."""
        best = greatest_ms(event_times)
        if best is not None and best > self.max_event_ms.get(table, best - 1):
            self.max_event_ms[table] = best

    def current(self) -> dict[str, int]:
        """Each table's watermark now (tables that have read nothing are absent)."""
        if self.ended:
            return {t: END_OF_INPUT for t in self.delays}
        return {t: ms - self.delays[t] for t, ms in self.max_event_ms.items()}


def watermark_of(watermarks: Mapping[str, int], tables: Iterable[str]) -> int | None:
    """A stage's watermark: the least of its upstream sources' (None while one has none)."""
    values = [watermarks.get(t) for t in tables]
    if not values or any(v is None for v in values):
        return None
    return min(values)  # type: ignore[type-var]
