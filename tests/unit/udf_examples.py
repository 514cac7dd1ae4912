"""Python UDFs for tests/unit/test_udf.py (imported by module path, as a pipeline's are)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from tidemark.udf import udf

#: batches count_char was called on (the test checks it is called once per batch)
CALLS: list[int] = []


@udf(result_type="BIGINT")
def count_char(s: pa.Array, c: pa.Array) -> pa.Array:
    """Nexmark's CountChar: how many times the character ``c`` occurs in ``s``."""
    CALLS.append(len(s))
    return pc.count_substring(s, pattern=c[0].as_py()) if len(c) else pa.array([], pa.int64())


@udf(result_type="DECIMAL(10, 2)")
def with_tax(amount: pa.Array) -> pa.Array:
    return pc.round(pc.multiply(amount.cast(pa.float64()), 1.2), 2)


@udf(result_type="STRING")
def fails(s: pa.Array) -> pa.Array:
    raise RuntimeError("no service")


def undeclared(s: pa.Array) -> pa.Array:
    return s
