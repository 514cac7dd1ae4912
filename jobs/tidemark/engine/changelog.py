"""The changelog model every stage speaks.

A change is ``(kind, row, pos)``. Kinds weigh +1 (``+I``, ``+U``) or -1 (``-U``, ``-D``),
so a batch of changes is a Z-set: consolidating it sums weights per distinct row and does
not depend on the order of the rows in the batch. That is what makes disorder inside a
micro-batch harmless, and it is why no code here may depend on arrival order.

``pos`` is the source position of the change that produced the row: a tuple compared
lexicographically (replay: ``(seq,)``; Spark: ``(batch_id, source index, partition,
offset)``). "Latest" always means the greater position, never the later arrival.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from operator import itemgetter
from typing import NamedTuple

INSERT = "+I"
UPDATE_BEFORE = "-U"
UPDATE_AFTER = "+U"
DELETE = "-D"
KINDS = (INSERT, UPDATE_BEFORE, UPDATE_AFTER, DELETE)
ADDS = frozenset((INSERT, UPDATE_AFTER))
RETRACTS = frozenset((UPDATE_BEFORE, DELETE))

Row = tuple
Pos = tuple


class Change(NamedTuple):
    kind: str
    row: Row
    pos: Pos = ()

    @property
    def weight(self) -> int:
        return 1 if self.kind in ADDS else -1

    @property
    def is_add(self) -> bool:
        return self.kind in ADDS


def columns_of(indexes: Sequence[int]) -> Callable[[Row], tuple]:
    """``row -> tuple(row[i] for i in indexes)``, the key of a row, without a generator per
    call: the per-key path takes a key of every change it reads."""
    if len(indexes) == 1:
        i = indexes[0]
        return itemgetter(slice(i, i + 1))  # a slice of a tuple row is a tuple
    if not indexes:
        return itemgetter(slice(0, 0))
    return itemgetter(*indexes)


def order_key(pos: Pos, is_add: bool, row: Row) -> tuple:
    """THE canonical order of changes, defined once: source position, then retractions
    before adds at one position (the ``-U`` of an update precedes its ``+U``), then the
    row's ``repr`` so that even full ties never depend on arrival order. ``ChangeBatch``
    sorts by the same key (``tidemark.engine.batch``)."""
    return (pos, is_add, repr(row))


def canonical_key(change: Change) -> tuple:
    """``order_key`` of a change: ``sorted(changes, key=canonical_key)``."""
    return order_key(change.pos, change.kind in ADDS, change.row)


def canonical_sorted(changes: Iterable[Change]) -> list[Change]:
    """``sorted(changes, key=canonical_key)``, cheaper (see ``sorted_by_order``)."""
    return sorted_by_order(changes, _position_and_sign, canonical_key)


def sorted_ops(ops: Iterable[tuple[Pos, bool, Row]]) -> list[tuple[Pos, bool, Row]]:
    """``(pos, is_add, row)`` triples in the canonical order (``order_key``), cheaper (see
    ``sorted_by_order``)."""
    return sorted_by_order(ops, itemgetter(0, 1), _op_order_key)


def sorted_by_order(items: Iterable, coarse_key: Callable, full_key: Callable) -> list:
    """``sorted(items, key=full_key)`` where ``full_key`` is the canonical order and
    ``coarse_key`` the same without its ``repr`` tiebreak: sorts by the coarse key, and by
    the full one only when two items tie on it. The sort is stable, so without ties the
    order already is the canonical one, and ``repr`` of a row costs several times the rest
    of the key (and most lists sorted here hold one or two changes)."""
    out = sorted(items, key=coarse_key)
    previous = None  # no coarse key is None
    for item in out:
        key = coarse_key(item)
        if key == previous:
            out.sort(key=full_key)
            break
        previous = key
    return out


def _position_and_sign(change: Change) -> tuple:
    return (change.pos, change.kind in ADDS)


def _op_order_key(op: tuple[Pos, bool, Row]) -> tuple:
    return order_key(*op)


def weight(kind: str) -> int:
    return 1 if kind in ADDS else -1


def zset(changes: Iterable[Change]) -> Counter:
    """Sum weights per distinct row, dropping rows whose weight cancels to zero."""
    total: Counter = Counter()
    for c in changes:
        total[c.row] += 1 if c.kind in ADDS else -1
    return Counter({r: w for r, w in total.items() if w != 0})


def diff_to_changes(old: Row | None, new: Row | None, pos: Pos) -> list[Change]:
    """The changes that turn one row value for a key into another: the usual
    ``+I`` / ``-U,+U`` / ``-D`` encoding, nothing when the value did not change."""
    if old == new:
        return []
    if old is None:
        return [Change(INSERT, new, pos)]
    if new is None:
        return [Change(DELETE, old, pos)]
    return [Change(UPDATE_BEFORE, old, pos), Change(UPDATE_AFTER, new, pos)]


def zset_to_changes(delta: dict[Row, int], pos_of: dict[Row, Pos]) -> list[Change]:
    """Encode a consolidated Z-set delta as changes. Each unit of weight is one change;
    retractions come first, and when a batch both retracts and adds, the halves are
    ``-U``/``+U`` (an update), otherwise ``-D`` / ``+I``."""
    minus = [(r, -w) for r, w in delta.items() if w < 0]
    plus = [(r, w) for r, w in delta.items() if w > 0]
    update = bool(minus) and bool(plus)
    out: list[Change] = []
    for r, n in minus:
        out.extend([Change(UPDATE_BEFORE if update else DELETE, r, pos_of.get(r, ()))] * n)
    for r, n in plus:
        out.extend([Change(UPDATE_AFTER if update else INSERT, r, pos_of.get(r, ()))] * n)
    return out
