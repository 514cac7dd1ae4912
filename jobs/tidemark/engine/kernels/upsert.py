"""The one change an upsert sink writes per key and batch, over the whole batch at once.

``net_upsert`` defines it for one key's changes: exact ``+X``/``-X``
pairs cancel first (the Z-set), then of the rows that survive, the one whose change comes
last in the canonical order decides: ``+U(row)`` for an add, ``-D(row)`` (a tombstone) for
a retraction. Over a batch that is

    net    = consolidate(batch)                  # Z-set per row, each surviving row at its
                                                 # latest change of the surviving sign
    result = last per key of sorted(net)         # sorted: the canonical order

because rows of different keys are different rows, so consolidating the whole batch is
consolidating each key's changes; and a surviving row's place is its latest change of the
surviving sign, the greatest ``canonical_key`` among that row's changes ``net_upsert`` looks
at. Rows compare as polars compares them: as in Python, ``0.0`` equals ``-0.0``; unlike
two decoded Python NaNs, one NaN equals another (as in Flink's binary rows).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from tidemark.engine.batch import KIND, WEIGHT, ChangeBatch
from tidemark.engine.changelog import ADDS, DELETE, UPDATE_AFTER, Change, canonical_key, zset

_I = "$i"


def net_upsert(changes: Iterable[Change]) -> Change | None:
    """The one change an upsert sink writes for a key's changes of one batch:
    ``+U(row)``, ``-D(row)`` (a tombstone) or None (everything cancelled).

    Exact pairs cancel first (the Z-set), so an arrival order that splits a ``-U/+U``
    pair cannot matter. Of what remains, the change with the greatest source position
    decides; at equal positions an add beats a retraction (retractions apply first)."""
    changes = list(changes)
    remaining = zset(changes)
    if not remaining:
        return None
    best: tuple | None = None
    for c in changes:
        w = remaining.get(c.row, 0)
        if w == 0 or (w > 0) != (c.kind in ADDS):
            continue
        rank = canonical_key(c)
        if best is None or rank > best[0]:
            best = (rank, c)
    assert best is not None
    c = best[1]
    return Change(UPDATE_AFTER if c.kind in ADDS else DELETE, c.row, c.pos)


def net_upserts(batch: ChangeBatch, pk: Sequence[int]) -> ChangeBatch:
    """Each key's one change of ``batch`` (module docstring), weight +1 for ``+U`` and -1
    for ``-D``; keys whose changes all cancel have none. ``pk``: the key's row columns."""
    net = batch.consolidate().table()
    if net.num_rows == 0:
        return ChangeBatch.from_table(net)
    names = [c for c in net.column_names if not c.startswith("$")]
    last = (
        pl.from_arrow(net.select([names[i] for i in pk]))
        .with_row_index(_I)
        .unique(subset=[names[i] for i in pk], keep="last", maintain_order=True)
        .get_column(_I)
        .to_arrow()
    )
    out = net.take(last)
    adds = pc.greater(out.column(WEIGHT), 0)
    out = out.set_column(out.schema.get_field_index(KIND), KIND, pc.if_else(adds, UPDATE_AFTER, DELETE))
    return ChangeBatch.from_table(
        out.set_column(out.schema.get_field_index(WEIGHT), WEIGHT, pc.if_else(adds, 1, -1).cast(pa.int64()))
    )
