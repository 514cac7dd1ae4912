"""Table definitions from ``CREATE TABLE``: columns, primary key, options.

A table's ``format`` option decides what its changes mean, as in Flink: an append format
carries inserts only, a retracting format carries exact before-images, an upsert format
carries only the new row (or a tombstone) per key and must be normalized before anything
that needs before-images.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from tidemark.engine.errors import PlanError
from tidemark.engine.options import APPEND_FORMATS, RETRACT_FORMATS, UPSERT_FORMATS, format_problem
from tidemark.engine.types import SqlType


@dataclass(frozen=True)
class Column:
    name: str
    type: SqlType


@dataclass(frozen=True)
class ComputedColumn:
    """``name AS expr`` in CREATE TABLE: a column computed from the physical ones (``expr``
    is the sqlglot expression over the table's columns, resolved by the planner)."""

    name: str
    expr: Any


@dataclass(frozen=True)
class WatermarkDef:
    """``WATERMARK FOR column AS column - INTERVAL ...``: the event-time column and how far
    behind the greatest event time seen the watermark trails (0: strictly ascending)."""

    column: str
    delay_ms: int


@dataclass(frozen=True)
class TableDef:
    """A declared table. ``primary_key`` holds column names in declaration order of the
    PRIMARY KEY clause; ``columns`` are the physical columns a source record carries."""

    name: str
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...] = ()
    options: dict[str, str] = field(default_factory=dict)
    #: computed columns follow the physical ``columns`` in the table's schema; sources
    #: carry only the physical ones
    computed: tuple[ComputedColumn, ...] = ()
    watermark: WatermarkDef | None = None

    def __post_init__(self) -> None:
        # accept lists from callers; keep the dataclass hash-free but tuple-valued
        object.__setattr__(self, "columns", tuple(self.columns))
        object.__setattr__(self, "primary_key", tuple(self.primary_key))
        object.__setattr__(self, "computed", tuple(self.computed))

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def types(self) -> list[SqlType]:
        return [c.type for c in self.columns]

    def has_column(self, name: str) -> bool:
        return self._position(name) is not None

    def index_of(self, name: str) -> int:
        """Position of a column (case-insensitive, as Flink's default identifiers are
        matched by the planner here). Raises KeyError naming the table."""
        i = self._position(name)
        if i is None:
            raise KeyError(f"table '{self.name}' has no column '{name}'")
        return i

    def _position(self, name: str) -> int | None:
        exact, folded = self._positions
        i = exact.get(name)
        return i if i is not None else folded.get(name.lower())

    @cached_property
    def _positions(self) -> tuple[dict[str, int], dict[str, int]]:
        # dicts, not scans: a wide table is looked up once per column (planning, replay rows)
        exact: dict[str, int] = {}
        folded: dict[str, int] = {}
        for i, c in enumerate(self.columns):
            exact.setdefault(c.name, i)
            folded.setdefault(c.name.lower(), i)
        return exact, folded

    @property
    def pk_indexes(self) -> tuple[int, ...]:
        return tuple(self.index_of(n) for n in self.primary_key)

    @property
    def format(self) -> str | None:
        """The format as Tidemark names it: Flink's ``upsert-kafka`` connector with a
        ``value.format`` of ``json`` is ``upsert-json``, and so on."""
        fmt = self.options.get("format") or self.options.get("value.format")
        if self.options.get("connector", "").lower() == "upsert-kafka":
            if fmt is None:
                return "upsert-json"
            if fmt.lower() in APPEND_FORMATS:
                return f"upsert-{fmt.lower()}"
        return fmt

    @property
    def changelog_mode(self) -> str:
        """``append`` | ``retract`` | ``upsert``, from the ``format`` option (no format:
        append). An unknown format is a PlanError naming the table and the format."""
        fmt = self.format
        if fmt is None:
            return "append"
        problem = format_problem(self.name, fmt)
        if problem is not None:
            raise PlanError(problem)
        fmt = fmt.lower()
        if fmt in RETRACT_FORMATS:
            return "retract"
        if fmt in UPSERT_FORMATS:
            return "upsert"
        return "append"

    @property
    def merge_engine(self) -> str | None:
        """The Paimon-style ``merge-engine`` option, lower-cased, or None."""
        me = self.options.get("merge-engine")
        return me.lower() if me else None
