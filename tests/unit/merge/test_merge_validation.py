"""Every invalid configuration is a PlanError at build time that names the option."""

from __future__ import annotations

import pytest

from tidemark.engine.errors import PlanError
from tidemark.engine.stages.merge_engine import build_merge_engine

COLS = ["k", "a", "b", "s"]


def build(options, input_retracts=False, types=None, columns=COLS):
    return build_merge_engine("t", columns, (0,), options, input_retracts, types=types)


@pytest.mark.parametrize("options,retracts,match", [
    ({"merge-engine": "upsert"}, False, "'merge-engine': unknown merge engine 'upsert'"),
    ({"changelog-producer": "magic"}, False, "'changelog-producer': unknown changelog producer"),
    ({"merge-engine": "aggregation", "fields.a.aggregate-function": "summ"}, False,
     "'fields.a.aggregate-function': unknown aggregate function 'summ'"),
    ({"merge-engine": "aggregation", "fields.default-aggregate-function": "avg"}, False,
     "'fields.default-aggregate-function': unknown aggregate function 'avg'"),
    ({"merge-engine": "aggregation", "fields.a.aggregate-function": "max"}, True,
     "'fields.a.aggregate-function': aggregate function 'max' on column 'a' cannot take"),
    ({"merge-engine": "aggregation"}, False, None),
    ({"merge-engine": "aggregation", "fields.default-aggregate-function": "first_value"}, True,
     "'fields.default-aggregate-function'"),
    ({"merge-engine": "partial-update", "fields.a.aggregate-function": "sum"}, False,
     "'fields.a.aggregate-function': partial-update can only aggregate fields inside a sequence group"),
    ({"merge-engine": "partial-update", "fields.default-aggregate-function": "sum"}, False,
     "'fields.default-aggregate-function': partial-update can only aggregate"),
    ({"merge-engine": "partial-update", "fields.s.sequence-group": "a",
      "fields.b.sequence-group": "a"}, False, "field 'a' is defined repeatedly by multiple groups"),
    ({"merge-engine": "partial-update", "fields.s.sequence-group": "a,zz"}, False,
     "'fields.s.sequence-group': column 'zz' not found"),
    ({"merge-engine": "partial-update", "fields.s.sequence-group": "k"}, False, "primary key column"),
    ({"merge-engine": "partial-update", "fields.s.sequence-group": "a",
      "fields.a.aggregate-function": "max"}, True, "'fields.a.aggregate-function': aggregate function 'max'"),
    ({"merge-engine": "partial-update"}, True,
     "partial-update' cannot take the retractions.*'ignore-delete'"),
    ({"merge-engine": "partial-update", "ignore-delete": "true",
      "partial-update.remove-record-on-delete": "true"}, False,
     "'ignore-delete' and 'partial-update.remove-record-on-delete' conflict"),
    ({"merge-engine": "partial-update", "fields.s.sequence-group": "a",
      "partial-update.remove-record-on-delete": "true"}, False,
     "'partial-update.remove-record-on-delete' and 'fields.<seq>.sequence-group' conflict"),
    ({"merge-engine": "partial-update", "fields.s.sequence-group": "a", "ignore-delete": "true",
      "partial-update.remove-record-on-sequence-group": "s"}, False,
     "'ignore-delete' and 'partial-update.remove-record-on-sequence-group' conflict"),
    ({"merge-engine": "partial-update", "fields.s.sequence-group": "a",
      "partial-update.remove-record-on-sequence-group": "a"}, False,
     "field 'a' must be the sequence field of a sequence group"),
    ({"merge-engine": "aggregation", "ignore-delete": "true",
      "aggregation.remove-record-on-delete": "true"}, False,
     "'ignore-delete' and 'aggregation.remove-record-on-delete' conflict"),
    ({"ignore-delete": "true", "deduplicate.ignore-delete": "false"}, False, "contradict"),
    ({"merge-engine": "first-row", "sequence.field": "s"}, False,
     "'sequence.field' cannot be used with merge-engine 'first-row'"),
    ({"merge-engine": "first-row"}, True, "first-row' cannot take the retractions.*ignore-delete"),
    ({"merge-engine": "first-row", "changelog-producer": "input"}, False, "insert-only"),
    ({"sequence.field": "nope"}, False, "'sequence.field': column 'nope' not found"),
    ({"sequence.field": "s,s"}, False, "listed twice"),
    ({"sequence.field": "s", "sequence.field.sort-order": "up"}, False, "'sequence.field.sort-order'"),
    ({"merge-engine": "aggregation", "sequence.field": "s", "fields.s.aggregate-function": "max"},
     False, "'fields.s.aggregate-function': a sequence field cannot be aggregated"),
    ({"fields.a.aggregate-function": "sum"}, False,
     "'fields.a.aggregate-function' only applies to merge-engine 'aggregation' or 'partial-update'"),
    ({"fields.s.sequence-group": "a"}, False, "only applies to merge-engine 'partial-update'"),
    ({"aggregation.remove-record-on-delete": "true"}, False, "only applies to merge-engine 'aggregation'"),
    ({"merge-engine": "aggregation", "fields.a.agregate-function": "sum"}, False,
     "'fields.a.agregate-function': unknown field option"),
    ({"partial-update.ignore-deletes": "true"}, False, "unknown merge option"),
    ({"changelog-producer.row-deduplicate": "true"}, False, "only applies to changelog-producer 'lookup'"),
    ({"changelog-producer": "full-compaction", "changelog-producer.compaction-interval": "soon"},
     False, "cannot read duration"),
    ({"merge-engine": "aggregation", "fields.a.aggregate-function": "sum",
      "fields.a.ignore-retract": "yes"}, False, "'fields.a.ignore-retract' must be 'true' or 'false'"),
    ({"merge-engine": "aggregation", "fields.a.list-agg-delimiter": ";"}, False,
     "'fields.a.list-agg-delimiter' has no effect"),
])
def test_invalid_options(options, retracts, match):
    if match is None:
        build(options, retracts)
        return
    with pytest.raises(PlanError, match=match):
        build(options, retracts)


def test_ignore_delete_lets_non_retractable_functions_take_a_retracting_input():
    build({"merge-engine": "aggregation", "fields.a.aggregate-function": "max", "ignore-delete": "true"},
          input_retracts=True)
    build({"merge-engine": "first-row", "first-row.ignore-delete": "true"}, input_retracts=True)
    build({"merge-engine": "partial-update", "partial-update.ignore-delete": "true"}, input_retracts=True)


def test_type_checks_when_types_are_known():
    with pytest.raises(PlanError, match="'sum' does not support column 'a' of type STRING"):
        build({"merge-engine": "aggregation", "fields.a.aggregate-function": "sum"},
              types=["BIGINT", "STRING", "INT", "INT"])
    with pytest.raises(PlanError, match="sequence field 's' has type BOOLEAN"):
        build({"merge-engine": "partial-update", "fields.s.sequence-group": "a"},
              types=["BIGINT", "STRING", "INT", "BOOLEAN"])


def test_no_primary_key():
    with pytest.raises(PlanError, match="needs a PRIMARY KEY"):
        build_merge_engine("t", COLS, (), {}, False)


def test_other_table_options_are_left_alone():
    stage = build({"topic": "t", "format": "upsert-json", "merge-engine": "aggregation",
                   "fields.a.aggregate-function": "sum", "index.by_a.columns": "a"})
    assert stage.describe() == {"merge_engine": "aggregation", "changelog_producer": "none",
                                "aggregate_functions": {"a": "sum", "b": "last_non_null_value",
                                                        "s": "last_non_null_value"}}
