"""Compare two final sink tables (Flink's and Tidemark's) row by row, type-normalized.

Why normalize: the same value reaches the comparison as different Python types — Flink's
rows come through JSON (``5``, ``"1.50"`` for a DECIMAL, ``5.0``), Tidemark's as tuples of
Python values (``Decimal('1.50')``, ``5``). Numbers compare by value (``1 == 1.0 ==
Decimal('1.00')``; floats to a relative 1e-9, as a DOUBLE SUM may add in another order);
timestamps by their instant (Flink's measuring sink writes a TIMESTAMP as its
``TimestampData``, ``{"millisecond", "nanoOfMillisecond"}`` since the epoch, Tidemark's is a
naive ``datetime``, both in UTC); everything else exactly, ``None`` only equals ``None``. Stdlib only (both venvs import it).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

MAX_REPORTED = 20


def _num(v: Any) -> Decimal | float | None:
    """The numeric value of ``v``, or None when it is not a number (strings that spell a
    decimal count: Flink's sink writes DECIMAL as text)."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        return Decimal(v)
    if isinstance(v, Decimal):
        return v
    if isinstance(v, float):
        return v
    if isinstance(v, str):
        try:
            d = Decimal(v)
        except InvalidOperation:
            return None
        return d if d.is_finite() else None
    return None


_EPOCH = dt.datetime(1970, 1, 1)


def _epoch_nanos(v: Any) -> int | None:
    """The instant of a timestamp as nanoseconds since the epoch, or None when ``v`` is none."""
    if isinstance(v, dt.datetime):
        return (v.replace(tzinfo=None) - _EPOCH) // dt.timedelta(microseconds=1) * 1000
    if isinstance(v, Mapping) and set(v) == {"millisecond", "nanoOfMillisecond"}:
        return int(v["millisecond"]) * 1_000_000 + int(v["nanoOfMillisecond"])
    return None


def values_equal(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or (isinstance(a, bool) and isinstance(b, bool) and a == b)
    if isinstance(a, str) and isinstance(b, str):
        return a == b
    na, nb = _num(a), _num(b)
    if na is not None and nb is not None:
        if isinstance(na, float) or isinstance(nb, float):
            fa, fb = float(na), float(nb)
            return fa == fb or math.isclose(fa, fb, rel_tol=1e-9, abs_tol=1e-12)
        return na == nb
    ta, tb = _epoch_nanos(a), _epoch_nanos(b)
    if ta is not None and tb is not None:
        return ta == tb
    return a == b


def _norm_key_part(v: Any) -> Any:
    """Hashable canonical form of a key value, so 1, 1.0, Decimal(1) and '1' (a DECIMAL
    written as text) find each other."""
    if v is None or isinstance(v, bool):
        return v
    n = _num(v)
    if n is not None:
        return ("n", Decimal(repr(n)) if isinstance(n, float) else n.normalize())
    return ("s", v) if isinstance(v, str) else ("o", repr(v))


def _index(rows: Iterable[Sequence[Any]] | Mapping[Any, Sequence[Any]], key: Sequence[int], side: str,
           problems: list[str]) -> dict[tuple, tuple]:
    out: dict[tuple, tuple] = {}
    values = rows.values() if isinstance(rows, Mapping) else rows
    for row in values:
        row = tuple(row)
        k = tuple(_norm_key_part(row[i]) for i in key) if key else tuple(_norm_key_part(v) for v in row)
        if k in out:
            problems.append(f"{side}: two rows for key {_show_key(row, key)}: {out[k]!r} and {row!r}")
        out[k] = row
    return out


def _show_key(row: tuple, key: Sequence[int]) -> str:
    return repr(tuple(row[i] for i in key)) if key else repr(row)


def compare_tables(flink_rows: Iterable[Sequence[Any]] | Mapping[Any, Sequence[Any]],
                   tidemark_rows: Iterable[Sequence[Any]] | Mapping[Any, Sequence[Any]],
                   key: Sequence[int]) -> list[str]:
    """Differences between two tables given as rows (or {pk: row} dicts) in the same column
    order; ``key`` = positions of the primary key columns (empty: the whole row). Returns []
    when equal, else one line per difference (at most ``MAX_REPORTED`` plus a count)."""
    problems: list[str] = []
    f = _index(flink_rows, key, "flink", problems)
    t = _index(tidemark_rows, key, "tidemark", problems)
    for k in f.keys() - t.keys():
        problems.append(f"only in flink: {f[k]!r}")
    for k in t.keys() - f.keys():
        problems.append(f"only in tidemark: {t[k]!r}")
    for k in f.keys() & t.keys():
        a, b = f[k], t[k]
        if len(a) != len(b):
            problems.append(f"key {_show_key(a, key)}: flink has {len(a)} columns, tidemark {len(b)}")
        elif not all(values_equal(x, y) for x, y in zip(a, b)):
            problems.append(f"key {_show_key(a, key)}: flink {a!r} != tidemark {b!r}")
    problems.sort()
    if len(problems) > MAX_REPORTED:
        more = len(problems) - MAX_REPORTED
        problems = problems[:MAX_REPORTED] + [f"... and {more} more differences"]
    return problems


def key_positions(columns: Sequence[str], pk: Sequence[str]) -> list[int]:
    """Positions of ``pk`` in ``columns`` (a Workload's ``sink_columns``/``sink_pk``)."""
    return [list(columns).index(c) for c in pk]
