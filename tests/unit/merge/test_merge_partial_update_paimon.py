"""Cases of Paimon's ``PartialUpdateMergeFunctionTest`` (apache/paimon, paimon-core), ported.

Paimon's test adds one KeyValue after another (increasing sequence numbers) to one merge
function and validates the merged value after some of them. Here each ``add`` is one batch
with one record at an increasing source position, so every step also goes through state
(the merged row re-enters the next fold) -- which is how Paimon re-merges compacted files.
Where Paimon's value is all nulls after a whole-row delete, the key is gone here (Paimon's
result kind is DELETE). The projection-pushdown cases test Paimon's reader and have no
counterpart; their merge assertions on whole rows are ported.
"""

from __future__ import annotations

import pytest

from merge_harness import Feeder, harness
from tidemark.engine.errors import PlanError


def fields(n: int) -> str:
    return ",".join(f"f{i}" for i in range(n))


def pu(n: int, **options: str):
    opts = {"merge-engine": "partial-update"}
    opts.update({k.replace("__", "."): v for k, v in options.items()})
    h = harness(fields(n), opts)
    return h, Feeder(h)


def pu_opts(n: int, options: dict[str, str]):
    h = harness(fields(n), {"merge-engine": "partial-update", **options})
    return h, Feeder(h)


def test_update_non_null():
    h, f = pu_opts(7, {})
    f.add(1, 1, 1, 1, 1, 1, 1)
    f.add(1, 2, 2, 2, 2, 2, None)
    assert h.row(1) == (1, 2, 2, 2, 2, 2, 1)


GROUPS = {"fields.f3.sequence-group": "f1,f2", "fields.f6.sequence-group": "f4,f5"}


def test_sequence_group():
    h, f = pu_opts(7, GROUPS)
    f.add(1, 1, 1, 1, 1, 1, 1)
    f.add(1, 2, 2, 2, 2, 2, None)
    assert h.row(1) == (1, 2, 2, 2, 1, 1, 1)
    f.add(1, 3, 3, 1, 3, 3, 3)
    assert h.row(1) == (1, 2, 2, 2, 3, 3, 3)
    # delete
    f.add(1, 1, 1, 3, 1, 1, None, kind="-D")
    assert h.row(1) == (1, None, None, 3, 3, 3, 3)
    f.add(1, 1, 1, 3, 1, 1, 4, kind="-D")
    assert h.row(1) == (1, None, None, 3, None, None, 4)
    f.add(1, 4, 4, 4, 5, 5, 5)
    assert h.row(1) == (1, 4, 4, 4, 5, 5, 5)
    f.add(1, 1, 1, 6, 1, 1, 6, kind="-D")
    assert h.row(1) == (1, None, None, 6, None, None, 6)


def test_sequence_group_partial_delete():
    h, f = pu_opts(7, {**GROUPS, "partial-update.remove-record-on-sequence-group": "f6"})
    f.add(1, 1, 1, 1, 1, 1, 1)
    f.add(1, 2, 2, 2, 2, 2, None)
    assert h.row(1) == (1, 2, 2, 2, 1, 1, 1)
    f.add(1, 3, 3, 1, 3, 3, 3)
    assert h.row(1) == (1, 2, 2, 2, 3, 3, 3)
    f.add(1, 1, 1, 3, 1, 1, None, kind="-D")
    assert h.row(1) == (1, None, None, 3, 3, 3, 3)
    f.add(1, 1, 1, 3, 1, 1, 4, kind="-D")  # f6's group is newer: the whole row goes
    assert h.row(1) is None
    f.add(1, 4, 4, 4, 5, 5, 5)
    assert h.row(1) == (1, 4, 4, 4, 5, 5, 5)
    f.add(1, 1, 1, 6, 1, 1, 6, kind="-D")
    assert h.row(1) is None


MULTI = {"fields.f3,f4.sequence-group": "f1,f2", "fields.f7,f8.sequence-group": "f5,f6"}


def test_multi_sequence_fields_null_sequence():
    h, f = pu_opts(9, MULTI)
    f.add(1, None, None, None, None, 1, 1, 1, 3)
    f.add(1, 2, 2, None, None, 2, 2, 1, 3)
    assert h.row(1) == (1, None, None, None, None, 2, 2, 1, 3)


def test_multi_sequence_fields():
    h, f = pu_opts(9, MULTI)
    f.add(1, 1, 1, 1, 1, 1, 1, 1, 3)
    f.add(1, 2, 2, 2, 2, 2, 1, 1, None)
    assert h.row(1) == (1, 2, 2, 2, 2, 1, 1, 1, 3)
    f.add(1, 1, 3, 1, 3, 3, 3, 3, 2)
    assert h.row(1) == (1, 2, 2, 2, 2, 3, 3, 3, 2)
    f.add(1, 1, 1, 3, 3, 1, 1, None, None, kind="-D")
    assert h.row(1) == (1, None, None, 3, 3, 3, 3, 3, 2)
    f.add(1, 1, 1, 3, 1, 1, 1, 4, 4, kind="-D")
    assert h.row(1) == (1, None, None, 3, 3, None, None, 4, 4)
    f.add(1, 4, 4, 4, 4, 5, 5, 5, 5)
    assert h.row(1) == (1, 4, 4, 4, 4, 5, 5, 5, 5)
    f.add(1, 1, 1, 6, 1, 1, 1, 6, 1, kind="-D")
    assert h.row(1) == (1, None, None, 6, 1, None, None, 6, 1)


def test_sequence_group_default_agg_func():
    h, f = pu_opts(7, {**GROUPS, "fields.default-aggregate-function": "last_non_null_value"})
    f.add(1, 1, 1, 1, 1, 1, 1)
    f.add(1, 2, 2, 2, 2, 2, None)
    assert h.row(1) == (1, 2, 2, 2, 1, 1, 1)
    f.add(1, 3, 3, 1, 3, 3, 3)
    assert h.row(1) == (1, 2, 2, 2, 3, 3, 3)
    f.add(1, 4, None, 4, 5, None, 5)
    assert h.row(1) == (1, 4, 2, 4, 5, 3, 5)


def test_multi_sequence_fields_default_agg_func():
    h, f = pu_opts(9, {**MULTI, "fields.default-aggregate-function": "last_non_null_value"})
    f.add(1, 1, 1, 1, 1, 1, 1, 1, 1)
    f.add(1, 2, 2, 2, 2, 2, 2, None, None)
    assert h.row(1) == (1, 2, 2, 2, 2, 1, 1, 1, 1)
    f.add(1, 3, 3, 1, 1, 3, 3, 3, 3)
    assert h.row(1) == (1, 2, 2, 2, 2, 3, 3, 3, 3)
    f.add(1, 4, None, 4, 4, 5, None, 5, 5)
    assert h.row(1) == (1, 4, 2, 4, 4, 5, 3, 5, 5)


@pytest.mark.parametrize("n,options", [
    (7, {"fields.f3.sequence-group": "f1,f2,f7", "fields.f6.sequence-group": "f4,f5"}),
    (7, {"fields.f2,f3.sequence-group": "f1,f7", "fields.f5,f6.sequence-group": "f4"}),
])
def test_sequence_group_defined_no_field(n, options):
    with pytest.raises(PlanError, match="column 'f7' not found"):
        pu_opts(n, options)


@pytest.mark.parametrize("n,options", [
    (5, {"fields.f3.sequence-group": "f1,f2", "fields.f4.sequence-group": "f1,f2"}),
    (7, {"fields.f3,f4.sequence-group": "f1,f2", "fields.f5,f6.sequence-group": "f1,f2"}),
])
def test_sequence_group_repeat_define(n, options):
    with pytest.raises(PlanError, match="defined repeatedly by multiple groups"):
        pu_opts(n, options)


def test_all_fields_project_field_outside_group_not_updated_by_null():
    """testAdjustProjectionAllFieldsProject / NonProject, whole-row part."""
    h, f = pu_opts(8, {"fields.f4.sequence-group": "f1,f3", "fields.f5.sequence-group": "f7"})
    f.add(1, 1, 1, 1, 1, 1, 1, 1)
    f.add(1, 2, 4, 2, 2, 0, None, 3)
    assert h.row(1) == (1, 2, 4, 2, 2, 1, 1, 1)


def test_multi_sequence_fields_all_fields_project():
    h, f = pu_opts(8, {"fields.f2,f4.sequence-group": "f1,f3", "fields.f5,f6.sequence-group": "f7"})
    f.add(1, 1, 1, 1, 1, 1, 1, 1)
    f.add(1, 2, 4, 2, 2, 0, None, 3)
    assert h.row(1) == (1, 2, 4, 2, 2, 1, 1, 1)


def test_sequence_field_null_keeps_group():
    """testAdjustProjectionSequenceFieldsProject: a null sequence leaves its group alone."""
    h, f = pu_opts(8, {"fields.f4.sequence-group": "f1,f3", "fields.f5.sequence-group": "f7"})
    f.add(1, 1, None, 1, 1, 1, None, 1)
    f.add(1, None, None, 2, None, 2, None, 2)  # f4 null: f1, f3 stay; f5 advances: f7 updates
    assert h.row(1) == (1, 1, None, 1, 1, 2, None, 2)


def test_first_value():
    h, f = pu_opts(4, {"fields.f1.sequence-group": "f2,f3",
                       "fields.f2.aggregate-function": "first_value",
                       "fields.f3.aggregate-function": "last_value"})
    f.add(1, 1, 1, 1)
    f.add(1, 2, 2, 2)
    assert h.row(1) == (1, 2, 1, 2)
    f.add(1, 0, 3, 3)
    assert h.row(1) == (1, 2, 3, 2)


def test_multi_sequence_fields_first_value():
    h, f = pu_opts(5, {"fields.f1,f2.sequence-group": "f3,f4",
                       "fields.f3.aggregate-function": "first_value",
                       "fields.f4.aggregate-function": "last_value"})
    f.add(1, 1, 1, 1, 1)
    f.add(1, 2, 2, 2, 2)
    assert h.row(1) == (1, 2, 2, 1, 2)
    f.add(1, 0, 1, 3, 3)
    assert h.row(1) == (1, 2, 2, 3, 2)


def test_partial_update_with_aggregation():
    h, f = pu_opts(8, {
        "fields.f1.sequence-group": "f2,f3,f4",
        "fields.f7.sequence-group": "f6",
        "fields.f0.aggregate-function": "listagg",  # a primary key: ignored, as in Paimon
        "fields.f2.aggregate-function": "sum",
        "fields.f4.aggregate-function": "last_value",
        "fields.f6.aggregate-function": "last_non_null_value",
        "fields.f4.ignore-retract": "true",
        "fields.f6.ignore-retract": "true",
    })
    f.add(1, 1, 1, 1, 1, 1, 1, 1)
    f.add(1, 2, 1, 2, 2, 2, 2, 0)
    assert h.row(1) == (1, 2, 2, 2, 2, 2, 1, 1)
    # g_1, g_2 not advanced
    f.add(1, 1, 1, 1, 1, 1, 2, 0)
    assert h.row(1) == (1, 2, 3, 2, 2, 1, 1, 1)
    f.add(1, 1, -1, 1, 1, 2, 2, 0)
    # null
    f.add(1, 3, None, None, None, None, None, 2)
    assert h.row(1) == (1, 3, 2, None, None, 2, 1, 2)
    # retract
    f.add(1, 3, 1, 1, 1, 1, 1, 3)
    assert h.row(1) == (1, 3, 3, 1, 1, 1, 1, 3)
    f.add(1, 3, 2, 1, 1, 1, 1, 3, kind="-U")
    assert h.row(1) == (1, 3, 1, None, 1, 1, 1, 3)
    f.add(1, 3, 2, 1, 1, 1, 1, 3, kind="-D")
    assert h.row(1) == (1, 3, -1, None, 1, 1, 1, 3)
    # retract for an old sequence
    f.add(1, 2, 2, 1, 1, 1, 1, 3, kind="-D")
    assert h.row(1) == (1, 3, -3, None, 1, 1, 1, 3)


def test_multi_sequence_fields_partial_update_with_aggregation():
    h, f = pu_opts(9, {
        "fields.f1,f2.sequence-group": "f3,f4,f5",
        "fields.f7,f8.sequence-group": "f6",
        "fields.f0.aggregate-function": "listagg",
        "fields.f3.aggregate-function": "sum",
        "fields.f4.aggregate-function": "first_value",
        "fields.f5.aggregate-function": "last_value",
        "fields.f6.aggregate-function": "last_non_null_value",
        "fields.f4.ignore-retract": "true",
        "fields.f6.ignore-retract": "true",
    })
    # null retract
    f.add(1, None, None, 1, 1, 1, 1, 1, 1)
    assert h.row(1) == (1, None, None, None, None, None, 1, 1, 1)
    f.add(1, None, None, 1, 1, 1, 0, 1, 1, kind="-D")
    assert h.row(1) == (1, None, None, None, None, None, 1, 1, 1)
    f.add(1, 1, 1, 1, 1, 1, 1, 1, 1)
    f.add(1, 1, 2, 1, 2, 2, None, 2, 0)
    assert h.row(1) == (1, 1, 2, 2, 1, 2, 1, 2, 0)
    # sequence group not advanced
    f.add(1, 1, 1, 1, 3, 1, 1, 2, 0)
    assert h.row(1) == (1, 1, 2, 3, 3, 2, 1, 2, 0)
    # null
    f.add(1, 1, 3, None, None, None, None, 4, 2)
    assert h.row(1) == (1, 1, 3, 3, 3, None, 1, 4, 2)
    # retract
    f.add(1, 2, 3, 1, 1, 1, 1, 4, 3)
    assert h.row(1) == (1, 2, 3, 4, 3, 1, 1, 4, 3)
    f.add(1, 2, 3, 2, 1, 2, 1, 4, 3, kind="-U")
    assert h.row(1) == (1, 2, 3, 2, 3, None, 1, 4, 3)
    f.add(1, 3, 2, 3, 1, 1, 1, 4, 3, kind="-D")
    assert h.row(1) == (1, 3, 2, -1, 3, None, 1, 4, 3)
    # retract for an old sequence
    f.add(1, 2, 2, 2, 1, 1, 1, 1, 3, kind="-D")
    assert h.row(1) == (1, 3, 2, -3, 3, None, 1, 4, 3)


def test_aggregation_without_sequence_group():
    with pytest.raises(PlanError, match="fields.f1.aggregate-function.*inside a sequence group"):
        pu_opts(2, {"fields.f1.aggregate-function": "listagg"})
