"""A group aggregate's bucket state as one typed Arrow table (the typed state protocol of
``tidemark.engine.state_codec``), and back.

One row per group: the key columns, the group's row count, then per aggregate call what its
accumulator keeps (``tidemark.engine.stages.aggregate``): a total and a non-null count for
SUM/AVG, a count for COUNT, the value multiset as parallel value and count lists for MIN/MAX
and for a DISTINCT call's seen values, and for LAST_VALUE each active value with the
positions of its active instances. Values keep the input column's Arrow type (from the
planner, ``GroupAggregate.input_schema``); a stage built without one lets Arrow infer them.
Caches (the current extreme, the latest LAST_VALUE) are not stored: they are rebuilt from
the stored values.

A host that keys groups by its own ids (the Spark host's per-key adapter keys them by the
encoded key bytes it shuffled on) gets those ids back: they are stored as one binary
``group`` column instead of the key columns.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa

from tidemark.engine.arrow_types import python_values
from tidemark.engine.stages.aggregate import (
    CountAcc,
    ExtremeAcc,
    GroupAggregate,
    GroupState,
    LastValueAcc,
    SumAcc,
)

STATE_KIND = "group-aggregate"
STATE_VERSION = 1
_POS = pa.list_(pa.int64())


def to_table(stage: GroupAggregate, states: dict[tuple, GroupState]) -> pa.Table | None:
    """The bucket's groups as one table (None when there are none)."""
    if not states:
        return None
    keys, groups = list(states), list(states.values())
    columns: dict[str, pa.Array] = {}
    if isinstance(keys[0], bytes):
        columns["group"] = pa.array(keys, pa.binary())
    for j, col in enumerate(stage.group_by if not isinstance(keys[0], bytes) else ()):
        columns[f"key{j}"] = pa.array([k[j] for k in keys], _type(stage, col))
    columns["rows"] = pa.array([g.rows for g in groups], pa.int64())
    for i, call in enumerate(stage.aggs):
        accs = [g.accs[i] for g in groups]
        value_type = _type(stage, call.arg)
        if isinstance(accs[0], SumAcc):
            total_type = _total_type(value_type)
            columns[f"total{i}"] = pa.array([a.total if a.n > 0 else None for a in accs], total_type)
            columns[f"n{i}"] = pa.array([a.n for a in accs], pa.int64())
        elif isinstance(accs[0], CountAcc):
            columns[f"n{i}"] = pa.array([a.n for a in accs], pa.int64())
        elif isinstance(accs[0], ExtremeAcc):
            columns[f"values{i}"] = pa.array([list(a.values) for a in accs], _list(value_type))
            columns[f"counts{i}"] = pa.array([list(a.values.values()) for a in accs], pa.list_(pa.int64()))
        else:
            columns[f"last_values{i}"] = pa.array([list(a.positions) for a in accs], _list(value_type))
            columns[f"last_positions{i}"] = pa.array(
                [[[list(p) for p in ps] for ps in a.positions.values()] for a in accs], pa.list_(pa.list_(_POS))
            )
        seen = [g.distinct[i] for g in groups]
        if seen[0] is not None:
            columns[f"seen{i}"] = pa.array([list(s) for s in seen], _list(value_type))
            columns[f"seen_counts{i}"] = pa.array([list(s.values()) for s in seen], pa.list_(pa.int64()))
    return pa.table(columns)


def from_table(stage: GroupAggregate, table: pa.Table) -> dict[tuple, GroupState]:
    """The inverse of ``to_table``."""
    col = {name: python_values(table.column(name)) for name in table.column_names}
    if "group" in col:
        keys = col["group"]
    else:
        keys = list(zip(*(col[f"key{j}"] for j in range(len(stage.group_by))))) or [()] * table.num_rows
    states: dict[tuple, GroupState] = {}
    for r, key in enumerate(keys):
        st = GroupState(stage.aggs)
        st.rows = col["rows"][r]
        for i, acc in enumerate(st.accs):
            _restore(acc, col, i, r)
            if st.distinct[i] is not None:
                st.distinct[i] = Counter(dict(zip(col[f"seen{i}"][r], col[f"seen_counts{i}"][r])))
        states[key] = st
    return states


def _restore(acc: Any, col: dict[str, list], i: int, r: int) -> None:
    if isinstance(acc, SumAcc):
        total = col[f"total{i}"][r]
        acc.total, acc.n = (total if total is not None else 0), col[f"n{i}"][r]
    elif isinstance(acc, CountAcc):
        acc.n = col[f"n{i}"][r]
    elif isinstance(acc, ExtremeAcc):
        acc.values = dict(zip(col[f"values{i}"][r], col[f"counts{i}"][r]))
        acc.dirty = True  # the extreme is recomputed on first use
    elif isinstance(acc, LastValueAcc):
        acc.positions = {
            v: [tuple(p) for p in ps] for v, ps in zip(col[f"last_values{i}"][r], col[f"last_positions{i}"][r])
        }
        acc.cur = max(((p[-1], repr(v), v) for v, p in acc.positions.items()), default=None)


def _type(stage: GroupAggregate, column: int | None) -> pa.DataType | None:
    schema = stage.input_schema
    return schema.field(column).type if schema is not None and column is not None else None


def _list(value_type: pa.DataType | None) -> pa.DataType | None:
    return pa.list_(value_type) if value_type is not None else None


def _total_type(value_type: pa.DataType | None) -> pa.DataType | None:
    """A SUM's total: DECIMAL(38, s) as the planner types the SUM, integers as int64."""
    if value_type is None:
        return None
    if pa.types.is_decimal(value_type):
        return pa.decimal128(38, value_type.scale)
    if pa.types.is_integer(value_type):
        return pa.int64()
    return value_type
