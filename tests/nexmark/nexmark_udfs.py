"""Nexmark's one user-defined function, ``count_char`` (q14), written in Python.

Nexmark ships it as a Java class (``com.github.nexmark.flink.udf.CountChar``); q14 declares
it ``LANGUAGE PYTHON`` instead, the one adaptation its query text needs. The same module
serves both engines, so the query names one path: under Tidemark ``count_char`` is a
``tidemark.udf`` on whole columns; in the Flink oracle's interpreter (PyFlink, no Tidemark)
it is a PyFlink ``@udf`` computing the same value per row.
"""

from __future__ import annotations

try:
    import pyarrow as pa
    import pyarrow.compute as pc

    from tidemark.udf import udf

    @udf(result_type="BIGINT")
    def count_char(s: pa.Array, c: pa.Array) -> pa.Array:
        """How many times ``c``'s first character occurs in ``s`` (0 for a NULL ``s``, as
        CountChar returns); ``c`` is q14's constant ``'c'``, one pattern for the batch."""
        if len(c) == 0:
            return pa.array([], pa.int64())
        return pc.count_substring(s, pattern=c[0].as_py()[:1]).cast(pa.int64()).fill_null(0)

except ImportError:  # the Flink oracle's PyFlink interpreter
    from pyflink.table import DataTypes
    from pyflink.table.udf import udf as flink_udf

    @flink_udf(result_type=DataTypes.BIGINT())
    def count_char(s: str | None, c: str) -> int:
        """Nexmark's CountChar, per row: how many times ``c``'s first character occurs in ``s``."""
        return 0 if s is None else s.count(c[:1])
