"""In which order one key's records apply.

A batch is a set: the host delivers a key's records in any order, so the order is computed
from the records alone. Following the design's consolidation rule, exact pairs (a ``+X`` and
a ``-X`` of the identical row) cancel first. The rest apply in merge order, which is
Paimon's: by ``sequence.field`` (nulls first; ascending, or descending with
``sequence.field.sort-order``), then by source position (Paimon's system sequence number),
retractions before adds at the same position, and finally by the row's repr so that even
full ties are deterministic.

The merged row kept in state (or the tombstone of a deleted key, with ``sequence.field``)
re-enters every fold as one more record, positioned by its
own sequence value and the greatest source position applied so far, ahead of batch records
that tie with it. That is exactly how Paimon re-merges a compacted row with newer files, and
it is what makes "the record with the largest sequence wins" hold across batches: a late
record with a smaller sequence value sorts before the state and cannot override it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from tidemark.engine.changelog import ADDS, Change, order_key


class Item(NamedTuple):
    """One record to fold: ``is_state`` marks the merged row from earlier batches."""

    kind: str
    row: tuple
    is_state: bool


def freeze(value: Any) -> Any:
    """A hashable stand-in for a value that may contain lists or dicts (ARRAY, MAP)."""
    if isinstance(value, Mapping):
        return ("{}", tuple(sorted(((repr(k), freeze(v)) for k, v in value.items()))))
    if isinstance(value, (list, tuple)):
        return ("[]", tuple(freeze(v) for v in value))
    return value


def freeze_row(row: tuple) -> tuple:
    try:
        hash(row)
        return row
    except TypeError:
        return tuple(freeze(v) for v in row)


class _Desc:
    """Reverses the order of a non-null sequence value (descending sort order)."""

    __slots__ = ("v",)

    def __init__(self, v: Any):
        self.v = v

    def __lt__(self, other: _Desc) -> bool:
        return other.v < self.v

    def __gt__(self, other: _Desc) -> bool:
        return self.v < other.v

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Desc) and self.v == other.v

    def __le__(self, other: _Desc) -> bool:
        return not self.__gt__(other)

    def __ge__(self, other: _Desc) -> bool:
        return not self.__lt__(other)


def _atom(value: Any) -> tuple:
    """Total order of one sequence value: null first; floats as Java's Double.compare
    (-0.0 < 0.0, NaN above everything) so the order matches Paimon's."""
    if value is None:
        return (0,)
    if isinstance(value, float):
        if math.isnan(value):
            return (1, 1)
        return (1, 0, value, math.copysign(1.0, value))
    return (1, 0, value)


def sequence_key(row: tuple, fields: Sequence[int], ascending: bool = True) -> tuple:
    """The comparable sequence of a row over ``fields``; nulls first in both orders."""
    if ascending:
        return tuple(_atom(row[i]) for i in fields)
    return tuple((0,) if row[i] is None else (1, _Desc(_atom(row[i]))) for i in fields)


def cancel_pairs(records: Sequence[Change]) -> list[Change]:
    """Drop exact ``+X``/``-X`` pairs of the identical row, wherever they sit in the batch.
    When a row has more adds than retractions (or the reverse), the survivors are the ones
    with the greatest positions, so the result does not depend on which pair "matched"."""
    by_row: dict[tuple, list[Change]] = defaultdict(list)
    for c in records:
        by_row[freeze_row(c.row)].append(c)
    if len(by_row) == len(records):
        return list(records)
    out: list[Change] = []
    for group in by_row.values():
        adds = [c for c in group if c.kind in ADDS]
        retracts = [c for c in group if c.kind not in ADDS]
        n = min(len(adds), len(retracts))
        if n:
            adds.sort(key=_pos_then_kind)
            retracts.sort(key=_pos_then_kind)
            adds, retracts = adds[n:], retracts[n:]
        out.extend(adds)
        out.extend(retracts)
    return out


def _pos_then_kind(c: Change) -> tuple:
    return (c.pos, c.kind)


def merge_order(
    records: Sequence[Change],
    state_row: tuple | None,
    state_pos: tuple,
    seq_fields: Sequence[int],
    ascending: bool,
    state_kind: str = "+I",
) -> list[Item]:
    """The records of one key, plus the state row, in the order they fold. The state is
    the merged row (``+I``) or, with ``sequence.field``, the tombstone of a deleted key
    (``-D``, the record that deleted it), so older records cannot resurrect the key."""
    keyed: list[tuple] = []
    for c in records:
        seq = sequence_key(c.row, seq_fields, ascending) if seq_fields else ()
        keyed.append((seq, c.pos, 1 if c.kind in ADDS else 0, c))
    if state_row is not None:
        seq = sequence_key(state_row, seq_fields, ascending) if seq_fields else ()
        keyed.append((seq, state_pos, -1, None))
    keyed.sort(key=_sort_key)
    if _has_ties(keyed):
        keyed.sort(key=_full_key)
    return [
        Item(k[3].kind, k[3].row, False) if k[3] is not None else Item(state_kind, state_row, True)
        for k in keyed
    ]


def _sort_key(k: tuple) -> tuple:
    return k[:3]


def _full_key(k: tuple) -> tuple:
    return (k[0], *order_key(k[1], k[2], freeze_row(k[3].row) if k[3] is not None else ()))


def _has_ties(keyed: list[tuple]) -> bool:
    return any(keyed[i][:3] == keyed[i + 1][:3] for i in range(len(keyed) - 1))
