"""The Python UDF of the conformance suite's ``udf_view`` shape, for both engines.

Under Tidemark ``tag`` is a ``tidemark.udf`` on whole columns; in the Flink oracle's
interpreter (PyFlink, no Tidemark) it is a PyFlink ``@udf`` computing the same value per
row, so one ``CREATE FUNCTION ... AS 'conformance_udfs.tag'`` serves both. Its NULL
handling differs per argument on purpose: a retraction must recompute the very row it
retracts, NULLs included.
"""

from __future__ import annotations

try:
    import pyarrow as pa
    import pyarrow.compute as pc

    from tidemark.udf import udf

    @udf(result_type="STRING")
    def tag(name: pa.Array, v: pa.Array) -> pa.Array:
        """``name#v`` (``v`` NULL written ``null``); NULL when ``name`` is NULL."""
        shown = pc.cast(v, name.type).fill_null("null")  # STRING columns may arrive as large_string
        return pc.binary_join_element_wise(name, shown, pa.scalar("#", name.type))

except ImportError:  # the Flink oracle's PyFlink interpreter
    from pyflink.table import DataTypes
    from pyflink.table.udf import udf as flink_udf

    @flink_udf(result_type=DataTypes.STRING())
    def tag(name: str | None, v: int | None) -> str | None:
        """``name#v`` per row, as the Tidemark function computes it on columns."""
        return None if name is None else f"{name}#{'null' if v is None else v}"
