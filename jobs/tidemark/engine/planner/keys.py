"""Upsert-key inference. Upsert keys follow Flink's ``FlinkRelMdUpsertKeys`` (checked against Flink 2.3's
``EXPLAIN`` on the same queries):

- source: its PRIMARY KEY (none without one); normalize keeps it;
- calc: a filter keeps every key; a projection keeps a key only when each of its columns
  is projected unchanged (renaming is fine, ``k + 0`` is not);
- group aggregate: its group-by columns (a global aggregate has the empty key: one row);
- join: a side's keys are first kept only if they contain that side's join columns (the
  join repartitions by the join key; a key that does not contain it can see its changes
  reordered, which is exactly the seed's s1/s2 disorder). Then, like Flink's
  ``getJoinUniqueKeys``: every (left key + right key) union survives; the left keys
  survive if the right side is unique on its join columns and the join does not pad the
  left side with NULLs (inner/left); symmetrically for the right (inner/right).
"""

from __future__ import annotations

from itertools import product

from sqlglot import exp

from tidemark.engine.expressions import col_index
from tidemark.engine.planner.node import Key


def project_keys(keys: frozenset, projections: list[exp.Expr] | None) -> frozenset:
    """Keys that survive a projection: all their columns projected unchanged."""
    if projections is None:
        return keys
    outputs: dict[int, list[int]] = {}
    for out_pos, e in enumerate(projections):
        i = col_index(e)
        if i is not None:
            outputs.setdefault(i, []).append(out_pos)
    result = set()
    for k in keys:
        if all(c in outputs for c in k):
            # every way of picking one output per key column is a key (as Flink enumerates)
            for combo in product(*(outputs[c] for c in sorted(k))):
                result.add(Key(combo))
    return frozenset(result)


def join_keys(
    join_type: str,
    left_keys: frozenset,
    right_keys: frozenset,
    left_join_cols: frozenset,
    right_join_cols: frozenset,
    left_width: int,
) -> frozenset:
    """Flink's getJoinUpsertKeys: see the module docstring."""
    left_kept = {k for k in left_keys if left_join_cols <= k}
    right_kept = {Key(c + left_width for c in k) for k in right_keys if right_join_cols <= k}
    left_unique = any(k <= left_join_cols for k in left_keys)
    right_unique = any(k <= right_join_cols for k in right_keys)
    result = {lk | rk for lk in left_kept for rk in right_kept}
    if right_unique and join_type in ("inner", "left"):
        result |= left_kept
    if left_unique and join_type in ("inner", "right"):
        result |= right_kept
    return frozenset(result)
