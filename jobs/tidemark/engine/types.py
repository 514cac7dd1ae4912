"""SQL column types and the conversion of decoded input values into them.

Decisions (others rely on them):

- Python value per type: BIGINT/INT/SMALLINT/TINYINT -> ``int`` (range-checked),
  DOUBLE/FLOAT -> ``float``, DECIMAL(p, s) -> ``decimal.Decimal`` quantized to ``s``
  (exact: money must not drift through float), STRING/VARCHAR(n)/CHAR(n) -> ``str``,
  BOOLEAN -> ``bool``, DATE -> ``datetime.date``, TIMESTAMP(p) -> naive
  ``datetime.datetime`` (UTC wall clock).
- Input is strict about JSON types, because a silently converted value is a wrong
  answer nobody notices: a ``bool`` is never an integer, an integer column takes only
  integral numbers (``3`` or ``3.0``, not ``3.5``, not ``"3"``), a string column takes
  only strings. Exceptions, where JSON has no native form: DECIMAL also takes a numeric
  string (exact), DATE takes ``"YYYY-MM-DD"`` or days since epoch, TIMESTAMP takes an
  ISO-8601 string (``T`` or space separator) or epoch milliseconds. Values already of the
  Python type (e.g. from fastavro's logical types) pass through.
- JSON output (``to_json_value``): DECIMAL -> string (exact), DATE -> ``"YYYY-MM-DD"``,
  TIMESTAMP -> ``"YYYY-MM-DD HH:MM:SS[.ffffff]"`` (Flink's SQL timestamp format).
- Composite types, all hashable because rows are hashed in Z-sets and compared whole:
  ``ARRAY<T>`` -> ``tuple`` of T values (JSON array in and out). ``ROW<f T, ...>`` ->
  ``tuple`` in field order (JSON object by field name in and out -- a missing field is NULL,
  an unknown one an error -- or a JSON array of all fields in). ``MAP<K, V>`` -> a tuple of
  ``(key, value)`` pairs sorted by key (``map_value``), so two equal maps are one value
  whatever the order they were written in; in: a JSON object (keys of a non-string K are
  read from their text, as Flink's JSON format writes them: ``{"1": "a"}``) or an array of
  ``[key, value]`` pairs; out: a JSON object with the keys as text. NULL keys are refused.
  The merge engine's ``collect``/``merge_map``/``nested_update`` produce these same forms.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any

from tidemark.engine.errors import shorten

INTEGER_RANGES: dict[str, tuple[int, int]] = {
    "TINYINT": (-(2**7), 2**7 - 1),
    "SMALLINT": (-(2**15), 2**15 - 1),
    "INT": (-(2**31), 2**31 - 1),
    "BIGINT": (-(2**63), 2**63 - 1),
}
INTEGRAL = tuple(INTEGER_RANGES)
APPROX = ("FLOAT", "DOUBLE")
STRINGS = ("STRING", "VARCHAR", "CHAR")
ALIASES = {"INTEGER": "INT", "REAL": "FLOAT", "TEXT": "STRING", "DEC": "DECIMAL", "NUMERIC": "DECIMAL", "BOOL": "BOOLEAN"}
KNOWN = INTEGRAL + APPROX + STRINGS + ("DECIMAL", "BOOLEAN", "DATE", "TIMESTAMP")
COMPOSITE = ("ARRAY", "MAP", "ROW")

_EPOCH = _dt.datetime(1970, 1, 1)
_EPOCH_DATE = _dt.date(1970, 1, 1)


@dataclass(frozen=True)
class SqlType:
    """A column type. ``name`` is canonical (aliases resolved); ``params`` holds the
    length of VARCHAR/CHAR, (precision, scale) of DECIMAL, the precision of TIMESTAMP, the
    element type of ARRAY, (key type, value type) of MAP, ``(field name, type)`` pairs of
    ROW. Build composite types with ``array_of``/``map_of``/``row_of``."""

    name: str
    params: tuple[Any, ...] = ()

    def __str__(self) -> str:
        if self.name == "ARRAY":
            return f"ARRAY<{self.params[0]}>"
        if self.name == "MAP":
            return f"MAP<{self.params[0]}, {self.params[1]}>"
        if self.name == "ROW":
            return "ROW<" + ", ".join(f"{_ident(n)} {t}" for n, t in self.params) + ">"
        if self.params:
            return f"{self.name}({', '.join(str(p) for p in self.params)})"
        return self.name

    @property
    def is_composite(self) -> bool:
        return self.name in COMPOSITE

    @property
    def element(self) -> SqlType:
        """ARRAY's element type."""
        return self.params[0]

    @property
    def field_names(self) -> tuple[str, ...]:
        """ROW's field names, in order."""
        return tuple(n for n, _ in self.params)

    @property
    def is_integral(self) -> bool:
        return self.name in INTEGRAL

    @property
    def is_numeric(self) -> bool:
        return self.name in INTEGRAL or self.name in APPROX or self.name == "DECIMAL"

    @property
    def is_string(self) -> bool:
        return self.name in STRINGS


def _ident(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else '"' + name.replace('"', '""') + '"'


def array_of(element: SqlType) -> SqlType:
    return SqlType("ARRAY", (element,))


def map_of(key: SqlType, value: SqlType) -> SqlType:
    """MAP keys must be scalar: they are written as JSON object keys (text)."""
    if key.is_composite:
        raise ValueError(f"MAP key type must be a scalar type, got {key}")
    return SqlType("MAP", (key, value))


def row_of(fields: Iterable[tuple[str, SqlType]]) -> SqlType:
    fields = tuple((str(n), t) for n, t in fields)
    if not fields:
        raise ValueError("ROW needs at least one field")
    seen: set[str] = set()
    for n, _ in fields:
        if n.lower() in seen:
            raise ValueError(f"ROW field '{n}' is declared twice")
        seen.add(n.lower())
    return SqlType("ROW", fields)


def make_type(name: str, params: tuple[int, ...] = ()) -> SqlType:
    """Build a canonical type, filling Flink's defaults (DECIMAL -> (10, 0), TIMESTAMP ->
    6, VARCHAR/CHAR -> 1 for CHAR like Flink). Raises ValueError for unknown types."""
    upper = ALIASES.get(name.upper(), name.upper())
    if upper not in KNOWN:
        raise ValueError(f"unsupported column type {name}")
    if upper == "DECIMAL":
        p = params[0] if params else 10
        s = params[1] if len(params) > 1 else 0
        if not (1 <= p <= 38 and 0 <= s <= p):
            raise ValueError(f"invalid DECIMAL({p}, {s}): precision 1..38, scale 0..precision")
        return SqlType("DECIMAL", (p, s))
    if upper == "TIMESTAMP":
        p = params[0] if params else 6
        if not 0 <= p <= 9:
            raise ValueError(f"invalid TIMESTAMP({p}): precision 0..9")
        return SqlType("TIMESTAMP", (p,))
    if upper in ("VARCHAR", "CHAR"):
        if not params:
            return SqlType("STRING") if upper == "VARCHAR" else SqlType("CHAR", (1,))
        return SqlType(upper, (params[0],))
    if params and upper not in ("FLOAT",):  # FLOAT(p) is accepted and ignored
        raise ValueError(f"type {upper} takes no parameters")
    return SqlType(upper)


_TYPE_TEXT = re.compile(r"^\s*([A-Za-z_]+)\s*(?:\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\))?\s*$")


def parse_type(text: str) -> SqlType:
    """Parse ``"DECIMAL(10, 2)"``-style type text (as written in DDL), composite types
    (``ARRAY<INT>``, ``MAP<STRING, BIGINT>``, ``ROW<a INT, b STRING>``) included."""
    if "<" in text or text.strip().upper().startswith("ROW"):
        from tidemark.engine.sql import parse_type_text  # late: sql imports this module

        return parse_type_text(text)
    m = _TYPE_TEXT.match(text)
    if not m:
        raise ValueError(f"unsupported column type {text!r}")
    params = tuple(int(g) for g in m.groups()[1:] if g is not None)
    return make_type(m.group(1), params)


BIGINT = SqlType("BIGINT")
INT = SqlType("INT")
DOUBLE = SqlType("DOUBLE")
STRING = SqlType("STRING")
BOOLEAN = SqlType("BOOLEAN")


def _show(value: Any) -> str:
    return shorten(repr(value)) if not isinstance(value, bool) else str(value).lower()


def _fail(t: SqlType, value: Any) -> ValueError:
    return ValueError(f"expected {t}, got {_show(value)}")


def coerce_value(t: SqlType, value: Any) -> Any:
    """Convert one decoded (JSON/Avro) value into the Python value of ``t``; None stays
    None. Raises ValueError("expected BIGINT, got 'abc'")-style messages, also for values
    Python's date, time and float types cannot hold (their OverflowError would fail a
    whole batch instead of sending one record to the dead letters)."""
    try:
        return _coerce(t, value)
    except OverflowError:
        raise ValueError(f"expected {t}, got {_show(value)} (out of range)") from None


def _coerce(t: SqlType, value: Any) -> Any:
    if value is None:
        return None
    name = t.name
    if name in INTEGER_RANGES:
        if isinstance(value, bool):
            raise _fail(t, value)
        if isinstance(value, float):
            if not value.is_integer():
                raise _fail(t, value)
            value = int(value)
        elif isinstance(value, Decimal):
            if value != value.to_integral_value():
                raise _fail(t, value)
            value = int(value)
        if not isinstance(value, int):
            raise _fail(t, value)
        lo, hi = INTEGER_RANGES[name]
        if not lo <= value <= hi:
            raise ValueError(f"expected {t}, got {value} (out of range)")
        return value
    if name in APPROX:
        if isinstance(value, bool) or not isinstance(value, (int, float, Decimal)):
            raise _fail(t, value)
        return float(value)
    if name == "DECIMAL":
        return _coerce_decimal(t, value)
    if name in STRINGS:
        if not isinstance(value, str):
            raise _fail(t, value)
        return value
    if name == "BOOLEAN":
        if not isinstance(value, bool):
            raise _fail(t, value)
        return value
    if name == "DATE":
        return _coerce_date(t, value)
    if name == "TIMESTAMP":
        return _coerce_timestamp(t, value)
    if name == "ARRAY":
        return _coerce_array(t, value)
    if name == "MAP":
        return _coerce_map(t, value)
    if name == "ROW":
        return _coerce_row(t, value)
    raise ValueError(f"unsupported column type {t}")


def _coerce_array(t: SqlType, value: Any) -> tuple:
    if not isinstance(value, (list, tuple)):
        raise _fail(t, value)
    out = []
    for i, v in enumerate(value):
        try:
            out.append(coerce_value(t.element, v))
        except ValueError as e:
            raise ValueError(f"{t} element {i}: {e}") from None
    return tuple(out)


def map_value(entries: Mapping | Iterable[tuple[Any, Any]]) -> tuple[tuple[Any, Any], ...]:
    """The one MAP value form: ``(key, value)`` pairs sorted by key (a mapping or pairs
    in). Sorted so that equal maps are equal (and hash equally) as rows must; keys of one
    MAP share a type, the repr fallback only guards against a mixed-key stage input."""
    items = list(entries.items()) if isinstance(entries, Mapping) else [tuple(e) for e in entries]
    try:
        items.sort(key=lambda kv: kv[0])
    except TypeError:
        items.sort(key=lambda kv: repr(kv[0]))
    return tuple(items)


def _coerce_map_key(t: SqlType, key: Any) -> Any:
    if key is None:
        raise ValueError(f"{t}: a map key cannot be null")
    if isinstance(key, str) and not t.is_string and t.name not in ("DECIMAL", "DATE", "TIMESTAMP"):
        # JSON object keys are text: read the number/boolean they spell (Flink writes them so)
        try:
            key = json.loads(key)
        except ValueError:
            raise _fail(t, key) from None
    return coerce_value(t, key)


def _coerce_map(t: SqlType, value: Any) -> tuple:
    kt, vt = t.params
    if isinstance(value, Mapping):
        entries = list(value.items())
    elif isinstance(value, (list, tuple)) and all(isinstance(e, (list, tuple)) and len(e) == 2 for e in value):
        entries = list(value)
    else:
        raise ValueError(f"expected {t} (an object, or an array of [key, value] pairs), got {_show(value)}")
    out: dict[Any, Any] = {}
    for k, v in entries:
        try:
            key = _coerce_map_key(kt, k)
        except ValueError as e:
            raise ValueError(f"{t} key {_show(k)}: {e}") from None
        if key in out:
            raise ValueError(f"{t}: key {_show(k)} appears twice")
        try:
            out[key] = coerce_value(vt, v)
        except ValueError as e:
            raise ValueError(f"{t} value of key {_show(k)}: {e}") from None
    return map_value(out)


def _coerce_row(t: SqlType, value: Any) -> tuple:
    names = t.field_names
    if isinstance(value, Mapping):
        raw: list[Any] = [None] * len(names)
        lower = {n.lower(): i for i, n in enumerate(names)}
        for k, v in value.items():
            i = names.index(k) if k in names else lower.get(str(k).lower())
            if i is None:
                raise ValueError(f"{t}: unknown field {_show(k)} (fields: {', '.join(names)})")
            raw[i] = v
    elif isinstance(value, (list, tuple)):
        if len(value) != len(names):
            raise ValueError(f"expected {t}, got {len(value)} values for {len(names)} fields")
        raw = list(value)
    else:
        raise _fail(t, value)
    out = []
    for (name, ft), v in zip(t.params, raw):
        try:
            out.append(coerce_value(ft, v))
        except ValueError as e:
            raise ValueError(f"{t} field '{name}': {e}") from None
    return tuple(out)


def _coerce_decimal(t: SqlType, value: Any) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (int, float, str, Decimal)):
        raise _fail(t, value)
    if isinstance(value, float) and not math.isfinite(value):
        raise _fail(t, value)
    try:
        # repr() of a float is the shortest exact decimal text: 0.1 -> Decimal("0.1")
        d = Decimal(repr(value)) if isinstance(value, float) else Decimal(value.strip() if isinstance(value, str) else value)
    except InvalidOperation:
        raise _fail(t, value) from None
    if not d.is_finite():
        raise _fail(t, value)
    p, s = t.params
    q = d.quantize(Decimal(1).scaleb(-s), rounding=ROUND_HALF_UP)
    if q.adjusted() >= p - s:
        raise ValueError(f"expected {t}, got {_show(value)} (too many digits)")
    return q


def _coerce_date(t: SqlType, value: Any) -> _dt.date:
    if isinstance(value, _dt.datetime):
        raise _fail(t, value)
    if isinstance(value, _dt.date):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return _EPOCH_DATE + _dt.timedelta(days=value)
    if isinstance(value, str):
        try:
            return _dt.date.fromisoformat(value.strip())
        except ValueError:
            pass
    raise _fail(t, value)


def _coerce_timestamp(t: SqlType, value: Any) -> _dt.datetime:
    if isinstance(value, _dt.datetime):
        ts = value
    elif isinstance(value, int) and not isinstance(value, bool):
        ts = _EPOCH + _dt.timedelta(milliseconds=value)
    elif isinstance(value, str):
        try:
            ts = _dt.datetime.fromisoformat(value.strip())
        except ValueError:
            raise _fail(t, value) from None
    else:
        raise _fail(t, value)
    if ts.tzinfo is not None:
        ts = ts.astimezone(_dt.timezone.utc).replace(tzinfo=None)
    precision = t.params[0] if t.params else 6
    if precision < 6:
        unit = 10 ** (6 - precision)
        ts = ts.replace(microsecond=ts.microsecond - ts.microsecond % unit)
    return ts


def to_json_value(t: SqlType, value: Any) -> Any:
    """The JSON-serializable form of a value of type ``t`` (see module docstring)."""
    if value is None:
        return None
    if t.name == "ARRAY":
        return [to_json_value(t.element, v) for v in value]
    if t.name == "MAP":
        kt, vt = t.params
        entries = value.items() if isinstance(value, Mapping) else value
        return {_json_key(kt, k): to_json_value(vt, v) for k, v in entries}
    if t.name == "ROW":
        if isinstance(value, Mapping):  # a stage-API row given by field name
            return {n: to_json_value(ft, value.get(n)) for n, ft in t.params}
        return {n: to_json_value(ft, v) for (n, ft), v in zip(t.params, value)}
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, _dt.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, _dt.date):
        return value.isoformat()
    return value


def _json_key(t: SqlType, key: Any) -> str:
    """A map key as JSON object key text: strings as they are, other scalars as their JSON
    text (``1``, ``true``) or their JSON string form (DECIMAL, DATE, TIMESTAMP)."""
    j = to_json_value(t, key)
    return j if isinstance(j, str) else json.dumps(j)


def assignable(src: SqlType, dst: SqlType) -> bool:
    """Whether INSERT may write a value of ``src`` into a column of ``dst`` (Flink's
    implicit casts on INSERT: same family, widening within numerics, any string into a
    string; an integer into DECIMAL/DOUBLE)."""
    if src.is_composite or dst.is_composite:
        if src.name != dst.name or len(src.params) != len(dst.params):
            return src.name == "NULL"
        if src.name == "ROW":
            return all(assignable(a, b) for (_, a), (_, b) in zip(src.params, dst.params))
        return all(assignable(a, b) for a, b in zip(src.params, dst.params))
    if src.name == dst.name:
        return True
    if src.is_numeric and dst.is_numeric:
        if src.is_integral and dst.is_integral:
            return INTEGRAL.index(src.name) <= INTEGRAL.index(dst.name)
        if dst.name in APPROX:
            return True
        if dst.name == "DECIMAL":
            return src.is_integral or src.name == "DECIMAL"
        return False
    if src.is_string and dst.is_string:
        return True
    if src.name == "NULL":
        return True
    return False


def python_to_sql_type(value: Any) -> SqlType | None:
    """Best-effort type of a literal (used by the planner for constants)."""
    if value is None:
        return SqlType("NULL")
    if isinstance(value, bool):
        return BOOLEAN
    if isinstance(value, int):
        return INT if INTEGER_RANGES["INT"][0] <= value <= INTEGER_RANGES["INT"][1] else BIGINT
    if isinstance(value, float):
        return DOUBLE
    if isinstance(value, str):
        return STRING
    return None
