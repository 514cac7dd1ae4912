"""``pylist`` takes numpy's path for some column types: it must give what ``to_pylist`` gives."""

from __future__ import annotations

import pyarrow as pa
import pytest

from tidemark.engine.arrow_types import pylist

COLUMNS = [
    pa.array([1, 2, 3], pa.int64()),
    pa.array([1, None, 3], pa.int64()),  # NULLs: to_pylist's own path (numpy would give floats)
    pa.array([0.5, float("inf")], pa.float64()),
    pa.array([True, False]),
    pa.array(["a", None, "", "é"], pa.string()),
    pa.array(["a", None], pa.large_string()),
    pa.array([b'{"id":1}', None, b""], pa.binary()),
    pa.array([b"x", None], pa.large_binary()),
    pa.array([b"ab", None], pa.binary(2)),
    pa.chunked_array([pa.array([b"a"]), pa.array([None, b"b"], pa.binary())]),
]


@pytest.mark.parametrize("column", COLUMNS, ids=lambda c: str(c.type))
def test_pylist_is_to_pylist(column):
    got = pylist(column)
    assert got == column.to_pylist()
    assert [type(v) for v in got] == [type(v) for v in column.to_pylist()]
