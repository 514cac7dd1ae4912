"""A plan node: one stage with its columns, types, upsert keys and changelog mode."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tidemark.engine.types import SqlType

Key = frozenset  # frozenset[int]: one upsert key, as column positions


@dataclass
class Node:
    """One stage of the plan. ``stage`` is the runtime object (None for source/sink);
    ``upsert_keys`` are all keys that stay unique and ordered at this point."""

    id: int
    kind: str  # source | normalize | calc | join | lookup_join | union | aggregate | materializer | merge_engine | sink
    name: str
    inputs: list[int]
    columns: list[str]
    types: list[SqlType | None]
    upsert_keys: frozenset = frozenset()
    changelog_mode: str = "retract"
    stage: Any = None
    table: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def width(self) -> int:
        return len(self.columns)

    @property
    def upsert_key(self) -> tuple[int, ...] | None:
        """The key shown and used downstream: the smallest one (ties: earliest columns)."""
        return choose_key(self.upsert_keys)

    def key_names(self, key: tuple[int, ...] | None) -> list[str] | None:
        return None if key is None else [self.columns[i] for i in key]


def choose_key(keys: frozenset, prefer: frozenset | None = None) -> tuple[int, ...] | None:
    if not keys:
        return None
    if prefer is not None and prefer in keys:
        return tuple(sorted(prefer))
    return min((tuple(sorted(k)) for k in keys), key=lambda k: (len(k), k))


def format_key(names: list[str] | None) -> str:
    return "(none)" if names is None else "(" + ", ".join(names) + ")"

