"""q14's ``count_char`` as Tidemark calls it: Nexmark's CountChar on whole columns."""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nexmark_udfs  # noqa: E402  (sibling module, not a package)


def test_counts_the_first_character_and_gives_zero_for_null():
    got = nexmark_udfs.count_char(pa.array(["cc", None, "abc", ""]), pa.array(["cx"] * 4))
    assert got.to_pylist() == [2, 0, 1, 0]
    assert got.type == pa.int64()
