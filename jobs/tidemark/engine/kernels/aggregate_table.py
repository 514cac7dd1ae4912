"""The group aggregate on its stored table, for a stage whose calls keep only accumulators:
the bucket's groups stay one Arrow table (``aggregate_state``'s layout), and a batch
rewrites the rows of the groups it touches in polars, with no Python value per group.

Which stages: every call is COUNT(*), COUNT, or SUM or AVG over an integer or floating
point column, none DISTINCT, and the group-by columns are typed so that Arrow's equality is
Python's (``state_tables.compares_as_python``). Their accumulators are sums, so for one
group and one batch (``GroupAggregate.process_key``; w the weight of each record, v its
value for call i):

    rows' = rows + sum(w)
    n_i'  = n_i + sum(w over records where v is not NULL)   (COUNT(*): n_i + sum(w))
    t_i'  = t_i + sum(v * w)                                 (SUM, AVG; n_i' <= 0 resets both)

whatever the records' order, provided no count is clamped at 0 on the way and the group
does not empty before its last record (the per-key path clamps and re-creates record by
record). ``AggregateKernel.steps`` tells those groups apart (``$simple``) and computes, as
prefix sums over each group's records in the canonical order, the first and last records
that changed the group's output; the emitted changes are then a function of the old and
new output rows and those two positions, exactly the per-key stage's rules:

- new row absent: ``-D old`` at the batch's last record of the group (nothing if no old);
- one record: ``+I new``, or ``-U old, +U new`` when they differ, at that record;
- several records, new row equal to the old: nothing when no record changed the output,
  else the refresh ``-U old`` at the first changing record and ``+U old`` at the last;
- several records, new row different: ``+I new`` or ``-U old, +U new`` at the last
  changing record.

A group that is not simple takes the stage's own ``process_key`` with its records, its old
state read from the table and its new one written back. Emitted changes come group by
group in the order of each group's first record in the batch, as the per-key adapter emits
them.
"""

from __future__ import annotations

from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from tidemark.engine import batch_ipc
from tidemark.engine.batch import POS_PREFIX, WEIGHT
from tidemark.engine.batch_columns import row_indexes, sorted_table, to_changes, to_table
from tidemark.engine.kernels import aggregate_state
from tidemark.engine.stage import BatchContext
from tidemark.engine.stages.aggregate import GroupAggregate, uses_distinct
from tidemark.engine.state_tables import compares_as_python

_I = "$i"  # a record's index in the batch as it arrived
_G = "$g"  # a group's id: the arrival index of its first record
_K = "$k"  # the one group of an aggregate without GROUP BY
_IN = "$in"  # the group has stored state
_AT = "$at"  # the record whose position an emitted change takes
_SEQ = "$seq"  # an emitted change's place among its group's changes


def _c(name: str, i: int) -> str:
    return f"${name}{i}"


def eligible(stage: GroupAggregate) -> bool:
    """Whether ``stage`` keeps only accumulators this module updates (module docstring)."""
    schema = stage.input_schema
    if schema is None:
        return False
    if not all(compares_as_python(schema.field(j).type) for j in stage.group_by):
        return False
    for call in stage.aggs:
        if uses_distinct(call) or call.func not in ("SUM", "AVG", "COUNT", "COUNT_STAR"):
            return False
        if call.func in ("SUM", "AVG"):
            t = schema.field(call.arg).type
            if not (pa.types.is_integer(t) or pa.types.is_floating(t)):
                return False
    return True


def state_schema(stage: GroupAggregate) -> pa.Schema:
    """The stored table's schema for an eligible stage, as ``aggregate_state.to_table``
    types it."""
    schema = stage.input_schema
    fields = [pa.field(f"key{j}", schema.field(col).type) for j, col in enumerate(stage.group_by)]
    fields.append(pa.field("rows", pa.int64()))
    for i, call in enumerate(stage.aggs):
        if call.func in ("SUM", "AVG"):
            fields.append(pa.field(f"total{i}", aggregate_state._total_type(schema.field(call.arg).type)))
        fields.append(pa.field(f"n{i}", pa.int64()))
    return pa.schema(fields)


def _output_type(call: Any, schema: pa.Schema) -> pl.DataType:
    """The polars type of a call's output value: COUNT and integer SUM and AVG are BIGINT."""
    if call.func in ("COUNT", "COUNT_STAR") or pa.types.is_integer(schema.field(call.arg).type):
        return pl.Int64
    return pl.Float64


def _value(call: Any, total: pl.Expr, n: pl.Expr, schema: pa.Schema) -> pl.Expr:
    """A call's output from its accumulator (``GroupAggregate._output``)."""
    if call.func in ("COUNT", "COUNT_STAR"):
        return n.cast(pl.Int64)
    if call.func == "SUM":
        return pl.when(n > 0).then(total)
    if pa.types.is_integer(schema.field(call.arg).type):  # Java's long division truncates toward zero
        q = total.abs() // n
        return pl.when(n > 0).then(pl.when(total >= 0).then(q).otherwise(-q)).cast(pl.Int64)
    return pl.when(n > 0).then(total / n).cast(pl.Float64)


class AccumulatorTable:
    """The table path of ``AggregateKernel`` (module docstring)."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.stage: GroupAggregate = kernel.stage
        self.schema: pa.Schema = self.stage.input_schema
        self.state_schema = state_schema(self.stage)
        self.rows = list(self.schema.names)
        self.keys = [self.rows[j] for j in self.stage.group_by]

    def run(self, batch: pa.Table, stored: pa.Table | None, ctx: BatchContext) -> tuple[pa.Table | None, pa.Table] | None:
        """(the new stored table, or None when no group is left; the emitted changes as a
        batch table), or None when this batch or state is not for the table path: values
        the input schema does not type, weights other than +1/-1, or a state keyed by a
        host's group ids."""
        table = self._typed(batch)
        if table is None or (stored is not None and "group" in stored.column_names):
            return None
        if table.num_rows and pc.max(pc.abs(table.column(WEIGHT))).as_py() != 1:
            return None
        stage, rows, keys = self.stage, self.rows, self.keys
        table = table.append_column(_I, row_indexes(table.num_rows))
        df = pl.from_arrow(sorted_table(table))
        group_keys = keys or [_K]
        if not keys:
            df = df.with_columns(pl.lit(0).alias(_K))
        df = df.with_columns(pl.col(_I).min().over(group_keys).alias(_G))
        groups = df.group_by(_G).agg(pl.len().alias("$n"), *(pl.col(k).first() for k in group_keys)).sort(_G)
        old = self._old(groups, stored, group_keys)
        steps = self.kernel.steps(df, rows, old.select(_G, "$orows", *self._old_columns()))
        per_group = (
            steps.group_by(_G)
            .agg(
                pl.col("$simple").all(),
                pl.col(_I).filter(pl.col("$changed")).first().alias("$first"),
                pl.col(_I).filter(pl.col("$changed")).last().alias("$last"),
                pl.col(_I).last().alias("$max"),
                pl.col(WEIGHT).sum().alias("$drows"),
                *self.kernel._delta_exprs(rows),
            )
            .join(old, on=_G)
            .sort(_G)
        )
        simple = per_group.filter(pl.col("$simple"))
        new = self._new(simple)
        positions = df.select(_I, *(c for c in df.columns if c.startswith(POS_PREFIX)))
        out = self._emitted(new, positions)
        slow = per_group.filter(~pl.col("$simple"))
        slow_state = None
        if slow.height:
            slow_state, slow_out = self._per_group(slow[_G].to_list(), df, table, stored, ctx, out.schema)
            out = pa.concat_tables([out, slow_out], promote_options="permissive")
        out = pl.from_arrow(out).sort([_G, _SEQ]).drop(_G, _SEQ).to_arrow()
        return self._stored(stored, groups, new, slow_state, group_keys), out

    # ------------------------------------------------------------------ input and old state

    def _typed(self, batch: pa.Table) -> pa.Table | None:
        own = [c for c in batch.column_names if c.startswith("$")]
        if batch.num_columns - len(own) != len(self.rows):
            return None
        table = batch_ipc.typed(batch.rename_columns([*self.rows, *own]), self.schema)
        if any(table.schema.field(i).type != f.type for i, f in enumerate(self.schema)):
            return None
        return table

    def _old_columns(self) -> list[str]:
        out = []
        for i, call in enumerate(self.stage.aggs):
            if call.func in ("SUM", "AVG"):
                out.append(_c("ot", i))
            out += [_c("on", i), _c("ov", i)]
        return out

    def _old(self, groups: pl.DataFrame, stored: pa.Table | None, group_keys: list[str]) -> pl.DataFrame:
        """Each batch group's old state (``AggregateKernel.steps``'s ``old`` columns), and
        ``$in``: whether it has stored state."""
        state = pl.from_arrow(stored if stored is not None else self.state_schema.empty_table())
        state = state.rename({f"key{j}": k for j, k in enumerate(self.keys)})
        if not self.keys:
            state = state.with_columns(pl.lit(0).alias(_K))
        df = groups.join(state, on=group_keys, how="left", nulls_equal=True)
        present = pl.col("rows").is_not_null()
        cols = [present.alias(_IN), pl.col("rows").fill_null(0).alias("$orows")]
        for i, call in enumerate(self.stage.aggs):
            n = pl.col(f"n{i}").fill_null(0)
            cols.append(n.alias(_c("on", i)))
            total = pl.lit(None)
            if call.func in ("SUM", "AVG"):  # typed as ``steps`` adds the records' values to it
                arg = pl.from_arrow(pa.array([], self.schema.field(call.arg).type)).dtype
                total = pl.col(f"total{i}").cast(arg, strict=False)
                cols.append(total.alias(_c("ot", i)))
            cols.append(pl.when(present).then(_value(call, total, n, self.schema)).alias(_c("ov", i)))
        return df.with_columns(cols)

    # ------------------------------------------------------------------ the simple groups

    def _new(self, simple: pl.DataFrame) -> pl.DataFrame:
        """The simple groups with their new accumulators (``$nrows``, ``$nt<i>``, ``$nn<i>``)
        and output values (``$nv<i>``), and ``$equal``: the output row did not change."""
        nrows = pl.col("$orows") + pl.col("$drows")
        cols = [nrows.alias("$nrows")]
        values = []
        for i, call in enumerate(self.stage.aggs):
            on = pl.col(_c("on", i))
            total = pl.lit(None)
            if call.counts_rows:
                n = pl.max_horizontal(on + pl.col("$drows"), pl.lit(0))
            elif call.func == "COUNT":
                n = pl.max_horizontal(on + pl.col(_c("dn", i)), pl.lit(0))
            else:  # SUM, AVG: a count at 0 resets the total (``SumAcc``)
                grown = on + pl.col(_c("dn", i))
                n = pl.when(grown > 0).then(grown).otherwise(0)
                total = pl.when(grown > 0).then(pl.col(_c("ot", i)).fill_null(0) + pl.col(_c("dt", i)).fill_null(0))
                cols.append(total.alias(_c("nt", i)))
            cols.append(n.alias(_c("nn", i)))
            values.append(_value(call, total, n, self.schema).alias(_c("nv", i)))
        equal = pl.col(_IN) & (pl.col("$nrows") > 0)
        for i in range(len(self.stage.aggs)):
            equal = equal & pl.col(_c("ov", i)).eq_missing(pl.col(_c("nv", i)))
        return simple.with_columns(cols).with_columns(values).with_columns(equal.alias("$equal"))

    def _emitted(self, new: pl.DataFrame, positions: pl.DataFrame) -> pa.Table:
        """The simple groups' changes (module docstring's rules) as a batch table with
        ``$g`` and ``$seq`` for ordering."""
        one = pl.col("$n") == 1
        present, stays, equal = pl.col(_IN), pl.col("$nrows") > 0, pl.col("$equal")
        first, last, final = pl.col("$first"), pl.col("$last"), pl.col("$max")
        refresh = ~one & equal & last.is_not_null()
        at_change = pl.when(one).then(final).otherwise(pl.coalesce(last, final))
        minus = new.filter(present & (~stays | ~equal | refresh)).select(
            _G,
            pl.lit(0).alias(_SEQ),
            pl.when(~stays).then(pl.lit("-D")).otherwise(pl.lit("-U")).alias("$kind"),
            pl.when(~stays).then(final).when(refresh).then(first).otherwise(at_change).alias(_AT),
            *self._row("ov"),
        )
        plus = new.filter(stays & (~present | ~equal | refresh)).select(
            _G,
            pl.lit(1).alias(_SEQ),
            pl.when(~present).then(pl.lit("+I")).otherwise(pl.lit("+U")).alias("$kind"),
            at_change.alias(_AT),
            *self._row("nv"),
        )
        both = pl.concat([minus, plus])
        both = both.join(positions, left_on=_AT, right_on=_I, how="left").drop(_AT)
        weight = pl.when(pl.col("$kind").is_in(["+I", "+U"])).then(1).otherwise(-1).cast(pl.Int64)
        names = [f"r{j}" for j in range(len(self.keys) + len(self.stage.aggs))]
        pos = [c for c in positions.columns if c != _I]
        return both.select(*names, "$kind", weight.alias(WEIGHT), *pos, _G, _SEQ).to_arrow()

    def _row(self, prefix: str) -> list[pl.Expr]:
        """An output row's columns: the group's key, then each call's value (``$ov`` old,
        ``$nv`` new)."""
        keys = [pl.col(k).alias(f"r{j}") for j, k in enumerate(self.keys)]
        return keys + [
            pl.col(_c(prefix, i)).cast(_output_type(call, self.schema)).alias(f"r{len(self.keys) + i}")
            for i, call in enumerate(self.stage.aggs)
        ]

    # ------------------------------------------------------------------ the other groups

    def _per_group(self, gids: list[int], df: pl.DataFrame, table: pa.Table, stored: pa.Table | None,
                   ctx: BatchContext, schema: pa.Schema) -> tuple[pa.Table | None, pa.Table]:
        """The stage's own ``process_key`` for groups ``gids``, with their records in arrival
        order and their stored state: (their new stored rows, their changes)."""
        stage = self.stage
        members = df.filter(pl.col(_G).is_in(gids)).select(_I, _G).sort(_I)
        records = table.take(pa.array(members[_I].to_arrow())).drop_columns([_I])
        changes = to_changes(records)
        by_group: dict[int, list] = {}
        for g, change in zip(members[_G].to_list(), changes):
            by_group.setdefault(g, []).append(change)
        states = {}
        if stored is not None and stored.num_rows:
            key_names = [f"key{j}" for j in range(len(self.keys))]
            wanted = df.filter(pl.col(_G).is_in(gids)).select(
                *(pl.col(k).alias(n) for k, n in zip(self.keys, key_names))).unique()
            own = pl.from_arrow(stored)
            if key_names:
                own = own.join(wanted, on=key_names, how="semi", nulls_equal=True)
            states = aggregate_state.from_table(stage, own.to_arrow().cast(stored.schema))
        new_states, out, tags = {}, [], []
        for g in gids:
            cs = by_group[g]
            key = stage.key_of(cs[0])
            new_state, emitted = stage.process_key(key, [cs], states.get(key), ctx)
            if new_state is not None:
                new_states[key] = new_state
            out += emitted
            tags += [(g, k) for k in range(len(emitted))]
        row_schema = pa.schema([f for f in schema if not f.name.startswith("$")])
        emitted_table = to_table(out, row_schema) if out else pa.table({})
        if out:
            emitted_table = emitted_table.append_column(_G, pa.array([g for g, _ in tags], pa.int64()))
            emitted_table = emitted_table.append_column(_SEQ, pa.array([k for _, k in tags], pa.int32()))
        else:
            emitted_table = schema.empty_table()
        return aggregate_state.to_table(stage, new_states), emitted_table

    # ------------------------------------------------------------------ the new stored table

    def _stored(self, stored: pa.Table | None, groups: pl.DataFrame, new: pl.DataFrame,
                slow: pa.Table | None, group_keys: list[str]) -> pa.Table | None:
        key_names = {k: f"key{j}" for j, k in enumerate(self.keys)}
        cols = [pl.col(k).alias(n) for k, n in key_names.items()]
        cols.append(pl.col("$nrows").alias("rows"))
        for i, call in enumerate(self.stage.aggs):
            if call.func in ("SUM", "AVG"):
                cols.append(pl.col(_c("nt", i)).alias(f"total{i}"))
            cols.append(pl.col(_c("nn", i)).alias(f"n{i}"))
        parts = [new.filter(pl.col("$nrows") > 0).select(cols).to_arrow()]
        if stored is not None and stored.num_rows and self.keys:
            touched = groups.select(*(pl.col(k).alias(key_names[k]) for k in self.keys))
            kept = pl.from_arrow(stored).join(touched, on=list(key_names.values()), how="anti", nulls_equal=True)
            parts.append(kept.to_arrow())
        if slow is not None:
            parts.append(slow)
        parts = [p.select(self.state_schema.names).cast(self.state_schema) for p in parts if p.num_rows]
        if not parts:
            return None
        merged = pa.concat_tables(parts)
        if self.keys:
            merged = merged.sort_by([(f"key{j}", "ascending") for j in range(len(self.keys))])
        return merged
