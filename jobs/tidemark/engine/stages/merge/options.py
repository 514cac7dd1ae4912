"""Read and validate a sink table's merge options (Paimon's names) once, at planning time.

Every mistake Paimon would only hit at runtime, or silently ignore, is a ``PlanError`` here
that names the option: a typo in a function name, a function that cannot take the
retractions this input carries, aggregation outside a sequence group, a field in two
groups, options that contradict each other, options meant for another engine. A pipeline
that plans never fails later for a configuration reason.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tidemark.engine.errors import PlanError
from tidemark.engine.stages.merge import aggregators
from tidemark.engine.stages.merge.aggregators import FieldAgg

ENGINES = ("deduplicate", "partial-update", "aggregation", "first-row")
PRODUCERS = ("none", "input", "lookup", "full-compaction")
FIELD_SUFFIXES = (
    "aggregate-function", "ignore-retract", "list-agg-delimiter", "distinct", "nested-key",
    "sequence-group",
)
IGNORE_DELETE_KEYS = (
    "ignore-delete", "partial-update.ignore-delete", "first-row.ignore-delete",
    "deduplicate.ignore-delete",
)
#: Merge options outside ``fields.*``, with the engines they apply to (None = all).
GENERAL_KEYS: dict[str, tuple[str, ...] | None] = {
    "merge-engine": None,
    "sequence.field": None,
    "sequence.field.sort-order": None,
    "changelog-producer": None,
    "changelog-producer.row-deduplicate": None,
    "changelog-producer.compaction-interval": None,
    "ignore-delete": None,
    "partial-update.ignore-delete": ("partial-update",),
    "first-row.ignore-delete": ("first-row",),
    "deduplicate.ignore-delete": ("deduplicate",),
    "partial-update.remove-record-on-delete": ("partial-update",),
    "partial-update.remove-record-on-sequence-group": ("partial-update",),
    "aggregation.remove-record-on-delete": ("aggregation",),
    "fields.default-aggregate-function": ("partial-update", "aggregation"),
}
#: Option prefixes that belong to merging: an unknown key under them is a typo.
MERGE_PREFIXES = ("fields.", "partial-update.", "aggregation.", "first-row.", "deduplicate.",
                  "sequence.", "changelog-producer.")
#: Types Paimon accepts for a sequence-group's sequence fields.
SEQUENCE_TYPES = aggregators.NUMERIC_TYPES | {"DATE", "TIME", "TIMESTAMP", "TIMESTAMP_LTZ"}

_DURATION = re.compile(r"^\s*(\d+)\s*([a-z]*)\s*$")
_UNITS_MS = {
    "": 1000, "s": 1000, "sec": 1000, "secs": 1000, "second": 1000, "seconds": 1000,
    "ms": 1, "milli": 1, "millis": 1, "millisecond": 1, "milliseconds": 1,
    "min": 60_000, "m": 60_000, "minute": 60_000, "minutes": 60_000,
    "h": 3_600_000, "hour": 3_600_000, "hours": 3_600_000,
    "d": 86_400_000, "day": 86_400_000, "days": 86_400_000,
}


@dataclass(frozen=True)
class SequenceGroup:
    """``fields.<seq>[,<seq>...].sequence-group = <member>,...``: the members only change
    when a record's sequence fields are not all null and not older than the row's."""

    option: str
    seq_fields: tuple[int, ...]
    members: tuple[int, ...]


@dataclass
class MergeConfig:
    table: str
    columns: tuple[str, ...]
    pk: tuple[int, ...]
    engine: str = "deduplicate"
    producer: str = "none"
    row_deduplicate: bool = False
    compaction_interval_ms: int = 0
    sequence_fields: tuple[int, ...] = ()
    sequence_ascending: bool = True
    ignore_delete: bool = False
    input_retracts: bool = False
    groups: tuple[SequenceGroup, ...] = ()
    remove_record_on_delete: bool = False
    remove_record_on_sequence_group: frozenset[int] = frozenset()
    aggregation_remove_record_on_delete: bool = False
    #: value field index -> aggregator (aggregation: every non-PK, non-sequence field;
    #: partial-update: only fields with a function)
    aggs: dict[int, FieldAgg] = field(default_factory=dict)

    @property
    def value_fields(self) -> tuple[int, ...]:
        return tuple(i for i in range(len(self.columns)) if i not in self.pk)

    def describe(self) -> dict[str, Any]:
        """What EXPLAIN shows about the sink's merge engine."""
        out: dict[str, Any] = {"merge_engine": self.engine, "changelog_producer": self.producer}
        if self.producer == "full-compaction":
            out["compaction_interval_ms"] = self.compaction_interval_ms
        if self.row_deduplicate:
            out["row_deduplicate"] = True
        if self.sequence_fields:
            out["sequence_field"] = [self.columns[i] for i in self.sequence_fields]
            out["sequence_order"] = "ascending" if self.sequence_ascending else "descending"
        if self.groups:
            out["sequence_groups"] = {
                ",".join(self.columns[i] for i in g.seq_fields): [self.columns[i] for i in g.members]
                for g in self.groups
            }
        if self.aggs:
            out["aggregate_functions"] = {self.columns[i]: a.name for i, a in sorted(self.aggs.items())}
        if self.ignore_delete:
            out["ignore_delete"] = True
        if self.remove_record_on_delete or self.aggregation_remove_record_on_delete:
            out["remove_record_on_delete"] = True
        if self.remove_record_on_sequence_group:
            out["remove_record_on_sequence_group"] = [
                self.columns[i] for i in sorted(self.remove_record_on_sequence_group)
            ]
        return out


def parse(
    table: str,
    columns: Sequence[str],
    pk: Sequence[int],
    options: Mapping[str, str],
    input_retracts: bool,
    types: Sequence[Any] | None = None,
) -> MergeConfig:
    columns = tuple(columns)
    pk = tuple(pk)
    if not pk:
        raise PlanError(f"table '{table}': a merge engine needs a PRIMARY KEY")
    type_names = _type_names(columns, types)
    sql_types = list(types) if types is not None else [None] * len(columns)
    opts = {k: str(v) for k, v in options.items()}
    index = {name: i for i, name in enumerate(columns)}

    engine = opts.get("merge-engine", "deduplicate").strip().lower()
    if engine not in ENGINES:
        raise PlanError(
            f"option 'merge-engine': unknown merge engine '{engine}' for table '{table}'; "
            f"supported: {', '.join(ENGINES)}"
        )
    producer = opts.get("changelog-producer", "none").strip().lower()
    if producer not in PRODUCERS:
        raise PlanError(
            f"option 'changelog-producer': unknown changelog producer '{producer}' for table "
            f"'{table}'; supported: {', '.join(PRODUCERS)}"
        )
    cfg = MergeConfig(table=table, columns=columns, pk=pk, engine=engine, producer=producer,
                      input_retracts=input_retracts)
    field_opts = _field_options(opts, index, table)
    _check_keys(opts, engine, table)

    cfg.row_deduplicate = _bool(opts, "changelog-producer.row-deduplicate")
    if "changelog-producer.row-deduplicate" in opts and producer not in ("lookup", "full-compaction"):
        raise PlanError(
            "option 'changelog-producer.row-deduplicate' only applies to changelog-producer "
            f"'lookup' or 'full-compaction' (table '{table}' uses '{producer}')"
        )
    if "changelog-producer.compaction-interval" in opts:
        if producer != "full-compaction":
            raise PlanError(
                "option 'changelog-producer.compaction-interval' only applies to "
                f"changelog-producer 'full-compaction' (table '{table}' uses '{producer}')"
            )
        cfg.compaction_interval_ms = _duration_ms(opts, "changelog-producer.compaction-interval")

    cfg.ignore_delete = _ignore_delete(opts)
    _parse_sequence_field(cfg, opts, index, field_opts)

    if engine == "first-row":
        _validate_first_row(cfg)
    elif engine == "deduplicate":
        pass
    elif engine == "aggregation":
        _parse_aggregation(cfg, opts, field_opts, type_names, sql_types)
    else:
        _parse_partial_update(cfg, opts, index, field_opts, type_names, sql_types)
    return cfg


# -- which sink options ask for the merge engine --------------------------------------------


def _squash(key: str) -> str:
    return re.sub(r"[^a-z0-9]", "", key.lower())


_SQUASHED_KEYS = {_squash(k): k for k in GENERAL_KEYS}
_SQUASHED_PREFIXES = {_squash(p): p for p in MERGE_PREFIXES}


def is_merge_option(key: str) -> bool:
    """Whether ``key`` is spelled as a merge option (known, or under a merge prefix such as
    ``fields.`` -- an unknown key there is a typo that ``parse`` reports)."""
    return key in GENERAL_KEYS or key.startswith(MERGE_PREFIXES)


def routing_options(table: str, options: Mapping[str, str]) -> list[str]:
    """The sink options that configure merging, ``merge-engine`` itself aside: any of them
    makes the planner host the sink with the merge engine stage, also for ``deduplicate``,
    because an ignored ``sequence.field`` or ``changelog-producer`` is a silently wrong sink.

    A key that looks like a merge option but is not spelled as one (``merge_engine``,
    ``Sequence.Field``, ``changelog.producer``, ``fields_v_aggregate-function``) is a
    PlanError naming it and the spelling meant: nothing else would read it, so it would be
    ignored without a word."""
    out = []
    for key in options:
        if is_merge_option(key):
            if key != "merge-engine":
                out.append(key)
            continue
        squashed = _squash(key)
        meant = _SQUASHED_KEYS.get(squashed)
        if meant is None:
            meant = next((p + "<...>" for s, p in _SQUASHED_PREFIXES.items()
                          if squashed.startswith(s) and len(squashed) > len(s)), None)
        if meant is not None:
            raise PlanError(
                f"table '{table}': option '{key}' looks like the merge option '{meant}' but is "
                "not spelled as one, so nothing would read it; use Paimon's spelling (see "
                "docs/merge-engines.md, \"All options\")"
            )
    return out


# -- sequence.field ----------------------------------------------------------------------


def _parse_sequence_field(cfg: MergeConfig, opts: dict, index: dict, field_opts: dict) -> None:
    raw = opts.get("sequence.field")
    order = opts.get("sequence.field.sort-order", "ascending").strip().lower()
    if order not in ("ascending", "descending"):
        raise PlanError(
            f"option 'sequence.field.sort-order' must be 'ascending' or 'descending', got '{order}'"
        )
    cfg.sequence_ascending = order == "ascending"
    if raw is None:
        if "sequence.field.sort-order" in opts:
            raise PlanError("option 'sequence.field.sort-order' needs 'sequence.field'")
        return
    names = [n.strip() for n in raw.split(",")]
    seen: list[int] = []
    for name in names:
        if name not in index:
            raise PlanError(
                f"option 'sequence.field': column '{name}' not found in table '{cfg.table}'"
            )
        if index[name] in seen:
            raise PlanError(f"option 'sequence.field': column '{name}' is listed twice")
        if "aggregate-function" in field_opts.get(index[name], {}):
            raise PlanError(
                f"option 'fields.{name}.aggregate-function': a sequence field cannot be "
                "aggregated (its value is the latest sequence)"
            )
        seen.append(index[name])
    if cfg.engine == "first-row":
        raise PlanError(
            "option 'sequence.field' cannot be used with merge-engine 'first-row': first-row "
            "keeps the first row to arrive and never reorders by sequence"
        )
    cfg.sequence_fields = tuple(seen)


# -- engines ------------------------------------------------------------------------------


def _validate_first_row(cfg: MergeConfig) -> None:
    if cfg.producer not in ("none", "lookup"):
        raise PlanError(
            f"option 'changelog-producer': merge-engine 'first-row' produces an insert-only "
            f"changelog and supports 'none' or 'lookup', not '{cfg.producer}'"
        )
    if cfg.input_retracts and not cfg.ignore_delete:
        raise PlanError(
            f"table '{cfg.table}': merge-engine 'first-row' cannot take the retractions "
            "(-U/-D) this input carries; set 'ignore-delete' = 'true' to drop them"
        )


def _parse_aggregation(cfg: MergeConfig, opts: dict, field_opts: dict, types: list,
                       sql_types: list) -> None:
    default = opts.get("fields.default-aggregate-function")
    cfg.aggregation_remove_record_on_delete = _bool(opts, "aggregation.remove-record-on-delete")
    if cfg.aggregation_remove_record_on_delete and cfg.ignore_delete:
        raise PlanError(
            "options 'ignore-delete' and 'aggregation.remove-record-on-delete' conflict: one "
            "drops deletes, the other removes the row on a delete"
        )
    retracts = cfg.input_retracts and not cfg.ignore_delete
    for i in cfg.value_fields:
        if i in cfg.sequence_fields:
            continue
        name = cfg.columns[i]
        fopts = field_opts.get(i, {})
        if "aggregate-function" in fopts:
            func, key = fopts["aggregate-function"].strip(), f"fields.{name}.aggregate-function"
        elif default is not None:
            func, key = default.strip(), "fields.default-aggregate-function"
        else:
            func, key = "last_non_null_value", f"fields.{name}.aggregate-function"
        ignore_retract = _bool(fopts, "ignore-retract", f"fields.{name}.ignore-retract")
        agg = aggregators.create(func, name, types[i], fopts, ignore_retract, key, sql_types[i])
        if retracts and not agg.retractable:
            raise PlanError(
                f"option '{key}': aggregate function '{func}' on column '{name}' cannot take "
                f"the retractions (-U/-D) this input carries; set "
                f"'fields.{name}.ignore-retract' = 'true' to ignore them, or use a function "
                f"that retracts ({', '.join(sorted(aggregators.RETRACTABLE))})"
            )
        cfg.aggs[i] = agg
    _check_field_options_used(cfg, field_opts)


def _parse_partial_update(cfg: MergeConfig, opts: dict, index: dict, field_opts: dict,
                          types: list, sql_types: list) -> None:
    groups: list[SequenceGroup] = []
    owner: dict[int, str] = {}
    for key in sorted(k for k in opts if k.startswith("fields.") and k.endswith(".sequence-group")):
        seq_names = key[len("fields."):-len(".sequence-group")].split(",")
        seq = tuple(_column(n.strip(), index, key, cfg.table) for n in seq_names)
        members = tuple(_column(n.strip(), index, key, cfg.table)
                        for n in opts[key].split(",") if n.strip())
        if not members:
            raise PlanError(f"option '{key}': the group lists no fields")
        for i in seq + members:
            if i in cfg.pk:
                raise PlanError(
                    f"option '{key}': primary key column '{cfg.columns[i]}' cannot be in a "
                    "sequence group"
                )
        for i in members:
            if i in seq:
                raise PlanError(
                    f"option '{key}': column '{cfg.columns[i]}' is the group's own sequence field"
                )
        for i in seq + members:
            if i in owner:
                raise PlanError(
                    f"option '{key}': field '{cfg.columns[i]}' is defined repeatedly by "
                    f"multiple groups (also in '{owner[i]}')"
                )
            owner[i] = key
        for i in seq:
            if types[i] is not None and types[i] not in SEQUENCE_TYPES:
                raise PlanError(
                    f"option '{key}': sequence field '{cfg.columns[i]}' has type {types[i]}; "
                    "a sequence group needs a numeric, date, time or timestamp field"
                )
        groups.append(SequenceGroup(key, seq, members))
    cfg.groups = tuple(groups)
    in_group = {i for g in groups for i in g.members}
    group_seq = {i: g for g in groups for i in g.seq_fields}

    default = opts.get("fields.default-aggregate-function")
    for i in cfg.value_fields:
        if i in group_seq:
            if "aggregate-function" in field_opts.get(i, {}):
                raise PlanError(
                    f"option 'fields.{cfg.columns[i]}.aggregate-function': a sequence field "
                    "cannot be aggregated"
                )
            continue
        name = cfg.columns[i]
        fopts = field_opts.get(i, {})
        if "aggregate-function" in fopts:
            func, key = fopts["aggregate-function"].strip(), f"fields.{name}.aggregate-function"
        elif default is not None:
            func, key = default.strip(), "fields.default-aggregate-function"
        else:
            continue
        ignore_retract = _bool(fopts, "ignore-retract", f"fields.{name}.ignore-retract")
        agg = aggregators.create(func, name, types[i], fopts, ignore_retract, key, sql_types[i])
        if i not in in_group and func != "last_non_null_value":
            raise PlanError(
                f"option '{key}': partial-update can only aggregate fields inside a sequence "
                f"group, and '{name}' is in none; add it to a 'fields.<seq>.sequence-group'"
            )
        if i in in_group and cfg.input_retracts and not cfg.ignore_delete and not agg.retractable:
            raise PlanError(
                f"option '{key}': aggregate function '{func}' on column '{name}' cannot take "
                f"the retractions (-U/-D) this input carries; set "
                f"'fields.{name}.ignore-retract' = 'true' or 'ignore-delete' = 'true'"
            )
        cfg.aggs[i] = agg

    cfg.remove_record_on_delete = _bool(opts, "partial-update.remove-record-on-delete")
    rosg = opts.get("partial-update.remove-record-on-sequence-group")
    if cfg.remove_record_on_delete and cfg.ignore_delete:
        raise PlanError(
            "options 'ignore-delete' and 'partial-update.remove-record-on-delete' conflict: one "
            "drops deletes, the other removes the row on a delete"
        )
    if cfg.remove_record_on_delete and groups:
        raise PlanError(
            "options 'partial-update.remove-record-on-delete' and 'fields.<seq>.sequence-group' "
            "conflict: with sequence groups a delete retracts its group's fields; use "
            "'partial-update.remove-record-on-sequence-group' to remove the row instead"
        )
    if rosg is not None:
        if cfg.ignore_delete:
            raise PlanError(
                "options 'ignore-delete' and 'partial-update.remove-record-on-sequence-group' "
                "conflict: one drops deletes, the other removes the row on a delete"
            )
        chosen = set()
        for name in (n.strip() for n in rosg.split(",") if n.strip()):
            i = index.get(name)
            if i is None or i not in group_seq:
                raise PlanError(
                    f"option 'partial-update.remove-record-on-sequence-group': field '{name}' "
                    "must be the sequence field of a sequence group"
                )
            chosen.add(i)
        cfg.remove_record_on_sequence_group = frozenset(chosen)
    if cfg.input_retracts and not (cfg.ignore_delete or cfg.remove_record_on_delete or groups):
        raise PlanError(
            f"table '{cfg.table}': merge-engine 'partial-update' cannot take the retractions "
            "(-U/-D) this input carries; set 'ignore-delete' = 'true', or "
            "'partial-update.remove-record-on-delete' = 'true', or sequence groups "
            "('fields.<seq>.sequence-group') to retract the group's fields"
        )
    _check_field_options_used(cfg, field_opts)


# -- helpers ------------------------------------------------------------------------------


def _field_options(opts: dict, index: dict, table: str) -> dict[int, dict[str, str]]:
    """``fields.<f>.<suffix>`` options grouped by field index (sequence groups aside)."""
    out: dict[int, dict[str, str]] = {}
    for key, value in opts.items():
        if not key.startswith("fields.") or key == "fields.default-aggregate-function":
            continue
        rest = key[len("fields."):]
        name, dot, suffix = rest.rpartition(".")
        if not dot or suffix not in FIELD_SUFFIXES:
            raise PlanError(
                f"option '{key}': unknown field option; supported: "
                + ", ".join(f"fields.<field>.{s}" for s in FIELD_SUFFIXES)
                + ", fields.default-aggregate-function"
            )
        if suffix == "sequence-group":
            continue
        out.setdefault(_column(name, index, key, table), {})[suffix] = value
    return out


def _check_keys(opts: dict, engine: str, table: str) -> None:
    for key in opts:
        if key.startswith("fields.") and key != "fields.default-aggregate-function":
            if key.endswith(".sequence-group") and engine != "partial-update":
                raise PlanError(f"option '{key}' only applies to merge-engine 'partial-update'")
            if key.endswith(".aggregate-function") and engine not in ("partial-update", "aggregation"):
                raise PlanError(
                    f"option '{key}' only applies to merge-engine 'aggregation' or "
                    f"'partial-update' (table '{table}' uses '{engine}')"
                )
            continue
        if key in GENERAL_KEYS:
            engines = GENERAL_KEYS[key]
            if engines is not None and engine not in engines:
                raise PlanError(
                    f"option '{key}' only applies to merge-engine {' or '.join(repr(e) for e in engines)} "
                    f"(table '{table}' uses '{engine}')"
                )
            continue
        if key.startswith(MERGE_PREFIXES):
            known = sorted(k for k in GENERAL_KEYS if k != "merge-engine")
            raise PlanError(f"option '{key}': unknown merge option; supported: {', '.join(known)}")


def _check_field_options_used(cfg: MergeConfig, field_opts: dict) -> None:
    """An option for a field that has no function using it is almost always a mistake."""
    for i, fopts in field_opts.items():
        name = cfg.columns[i]
        func = cfg.aggs[i].name if i in cfg.aggs else None
        needs = {"list-agg-delimiter": ("listagg",), "distinct": ("listagg", "collect"),
                 "nested-key": ("nested_update",), "ignore-retract": None}
        for suffix, funcs in needs.items():
            if suffix not in fopts:
                continue
            if i in cfg.pk:
                continue
            if func is None or (funcs is not None and func not in funcs):
                raise PlanError(
                    f"option 'fields.{name}.{suffix}' has no effect: column '{name}' "
                    + (f"uses '{func}'" if func else "has no aggregate function")
                )


def _column(name: str, index: dict, key: str, table: str) -> int:
    if name not in index:
        raise PlanError(f"option '{key}': column '{name}' not found in table '{table}'")
    return index[name]


def _bool(opts: Mapping[str, str], key: str, label: str | None = None) -> bool:
    raw = opts.get(key)
    if raw is None:
        return False
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise PlanError(f"option '{label or key}' must be 'true' or 'false', got {raw!r}")
    return value == "true"


def _ignore_delete(opts: dict) -> bool:
    values = {k: _bool(opts, k) for k in IGNORE_DELETE_KEYS if k in opts}
    if len(set(values.values())) > 1:
        raise PlanError(
            "options " + ", ".join(f"'{k}' = '{str(v).lower()}'" for k, v in values.items())
            + " contradict each other"
        )
    return any(values.values())


def _duration_ms(opts: dict, key: str) -> int:
    m = _DURATION.match(opts[key].strip().lower())
    if not m or m.group(2) not in _UNITS_MS:
        raise PlanError(
            f"option '{key}': cannot read duration {opts[key]!r}; use e.g. '0', '30 s', "
            "'500 ms', '5 min', '1 h'"
        )
    return int(m.group(1)) * _UNITS_MS[m.group(2)]


def _type_names(columns: tuple[str, ...], types: Sequence[Any] | None) -> list[str | None]:
    if types is None:
        return [None] * len(columns)
    if len(types) != len(columns):
        raise PlanError(f"{len(types)} column types given for {len(columns)} columns")
    out: list[str | None] = []
    for t in types:
        name = getattr(t, "name", t)
        out.append(str(name).upper() if name is not None else None)
    return out
