"""The columnar side of ``ChangeBatch`` (``tidemark.engine.batch``): Arrow tables in the
batch's layout, converted from and to ``Change`` tuples, sorted in the canonical order and
consolidated, with pyarrow and polars. Kept apart so that code that never builds Arrow
never imports them (see the ``batch`` module docstring).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from tidemark.engine.arrow_types import arrow_type, pylist, python_values
from tidemark.engine.batch import KIND, POS_PREFIX, WEIGHT
from tidemark.engine.changelog import ADDS, KINDS, Change, Pos

if TYPE_CHECKING:
    from tidemark.engine.batch import ChangeBatch

_ADD = "$add"
_TIE = "$tie"
_KEY = "$key"


def row_indexes(n: int) -> pa.Array:
    """0 .. n-1 as Int64, from a numpy range: Arrow converts a Python range value by value,
    hundreds of times slower."""
    return pa.array(np.arange(n, dtype=np.int64))


def pos_columns(n: int) -> list[str]:
    return [f"{POS_PREFIX}{i}" for i in range(n)]


def from_arrow(rows: pa.Table, kinds: pa.Array | Sequence[str], positions: Sequence[pa.Array]) -> pa.Table:
    """The batch table of decoded columns (``ChangeBatch.from_arrow``), checked."""
    kinds = pa.array(kinds, pa.string()) if not isinstance(kinds, pa.Array) else kinds
    bad = pc.invert(pc.is_in(kinds, pa.array(KINDS)))
    if pc.any(bad).as_py():  # a null kind is not in KINDS either
        where = pc.index(bad, True).as_py()
        raise ValueError(f"change {where}: kind {kinds[where].as_py()!r} is not one of {', '.join(KINDS)}")
    for name in rows.column_names:
        if name.startswith("$"):
            raise ValueError(f"column '{name}': names starting with '$' are reserved for the batch's own columns")
    return _assemble(rows.column_names, rows.columns, kinds, positions)


def position_ranks(positions: pl.DataFrame) -> tuple[pl.Series, pl.DataFrame]:
    """A dense rank per row of ``positions`` (its columns are a position's fields, null past
    a shorter position's end), in the rows' order, that compares as the positions do: field by
    field, nulls first, so a shorter position sorts first; and the distinct positions in rank
    order (row ``r`` holds rank ``r``'s position). When the fields' ranges allow, each
    position packs into one integer that orders as the position does, and a one-column dense
    rank gives the ranks; otherwise one multi-column sort and its runs (a struct's rank is
    several times slower)."""
    packed = _packed_positions(positions)
    if packed is not None:
        ranks = (packed.rank("dense") - 1).cast(pl.Int64).alias("$rank")
        rows = pl.int_range(0, len(ranks), dtype=pl.Int64, eager=True)
        return ranks, positions[pl.zeros(packed.n_unique(), pl.Int64, eager=True).scatter(ranks, rows)]
    ordered = positions.with_row_index("$row").sort(positions.columns, nulls_last=False)
    runs = ordered.select(pl.struct(positions.columns).rle_id().cast(pl.Int64)).to_series()
    ranks = pl.zeros(positions.height, pl.Int64, eager=True).alias("$rank").scatter(ordered["$row"], runs)
    return ranks, ordered.filter(runs.diff().fill_null(1) != 0).select(positions.columns)


def _packed_positions(positions: pl.DataFrame) -> pl.Series | None:
    """Each position as one Int64 that compares as the position does (field by field, a
    null first), or None when there are no fields or their ranges do not fit: a field of
    span ``s`` (its largest value less its smallest, plus one, plus one more for null) is a
    digit of base ``s``."""
    cols = positions.columns
    if not cols:  # no fields: the frame's height is not the rows'
        return None
    bounds = positions.select(
        *(pl.col(c).min().alias(f"min{i}") for i, c in enumerate(cols)),
        *(pl.col(c).max().alias(f"max{i}") for i, c in enumerate(cols)),
    ).row(0)
    lows, highs = bounds[: len(cols)], bounds[len(cols) :]
    packed: pl.Expr | None = None
    total = 1
    for col, low, high in zip(cols, lows, highs):
        if low is None:  # every value null: one digit value
            continue
        span = high - low + 2
        total *= span
        if total >= 2**62:
            return None
        digit = (pl.col(col).cast(pl.Int64) - low + 1).fill_null(0)
        packed = digit if packed is None else packed * span + digit
    if packed is None:  # no field has a value: one position
        return pl.zeros(positions.height, pl.Int64, eager=True)
    return positions.select(packed.alias("$packed")).to_series()


def positions_as_lists(positions: pl.DataFrame) -> pl.Series:
    """Each row of ``positions`` (a position's fields, null past a shorter position's end) as
    one list of its fields: the form a stored position takes. Built from the columns' buffers:
    polars' ``concat_list`` costs about twenty times as much."""
    columns = positions.get_columns()
    values = np.stack([c.fill_null(0).to_numpy() for c in columns], axis=1)
    if any(c.null_count() for c in columns):
        present = np.stack([c.is_not_null().to_numpy() for c in columns], axis=1)
        values, counts = values[present], present.sum(axis=1)
    else:
        values, counts = values.ravel(), np.full(positions.height, len(columns))
    offsets = np.zeros(positions.height + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pl.Series(pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.int64())))


def weight_total(table: pa.Table) -> int:
    """Changes in a batch table: one per unit of weight."""
    return int(pc.sum(pc.abs(table.column(WEIGHT))).as_py() or 0)


def sorted_table(table: pa.Table) -> pa.Table:
    """The canonical order (``changelog.order_key``), stable for full ties. The ``repr``
    tiebreak is a Python value: computed only for rows that tie on position and sign."""
    pos = [c for c in table.column_names if c.startswith(POS_PREFIX)]
    df = pl.from_arrow(table).with_columns((pl.col(WEIGHT) > 0).alias(_ADD))
    packed = _packed_positions(df.select(pos))
    if packed is not None:  # (position, sign) as one integer: a one-column sort
        df = df.with_columns((packed * 2 + df[_ADD].cast(pl.Int64)).alias(_KEY))
        by, tied = [_KEY], df[_KEY].is_duplicated()
    else:
        by = [*pos, _ADD]
        tied = df.select(pl.len().over(by) > 1).to_series()
    if tied.any():
        rows = rows_of(table.filter(pa.array(tied.to_arrow())))
        tiebreak = pl.Series(_TIE, [None] * len(df), dtype=pl.String)
        tiebreak = tiebreak.scatter(tied.arg_true(), [repr(r) for r in rows])
        df = df.with_columns(tiebreak)
        by.append(_TIE)
    out = df.sort(by, nulls_last=False, maintain_order=True).drop(_ADD, _KEY, _TIE, strict=False)
    return _restore(out.to_arrow(), table.schema)


def _has_repeated_rows(rows: pa.Table) -> bool:
    """Whether a row occurs more than once, rows compared as the group-by of
    ``consolidated_table`` compares them (``0.0`` equals ``-0.0``, NaN equals NaN)."""
    return bool(pl.from_arrow(rows).is_duplicated().any())


def consolidated_table(table: pa.Table) -> pa.Table:
    """Net weight per distinct row, with the position and kind of its latest change of
    the surviving sign (``batch`` module docstring); rows netting zero dropped."""
    pos = [c for c in table.column_names if c.startswith(POS_PREFIX)]
    rows = [c for c in table.column_names if not c.startswith("$")]
    if rows and not _has_repeated_rows(table.select(rows)):  # each row's one change is its net
        return table.filter(pc.not_equal(table.column(WEIGHT), 0))
    last = pl.struct([*pos, KIND])
    df = pl.from_arrow(table).sort([*pos, KIND], nulls_last=False, maintain_order=True)
    net = (
        df.group_by(rows, maintain_order=True)
        .agg(
            pl.col(WEIGHT).sum(),
            last.filter(pl.col(WEIGHT) > 0).last().alias("$last_add"),
            last.filter(pl.col(WEIGHT) < 0).last().alias("$last_retract"),
        )
        .filter(pl.col(WEIGHT) != 0)
        .select(
            *rows,
            pl.when(pl.col(WEIGHT) > 0).then(pl.col("$last_add")).otherwise(pl.col("$last_retract")).alias("$last"),
            WEIGHT,
        )
        .unnest("$last")
        .select(*rows, KIND, WEIGHT, *pos)
    )
    return _restore(net.to_arrow(), table.schema)


# ---------------------------------------------------------------------- conversions


def row_schema(columns: Sequence[tuple[str, Any]] | None) -> pa.Schema | None:
    """A stage's ``(name, SQL type)`` columns as an Arrow schema; None when a type is unknown
    or has no Arrow form (a kernel then leaves the batch to the per-key path)."""
    if columns is None or any(t is None for _, t in columns):
        return None
    try:
        return pa.schema([(name, arrow_type(t)) for name, t in columns])
    except ValueError:
        return None


def typed_table(batch: ChangeBatch, schema: pa.Schema) -> pa.Table | None:
    """``batch`` as a table whose row columns are typed by ``schema``, or None: a batch of
    other types, ``Change`` tuples whose values do not fit, or tuples holding DECIMALs, whose
    scale an Arrow column would change."""
    if batch.is_columnar:
        table = batch.table()
    elif any(pa.types.is_decimal(t) for t in schema.types):
        return None
    else:
        try:
            table = to_table(batch.changes(), schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
            return None
    rows = [c for c in table.column_names if not c.startswith("$")]
    if [table.schema.field(c).type for c in rows] != list(schema.types):
        return None
    return table


def to_table(changes: list[Change], schema: pa.Schema | None) -> pa.Table:
    """The batch table of ``Change`` tuples; ``schema`` types the row columns (None: Arrow
    infers them from the values, and names them ``f0``, ``f1``...)."""
    width = len(schema) if schema is not None else (len(changes[0].row) if changes else 0)
    for i, c in enumerate(changes):
        if len(c.row) != width:
            raise ValueError(f"change {i}: row {c.row!r} has {len(c.row)} columns, expected {width}")
    names = schema.names if schema is not None else [f"f{i}" for i in range(width)]
    arrays = [
        pa.array([c.row[i] for c in changes], schema.field(i).type if schema is not None else None)
        for i in range(width)
    ]
    kinds = pa.array([c.kind for c in changes], pa.string())
    depth = max((len(c.pos) for c in changes), default=0)
    positions = [_pos_array([c.pos[i] if i < len(c.pos) else None for c in changes]) for i in range(depth)]
    return _assemble(names, arrays, kinds, positions)


def _assemble(names: Sequence[str], arrays: Sequence[Any], kinds: pa.Array, positions: Sequence[pa.Array]) -> pa.Table:
    weights = pc.if_else(pc.is_in(kinds, pa.array(sorted(ADDS))), 1, -1).cast(pa.int64())
    return pa.Table.from_arrays(
        [*arrays, kinds, weights, *positions], names=[*names, KIND, WEIGHT, *pos_columns(len(positions))]
    )


def _pos_array(values: list[Any]) -> pa.Array:
    arr = pa.array(values)
    return arr.cast(pa.int64()) if pa.types.is_null(arr.type) else arr


def rows_of(table: pa.Table) -> list[tuple]:
    """The row values of a batch table, one tuple per table row (not per unit of weight)."""
    names = [c for c in table.column_names if not c.startswith("$")]
    columns = [python_values(table.column(n)) for n in names]
    return list(zip(*columns)) if columns else [() for _ in range(table.num_rows)]


def to_changes(table: pa.Table) -> list[Change]:
    """A batch table as ``Change`` tuples, one per unit of weight, in the table's order."""
    rows = rows_of(table)
    kinds = pylist(table.column(KIND))
    weights = pylist(table.column(WEIGHT))
    pos_cols = [pylist(table.column(c)) for c in table.column_names if c.startswith(POS_PREFIX)]
    positions = [_pos(p) for p in zip(*pos_cols)] if pos_cols else [()] * len(rows)
    out: list[Change] = []
    for row, kind, w, pos in zip(rows, kinds, weights, positions):
        change = Change(kind, row, pos)
        out.extend([change] * abs(w))
    return out


def _pos(values: tuple) -> Pos:
    """A padded position without its trailing nulls."""
    n = len(values)
    while n and values[n - 1] is None:
        n -= 1
    return tuple(values[:n])


def _restore(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Polars widens or renames some Arrow types (large strings, ...): cast back."""
    return table.select(schema.names).cast(schema)
