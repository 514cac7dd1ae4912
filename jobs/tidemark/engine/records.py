"""Replay inputs: JSON Lines files of changes, one file per source table, turned into batches.

A line is a change ``{"kind": "+I", "row": {...}}`` (optionally ``"seq": <number>``) or a
barrier ``{"barrier": true}`` (optionally with ``"seq"``). Blank lines are skipped (they
still count for line numbers). Every line is checked against the source's ``TableDef``
and changelog mode before anything runs, because a replay that silently skips or
converts a bad record gives an answer that looks right and is not. All errors are
collected (up to ``MAX_ERRORS``) so a user fixes a file in one round, each one line
``path:line: what is wrong``.

Ordering rules (they decide the source position ``pos`` that "latest" is judged by):

- ``seq`` is all-or-nothing across a replay: either every change in every input has a
  ``seq`` or none has. Mixing would make positions from two clocks look comparable.
- With ``seq``: all inputs are merged in ``seq`` order (ties: order of the ``--input``
  flags, then line). ``seq`` must not decrease within one input (a file is one ordered
  stream, like a Kafka partition). ``pos = (seq,)``.
- Without ``seq``: inputs are replayed one after another in ``--input`` order and
  ``pos = (n,)`` where ``n`` is the line number counted across the inputs in that order
  (the second file's line 1 follows the first file's last line). For one input, ``pos``
  is simply the line number.
- A barrier stays where it is in its own input: without its own ``seq`` it sits right
  after the change before it in the same file. A barrier in any input closes the current
  batch; the end of the last input closes the last one. Empty batches are not run.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from tidemark.engine.catalog import TableDef
from tidemark.engine.changelog import DELETE, INSERT, KINDS, UPDATE_AFTER, Change
from tidemark.engine.errors import InputError, TidemarkError, shorten
from tidemark.engine.types import coerce_value

MAX_ERRORS = 20
#: longest input line read (``--max-line-bytes``): a record is a row, not a file
MAX_LINE_BYTES = 16 * 1024 * 1024
#: deepest JSON nesting of a line (composite columns included)
MAX_NESTING = 64
_SKIP_CHUNK = 1024 * 1024

#: kinds each changelog mode may carry (as Flink's formats do)
KINDS_BY_MODE: dict[str, tuple[str, ...]] = {
    "append": (INSERT,),
    "retract": KINDS,
    "upsert": (INSERT, UPDATE_AFTER, DELETE),
}


class InputErrors(InputError):
    """Several bad input lines at once; ``str()`` is one line per error."""

    def __init__(self, errors: Sequence[InputError], more: int = 0):
        lines = [str(e) for e in errors]
        if more:
            lines.append(f"... and {more} more input error(s) not shown")
        TidemarkError.__init__(self, "\n".join(lines))
        self.errors = list(errors)
        self.where = errors[0].where if errors else ""


@dataclass(frozen=True)
class Record:
    """One line of an input, validated. ``change`` is None for a barrier."""

    table: str
    change: Change | None
    seq: float | int | None
    where: str  # "path:line"
    input_index: int
    line: int

    @property
    def is_barrier(self) -> bool:
        return self.change is None


@dataclass(frozen=True)
class InputSpec:
    """One ``--input TABLE=PATH``: ``label`` is how errors name the file."""

    table: TableDef
    path: Path
    label: str


class _Errors:
    def __init__(self) -> None:
        self.items: list[InputError] = []
        self.more = 0

    def add(self, where: str, message: str) -> None:
        if len(self.items) < MAX_ERRORS:
            self.items.append(InputError(where, message))
        else:
            self.more += 1

    def raise_if_any(self) -> None:
        if len(self.items) == 1 and not self.more:
            raise self.items[0]
        if self.items:
            raise InputErrors(self.items, self.more)


def _json_text(value: Any) -> str:
    return shorten(json.dumps(value, ensure_ascii=False))


def parse_row(table: TableDef, kind: str, row: Any) -> tuple:
    """Validate one decoded row against ``table`` and return it as a tuple in column
    order. Raises ValueError with a message that names the column at fault.

    Every column must be present (``null`` for NULL), so a typo or an omission is an
    error rather than a NULL; the one exception is an upsert source's ``-D``, which may
    carry only the primary key (a tombstone knows nothing else)."""
    if not isinstance(row, dict):
        raise ValueError(f'"row" must be a JSON object, got {_json_text(row)}')
    names = table.column_names
    values: list[Any] = [None] * len(names)
    seen: dict[int, str] = {}
    for key, raw in row.items():
        try:
            i = table.index_of(key)
        except KeyError:
            raise ValueError(
                f"unknown column '{shorten(key)}' (table '{table.name}' has: {shorten(', '.join(names))})"
            ) from None
        if i in seen:
            raise ValueError(f"column '{names[i]}' given twice ('{shorten(seen[i])}' and '{shorten(key)}')")
        seen[i] = key
        try:
            values[i] = coerce_value(table.columns[i].type, raw)
        except ValueError as e:
            raise ValueError(f"column '{names[i]}': {e}") from None
    pk = set(table.pk_indexes)
    for i in table.pk_indexes:
        if i not in seen:
            raise ValueError(f"missing primary key column '{names[i]}'")
        if values[i] is None:
            raise ValueError(f"primary key column '{names[i]}' is null")
    tombstone = kind == DELETE and table.changelog_mode == "upsert"
    if not tombstone:
        missing = [names[i] for i in range(len(names)) if i not in seen and i not in pk]
        if missing:
            raise ValueError(
                f"missing column(s) {', '.join(repr(m) for m in missing)} (write null for a NULL value)"
            )
    return tuple(values)


def _parse_seq(value: Any) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
        isinstance(value, float) and not math.isfinite(value)
    ):
        raise ValueError(f'"seq" must be a number, got {_json_text(value)}')
    return value


def _depth(value: Any) -> int:
    """Nesting depth of a decoded JSON value, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        deepest = max(deepest, d)
        if isinstance(v, dict):
            stack.extend((c, d + 1) for c in v.values())
        elif isinstance(v, list):
            stack.extend((c, d + 1) for c in v)
    return deepest


def _load(text: str) -> Any:
    """json.loads with a nesting limit: Python's decoder recurses once per level."""
    too_deep = ValueError(f"JSON nested deeper than {MAX_NESTING} levels")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"malformed JSON: {e.msg} (column {e.colno})") from None
    except RecursionError:
        raise too_deep from None
    # the count of brackets bounds the depth: walk the value only when it might be deep
    if text.count("[") + text.count("{") > MAX_NESTING and _depth(obj) > MAX_NESTING:
        raise too_deep
    return obj


def _parse_line(table: TableDef, text: str) -> tuple[str | None, tuple | None, int | float | None]:
    """-> (kind or None for a barrier, row, seq). Raises ValueError on a bad line."""
    obj = _load(text)
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {_json_text(obj)}")
    seq = _parse_seq(obj["seq"]) if "seq" in obj else None
    if "barrier" in obj:
        extra = sorted(shorten(k) for k in set(obj) - {"barrier", "seq"})
        if obj["barrier"] is not True:
            raise ValueError(f'"barrier" must be true, got {_json_text(obj["barrier"])}')
        if extra:
            raise ValueError(f"unexpected key(s) on a barrier line: {', '.join(extra)}")
        return None, None, seq
    extra = sorted(shorten(k) for k in set(obj) - {"kind", "row", "seq"})
    if extra:
        raise ValueError(
            f"unexpected key(s) {', '.join(repr(k) for k in extra)} "
            '(a line is {"kind": ..., "row": {...}} with optional "seq", or {"barrier": true})'
        )
    if "kind" not in obj:
        raise ValueError('missing "kind"')
    kind = obj["kind"]
    if kind not in KINDS:
        raise ValueError(f"unknown kind {_json_text(kind)} (expected one of {', '.join(KINDS)})")
    mode = table.changelog_mode
    allowed = KINDS_BY_MODE[mode]
    if kind not in allowed:
        fmt = table.format or "no format"
        raise ValueError(
            f"kind {kind} not allowed: source '{table.name}' is {mode} ({fmt}) and takes {', '.join(allowed)}"
        )
    if "row" not in obj:
        raise ValueError('missing "row"')
    return kind, parse_row(table, kind, obj["row"]), seq


def _lines(f: BinaryIO, max_line_bytes: int) -> Iterator[bytes | None]:
    """The lines of ``f`` without their end of line, reading at most ``max_line_bytes``
    (+1) bytes of any one line: a longer line yields None once its first
    ``max_line_bytes`` are read, and the rest of it is skipped in bounded chunks, so a file
    without newlines never lands in memory whole."""
    while raw := f.readline(max_line_bytes + 1):
        if raw.endswith(b"\n"):
            yield raw[:-1].removesuffix(b"\r")
        elif len(raw) <= max_line_bytes:
            yield raw.removesuffix(b"\r")  # the last line, without a newline
        else:
            yield None
            while (rest := f.readline(_SKIP_CHUNK)) and not rest.endswith(b"\n"):
                pass


def _decode_line(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 text: byte 0x{raw[e.start]:02x} at byte {e.start + 1} of the line") from None


def read_input(
    spec: InputSpec, input_index: int, errors: _Errors, max_line_bytes: int = MAX_LINE_BYTES
) -> tuple[list[Record], int]:
    """All records of one file in file order, and its number of lines; errors go to
    ``errors``."""
    out: list[Record] = []
    n = 0
    try:
        with spec.path.open("rb") as f:
            for n, raw in enumerate(_lines(f, max_line_bytes), start=1):
                where = f"{spec.label}:{n}"
                if raw is None:
                    errors.add(where, f"line longer than {max_line_bytes} bytes (raise the limit with --max-line-bytes)")
                    continue
                try:
                    line = _decode_line(raw)
                    if not line.strip():
                        continue
                    kind, row, seq = _parse_line(spec.table, line)
                except ValueError as e:
                    errors.add(where, str(e))
                    continue
                change = None if kind is None else Change(kind, row, ())
                out.append(Record(spec.table.name, change, seq, where, input_index, n))
    except OSError as e:
        errors.add(spec.label, f"cannot read input for table '{spec.table.name}': {e.strerror or e}")
        return [], 0
    return out, n


def _order(per_input: list[list[Record]], line_counts: list[int], errors: _Errors) -> list[Record]:
    """Apply the ordering rules of the module docstring; fills in ``pos``."""
    changes = [r for recs in per_input for r in recs if not r.is_barrier]
    with_seq = [r for r in changes if r.seq is not None]
    if not with_seq:
        for recs in per_input:
            for r in recs:
                if r.seq is not None:
                    errors.add(r.where, 'barrier has a "seq" but no record has one: give every record a "seq" or none')
        ordered: list[Record] = []
        offset = 0
        for recs, count in zip(per_input, line_counts):
            for r in recs:
                if r.change is not None:
                    r = _with_pos(r, (offset + r.line,))
                ordered.append(r)
            offset += count
        return ordered
    if len(with_seq) != len(changes):
        first = with_seq[0]
        for r in changes:
            if r.seq is None:
                errors.add(
                    r.where,
                    f'no "seq", but {first.where} has one: give every record a "seq" or none',
                )
        return []
    keyed: list[tuple[tuple, Record]] = []
    for recs in per_input:
        prev: int | float = -math.inf
        for r in recs:
            seq = prev if r.seq is None else r.seq
            if seq < prev:
                errors.add(
                    r.where,
                    f'"seq" {r.seq} is smaller than the previous seq {prev} in this input '
                    "(seq must not decrease within one input)",
                )
                continue
            prev = seq
            if r.change is not None:
                r = _with_pos(r, (r.seq,))
            # barriers sort after the records that share their position in the same input
            keyed.append(((seq, r.input_index, r.line), r))
    keyed.sort(key=lambda kr: kr[0])
    return [r for _, r in keyed]


def _with_pos(r: Record, pos: tuple) -> Record:
    assert r.change is not None
    return Record(r.table, r.change._replace(pos=pos), r.seq, r.where, r.input_index, r.line)


def read_inputs(specs: Sequence[InputSpec], max_line_bytes: int = MAX_LINE_BYTES) -> list[Record]:
    """Read, validate and order every input. Raises InputError (one bad line) or
    InputErrors (several) after reading everything."""
    errors = _Errors()
    per_input: list[list[Record]] = []
    line_counts: list[int] = []
    for i, spec in enumerate(specs):
        records, count = read_input(spec, i, errors, max_line_bytes)
        per_input.append(records)
        line_counts.append(count)
    errors.raise_if_any()
    ordered = _order(per_input, line_counts, errors)
    errors.raise_if_any()
    return ordered


def batches(records: Iterable[Record], mode: str = "barrier") -> list[list[Record]]:
    """Split ordered records into batches. ``barrier``: a barrier (in any input) closes
    the current batch and the end of input closes the last; ``record``: every change is
    a batch of its own and barriers are ignored. Empty batches are dropped."""
    if mode not in ("barrier", "record"):
        raise ValueError(f"unknown batching mode {mode!r} (barrier or record)")
    out: list[list[Record]] = []
    current: list[Record] = []
    for r in records:
        if r.is_barrier:
            if mode == "barrier" and current:
                out.append(current)
                current = []
            continue
        if mode == "record":
            out.append([r])
        else:
            current.append(r)
    if current:
        out.append(current)
    return out


def batch_by_table(batch: Iterable[Record], tables: Iterable[str]) -> dict[str, list[Change]]:
    """The shape ``ReplayHost.run_batch`` takes: every source table, with its changes in
    replay order (possibly none)."""
    out: dict[str, list[Change]] = {t: [] for t in tables}
    for r in batch:
        assert r.change is not None
        out.setdefault(r.table, []).append(r.change)
    return out
