"""Per-field aggregate functions of the ``aggregation`` engine (and of sequence groups in
``partial-update``), with Paimon's names and null rules.

Each function folds one field of one key: ``agg(acc, value)`` for an add, ``retract`` for a
``-U``/``-D`` (only where Paimon allows it), ``agg_reversed`` for a record that is *older*
than the accumulator (partial-update sequence groups), and ``absorb`` for the merged row kept
in state when it re-enters a fold. ``fresh`` tells a function that nothing was folded into
this field yet in the current fold: ``first_value`` needs it, because a null can be a first
value. Functions never mutate their arguments: accumulators end up in state and in emitted
rows, and a shared list mutated later would corrupt both.

Values are plain Python: numbers, ``str``, ``bool``, ``decimal.Decimal``, and the forms of
``tidemark.engine.types`` for composite columns, which are what functions return: an ARRAY
is a tuple, a MAP a tuple of ``(key, value)`` pairs sorted by key (``types.map_value``), a
ROW a tuple in field order. Results must be hashable: rows are hashed in Z-sets. As inputs
(the stage API without SQL types, Arrow-decoded values) lists are read as arrays, dicts as
maps, and nested rows may also be dicts keyed by field name; ``nested_update`` reads its
``nested-key`` by name from those, or by position from tuple rows when the column type
(``ARRAY<ROW<...>>``) is known.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from tidemark.engine.errors import PlanError
from tidemark.engine.stages.merge.ordering import freeze as _freeze
from tidemark.engine.types import map_value

#: Integral ranges, for overflow checks when the column type is known.
INT_RANGES: dict[str, tuple[int, int]] = {
    "TINYINT": (-(2**7), 2**7 - 1),
    "SMALLINT": (-(2**15), 2**15 - 1),
    "INT": (-(2**31), 2**31 - 1),
    "INTEGER": (-(2**31), 2**31 - 1),
    "BIGINT": (-(2**63), 2**63 - 1),
}
NUMERIC_TYPES = frozenset(INT_RANGES) | {"FLOAT", "DOUBLE", "DECIMAL"}
STRING_TYPES = frozenset({"STRING", "VARCHAR", "CHAR"})


class MergeError(Exception):
    """A record the merge cannot apply; the stage adds table and key (and the engines the
    field) and raises it as an InputError."""


class FieldAgg:
    """Base: the null rules most functions share, no retraction."""

    name = "?"
    retractable = False

    def __init__(self, type_name: str | None = None):
        self.type_name = type_name

    def agg(self, acc: Any, value: Any, fresh: bool) -> Any:
        raise NotImplementedError

    def agg_reversed(self, acc: Any, value: Any, fresh: bool) -> Any:
        """``value`` is older than ``acc``: as Paimon, fold it as if it came first."""
        return self.agg(value, acc, fresh)

    def absorb(self, acc: Any, value: Any, fresh: bool) -> Any:
        """``value`` is the merged result of earlier batches re-entering the fold."""
        return self.agg(acc, value, fresh)

    def absorb_reversed(self, acc: Any, value: Any, fresh: bool) -> Any:
        return self.agg_reversed(acc, value, fresh)

    def retract(self, acc: Any, value: Any) -> Any:
        raise MergeError(
            f"aggregate function '{self.name}' does not support retraction (-U/-D); set "
            "'fields.<column>.ignore-retract' = 'true' to ignore retractions"
        )


class IgnoreRetract(FieldAgg):
    """``fields.<f>.ignore-retract = true``: retractions leave the field as it is."""

    retractable = True

    def __init__(self, inner: FieldAgg):
        super().__init__(inner.type_name)
        self.inner = inner
        self.name = inner.name

    def agg(self, acc: Any, value: Any, fresh: bool) -> Any:
        return self.inner.agg(acc, value, fresh)

    def agg_reversed(self, acc: Any, value: Any, fresh: bool) -> Any:
        return self.inner.agg_reversed(acc, value, fresh)

    def absorb(self, acc: Any, value: Any, fresh: bool) -> Any:
        return self.inner.absorb(acc, value, fresh)

    def absorb_reversed(self, acc: Any, value: Any, fresh: bool) -> Any:
        return self.inner.absorb_reversed(acc, value, fresh)

    def retract(self, acc: Any, value: Any) -> Any:
        return acc


def _checked(agg: FieldAgg, result: Any) -> Any:
    """Integral overflow is an error in Paimon (Java's exact arithmetic); Python ints never
    overflow, so check against the declared type when the planner told us the type."""
    bounds = INT_RANGES.get(agg.type_name or "")
    if bounds is not None and isinstance(result, int) and not bounds[0] <= result <= bounds[1]:
        raise MergeError(f"{agg.type_name} overflow in '{agg.name}': result {result}")
    return result


class Sum(FieldAgg):
    name = "sum"
    retractable = True

    def agg(self, acc: Any, value: Any, fresh: bool) -> Any:
        if acc is None or value is None:
            return acc if value is None else value
        return _checked(self, _arith(acc, value, "+"))

    def retract(self, acc: Any, value: Any) -> Any:
        if value is None:
            return acc
        if acc is None:
            try:
                return _checked(self, -value)
            except TypeError:
                raise MergeError(f"cannot negate {value!r}") from None
        return _checked(self, _arith(acc, value, "-"))


class Product(FieldAgg):
    name = "product"
    retractable = True

    def agg(self, acc: Any, value: Any, fresh: bool) -> Any:
        if acc is None or value is None:
            return acc if value is None else value
        return _checked(self, _arith(acc, value, "*"))

    def retract(self, acc: Any, value: Any) -> Any:
        if acc is None or value is None:
            return acc
        if isinstance(acc, float) or isinstance(value, float):
            if value == 0:
                return float("nan") if acc == 0 else float("inf") if acc > 0 else float("-inf")
            return acc / value
        if value == 0:
            raise MergeError("'product' retraction divides by zero")
        if isinstance(acc, Decimal) or isinstance(value, Decimal):
            return _arith(acc, value, "/")
        # Java integer division truncates toward zero; Python's // floors.
        quotient = abs(acc) // abs(value)
        return _checked(self, quotient if (acc >= 0) == (value >= 0) else -quotient)


class Count(FieldAgg):
    """Counts non-null values. Paimon also counts a null in the first row as 1, and a
    retraction on an empty count gives 1; Tidemark counts non-null values only (see
    docs/merge-engines.md)."""

    name = "count"
    retractable = True

    def agg(self, acc: Any, value: Any, fresh: bool) -> Any:
        if value is None:
            return acc
        return _checked(self, (acc or 0) + 1)

    def agg_reversed(self, acc: Any, value: Any, fresh: bool) -> Any:
        return self.agg(acc, value, fresh)

    def absorb(self, acc: Any, value: Any, fresh: bool) -> Any:
        # The merged row carries a count, not one value to count.
        if value is None:
            return acc
        return _checked(self, (acc or 0) + value)

    def absorb_reversed(self, acc: Any, value: Any, fresh: bool) -> Any:
        return self.absorb(acc, value, fresh)

    def retract(self, acc: Any, value: Any) -> Any:
        if value is None:
            return acc
        return _checked(self, (acc or 0) - 1)


class Max(FieldAgg):
    name = "max"

    def agg(self, acc: Any, value: Any, fresh: bool) -> Any:
        if acc is None or value is None:
            return acc if value is None else value
        return value if _less(acc, value) else acc


class Min(FieldAgg):
    name = "min"

    def agg(self, acc: Any, value: Any, fresh: bool) -> Any:
        if acc is None or value is None:
            return acc if value is None else value
        return acc if _less(acc, value) else value


class LastValue(FieldAgg):
    name = "last_value"
    retractable = True

    def agg(self, acc: Any, value: Any, fresh: bool) -> Any:
        return value

    def retract(self, acc: Any, value: Any) -> Any:
        return None


class LastNonNullValue(FieldAgg):
    name = "last_non_null_value"
    retractable = True

    def agg(self, acc: Any, value: Any, fresh: bool) -> Any:
        return acc if value is None else value

    def retract(self, acc: Any, value: Any) -> Any:
        return None if value is not None else acc


class FirstValue(FieldAgg):
    """The first value in merge order, null included: ``fresh`` says whether one came yet."""

    name = "first_value"

    def agg(self, acc: Any, value: Any, fresh: bool) -> Any:
        return value if fresh else acc

    def agg_reversed(self, acc: Any, value: Any, fresh: bool) -> Any:
        # An older record's value is, by definition, the earlier one.
        return value


class FirstNonNullValue(FieldAgg):
    name = "first_non_null_value"

    def agg(self, acc: Any, value: Any, fresh: bool) -> Any:
        return value if acc is None else acc

    def agg_reversed(self, acc: Any, value: Any, fresh: bool) -> Any:
        return acc if value is None else value


class BoolAnd(FieldAgg):
    name = "bool_and"

    def agg(self, acc: Any, value: Any, fresh: bool) -> Any:
        if acc is None or value is None:
            return acc if value is None else value
        return bool(acc) and bool(value)


class BoolOr(FieldAgg):
    name = "bool_or"

    def agg(self, acc: Any, value: Any, fresh: bool) -> Any:
        if acc is None or value is None:
            return acc if value is None else value
        return bool(acc) or bool(value)


class ListAgg(FieldAgg):
    """Concatenates strings with ``fields.<f>.list-agg-delimiter`` (default ``,``); blank
    values are skipped. With ``fields.<f>.distinct`` only tokens not yet present are added
    (tokens are split on the whole delimiter, as Paimon's splitByWholeSeparator)."""

    name = "listagg"

    def __init__(self, type_name: str | None, delimiter: str, distinct: bool):
        super().__init__(type_name)
        self.delimiter = delimiter
        self.distinct = distinct

    def _split(self, text: str) -> list[str]:
        return text.split(self.delimiter) if self.delimiter else text.split()

    def agg(self, acc: Any, value: Any, fresh: bool) -> Any:
        if value is None or str(value).strip() == "":
            return acc
        if acc is None or str(acc).strip() == "":
            return value
        acc, value = str(acc), str(value)
        if not self.distinct:
            return acc + self.delimiter + value
        seen = set(self._split(acc))
        parts = [acc]
        for token in self._split(value):
            if token.strip() == "" or token in seen:
                continue
            seen.add(token)
            parts.append(token)
        return self.delimiter.join(parts) if len(parts) > 1 else acc


class Collect(FieldAgg):
    """Collects ARRAY elements; ``fields.<f>.distinct`` keeps each element once. Retraction
    removes one occurrence per retracted element (best effort, as the seed warns)."""

    name = "collect"
    retractable = True

    def __init__(self, type_name: str | None, distinct: bool):
        super().__init__(type_name)
        self.distinct = distinct

    def agg(self, acc: Any, value: Any, fresh: bool) -> Any:
        if acc is None and value is None:
            return None
        if self.distinct:
            out: list = []
            for part in (acc, value):
                for element in _as_list(part, self.name):
                    if element not in out:
                        out.append(element)
            return tuple(out)
        if acc is None or value is None:
            return tuple(_as_list(acc if value is None else value, self.name))
        return tuple(_as_list(acc, self.name)) + tuple(_as_list(value, self.name))

    def retract(self, acc: Any, value: Any) -> Any:
        if acc is None:
            return None
        if value is None:
            return acc
        out = list(_as_list(acc, self.name))
        for element in _as_list(value, self.name):
            if element in out:
                out.remove(element)
        return tuple(out)


class MergeMap(FieldAgg):
    """Merges MAP values, the input's entries winning; retraction removes the retracted
    keys (best effort, as the seed warns)."""

    name = "merge_map"
    retractable = True

    def agg(self, acc: Any, value: Any, fresh: bool) -> Any:
        if acc is None and value is None:
            return None
        if acc is None or value is None:
            return map_value(_as_map(acc if value is None else value))
        merged = _as_map(acc)
        merged.update(_as_map(value))
        return map_value(merged)

    def retract(self, acc: Any, value: Any) -> Any:
        if acc is None:
            return None
        if value is None:
            return acc
        removed = set(_as_map(value))
        return map_value({k: v for k, v in _as_map(acc).items() if k not in removed})


class NestedUpdate(FieldAgg):
    """A nested table (ARRAY<ROW>): rows with the same ``fields.<f>.nested-key`` replace each
    other, keeping first-seen order; without a nested key rows are appended. Retraction
    removes rows by nested key (or, without one, rows equal to the retracted ones)."""

    name = "nested_update"
    retractable = True

    def __init__(self, type_name: str | None, field: str, nested_key: tuple[str, ...],
                 row_fields: tuple[str, ...] | None = None):
        super().__init__(type_name)
        self.field = field
        self.nested_key = nested_key
        #: positions of the nested key in tuple rows, when the ROW type is known
        self.key_positions = (tuple(row_fields.index(k) for k in nested_key)
                              if row_fields is not None else None)

    def _key(self, row: Any) -> tuple:
        if isinstance(row, Mapping):
            return tuple(_freeze(row.get(k)) for k in self.nested_key)
        if isinstance(row, tuple) and self.key_positions is not None:
            return tuple(_freeze(row[i]) for i in self.key_positions)
        raise MergeError(
            f"'nested_update' cannot read nested-key {', '.join(self.nested_key)} from "
            f"{row!r}: rows must be objects, or the column must be declared ARRAY<ROW<...>>"
        )

    def agg(self, acc: Any, value: Any, fresh: bool) -> Any:
        if value is None:
            return acc
        if not self.nested_key:
            rows = tuple(r for r in _as_list(acc, self.name) if r is not None) if acc is not None else ()
            return rows + tuple(r for r in _as_list(value, self.name) if r is not None)
        by_key: dict = {}
        for part in (acc, value):
            for row in _as_list(part, self.name):
                if row is not None:
                    by_key[self._key(row)] = row
        return tuple(by_key.values())

    def retract(self, acc: Any, value: Any) -> Any:
        if acc is None or value is None:
            return acc
        rows = [r for r in _as_list(acc, self.name) if r is not None]
        for gone in _as_list(value, self.name):
            if gone is None:
                continue
            if self.nested_key:
                key = self._key(gone)
                rows = [r for r in rows if self._key(r) != key]
            else:
                rows = [r for r in rows if r != gone]
        return tuple(rows)


#: Every function the seed lists, and whether Paimon lets it take retractions.
FUNCTIONS = (
    "sum", "product", "count", "max", "min", "last_value", "last_non_null_value", "listagg",
    "bool_and", "bool_or", "first_value", "first_non_null_value", "nested_update", "collect",
    "merge_map",
)
RETRACTABLE = frozenset(
    {"sum", "product", "count", "collect", "merge_map", "nested_update", "last_value",
     "last_non_null_value"}
)
#: Column types each function accepts, checked when the planner passes types (Paimon's
#: factories check the same). ``None`` = any type.
_ACCEPTS: dict[str, frozenset[str] | None] = {
    "sum": NUMERIC_TYPES,
    "product": NUMERIC_TYPES,
    "count": frozenset({"INT", "INTEGER", "BIGINT"}),
    "max": None,
    "min": None,
    "last_value": None,
    "last_non_null_value": None,
    "first_value": None,
    "first_non_null_value": None,
    "listagg": STRING_TYPES,
    "bool_and": frozenset({"BOOLEAN"}),
    "bool_or": frozenset({"BOOLEAN"}),
    "collect": frozenset({"ARRAY"}),
    "nested_update": frozenset({"ARRAY"}),
    "merge_map": frozenset({"MAP"}),
}


def create(
    func: str,
    field: str,
    type_name: str | None,
    field_options: Mapping[str, str],
    ignore_retract: bool,
    option_key: str,
    sql_type: Any = None,
) -> FieldAgg:
    """Build the aggregator for one field. ``option_key`` is the option that chose the
    function, so an error names what the user wrote. ``sql_type`` (a
    ``tidemark.engine.types.SqlType``, when the planner knows it) lets ``nested_update``
    check its nested key against the ROW fields and read it from tuple rows."""
    if func not in _ACCEPTS:
        raise PlanError(
            f"option '{option_key}': unknown aggregate function '{func}'; "
            f"supported: {', '.join(FUNCTIONS)}"
        )
    accepts = _ACCEPTS[func]
    if type_name is not None and accepts is not None and type_name not in accepts:
        raise PlanError(
            f"option '{option_key}': aggregate function '{func}' does not support column "
            f"'{field}' of type {sql_type if sql_type is not None else type_name} "
            f"(supported: {', '.join(sorted(accepts))})"
        )
    agg: FieldAgg
    if func == "listagg":
        agg = ListAgg(type_name, field_options.get("list-agg-delimiter", ","),
                      _bool_option(field_options, "distinct", field))
    elif func == "collect":
        agg = Collect(type_name, _bool_option(field_options, "distinct", field))
    elif func == "nested_update":
        keys = tuple(k.strip() for k in field_options.get("nested-key", "").split(",") if k.strip())
        agg = NestedUpdate(type_name, field, keys, _nested_row_fields(field, sql_type, keys, option_key))
    else:
        agg = _SIMPLE[func](type_name)
    return IgnoreRetract(agg) if ignore_retract else agg


_SIMPLE: dict[str, type[FieldAgg]] = {
    "sum": Sum, "product": Product, "count": Count, "max": Max, "min": Min,
    "last_value": LastValue, "last_non_null_value": LastNonNullValue,
    "first_value": FirstValue, "first_non_null_value": FirstNonNullValue,
    "bool_and": BoolAnd, "bool_or": BoolOr, "merge_map": MergeMap,
}


def _nested_row_fields(field: str, sql_type: Any, keys: tuple[str, ...],
                       option_key: str) -> tuple[str, ...] | None:
    """The ROW field names of an ``ARRAY<ROW<...>>`` column (None when the type is not
    known); a nested key naming no field is a PlanError, as in Paimon."""
    if getattr(sql_type, "name", None) != "ARRAY":
        return None
    element = sql_type.params[0]
    if element.name != "ROW":
        raise PlanError(
            f"option '{option_key}': 'nested_update' needs column '{field}' to be "
            f"ARRAY<ROW<...>>, it is {sql_type}"
        )
    names = element.field_names
    for k in keys:
        if k not in names:
            raise PlanError(
                f"option 'fields.{field}.nested-key': field '{k}' is not in {element} "
                f"(column '{field}')"
            )
    return names


def _bool_option(field_options: Mapping[str, str], suffix: str, field: str) -> bool:
    raw = field_options.get(suffix, "false").strip().lower()
    if raw not in ("true", "false"):
        raise PlanError(f"option 'fields.{field}.{suffix}' must be 'true' or 'false', got {raw!r}")
    return raw == "true"


def _arith(a: Any, b: Any, op: str) -> Any:
    try:
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        return a / b
    except (TypeError, ArithmeticError) as exc:
        raise MergeError(f"cannot compute {a!r} {op} {b!r}: {exc}") from None


def _less(a: Any, b: Any) -> bool:
    try:
        return a < b
    except TypeError:
        raise MergeError(f"cannot compare {a!r} with {b!r}") from None


def _as_list(value: Any, func: str) -> Sequence:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return value
    raise MergeError(f"'{func}' needs an ARRAY value (a list), got {value!r}")


def _as_map(value: Any) -> dict:
    """A MAP value as a dict. Arrow hands maps over as lists of (key, value) pairs or
    ``{'key':..., 'value':...}`` entries; JSON as objects."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (list, tuple)):
        out = {}
        for entry in value:
            if isinstance(entry, Mapping) and "key" in entry:
                out[entry["key"]] = entry.get("value")
            elif isinstance(entry, (list, tuple)) and len(entry) == 2:
                out[entry[0]] = entry[1]
            else:
                raise MergeError(f"'merge_map' cannot read map entry {entry!r}")
        return out
    raise MergeError(f"'merge_map' needs a MAP value (an object), got {value!r}")
