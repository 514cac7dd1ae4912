"""Python UDFs for examples/orders_udf.sql (run with PYTHONPATH=examples)."""

import pyarrow as pa
import pyarrow.compute as pc

from tidemark.udf import udf


@udf(result_type="BIGINT")
def count_char(s: pa.Array, c: pa.Array) -> pa.Array:
    """How many times the character ``c`` occurs in ``s`` (Nexmark's CountChar)."""
    return pc.count_substring(s, pattern=c[0].as_py())
