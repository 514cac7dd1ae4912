"""Cases of Paimon's ``FieldAggregatorTest`` and ``FieldAggregatorRetractNullTest``
(apache/paimon, paimon-core), ported to the aggregate functions of the seed.

Paimon's aggregators keep a per-merge ``initialized`` flag (first_value); here that flag is
the ``fresh`` argument: ``fresh=True`` is Paimon's state right after ``reset()``. Sketch,
bitmap and nested-sequence cases test functions outside the seed and are not ported.
"""

from __future__ import annotations

from decimal import Decimal
from functools import reduce

import pytest

from tidemark.engine.stages.merge.aggregators import MergeError, create


def make(func: str, type_name: str | None = None, **field_options: str):
    return create(func, "f", type_name, {k.replace("_", "-"): v for k, v in field_options.items()},
                  False, "fields.f.aggregate-function")


def fold(agg, values):
    acc, fresh = None, True
    for v in values:
        acc, fresh = agg.agg(acc, v, fresh), False
    return acc


def test_bool_and():
    agg = make("bool_and", "BOOLEAN")
    assert agg.agg(False, True, False) is False
    assert agg.agg(True, True, False) is True


def test_bool_or():
    agg = make("bool_or", "BOOLEAN")
    assert agg.agg(False, True, False) is True
    assert agg.agg(False, False, False) is False


def test_last_non_null_value():
    agg = make("last_non_null_value", "INT")
    assert agg.agg(None, 1, True) == 1
    assert agg.agg(1, None, False) == 1


def test_last_value():
    agg = make("last_value", "INT")
    assert agg.agg(None, 1, True) == 1
    assert agg.agg(1, None, False) is None


def test_first_value():
    agg = make("first_value", "INT")
    assert agg.agg(None, 1, True) == 1
    assert agg.agg(1, 2, False) == 1
    assert agg.agg(1, 3, True) == 3  # after reset


def test_first_non_null_value():
    agg = make("first_non_null_value", "INT")
    assert agg.agg(None, None, True) is None
    assert agg.agg(None, 1, True) == 1
    assert agg.agg(1, 2, False) == 1


def test_listagg_default_delimiter():
    assert make("listagg", "STRING").agg("user1", "user2", False) == "user1,user2"


@pytest.mark.parametrize("values,delimiter,expected", [
    (["user1", "user2", "user1", "user3"], ",", "user1,user2,user3"),
    (["", ""], ";", ""),
    (["user1", "user2", "user1,user3"], ",", "user1,user2,user3"),
    (["", "user2", "user1,user3"], ",", "user2,user1,user3"),
    (["k1=v1;k2=v2", "k1=v1;k3=v3", ""], ";", "k1=v1;k2=v2;k3=v3"),
    (["k1=v1 k2=v2", " k1=v1  k3=v3", " "], " ", "k1=v1 k2=v2 k3=v3"),
    (["k1=v1,k2=v2", "k1=v1,k2=v3", ""], ",", "k1=v1,k2=v2,k2=v3"),
])
def test_listagg_distinct(values, delimiter, expected):
    agg = make("listagg", "STRING", distinct="true", list_agg_delimiter=delimiter)
    assert reduce(lambda a, b: agg.agg(a, b, False), values) == expected


def test_listagg_custom_delimiter():
    assert make("listagg", "STRING", list_agg_delimiter="-").agg("user1", "user2", False) == "user1-user2"


def test_listagg_distinct_does_not_match_substrings():
    assert make("listagg", distinct="true").agg("abc,def,asd", "ab,xy", False) == "abc,def,asd,ab,xy"
    agg = make("listagg", distinct="true", list_agg_delimiter=";")
    assert agg.agg("abc;def;asd", "ab;xy;def", False) == "abc;def;asd;ab;xy"


def test_max_min():
    assert make("max", "INT").agg(1, 10, False) == 10
    assert make("min", "INT").agg(1, 10, False) == 1


@pytest.mark.parametrize("type_name,ten,five,one", [
    ("INT", 10, 5, 1), ("TINYINT", 10, 5, 1), ("SMALLINT", 10, 5, 1), ("BIGINT", 10, 5, 1),
    ("FLOAT", 10.0, 5.0, 1.0), ("DOUBLE", 10.0, 5.0, 1.0),
    ("DECIMAL", Decimal(10), Decimal(5), Decimal(1)),
])
def test_sum_and_product(type_name, ten, five, one):
    s = make("sum", type_name)
    assert s.agg(None, ten, True) == ten
    assert s.agg(one, ten, False) == ten + one
    assert s.retract(ten, five) == five
    assert s.retract(None, five) == -five
    p = make("product", type_name)
    assert p.agg(None, ten, True) == ten
    assert p.agg(one, ten, False) == ten
    assert p.retract(ten, five) == 2
    assert p.retract(None, five) is None


@pytest.mark.parametrize("func,type_name,acc,value", [
    ("product", "TINYINT", 64, 2), ("product", "TINYINT", -64, 4),
    ("product", "SMALLINT", 1000, 100), ("product", "SMALLINT", -(2**15), 2),
    ("product", "INT", 100_000, 100_000), ("product", "INT", -(2**31), -1),
    ("product", "BIGINT", 2**63 - 1, 2), ("product", "BIGINT", -(2**63), -1),
    ("sum", "TINYINT", 127, 1), ("sum", "TINYINT", -128, -1),
    ("sum", "SMALLINT", 2**15 - 1, 1), ("sum", "SMALLINT", -(2**15), -1),
    ("sum", "INT", 2**31 - 1, 1), ("sum", "INT", -(2**31), -1),
    ("sum", "BIGINT", 2**63 - 1, 1), ("sum", "BIGINT", -(2**63), -1),
])
def test_overflow(func, type_name, acc, value):
    with pytest.raises(MergeError, match="overflow"):
        make(func, type_name).agg(acc, value, False)


@pytest.mark.parametrize("func,type_name,acc,value", [
    ("product", "TINYINT", -128, -1), ("product", "SMALLINT", -(2**15), -1),
    ("product", "INT", -(2**31), -1), ("product", "BIGINT", -(2**63), -1),
    ("sum", "TINYINT", -128, 1), ("sum", "TINYINT", 127, -1), ("sum", "TINYINT", None, -128),
    ("sum", "SMALLINT", -(2**15), 1), ("sum", "SMALLINT", None, -(2**15)),
    ("sum", "INT", -(2**31), 1), ("sum", "INT", 2**31 - 1, -1), ("sum", "INT", None, -(2**31)),
    ("sum", "BIGINT", -(2**63), 1), ("sum", "BIGINT", None, -(2**63)),
])
def test_retract_overflow(func, type_name, acc, value):
    with pytest.raises(MergeError, match="overflow"):
        make(func, type_name).retract(acc, value)


def row(k0, k1, v, seq=None):
    out = {"k0": k0, "k1": k1, "v": v}
    if seq is not None:
        out["seq"] = seq
    return out


def test_nested_update():
    agg = make("nested_update", nested_key="k0,k1")
    acc = agg.agg(None, [row(0, 0, "A")], True)
    assert acc == (row(0, 0, "A"),)  # ARRAY values come back as tuples (hashable rows)
    acc = agg.agg(acc, [row(0, 1, "B")], False)
    assert acc == (row(0, 0, "A"), row(0, 1, "B"))
    acc = agg.agg(acc, [row(0, 1, "b")], False)
    assert sorted(acc, key=repr) == sorted([row(0, 0, "A"), row(0, 1, "b")], key=repr)
    acc = agg.retract(acc, [row(0, 1, "b")])
    assert acc == (row(0, 0, "A"),)


def test_nested_append():
    agg = make("nested_update")
    acc = agg.agg(None, [row(0, 1, "B")], True)
    acc = agg.agg(acc, [row(0, 1, "b")], False)
    assert acc == (row(0, 1, "B"), row(0, 1, "b"))
    assert agg.retract(acc, [row(0, 1, "b")]) == (row(0, 1, "B"),)


def test_nested_update_null_key_parts_merge_by_default():
    agg = make("nested_update", nested_key="k0,k1")
    acc = fold(agg, [[row(0, 0, "A")], [row(0, 1, "B")], [row(0, None, "C")], [row(None, None, "D")]])
    assert acc == (row(0, 0, "A"), row(0, 1, "B"), row(0, None, "C"), row(None, None, "D"))


def test_collect_distinct():
    agg = make("collect", distinct="true")
    assert agg.agg(None, None, True) is None
    assert sorted(agg.agg(None, [1, 1, 2], True)) == [1, 2]
    assert sorted(agg.agg([1, 1, 2], [2, 3], False)) == [1, 2, 3]


def test_collect_distinct_rows_arrays_maps():
    agg = make("collect", distinct="true")
    rows = agg.agg([(1, "A"), (1, "B")], [(1, "A"), (2, "A")], False)
    assert sorted(rows) == [(1, "A"), (1, "B"), (2, "A")]
    arrays = agg.agg([[1, 1], [1, 2]], [[1, 1], [1, 2], [2, 1]], False)
    assert sorted(arrays) == [[1, 1], [1, 2], [2, 1]]
    maps = agg.agg([{1: "A"}, {1: "A", 2: "B"}], [{1: "A"}, {2: "B", 1: "A"}, {1: "C"}], False)
    assert len(maps) == 3 and {1: "C"} in maps


def test_collect_without_distinct():
    agg = make("collect", distinct="false")
    assert agg.agg(None, None, True) is None
    assert sorted(agg.agg(None, [1, 1, 2], True)) == [1, 1, 2]
    assert sorted(agg.agg([1, 1, 2], [2, 3], False)) == [1, 1, 2, 2, 3]


def test_collect_retract():
    agg = make("collect", distinct="true")
    assert sorted(agg.retract([1, 2, 3], [1])) == [2, 3]
    assert agg.retract([(1, "A"), (1, "B"), (2, "B")], [(1, "A"), (2, "B")]) == ((1, "B"),)
    assert agg.retract([[1, 1], [1, 2], [2, 1]], [[1, 1], [1, 2]]) == ([2, 1],)
    assert agg.retract([{1: "A"}, {2: "B", 1: "A"}, {1: "C"}], [{1: "A"}, {1: "A", 2: "B"}]) == ({1: "C"},)
    # one occurrence per retracted element
    assert sorted(agg.retract([1, 1, 2, 2, 3], [1, 2, 3])) == [1, 2]


def test_merge_map():
    agg = make("merge_map")
    assert agg.agg(None, None, True) is None
    acc = agg.agg(None, {1: "A"}, True)
    assert acc == ((1, "A"),)  # MAP values come back as key-sorted (key, value) pairs
    acc = agg.agg(acc, {2: "B", 1: "A"}, False)
    assert acc == ((1, "A"), (2, "B"))
    acc = agg.agg(acc, {3: "c", 1: "a"}, False)
    assert acc == ((1, "a"), (2, "B"), (3, "c"))
    assert hash(acc) == hash(agg.agg({1: "a", 2: "B"}, ((3, "c"),), False))


def test_merge_map_retract():
    assert make("merge_map").retract({1: "A", 2: "B", 3: "C"}, {1: "A", 2: "A"}) == ((3, "C"),)
    assert make("merge_map").retract(((1, "A"), (3, "C")), ((3, "x"),)) == ((1, "A"),)


# -- FieldAggregatorRetractNullTest --------------------------------------------------------


@pytest.mark.parametrize("func,type_name,a,b", [
    ("first_value", "INT", 1, 1), ("first_non_null_value", "INT", 1, 1), ("min", "INT", 1, 1),
    ("max", "INT", 1, 1), ("listagg", "STRING", "a", "a"), ("bool_and", "BOOLEAN", True, True),
    ("bool_or", "BOOLEAN", True, True),
])
def test_no_retraction(func, type_name, a, b):
    with pytest.raises(MergeError, match=f"aggregate function '{func}' does not support retraction"):
        make(func, type_name).retract(a, b)


@pytest.mark.parametrize("func,a,b", [
    ("sum", 1, 1), ("product", 1, 1), ("nested_update", [], []), ("collect", [], []),
    ("merge_map", {}, {}),
])
def test_retraction_of_non_null_is_not_null(func, a, b):
    assert make(func, "INT" if func in ("sum", "product") else None).retract(a, b) is not None


@pytest.mark.parametrize("func", ["last_value", "last_non_null_value"])
def test_last_value_retraction_sets_null(func):
    assert make(func, "INT").retract(1, 1) is None


def test_ignore_retract_keeps_accumulator():
    agg = create("max", "f", "INT", {}, True, "fields.f.aggregate-function")
    assert agg.retract(7, 3) == 7
    assert agg.agg(7, 9, False) == 9


# -- count (not in pypaimon; Tidemark counts non-null values) ------------------------------


def test_count_counts_non_null_values_and_retracts():
    agg = make("count", "BIGINT")
    assert fold(agg, [5, None, 7, 9]) == 3
    assert agg.retract(3, 4) == 2
    assert agg.retract(3, None) == 3
    assert agg.agg(None, None, True) is None
    assert agg.absorb(2, 5, False) == 7  # a merged count re-entering a fold adds up
