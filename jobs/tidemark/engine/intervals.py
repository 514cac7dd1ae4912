"""Flink's day-time interval literals (``INTERVAL '4' SECOND``) as milliseconds: the one
reading of a duration for watermark delays and window sizes."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from sqlglot import exp

from tidemark.engine.sql import sql_error

_UNIT_MS = {  # Flink's parser has no MILLISECOND unit: INTERVAL '0.5' SECOND
    "SECOND": 1000,
    "MINUTE": 60_000,
    "HOUR": 3_600_000,
    "DAY": 86_400_000,
}


def interval_ms(node: exp.Expr, what: str) -> int:
    """The milliseconds of ``INTERVAL 'n' unit``; anything else is a SqlError naming
    ``what`` (the clause it was written in) and its position. Year-month intervals have no
    fixed length, so they are refused too."""
    if not isinstance(node, exp.Interval) or not isinstance(node.this, exp.Literal):
        raise sql_error(f"{what} needs an interval literal such as INTERVAL '10' SECOND, not {node.sql()}", node)
    unit = node.args.get("unit")
    name = (unit.name if unit is not None else "").upper().removesuffix("S")
    if name not in _UNIT_MS:
        raise sql_error(
            f"{what}: interval unit {name or '(none)'} is not supported (use {', '.join(_UNIT_MS)})", node
        )
    try:
        amount = Decimal(str(node.this.this).strip())
    except InvalidOperation:
        raise sql_error(f"{what}: {node.this.this!r} is not a number of {name.lower()}s", node) from None
    ms = amount * _UNIT_MS[name]
    if ms != ms.to_integral_value() or ms < 0:
        raise sql_error(f"{what}: {node.sql()} is not a whole, non-negative number of milliseconds", node)
    return int(ms)
