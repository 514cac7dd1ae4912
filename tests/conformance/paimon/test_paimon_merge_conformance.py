"""Conformance with Paimon: the same random record sequences through pypaimon 2.1 and through
Tidemark's merge engine stage must give the same merged table.

Per case and seed: a few keys, several micro-batches of random records (nulls, blanks,
duplicate and out-of-order sequence values, retractions where the engine takes them).
Tidemark gets each batch shuffled (a batch is a set); Paimon gets it as one commit in
source-position order. The generator never puts a ``+X`` and a ``-X`` of the identical row
in one batch: Tidemark cancels such pairs (docs/merge-engines.md) where Paimon applies both.

Every case the planner hosts with a merge engine also runs through SQL (``compile_sql`` +
``ReplayHost``), ARRAY/MAP/ROW columns included.

What pypaimon 2.1 refuses -- sequence groups, ``ignore-delete`` on partial-update,
retraction in the aggregation engine, ``count`` -- is covered by the ported Java tests in
tests/unit/merge. pypaimon's ``merge_map`` cannot merge two records of one key inside a
single commit (its write buffer hands maps over as tuples it does not read), so that case
commits record by record.

Fast slice by default (a few seeds per case); ``TIDEMARK_CONFORMANCE=full`` runs many seeds.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal

import pyarrow as pa
import pytest

from paimon_oracle import PaimonTable, normalize_table
from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import ADDS, Change
from tidemark.engine.driver import Bucket, PerKeyAdapter
from tidemark.engine.kernels import merge as merge_kernel
from tidemark.engine.stage import BatchContext
from tidemark.engine.stages.merge.options import routing_options
from tidemark.engine.stages.merge_engine import build_merge_engine

pytestmark = pytest.mark.conformance

FULL = os.environ.get("TIDEMARK_CONFORMANCE", "").lower() == "full"
SEEDS = range(40) if FULL else range(3)


def small_int(r: random.Random):
    return r.choice([None, 0, 1, 2, 3, 4, 5])


def pos_int(r: random.Random):
    return r.choice([None, 1, 2, 3])


def word(r: random.Random):
    return r.choice([None, "a", "b", "c", "", " ", "a,b"])


def flag(r: random.Random):
    return r.choice([None, True, False])


def ints(r: random.Random):
    return None if r.random() < 0.25 else [r.randint(0, 3) for _ in range(r.randint(0, 3))]


def mapping(r: random.Random):
    return None if r.random() < 0.25 else {r.choice("abc"): r.randint(0, 9) for _ in range(r.randint(0, 2))}


def nested(r: random.Random):
    if r.random() < 0.25:
        return None
    return [{"id": r.randint(0, 3), "v": r.choice("xyz")} for _ in range(r.randint(1, 2))]


def cents(r: random.Random):
    return None if r.random() < 0.25 else Decimal(r.randint(-500, 500)) / 100


def seq(r: random.Random, batch: int = 0):
    return r.choice([None, 0, 1, 2, 3, 4])


def rising_seq(r: random.Random, batch: int = 0):
    """Out of order inside a batch, rising from batch to batch (see ``ordered_batches``)."""
    return 10 * batch + r.randint(0, 4)


INT = pa.int64()
DECIMAL = pa.decimal128(10, 2)
NESTED = pa.list_(pa.struct([("id", pa.int64()), ("v", pa.string())]))


@dataclass
class Case:
    name: str
    options: dict[str, str]
    #: value columns after the key ``k``: (name, arrow type, generator)
    columns: list[tuple[str, pa.DataType, Callable]]
    retracts: bool = False  # the stream carries -U/-D
    per_record_commit: bool = False
    map_columns: set[int] = field(default_factory=set)
    #: Order-sensitive merges with ``sequence.field``: sequence values rise from batch to
    #: batch. Paimon pre-merges each commit into one record placed by its greatest sequence,
    #: Tidemark places each record by its own; the two agree unless a later batch carries a
    #: sequence older than an earlier batch's (docs/merge-engines.md, "Differences").
    ordered_batches: bool = False
    #: pypaimon 2.1 cannot read back a MAP its merge passed through unmerged (ArrowTypeError
    #: on the raw list of entries): two trailing batches of empty maps make every key's map
    #: a merged one.
    pad_keys: bool = False


COMMUTATIVE = ("sum", "product", "max", "min", "bool_and", "bool_or")


def agg_case(func: str, arrow: pa.DataType, gen: Callable, extra: dict | None = None,
             seq_field: bool = False, **kw) -> Case:
    options = {"merge-engine": "aggregation", "fields.v.aggregate-function": func, **(extra or {})}
    columns = [("v", arrow, gen), ("w", INT, small_int)]
    if seq_field:
        options["sequence.field"] = "s"
        if func in COMMUTATIVE:
            # every value column commutative: sequence values may go back across batches
            options["fields.default-aggregate-function"] = func
            columns = [("v", arrow, gen), ("w", arrow, gen), ("s", INT, seq)]
        else:
            columns.append(("s", INT, rising_seq))
            kw.setdefault("ordered_batches", True)
    name = "aggregation-" + func + ("-" + "-".join(f"{k.split('.')[-1]}={v}" for k, v in (extra or {}).items())
                                    if extra else "") + ("-seq" if seq_field else "")
    return Case(name, options, columns, **kw)


CASES = [
    Case("deduplicate", {}, [("v", pa.string(), word), ("w", INT, small_int)], retracts=True),
    # a merge option routes the sink to the merge engine stage (and its batch kernel)
    Case("deduplicate-lookup", {"changelog-producer": "lookup"},
         [("v", pa.string(), word), ("w", INT, small_int)], retracts=True),
    Case("deduplicate-ignore-delete", {"ignore-delete": "true"},
         [("v", pa.string(), word), ("w", INT, small_int)], retracts=True),
    Case("deduplicate-seq", {"sequence.field": "s"},
         [("v", pa.string(), word), ("s", INT, seq)], retracts=True),
    Case("deduplicate-seq-desc", {"sequence.field": "s", "sequence.field.sort-order": "descending"},
         [("v", pa.string(), word), ("s", INT, seq)], retracts=True),
    Case("deduplicate-two-seq", {"sequence.field": "s,t"},
         [("v", pa.string(), word), ("s", INT, seq), ("t", INT, seq)], retracts=True),
    Case("first-row", {"merge-engine": "first-row"}, [("v", pa.string(), word), ("w", INT, small_int)]),
    Case("first-row-ignore-delete", {"merge-engine": "first-row", "ignore-delete": "true"},
         [("v", pa.string(), word), ("w", INT, small_int)], retracts=True),
    Case("partial-update", {"merge-engine": "partial-update"},
         [("v", pa.string(), word), ("w", INT, small_int), ("x", pa.bool_(), flag)]),
    Case("partial-update-seq", {"merge-engine": "partial-update", "sequence.field": "s"},
         [("v", pa.string(), word), ("w", INT, small_int), ("s", INT, rising_seq)],
         ordered_batches=True),
    agg_case("sum", INT, small_int),
    agg_case("sum", INT, small_int, seq_field=True),
    agg_case("sum", DECIMAL, cents),
    agg_case("sum", DECIMAL, cents, seq_field=True),
    agg_case("product", INT, pos_int),
    agg_case("max", INT, small_int),
    agg_case("max", pa.string(), word, seq_field=True),
    agg_case("bool_or", pa.bool_(), flag, seq_field=True),
    agg_case("min", INT, small_int),
    agg_case("last_value", pa.string(), word),
    agg_case("last_value", pa.string(), word, seq_field=True),
    agg_case("last_non_null_value", pa.string(), word),
    agg_case("first_value", pa.string(), word),
    agg_case("first_value", INT, small_int, seq_field=True),
    agg_case("first_non_null_value", pa.string(), word),
    agg_case("bool_and", pa.bool_(), flag),
    agg_case("bool_or", pa.bool_(), flag),
    agg_case("listagg", pa.string(), word),
    agg_case("listagg", pa.string(), word, {"fields.v.distinct": "true"}),
    agg_case("listagg", pa.string(), word, {"fields.v.list-agg-delimiter": ";"}),
    agg_case("collect", pa.list_(INT), ints),
    agg_case("collect", pa.list_(INT), ints, {"fields.v.distinct": "true"}),
    agg_case("merge_map", pa.map_(pa.string(), INT), mapping, per_record_commit=True,
             map_columns={1}, pad_keys=True),
    agg_case("nested_update", NESTED, nested, {"fields.v.nested-key": "id"}),
    agg_case("nested_update", NESTED, nested),
    Case("aggregation-default-function", {"merge-engine": "aggregation",
                                          "fields.default-aggregate-function": "first_non_null_value",
                                          "fields.v.aggregate-function": "sum"},
         [("v", INT, small_int), ("w", INT, small_int)]),
]


def generate(case: Case, seed: int) -> list[list[Change]]:
    r = random.Random(seed)
    pos = 0
    batches = []
    kinds = ["+I", "+U", "-U", "-D"] if case.retracts else ["+I", "+U"]
    weights = [4, 3, 1, 2] if case.retracts else [1, 1]
    for b in range(r.randint(2, 6)):
        batch: list[Change] = []
        for _ in range(r.randint(1, 7)):
            while True:
                kind = r.choices(kinds, weights)[0]
                row = (r.randint(1, 3),) + tuple(
                    gen(r, b) if gen in (seq, rising_seq) else gen(r) for _, _, gen in case.columns)
                opposite = [c for c in batch if c.row == row and (c.kind in ADDS) != (kind in ADDS)]
                if not opposite:
                    break
            pos += 1
            batch.append(Change(kind, row, (pos,)))
        batches.append(batch)
    if case.pad_keys:
        for _ in range(2):
            batch = []
            for k in (1, 2, 3):
                pos += 1
                pad = tuple({} if i + 1 in case.map_columns else None for i in range(len(case.columns)))
                batch.append(Change("+I", (k,) + pad, (pos,)))
            batches.append(batch)
    return batches


def run_tidemark(case: Case, batches: list[list[Change]], seed: int) -> dict[tuple, tuple]:
    """The stage through the hosts' driver loop, one in-memory bucket, records shuffled."""
    columns = ["k"] + [name for name, _, _ in case.columns]
    stage = build_merge_engine("t", columns, (0,), case.options, case.retracts)
    adapter, bucket = PerKeyAdapter(stage), Bucket()
    shuffle = random.Random(seed + 1000)
    for batch_id, batch in enumerate(batches):
        batch = list(batch)
        shuffle.shuffle(batch)
        bucket, _ = adapter.process_batch([ChangeBatch(changes=batch)], bucket, BatchContext(batch_id=batch_id))
    return {k: s.row for k, s in bucket.states.items() if s.row is not None}


def run_kernel(case: Case, batches: list[list[Change]], seed: int) -> dict[tuple, tuple] | None:
    """The batch kernel on every batch, each batch as Arrow columns (what the Spark host
    hands it; the replay host's tuples take the per-key path for DECIMAL columns) and the
    bucket stored between batches as the Spark host stores it; None when the kernel does not
    compute the case's engine or a column's SQL type is not in ``SQL_TYPES``."""
    from tidemark.engine import state_codec
    from tidemark.engine.types import parse_type

    if any(arrow not in SQL_TYPES for _, arrow, _ in case.columns):
        return None
    columns = ["k"] + [name for name, _, _ in case.columns]
    types = [parse_type("BIGINT")] + [parse_type(SQL_TYPES[arrow]) for _, arrow, _ in case.columns]
    stage = build_merge_engine("t", columns, (0,), case.options, case.retracts, types=types)
    if not merge_kernel.supports(stage):
        return None
    kernel = merge_kernel.MergeKernel(stage)
    schema = pa.schema([("k", INT)] + [(name, arrow) for name, arrow, _ in case.columns])
    stored, shuffle = None, random.Random(seed + 3000)
    for batch_id, batch in enumerate(batches):
        batch = list(batch)
        shuffle.shuffle(batch)
        columnar = ChangeBatch.from_table(ChangeBatch.from_changes(batch, schema).table())
        bucket, _ = kernel.process_batch([columnar], state_codec.decode_state(stage, stored), BatchContext(batch_id=batch_id))
        stored = state_codec.encode_state(stage, bucket)
    return {k: s.row for k, s in state_codec.decode_state(stage, stored).states.items() if s.row is not None}


def run_paimon(case: Case, batches: list[list[Change]], warehouse: str) -> dict[tuple, tuple]:
    schema = pa.schema([pa.field("k", INT, nullable=False)]
                       + [pa.field(name, arrow) for name, arrow, _ in case.columns])
    table = PaimonTable(warehouse, schema, ["k"], case.options)
    for batch in batches:
        if case.per_record_commit:
            for c in sorted(batch, key=lambda c: c.pos):
                table.commit([c])
        else:
            table.commit(batch)
    return table.rows()


SQL_TYPES = {
    pa.int64(): "BIGINT", pa.string(): "STRING", pa.bool_(): "BOOLEAN", DECIMAL: "DECIMAL(10, 2)",
    pa.list_(INT): "ARRAY<BIGINT>", pa.map_(pa.string(), INT): "MAP<STRING, BIGINT>",
    NESTED: "ARRAY<ROW<id BIGINT, v STRING>>",
}


def sql_for(case: Case) -> str | None:
    """The pipeline that writes the case's records into a sink with the case's options, or
    None when the planner would not use a merge engine (a ``deduplicate`` sink without
    merge options goes through the upsert materializer)."""
    if case.options.get("merge-engine", "deduplicate") == "deduplicate" and not routing_options("dst", case.options):
        return None
    if any(arrow not in SQL_TYPES for _, arrow, _ in case.columns):
        return None
    cols = ", ".join(["k BIGINT"] + [f"{name} {SQL_TYPES[arrow]}" for name, arrow, _ in case.columns])
    names = ", ".join(["k"] + [name for name, _, _ in case.columns])
    src_format = "changelog-json" if case.retracts else "json"
    with_opts = ", ".join(f"'{k}' = '{v}'" for k, v in
                          {"topic": "dst", "format": "upsert-json", **case.options}.items())
    return (
        f"CREATE TABLE src ({cols}) WITH ('topic' = 'src', 'format' = '{src_format}');\n"
        f"CREATE TABLE dst ({cols}, PRIMARY KEY (k) NOT ENFORCED) WITH ({with_opts});\n"
        f"INSERT INTO dst SELECT {names} FROM src;"
    )


def run_replay(case: Case, batches: list[list[Change]], seed: int) -> dict[tuple, tuple]:
    """Through SQL: compile the pipeline and run it in the in-process replay host. Records
    enter as decoded JSON does (``coerce_value``: ARRAY/ROW -> tuples, MAP -> sorted pairs)
    and the merged rows leave as JSON values (``to_json_value``), as ``tidemark replay``
    reads and prints them; a DECIMAL's JSON value, its exact digits as a string, is read back
    as the ``Decimal`` Paimon gives."""
    from tidemark.engine.pipeline import compile_sql
    from tidemark.engine.replay import ReplayHost
    from tidemark.engine.types import coerce_value, to_json_value

    pipeline = compile_sql(sql_for(case))
    types = pipeline.sink.types
    host = ReplayHost(pipeline)
    shuffle = random.Random(seed + 2000)
    for batch in batches:
        batch = [c._replace(row=tuple(coerce_value(t, v) for t, v in zip(types, c.row))) for c in batch]
        shuffle.shuffle(batch)
        host.run_batch({"src": batch}, now_ms=0)
    def read(t, v):
        out = to_json_value(t, v)
        return Decimal(out) if t.name == "DECIMAL" and out is not None else out

    return {k: tuple(read(t, v) for t, v in zip(types, row)) for k, row in host.table().items()}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_same_merged_table_as_paimon(case: Case, seed: int, tmp_path, monkeypatch):
    """Directly through the per-key stage and through the batch kernel on Arrow batches
    (``tidemark.engine.kernels.merge``, where it computes the engine), and through SQL and the
    replay host: as it runs (small batches take the per-key path) and with the batch kernel on
    every batch it computes."""
    batches = generate(case, seed)
    expected = normalize_table(run_paimon(case, batches, str(tmp_path)), case.map_columns)
    actual = normalize_table(run_tidemark(case, batches, seed), case.map_columns)
    assert actual == expected, f"batches: {batches}"
    kernel = run_kernel(case, batches, seed)
    if kernel is not None:
        assert normalize_table(kernel, case.map_columns) == expected, f"the batch kernel on Arrow batches; batches: {batches}"
    if sql_for(case) is not None:
        replayed = normalize_table(run_replay(case, batches, seed), case.map_columns)
        assert replayed == expected, f"through SQL and replay; batches: {batches}"
        monkeypatch.setattr(merge_kernel, "KERNEL_MIN_CHANGES", 0)
        replayed = normalize_table(run_replay(case, batches, seed), case.map_columns)
        assert replayed == expected, f"through SQL and replay, batch kernel on; batches: {batches}"
