"""Kafka records of a JSON source table decoded a batch at a time into typed Arrow columns.

The per-record ``Decoder`` (``codecs``) defines what a record means; this decoder reads a
whole batch with pyarrow's JSON reader and sends every record it cannot vouch for through
that per-record decoder, so a record's changes, its dead letter and the reason text are the
same whichever path decoded it. One bad record never fails the batch: when the reader
rejects a batch, the batch is split in halves until the rejected records stand alone.

Decoded record by record (the reader could read them differently from ``json.loads``):
values that are blank or hold a line break, a NUL, a byte-order mark or an escaped ASCII
character (an escaped key may name a column), a field name matching a column only
case-insensitively, a null or missing primary key, any null under
``json.fail-on-missing-field``, a value the column's conversion refuses, a DECIMAL
number of 2**53 or more or zero (the reader holds it as a double), Debezium ops other than
c/r/u/d or a missing image, the ``schema``/``payload`` wrapping, upsert tombstones and
upsert keys that are not the plain JSON of the value's primary key. Tables with ARRAY, MAP
or ROW columns, column names that need quoting and Avro formats are decoded record by
record throughout.

DECIMAL, DATE and TIMESTAMP arrive as JSON strings or numbers; each column is read as the
form its records used last (a batch in the other form is retried once per column). Values
in the plain forms (``123.45`` within the scale, ``YYYY-MM-DD``, ``YYYY-MM-DD hh:mm:ss[.f]``,
epoch days or milliseconds within Python's date range) are cast by Arrow; the others go
through ``coerce_value`` one by one. A DECIMAL zero loses its sign (Arrow's decimal has no
negative zero, nor has Flink's): ``-0.001`` in a DECIMAL(10, 2) column is ``0.00``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from tidemark.engine.catalog import TableDef
from tidemark.engine.changelog import DELETE, INSERT, KINDS, UPDATE_AFTER, UPDATE_BEFORE, Change
from tidemark.engine.types import INTEGER_RANGES, SqlType, coerce_value
from tidemark.formats.codecs import Decoder
from tidemark.formats.errors import DecodeError

_SIMPLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: what a value must not hold to be read by the batch reader (see module docstring)
_UNVOUCHED = r"[\n\r\x00\x{FEFF}\x{212A}]|\\u00[2-7][0-9a-fA-F]|\\u212[aA]|^[ \t]*$|^[ \t]*[^{ \t]"
#: read as a JSON string or number, converted by ``_coerce_each``
_RICH = ("DECIMAL", "DATE", "TIMESTAMP")
_NUMBER_FORM = {"DECIMAL": pa.float64(), "DATE": pa.int64(), "TIMESTAMP": pa.int64()}
_TWO_53 = float(2**53)
_SMALLEST_SPLIT = 2
#: a string key value whose JSON text is itself between quotes (printable ASCII, no quote or backslash)
_KEY_TEXT = r"^[\x20\x21\x23-\x5b\x5d-\x7e]*$"


def arrow_type(t: SqlType) -> pa.DataType:
    """The Arrow type holding a column's Python values exactly (FLOAT is a Python float,
    so float64)."""
    name = t.name
    if name == "TINYINT":
        return pa.int8()
    if name == "SMALLINT":
        return pa.int16()
    if name == "INT":
        return pa.int32()
    if name == "BIGINT":
        return pa.int64()
    if name in ("FLOAT", "DOUBLE"):
        return pa.float64()
    if name == "DECIMAL":
        return pa.decimal128(*t.params)
    if name == "BOOLEAN":
        return pa.bool_()
    if name == "DATE":
        return pa.date32()
    if name == "TIMESTAMP":
        return pa.timestamp("us")
    if t.is_string:
        return pa.string()
    raise ValueError(f"no columnar form for {t}")


@dataclass
class DecodedBatch:
    """The changes of a batch of records: ``rows`` (the table's typed columns), ``kinds``
    and ``record`` (the index of the record each change came from), in record order and
    within a record in the per-record decoder's order; ``dead``: ``(record index,
    DecodeError)`` of every bad record. ``ChangeBatch.from_arrow(rows, kinds, positions)``
    wraps it, with the positions taken by ``record``."""

    rows: pa.Table
    kinds: pa.Array
    record: pa.Array
    dead: list[tuple[int, DecodeError]]

    def row_tuples(self) -> list[tuple]:
        columns = [python_values(c.combine_chunks()) for c in self.rows.columns]
        return list(zip(*columns)) if columns else [() for _ in range(self.rows.num_rows)]

    def changes(self, positions: Sequence[tuple]) -> list[Change]:
        """As ``Change`` tuples, ``positions[i]`` being record i's position."""
        return [
            Change(k, r, positions[i])
            for k, r, i in zip(self.kinds.to_pylist(), self.row_tuples(), self.record.to_pylist())
        ]


def columnar(table: TableDef, encoding: str, envelope: str) -> bool:
    """Whether a table's records can be decoded a batch at a time (module docstring)."""
    return (
        encoding == "json"
        and all(_SIMPLE_NAME.fullmatch(n) for n in table.column_names)
        and not any(t.is_composite for t in table.types)
        and not (envelope == "changelog" and any(n.lower() == "op" for n in table.column_names))
    )


def batch_decoder_for(table: TableDef, registry_url: str | None = None) -> BatchDecoder | None:
    """The batch decoder of a table, None when its records are decoded one at a time."""
    from tidemark.formats.codecs import parse_format

    spec, _ = parse_format(table, registry_url)
    return BatchDecoder(table, registry_url) if columnar(table, spec.encoding, spec.envelope) else None


class BatchDecoder:
    """Decodes batches of Kafka records of one source table (see module docstring)."""

    def __init__(self, table: TableDef, registry_url: str | None = None):
        self.record_decoder = Decoder(table, registry_url)
        self.spec = self.record_decoder.spec
        self.table = table
        self.names = table.column_names
        self.types = table.types
        self.pk = table.pk_indexes
        self.fail_on_missing = self.record_decoder.rows.fail_on_missing
        if not columnar(table, self.spec.encoding, self.spec.envelope):
            raise ValueError(f"table '{table.name}': format '{self.spec.name}' has no columnar decoder")
        self.arrow_types = [arrow_type(t) for t in self.types]
        # the JSON form each DECIMAL/DATE/TIMESTAMP column is read as: string or number
        self._as_number = {i: False for i, t in enumerate(self.types) if t.name in _RICH}

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([(n, arrow_type(t)) for n, t in zip(self.names, self.types)])

    # ------------------------------------------------------------------ entry point
    def decode(self, keys: Sequence[bytes | None] | pa.Array, values: Sequence[bytes | None] | pa.Array,
               topic: str | None = None) -> DecodedBatch:
        """``keys`` and ``values``: the records' Kafka keys and values, as Arrow binary
        arrays (the source's columns as they arrive: a value becomes a Python object only
        when its record is decoded one by one) or as lists of bytes."""
        keys, values = _binary(keys), _binary(values)
        n = len(values)
        single: list[int] = []  # records decoded by the per-record decoder
        pieces: list[tuple[pa.Table, pa.Array, pa.Array, pa.Array]] = []  # rows, kinds, record, order within record
        candidates = self._screen(values, single) if n else []
        if candidates:
            for idx, parsed in self._parse(values, candidates, single):
                pieces.extend(self._changes(parsed, idx, keys, single))
        dead: list[tuple[int, DecodeError]] = []
        if single:
            pieces.append(self._one_by_one(sorted(single), keys, values, topic, dead))
        return self._assemble(pieces, dead)

    # ------------------------------------------------------------------ screening
    def _screen(self, values: pa.BinaryArray, single: list[int]) -> list[int]:
        """The records the batch reader may read; the others go to ``single``."""
        valid = pc.is_valid(values)
        present = pc.indices_nonzero(valid)
        if values.null_count:
            single.extend(pc.indices_nonzero(pc.invert(valid)).to_pylist())
            values = values.filter(valid)
        if not len(present):
            return []
        try:
            text = values.cast(pa.string())
        except pa.ArrowInvalid:  # not UTF-8 somewhere: find which
            is_utf8 = pa.array([_is_utf8(v) for v in values.to_pylist()], pa.bool_())
            single.extend(present.filter(pc.invert(is_utf8)).to_pylist())
            present = present.filter(is_utf8)
            if not len(present):
                return []
            text = values.filter(is_utf8).cast(pa.string())
        bad = pc.or_(pc.match_substring_regex(text, _UNVOUCHED), self._other_case_keys(text))
        if bad.true_count:
            single.extend(present.filter(bad).to_pylist())
            present = present.filter(pc.invert(bad))
        return present.to_numpy().tolist()

    def _other_case_keys(self, text: pa.StringArray) -> pa.BooleanArray:
        """True where a value may hold a key naming a column in another case (such a record
        is decoded one by one): where a quoted column name occurs case-insensitively more
        often than as written. When every column name is lowercase ASCII, a value that is
        ASCII without an uppercase letter cannot hold one, and only the others are counted
        (the two counts are most of the screen's time)."""
        quoted = '"(' + "|".join(self.names) + ')"'

        def differ(t: pa.StringArray) -> pa.BooleanArray:
            return pc.not_equal(pc.count_substring_regex(t, quoted, ignore_case=True), pc.count_substring_regex(t, quoted))

        if any(n != n.lower() for n in self.names):
            return differ(text)
        suspect = pc.invert(pc.and_(pc.string_is_ascii(text), pc.equal(pc.ascii_lower(text), text)))
        flags = pa.repeat(False, len(text))
        if not suspect.true_count:
            return flags
        return pc.replace_with_mask(flags, suspect, differ(text.filter(suspect)))

    # ------------------------------------------------------------------ reading
    def _read_schema(self) -> pa.Schema:
        cols = [
            (n, _NUMBER_FORM[t.name] if self._as_number.get(i) else (pa.string() if t.name in _RICH else arrow_type(t)))
            for i, (n, t) in enumerate(zip(self.names, self.types))
        ]
        cols = [(n, pa.int64() if pa.types.is_integer(t) else t) for n, t in cols]  # range checked after reading
        envelope = self.spec.envelope
        if envelope == "debezium":
            image = pa.struct(cols)
            return pa.schema([("before", image), ("after", image), ("op", pa.string()), ("ts_ms", pa.int64())])
        if envelope == "changelog":
            return pa.schema(cols + [("op", pa.string())])
        return pa.schema(cols)

    def _read(self, values: pa.BinaryArray, idx: list[int]) -> pa.Table:
        data = _lines(values.take(pa.array(idx, pa.int64())))
        options = pj.ParseOptions(explicit_schema=self._read_schema(), unexpected_field_behavior="ignore")
        table = pj.read_json(
            pa.BufferReader(data), read_options=pj.ReadOptions(use_threads=False, block_size=data.size + 1), parse_options=options
        )
        if table.num_rows != len(idx):  # e.g. two objects in one value
            raise pa.ArrowInvalid(f"{table.num_rows} rows for {len(idx)} records")
        return table

    def _flip(self, message: str) -> bool:
        """After a "changed from string to number" error naming a DECIMAL/DATE/TIMESTAMP
        column, read that column in the other form; False when the error is not that."""
        m = re.search(r"Column\(/(?:before/|after/)?([A-Za-z0-9_]+)\) changed from (string|number) to (string|number)", message)
        if not m:
            return False
        i = self.names.index(m.group(1)) if m.group(1) in self.names else None
        if i is None or i not in self._as_number:
            return False
        self._as_number[i] = m.group(3) == "number"
        return True

    def _parse(self, values: pa.BinaryArray, idx: list[int], single: list[int]) -> list[tuple[list[int], pa.Table]]:
        tries = len(self._as_number) + 1
        while True:
            try:
                return [(idx, self._read(values, idx))]
            except pa.ArrowInvalid as err:
                tries -= 1
                if tries > 0 and self._flip(str(err)):
                    continue
            if len(idx) <= _SMALLEST_SPLIT:
                single.extend(idx)
                return []
            half = len(idx) // 2
            return self._parse(values, idx[:half], single) + self._parse(values, idx[half:], single)

    # ------------------------------------------------------------------ changes
    def _changes(self, parsed: pa.Table, idx: list[int], keys: pa.BinaryArray, single: list[int]) -> list[tuple]:
        """(rows, kinds, record, order) pieces of the parsed records that pass every check;
        the others are added to ``single`` and left out of every piece."""
        records = pa.array(idx, pa.int64())
        envelope = self.spec.envelope
        if envelope == "debezium":
            op = parsed.column("op").combine_chunks()
            before_ops, after_ops = pa.array(["u", "d"]), pa.array(["c", "r", "u"])
            known = pc.is_in(op, pa.array(["c", "r", "u", "d"]))
            has_before = pc.is_valid(parsed.column("before"))
            has_after = pc.is_valid(parsed.column("after"))
            wants_before = pc.fill_null(pc.is_in(op, before_ops), False)
            wants_after = pc.fill_null(pc.is_in(op, after_ops), False)
            ok = pc.and_(
                pc.fill_null(known, False),
                pc.and_(pc.or_(pc.invert(wants_before), has_before), pc.or_(pc.invert(wants_after), has_after)),
            )
            images = []
            for field, wants, order in (("before", wants_before, 0), ("after", wants_after, 1)):
                sel = pc.and_(wants, ok)
                struct = pc.filter(parsed.column(field), sel).combine_chunks()
                table = pa.Table.from_arrays(struct.flatten(), names=list(self.names))
                kinds = _debezium_kinds(pc.filter(op, sel), field)
                images.append((table, kinds, pc.filter(records, sel), order))
            bad_records = pc.filter(records, pc.invert(ok)).to_pylist()
            single.extend(bad_records)
            converted = [self._convert(t, k, r, o, keys) for t, k, r, o in images]
            rejected = set()
            for _, _, _, _, rej in converted:
                rejected.update(rej)
            single.extend(rejected)
            return [_without(piece, rejected) for *piece, _ in converted]
        if envelope == "changelog":
            op = parsed.column("op").combine_chunks()
            ok = pc.fill_null(pc.is_in(op, pa.array(list(KINDS))), False)
            single.extend(pc.filter(records, pc.invert(ok)).to_pylist())
            rows = parsed.drop_columns(["op"]).filter(ok)
            kinds = pc.filter(op, ok)
            records = pc.filter(records, ok)
        else:
            rows = parsed
            kind = UPDATE_AFTER if envelope == "upsert" else INSERT
            kinds = pa.array([kind] * len(idx), pa.string())
        *piece, rejected = self._convert(rows, kinds, records, 0, keys)
        single.extend(rejected)
        return [tuple(piece)]

    def _convert(
        self, rows: pa.Table, kinds: pa.Array, records: pa.Array, order: int, keys: pa.BinaryArray
    ) -> tuple[pa.Table, pa.Array, pa.Array, pa.Array, set[int]]:
        """Typed columns of read rows; the records whose values fail a check are returned
        as the last element (and dropped from the others)."""
        n = rows.num_rows
        ok = pa.array([True] * n, pa.bool_())
        columns: list[pa.Array] = []
        for i, (t, at) in enumerate(zip(self.types, self.arrow_types)):
            col = rows.column(i).combine_chunks()
            if t.name in _RICH:
                col, good = _coerce_each(t, col)
                ok = pc.and_(ok, good)
            elif t.name in INTEGER_RANGES and t.name != "BIGINT":
                lo, hi = INTEGER_RANGES[t.name]
                inside = pc.fill_null(pc.and_(pc.greater_equal(col, lo), pc.less_equal(col, hi)), True)
                ok = pc.and_(ok, inside)
                col = pc.if_else(inside, col, pa.scalar(None, col.type)).cast(at)
            elif t.name in ("FLOAT", "DOUBLE") and pa.types.is_floating(col.type):
                # the reader turns an integer too large for a double into inf, which the
                # per-record decoder refuses: such a record takes the per-record path
                ok = pc.and_(ok, pc.fill_null(pc.is_finite(col), True))
            if i in self.pk or self.fail_on_missing:
                ok = pc.and_(ok, pc.is_valid(col))
            columns.append(col)
        if self.spec.envelope == "upsert" and n:
            ok = pc.and_(ok, self._plain_keys(columns, records, keys))
        table = pa.Table.from_arrays(columns, schema=self.schema)
        rejected = set(pc.filter(records, pc.invert(ok)).to_pylist())
        return (table.filter(ok), pc.filter(kinds, ok), pc.filter(records, ok), pa.array([order] * (n - len(rejected)), pa.int8()), rejected)

    def _plain_keys(self, columns: list[pa.Array], records: pa.Array, keys: pa.BinaryArray) -> pa.Array:
        """True where the record's Kafka key is absent or the plain JSON of the value's
        primary key (so the per-record decoder's key merge would add nothing)."""
        record_keys = keys.take(records)
        texts = []
        for i in self.pk:
            t, col = self.types[i], columns[i]
            if t.is_integral:
                texts.append(col.cast(pa.string()))
            elif t.is_string:
                plain = pc.match_substring_regex(col, _KEY_TEXT)
                texts.append(pc.if_else(plain, pc.binary_join_element_wise('"', col, '"', ""), pa.scalar(None, pa.string())))
            else:
                return pc.is_null(record_keys)
        forms = []
        for sep, colon in ((",", ":"), (", ", ": ")):
            parts: list[Any] = ["{"]
            for j, (i, text) in enumerate(zip(self.pk, texts)):
                parts += ([sep] if j else []) + [f'"{self.names[i]}"{colon}', text]
            parts.append("}")
            forms.append(pc.binary_join_element_wise(*parts, ""))
        if len(self.pk) == 1:
            forms.append(texts[0])
        try:
            actual = record_keys.cast(pa.string())
        except pa.ArrowInvalid:
            return pc.is_null(record_keys)
        ok = pc.is_null(actual)
        for form in forms:
            ok = pc.or_(ok, pc.fill_null(pc.equal(actual, form), False))
        return ok

    # ------------------------------------------------------------------ record by record
    def _one_by_one(
        self, idx: list[int], keys: pa.BinaryArray, values: pa.BinaryArray, topic: str | None,
        dead: list[tuple[int, DecodeError]],
    ) -> tuple[pa.Table, pa.Array, pa.Array, pa.Array]:
        rows, kinds, records, order = [], [], [], []
        for i in idx:
            try:
                changes = self.record_decoder.decode(keys[i].as_py(), values[i].as_py(), (), topic)
            except DecodeError as err:
                dead.append((i, err))
                continue
            for j, c in enumerate(changes):
                rows.append(c.row)
                kinds.append(c.kind)
                records.append(i)
                order.append(j)
        columns = list(zip(*rows)) if rows else [[] for _ in self.names]
        table = pa.Table.from_arrays([pa.array(list(c), at) for c, at in zip(columns, self.arrow_types)], schema=self.schema)
        return table, pa.array(kinds, pa.string()), pa.array(records, pa.int64()), pa.array(order, pa.int8())

    def _assemble(self, pieces: list[tuple], dead: list[tuple[int, DecodeError]]) -> DecodedBatch:
        dead.sort(key=lambda d: d[0])
        pieces = [p for p in pieces if len(p[2])]
        if not pieces:
            return DecodedBatch(self.schema.empty_table(), pa.array([], pa.string()), pa.array([], pa.int64()), dead)
        rows = pa.concat_tables([p[0] for p in pieces]).combine_chunks()
        kinds, records, order = (pa.concat_arrays([_array(p[i]) for p in pieces]) for i in (1, 2, 3))
        sort = pc.sort_indices(pa.table({"r": records, "o": order}), sort_keys=[("r", "ascending"), ("o", "ascending")])
        return DecodedBatch(rows.take(sort), kinds.take(sort), records.take(sort), dead)


def python_values(col: pa.Array) -> list[Any]:
    """``col.to_pylist()``, through NumPy or text where Arrow's per-value conversion is
    several times slower (timestamps, dates, decimals, null-free numbers)."""
    t = col.type
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        return col.to_numpy(zero_copy_only=False).astype(object).tolist()  # NaT -> None
    if pa.types.is_decimal(t):
        return [None if v is None else Decimal(v) for v in col.cast(pa.string()).to_pylist()]
    if (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)) and not col.null_count:
        return col.to_numpy(zero_copy_only=False).tolist()
    return col.to_pylist()


def _binary(values: Sequence[bytes | None] | pa.Array | pa.ChunkedArray) -> pa.BinaryArray:
    """Keys or values as one Arrow binary array."""
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return _array(values).cast(pa.binary())
    return pa.array(values, pa.binary())


def _lines(values: pa.BinaryArray) -> pa.Buffer:
    """The values joined by newlines, as the JSON reader reads them: one buffer, built in
    Arrow (large types: a batch's text may pass 2 GiB)."""
    lists = pa.LargeListArray.from_arrays(pa.array([0, len(values)], pa.int64()), values.cast(pa.large_binary()))
    return pc.binary_join(lists, pa.scalar(b"\n", pa.large_binary()))[0].as_buffer()


def _is_utf8(value: bytes) -> bool:
    try:
        value.decode()
    except UnicodeDecodeError:
        return False
    return True


def _array(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def _without(piece: list, rejected: set[int]) -> tuple:
    rows, kinds, records, order = piece
    if not rejected:
        return tuple(piece)
    keep = pc.invert(pc.is_in(records, pa.array(sorted(rejected), pa.int64())))
    return rows.filter(keep), pc.filter(kinds, keep), pc.filter(records, keep), pc.filter(order, keep)


def _debezium_kinds(op: pa.Array, field: str) -> pa.Array:
    if field == "before":
        return pc.if_else(pc.equal(op, "u"), UPDATE_BEFORE, DELETE)
    return pc.if_else(pc.equal(op, "u"), UPDATE_AFTER, INSERT)


_YEAR = r"([1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"
_DATE_TEXT = _YEAR + r"-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
_TIME_TEXT = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?"
#: Python's datetime range, in the units a JSON number means (days, milliseconds)
_DAYS = (-719_162, 2_932_896)
_MILLIS = (-62_135_596_800_000, 253_402_300_799_999)


def _fast_mask(t: SqlType, col: pa.Array) -> pa.Array | None:
    """Where Arrow's cast of a value gives what ``coerce_value`` gives (None: nowhere)."""
    if pa.types.is_string(col.type):
        if t.name == "DECIMAL":
            p, s = t.params
            if p == s:
                return None
            pattern = rf"^-?[0-9]{{1,{p - s}}}" + (rf"(\.[0-9]{{1,{s}}})?$" if s else "$")
        elif t.name == "DATE":
            pattern = f"^{_DATE_TEXT}$"
        else:
            pattern = f"^{_DATE_TEXT}[ T]{_TIME_TEXT}$"
        return pc.fill_null(pc.match_substring_regex(col, pattern), False)
    if t.name == "DECIMAL":  # a JSON number: coerce_value goes through its repr
        return None
    lo, hi = _DAYS if t.name == "DATE" else _MILLIS
    return pc.fill_null(pc.and_(pc.greater_equal(col, lo), pc.less_equal(col, hi)), False)


def _fast_cast(t: SqlType, col: pa.Array) -> pa.Array:
    if t.name == "DATE":
        return col.cast(pa.date32()) if pa.types.is_string(col.type) else col.cast(pa.int32()).cast(pa.date32())
    if t.name == "DECIMAL":
        return col.cast(arrow_type(t))
    ts = col.cast(pa.timestamp("us")) if pa.types.is_string(col.type) else col.cast(pa.timestamp("ms")).cast(pa.timestamp("us"))
    precision = t.params[0] if t.params else 6
    return ts if precision >= 6 else pc.floor_temporal(ts, multiple=10 ** (6 - precision), unit="microsecond")


def _coerce_each(t: SqlType, col: pa.Array) -> tuple[pa.Array, pa.Array]:
    """A DECIMAL/DATE/TIMESTAMP column's values as ``coerce_value`` converts them (Arrow's
    cast where it is the same, ``coerce_value`` itself elsewhere) and where it accepted them."""
    target = arrow_type(t)
    fast = _fast_mask(t, col)
    converted = pa.nulls(len(col), target)
    if fast is not None and pc.any(fast).as_py():
        try:
            converted = _fast_cast(t, pc.if_else(fast, col, pa.scalar(None, col.type)))
        except pa.ArrowInvalid:  # e.g. February 30: every value goes the slow way
            fast = None
    slow = pc.is_valid(col) if fast is None else pc.and_(pc.is_valid(col), pc.invert(fast))
    positions = pc.indices_nonzero(slow)
    if not len(positions):
        return converted, pa.array([True] * len(col), pa.bool_())
    as_number = not pa.types.is_string(col.type)
    out: list[Any] = []
    failed: list[int] = []
    for i, v in zip(positions.to_pylist(), col.take(positions).to_pylist()):
        if as_number and t.name == "DECIMAL" and (v == 0 or abs(v) >= _TWO_53 or v != v):
            failed.append(i)  # the reader held it as a double: zero's sign, large integers differ
            out.append(None)
            continue
        try:
            out.append(coerce_value(t, v))
        except Exception:  # the per-record decoder gives this record its exact outcome
            failed.append(i)
            out.append(None)
    converted = pc.replace_with_mask(converted, slow, pa.array(out, target))
    good = np.ones(len(col), dtype=bool)
    good[failed] = False
    return converted, pa.array(good)
