"""The batch encoder writes the bytes the per-record encoder writes, for random rows of
every column type, from ``Change`` tuples and from a batch's Arrow columns."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemark.engine.batch import ChangeBatch
from tidemark.engine.batch_ipc import schema_of
from tidemark.engine.catalog import Column, TableDef
from tidemark.engine.changelog import KINDS, Change
from tidemark.engine.types import coerce_value, parse_type
from tidemark.formats.batch_encode import BatchEncoder
from tidemark.formats.codecs import Encoder

COLUMNS = [
    ("id", "BIGINT"), ("n", "INT"), ("x", "DOUBLE"), ("f", "FLOAT"), ("s", "STRING"), ("b", "BOOLEAN"),
    ("amount", "DECIMAL(10, 2)"), ("d", "DATE"), ("ts", "TIMESTAMP(6)"), ("tags", "ARRAY<STRING>"),
    ("m", "MAP<STRING, INT>"), ("r", "ROW<a INT, b STRING>"),
]
TYPES = {n: parse_type(t) for n, t in COLUMNS}


def table(fmt: str, pk: tuple[str, ...]) -> TableDef:
    return TableDef("o", [Column(n, parse_type(t)) for n, t in COLUMNS], pk, {"format": fmt, "topic": "o"})


text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]) | st.sampled_from('"\\\n\t\x00\x1f\x7f\u2028é😀'), max_size=8)
values = {
    "id": st.integers(-(2**63), 2**63 - 1),
    "n": st.integers(-(2**31), 2**31 - 1),
    "x": st.floats(),
    "f": st.floats(width=32),
    "s": text,
    "b": st.booleans(),
    "amount": st.decimals(-(10**7), 10**7, places=2, allow_nan=False),
    "d": st.dates(),
    "ts": st.datetimes(),
    "tags": st.lists(text, max_size=3).map(tuple),
    "m": st.dictionaries(text, st.integers(-5, 5), max_size=3).map(lambda m: coerce_value(TYPES["m"], m)),
    "r": st.tuples(st.integers(-5, 5), text),
}


@st.composite
def rows(draw):
    return tuple(draw(st.none() | values[n]) if n != "id" else draw(values[n]) for n, _ in COLUMNS)


@pytest.mark.parametrize("fmt,pk", [("upsert-json", ("id",)), ("changelog-json", ("id", "s")), ("changelog-json", ())])
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_batch_encoder_writes_the_per_record_bytes(fmt, pk, data):
    if fmt == "upsert-json" and not pk:
        pytest.skip("upsert needs a key")
    changes = data.draw(st.lists(st.builds(Change, st.sampled_from(KINDS), rows(), st.just((0,))), max_size=20))
    t = table(fmt, pk)
    if "s" in pk:  # a key column is never null
        changes = [c._replace(row=c.row[:4] + (c.row[4] or "",) + c.row[5:]) for c in changes]
    expected = [Encoder(t).encode(c, "o") for c in changes]
    assert BatchEncoder(t).encode(changes, "o") == expected
    batch = ChangeBatch.from_changes(changes, schema_of(t.column_names, t.types))
    assert BatchEncoder(t).encode_table(batch.table(), "o") == expected  # from the columns
    whole, half = batch.table(), len(changes) // 2
    chunked = pa.concat_tables([whole.slice(0, half), whole.slice(half)])  # as a stage's output may be
    assert BatchEncoder(t).encode_table(chunked, "o") == expected


def test_values_of_unexpected_python_types_are_rendered_as_the_encoder_does():
    """An int column holding a bool or a float (a stage's output), a huge int: no fast path."""
    t = table("changelog-json", ("id",))
    base = (1, None, None, None, None, None, Decimal("1.00"), dt.date(2024, 1, 2), dt.datetime(2024, 1, 2, 3, 4, 5, 6), None, None, None)
    odd = [base, base[:1] + (True,) + base[2:], base[:1] + (2**70,) + base[2:], base[:1] + (1.0,) + base[2:]]
    changes = [Change("+I", r, (0,)) for r in odd]
    assert BatchEncoder(t).encode(changes, "o") == [Encoder(t).encode(c, "o") for c in changes]
