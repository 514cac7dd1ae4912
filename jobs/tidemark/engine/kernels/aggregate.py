"""The group aggregate under the batch contract: one polars pass per batch, then one state
update per touched group from its net deltas.

What is columnar (polars over the batch's Arrow table in the canonical order): grouping by
the group-by columns, each group's net deltas (row count, SUM/AVG totals and non-null
counts, COUNT counts, the values MIN/MAX add or retract, each DISTINCT value's
multiplicity), and the refresh replay (``GroupAggregate._changing_steps``) as prefix sums:
the output after each record of a group is a function of running totals from the group's
old state, so "the first and the last record that changed the output" is a window
computation, not a loop over records. A MIN or MAX after each record is a running extreme
over adds, and with retractions the extreme of a multiset of running counts
(``_retracted_extremes``); a LAST_VALUE is a running greatest (position, ``repr``) rank,
and with retractions the greatest among the values whose running count is positive
(``_last_values``).

What stays per group, in Python: adding the deltas to the group's ``GroupState`` (the
stage's own accumulators, so the output values are the per-key path's by construction) and
choosing the changes to emit with the stage's rules.

Which groups take the stage's own ``process_key`` instead (their records in hand):

- a group that empties inside the batch before its last record (the group is cleared and
  re-created mid-batch: Flink's refresh of a re-created group needs that record order);
- a group where a MIN or MAX call gets a retraction and its multiset could not be computed
  as running counts: a count that could drop below zero in some order, a group emptied with
  values left in it, or more than ``_PAIRS_PER_GROUP`` (changes x values it touches)
  (``_retracted_extremes``: the value after each record is the extreme of the old values the
  batch does not touch and of the touched values whose running count is positive);
- the same for a LAST_VALUE call with a retraction (``_last_values``), and every group of a
  batch whose LAST_VALUE column holds values polars and Python tell apart differently (NaN,
  ``0.0`` beside ``-0.0``, one DECIMAL at two scales: ties are broken by ``repr``);
- a group where a count could drop below zero in some order (a retraction of a row that was
  never added): the per-key path clamps it record by record;
- a group whose AVG is over DECIMAL and that has several records (Python's ``Decimal``
  division rounds to 28 digits: two averages are compared as the per-key path computes them).

Batches whose values Arrow cannot type as one column per field run wholly per group too.

Two known differences from the per-key path, both outside valid changelogs or exact
arithmetic: a retraction of a value that was never added, while the group's counts stay
positive, makes both paths' totals meaningless in different ways (the per-key path resets a
total whose count reaches 0 in arrival order); and DOUBLE/FLOAT totals are summed in another
order (the per-key path's order is the batch's arrival order, itself not canonical), so they
may differ in the last bits.

State is the per-key path's ``Bucket`` of ``GroupState`` keyed by the group's key tuple
(never by a host's group id, so the same state works whichever host calls), stored as typed
Arrow (``aggregate_state``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl
import pyarrow as pa

from tidemark.engine.batch import POS_PREFIX, WEIGHT, ChangeBatch
from tidemark.engine.batch_columns import position_ranks, row_indexes, sorted_table
from tidemark.engine.changelog import UPDATE_AFTER, UPDATE_BEFORE, Change, diff_to_changes
from tidemark.engine.driver import Bucket
from tidemark.engine.kernels import aggregate_state
from tidemark.engine.kernels.aggregate_table import AccumulatorTable, eligible
from tidemark.engine.kernels.materializer import _NOT_TABULAR
from tidemark.engine.kernels.runs import Runs
from tidemark.engine.kernels.table_bucket import TableBucket
from tidemark.engine.stage import BatchContext
from tidemark.engine.stages.aggregate import GroupAggregate, GroupState, uses_distinct

_I = "$i"  # a change's index in the batch's change list
_G = "$g"  # the group's first arrival index: a group id that orders groups as the adapter does
_STEP = "$step"  # a change's rank within its group, in the canonical order
_ROWS = "$rows"  # the group's row count after the change
_CHANGED = "$changed"  # the change changed the group's output (the refresh replay)
_SIMPLE = "$simple"  # the group's batch is computed from its deltas (module docstring)
#: a group whose changes times the values they touch exceed this takes the per-group path
#: for a MIN/MAX call with a retraction (``_retracted_extremes``)
_PAIRS_PER_GROUP = 20_000


def _c(name: str, i: int) -> str:
    return f"${name}{i}"


class AggregateKernel:
    """``process_batch`` for a ``GroupAggregate`` (module docstring), with typed state."""

    state_kind = aggregate_state.STATE_KIND
    state_version = aggregate_state.STATE_VERSION

    def __init__(self, stage: GroupAggregate, on_table: bool = True) -> None:
        """``on_table=False``: never the stored table's path (``aggregate_table``), which is
        then only the reference its tests compare with."""
        self.stage = stage
        self.name = stage.name
        self.n_inputs = stage.n_inputs
        #: the stored table's own path, for a stage that keeps only accumulators
        self._table = AccumulatorTable(self) if on_table and eligible(stage) else None

    # ------------------------------------------------------------------ typed state

    def empty_state(self) -> Bucket:
        return Bucket()

    def state_to_table(self, state: Bucket) -> pa.Table | None:
        if isinstance(state, TableBucket) and state.table is not None:
            return state.table
        return aggregate_state.to_table(self.stage, state.states)

    def state_from_table(self, table: pa.Table) -> Bucket:
        """The stored table, read into ``GroupState`` values only if a batch needs them."""
        return TableBucket(table, self._states_of)

    def _states_of(self, table: pa.Table) -> dict[tuple, GroupState]:
        return aggregate_state.from_table(self.stage, table)

    # ------------------------------------------------------------------ the batch

    def process_batch(
        self, inputs: Sequence[ChangeBatch], state: Bucket, ctx: BatchContext
    ) -> tuple[Bucket, ChangeBatch]:
        if len(inputs[0]) == 0:
            return state, ChangeBatch(changes=[])
        if self._table is not None:
            done = self._on_table(inputs[0], state, ctx)
            if done is not None:
                return done
        changes = inputs[0].changes()
        try:
            table = ChangeBatch.from_changes(changes, self.stage.input_schema).table()
            table = table.append_column(_I, row_indexes(len(changes)))
            emitted = self._columnar_batch(table, changes, state, ctx)
        except _NOT_TABULAR:
            emitted = self._per_group(_groups_of(self.stage, changes), changes, state, ctx)
        return state, ChangeBatch(changes=emitted)

    def _on_table(self, batch: ChangeBatch, state: Bucket, ctx: BatchContext) -> tuple[Bucket, ChangeBatch] | None:
        """The batch on the bucket's stored table (``aggregate_table``); None when the table
        path does not take it (values it cannot type, a state keyed by a host's ids)."""
        if isinstance(state, TableBucket) and state.table is not None:
            stored = state.table
        else:
            stored = aggregate_state.to_table(self.stage, state.states)
        try:
            done = self._table.run(batch.table(), stored, ctx)
        except _NOT_TABULAR:
            return None
        if done is None:
            return None
        table, out = done
        return (TableBucket(table, self._states_of) if table is not None else Bucket()), ChangeBatch.from_table(out)

    def _per_group(
        self, groups: dict[tuple, list[int]], changes: list[Change], state: Bucket, ctx: BatchContext
    ) -> list[Change]:
        """The stage's own ``process_key`` for each group (its change indexes in arrival
        order, as the per-key adapter passes them), in arrival order of the groups."""
        states, emitted = state.states, []
        for key, idx in groups.items():
            new_state, out = self.stage.process_key(key, [[changes[i] for i in idx]], states.get(key), ctx)
            _store(states, key, new_state)
            emitted.extend(out)
        return emitted

    def _columnar_batch(
        self, table: pa.Table, changes: list[Change], state: Bucket, ctx: BatchContext
    ) -> list[Change]:
        stage, states = self.stage, state.states
        rows = [c for c in table.column_names if not c.startswith("$")]
        key_cols = [rows[j] for j in stage.group_by]
        first = pl.col(_I).min().over(key_cols) if key_cols else pl.col(_I).min()
        df = pl.from_arrow(sorted_table(table)).with_columns(first.alias(_G))
        firsts = df.group_by(_G).agg(pl.len().alias("$n")).sort(_G)
        gids, counts = firsts[_G].to_list(), firsts["$n"].to_list()
        keys = [tuple(changes[g].row[j] for j in stage.group_by) for g in gids]
        olds = [states.get(k) for k in keys]
        steps = self._steps(df, rows, gids, olds)
        per_group = steps.group_by(_G).agg(
            pl.col(_SIMPLE).all(),
            pl.col(_I).filter(pl.col(_CHANGED)).first().alias("$first"),
            pl.col(_I).filter(pl.col(_CHANGED)).last().alias("$last"),
            pl.col(_I).last().alias("$max"),
            pl.col(WEIGHT).sum().alias("$drows"),
            *self._delta_exprs(rows),
        ).sort(_G)
        values = self._added_values(steps, rows)
        members = self._last_value_members(steps)
        slow = dict(
            steps.filter(~pl.col(_SIMPLE)).group_by(_G, maintain_order=True).agg(pl.col(_I)).iter_rows()
        )
        emitted: list[Change] = []
        for n_changes, key, old_state, g in zip(counts, keys, olds, per_group.iter_rows(named=True)):
            if g[_G] in slow:
                emitted.extend(self._per_group({key: sorted(slow[g[_G]])}, changes, state, ctx))
            else:
                emitted.extend(self._apply(key, old_state, g, values.get(g[_G], ()), members.get(g[_G], ()), n_changes,
                                           changes, states))
        return emitted

    # ------------------------------------------------------------------ the replay as prefix sums

    def _steps(self, df: pl.DataFrame, rows: list[str], gids: list[int], olds: list[GroupState | None]) -> pl.DataFrame:
        """``steps`` with the groups' old states as Python ``GroupState`` values."""
        return self.steps(df, rows, self._old_frame(df, rows, gids, olds), gids, olds)

    def _old_frame(self, df: pl.DataFrame, rows: list[str], gids: list[int], olds: list[GroupState | None]) -> pl.DataFrame:
        """Per group id: what ``steps`` reads of its old state (``old_columns``)."""
        stage = self.stage
        old = {_G: gids, "$orows": [s.rows if s is not None else 0 for s in olds]}
        old_out = [stage._output((), s) if s is not None else None for s in olds]
        dtypes: dict[str, pl.DataType] = {}
        untouched: dict[int, tuple[list[Any], list[Any]]] = {}  # per MIN/MAX column: both extremes
        for i, call in enumerate(stage.aggs):
            arg_type = df[rows[call.arg]].dtype if call.arg is not None else pl.Int64
            if call.func in ("SUM", "AVG"):
                old[_c("ot", i)] = [s.accs[i].total if s is not None and s.accs[i].n > 0 else None for s in olds]
                old[_c("on", i)] = [s.accs[i].n if s is not None else 0 for s in olds]
                dtypes[_c("ot", i)] = arg_type
            elif call.func in ("COUNT", "COUNT_STAR"):
                old[_c("on", i)] = [s.accs[i].n if s is not None else 0 for s in olds]
            if _decimal_avg(call, arg_type):  # not compared: such groups of several changes go per group
                continue
            old[_c("ov", i)] = [o[i] if o is not None else None for o in old_out]
            if call.func in ("MIN", "MAX", "SUM", "LAST_VALUE"):
                dtypes[_c("ov", i)] = arg_type
            if call.func in ("MIN", "MAX"):
                if call.arg not in untouched:
                    untouched[call.arg] = _untouched_extremes(df, rows[call.arg], i, gids, olds)
                old[_c("ob", i)] = untouched[call.arg][call.func == "MAX"]
                dtypes[_c("ob", i)] = arg_type
            elif call.func == "AVG":
                dtypes[_c("ov", i)] = pl.Int64 if arg_type.is_integer() else pl.Float64
        return pl.DataFrame(
            {name: pl.Series(name, vals, dtype=dtypes.get(name), strict=False) for name, vals in old.items()}
        )

    def steps(self, df: pl.DataFrame, rows: list[str], old: pl.DataFrame,
              gids: Sequence[int] = (), olds: Sequence[GroupState | None] = ()) -> pl.DataFrame:
        """Per change (canonical order within each group): the group's output after it,
        whether it changed the output, and whether the group stays on the columnar path.
        ``old``: per group id (``$g``) its old row count (``$orows``, 0 for a new group) and
        per call ``i`` its old total (``$ot<i>``, SUM and AVG), count (``$on<i>``) and output
        value (``$ov<i>``, null for a new group); ``gids`` and ``olds``: the same groups'
        ``GroupState``, which only DISTINCT, MIN and MAX calls read."""
        stage = self.stage
        # each group's changes together, in the canonical order: windows are runs (``Runs``)
        df = df.sort(_G, maintain_order=True)
        df = _ranked_extremes(df.join(old, on=_G, how="left", maintain_order="left"), rows, stage.aggs)
        w = pl.col(WEIGHT)
        over = dict(partition_by=_G)
        runs = Runs(_G)
        df = df.with_columns(runs.step().alias(_STEP), (pl.col("$orows") + runs.cum_sum(w)).alias(_ROWS))
        net = df.group_by([_G, *rows]).agg(pl.col(WEIGHT).sum().alias("$net"))
        retractions = self._net_retractions(net, rows)
        df = self._distinct_steps(df.join(retractions, on=_G, how="left", maintain_order="left"), net, rows, gids, olds)
        df = self._retracted_extremes(df, net, rows, gids, olds)
        df = self._last_values(df, rows, gids, olds)
        # no record finds the group empty and retracts (the per-key path skips it)
        simple = pl.col(_ROWS) >= 0
        values = []
        for i, call in enumerate(stage.aggs):
            if _decimal_avg(call, df[rows[call.arg]].dtype if call.arg is not None else None):
                simple = simple & (pl.len().over(**over) == 1)
                continue
            value, ok = self._step_value(df, rows, i, call, runs)
            simple = simple & ok
            values.append((i, value.alias(_c("val", i))))
        df = df.with_columns(simple.alias(_SIMPLE), *(v for _, v in values))
        first = pl.col(_STEP) == 0
        before = runs.previous(pl.col(_ROWS)) > 0
        changed = (pl.col(_ROWS) > 0) != pl.when(first).then(pl.col("$orows") > 0).otherwise(before)
        for i, _ in values:
            value = pl.col(_c("val", i))
            prev = pl.when(first).then(pl.col(_c("ov", i))).otherwise(runs.previous(value))
            changed = changed | value.ne_missing(prev)
        return df.with_columns(pl.col(_SIMPLE).all().over(**over), changed.alias(_CHANGED))

    def _step_value(self, df: pl.DataFrame, rows: list[str], i: int, call: Any, runs: Runs) -> tuple[pl.Expr, pl.Expr]:
        """(the call's output after each change, whether the group's counts for it can
        never clamp) as expressions over the joined steps frame."""
        over = dict(partition_by=_G)
        w = pl.col(WEIGHT)
        if call.func == "COUNT_STAR" or call.counts_rows:
            return pl.col(_ROWS), pl.lit(True)
        if call.func == "LAST_VALUE":
            return pl.col(_c("lv", i)), pl.col(_c("lok", i))
        arg = pl.col(rows[call.arg])
        if call.func in ("MIN", "MAX"):
            if _c("rank", i) in df.columns:  # compared by rank (``_ranked_extremes``)
                arg = pl.col(_c("rank", i))
            cum = (arg.cum_max() if call.func == "MAX" else arg.cum_min()).forward_fill().over(**over)
            both = [pl.col(_c("ov", i)), cum]
            value = pl.max_horizontal(both) if call.func == "MAX" else pl.min_horizontal(both)
            # only adds of values (a retracted NULL leaves the multiset as it is), and where
            # the group empties an empty multiset (the per-key replay starts it again)
            valued = pl.col(rows[call.arg]).is_not_null()
            adds = (((w > 0) | ~valued) & ((pl.col(_ROWS) > 0) | value.is_null())).all().over(**over)
            if _c("xv", i) not in df.columns:
                return value, adds
            # a group with a retraction of a value: its multiset after each change (``_retracted_extremes``)
            retracted = pl.col(_c("xr", i))
            return (pl.when(retracted).then(pl.col(_c("xv", i))).otherwise(value),
                    pl.when(retracted).then(pl.col(_c("xok", i))).otherwise(adds))
        if uses_distinct(call):  # a value counts once: its 0 -> 1 and 1 -> 0 moves (``_distinct_steps``)
            c = pl.col(_c("dc", i))
            never_clamps = pl.col(_c("dok", i))
        else:
            c = pl.when(arg.is_not_null()).then(w).otherwise(0)
            # the per-key path feeds each row's net weight in arrival order, clamping at 0:
            # no order may take the count below 0
            never_clamps = pl.col(_c("on", i)) + pl.col(_c("neg", i)) >= 0
        n_k = pl.col(_c("on", i)) + runs.cum_sum(c)
        never_clamps = never_clamps & (n_k >= 0)  # nor may the replay in the canonical order
        emptied = pl.col(_ROWS) == 0  # the per-key replay re-creates the group's state after it
        if call.func == "COUNT":
            return n_k, never_clamps & (~emptied | (n_k == 0))
        weighted = (arg * c).fill_null(0)
        integral = df[rows[call.arg]].dtype.is_integer()
        t_k = pl.col(_c("ot", i)).fill_null(0) + (runs.cum_sum(weighted) if integral else weighted.cum_sum().over(**over))
        # a count at 0 resets its total (``SumAcc``): the running total must be 0 there too
        never_clamps = never_clamps & ((n_k != 0) | (t_k == 0)) & (~emptied | (n_k == 0))
        if call.func == "SUM":
            return pl.when(n_k > 0).then(t_k), never_clamps
        if integral:  # Java's long division truncates toward zero
            q = t_k.abs() // n_k
            return pl.when(n_k > 0).then(pl.when(t_k >= 0).then(q).otherwise(-q)), never_clamps
        return pl.when(n_k > 0).then(t_k / n_k), never_clamps

    def _retracted_extremes(
        self, df: pl.DataFrame, net: pl.DataFrame, rows: list[str], gids: Sequence[int], olds: Sequence[GroupState | None]
    ) -> pl.DataFrame:
        """For each MIN/MAX call, in the groups where its column gets a retraction (``$xr``):
        its value after each change (``$xv``) from the group's multiset at that change, and
        whether the columnar path computes what the per-key replay does (``$xok``).

        Derivation: the multiset after change ``k`` is the old one plus the changes up to
        ``k``. Split it into the values the batch touches, whose count after ``k`` is the old
        count plus a running sum of their changes' weights, and the others, whose extremes
        (``$ob``, ``_untouched_extremes``) do not move; the value after ``k`` is the extreme
        of those and of the touched values whose count is positive. Each change is paired
        with each value its group touches (a join on the group, in (value, change) order),
        so a group costs its changes times its values; a group above ``_PAIRS_PER_GROUP``
        goes per group. The calls over one column share the pairs: an untouched extreme of
        either kind is in the multiset, so both take part in both.

        The per-key path feeds values record by record in the canonical order, and at the
        end row by row in arrival order, dropping a value whose count reaches 0 or less:
        both agree with these sums only where no count can go below 0 in either order (a
        running count stays >= 0, and the old count plus the row's negative net weights
        too); and it starts a group again from nothing where it empties, which these sums
        match where the multiset is empty there. Elsewhere ``$xok`` is false."""
        by_column: dict[int, list[int]] = {}
        for i, call in enumerate(self.stage.aggs):
            if call.func in ("MIN", "MAX"):
                by_column.setdefault(call.arg, []).append(i)
        if not by_column or not olds:
            return df
        at = {g: n for n, g in enumerate(gids)}
        w = pl.col(WEIGHT)
        for column, calls in by_column.items():
            arg = rows[column]
            ranked = [_c("rank", i) for i in calls if _c("rank", i) in df.columns]
            value = ranked[0] if ranked else arg  # a string column's calls share one ranking
            retracting = (pl.col(arg).is_not_null() & (w < 0)).any().over(_G)
            part = df.filter(retracting)
            if part.is_empty():
                continue
            # the values each group touches, with their old counts
            touched = part.filter(pl.col(arg).is_not_null()).select(_G, *dict.fromkeys([arg, value])).unique(
                [_G, arg], maintain_order=True)
            counts = [olds[at[g]].accs[calls[0]].values.get(v, 0) if olds[at[g]] is not None else 0
                      for g, v in touched.select(_G, arg).iter_rows()]
            negs = net.filter((pl.col("$net") < 0) & pl.col(arg).is_not_null()).group_by(_G, arg).agg(
                pl.col("$net").sum().alias("$neg"))
            touched = touched.with_columns(pl.Series("$c0", counts, dtype=pl.Int64)).join(
                negs, on=[_G, arg], how="left", nulls_equal=False, maintain_order="left")
            never_below = touched.group_by(_G).agg((pl.col("$c0") + pl.col("$neg").fill_null(0) >= 0).all().alias("$nb"))
            # the untouched values' extremes: present at every change
            bases = [part.select(_G, pl.col(_c("ob", i)).alias("$v")) for i in calls]
            values = pl.concat([
                touched.select(_G, pl.col(value).alias("$v"), "$c0"),
                pl.concat(bases).unique().filter(pl.col("$v").is_not_null()).with_columns(pl.lit(1, pl.Int64).alias("$c0")),
            ], how="vertical_relaxed").sort(_G, "$v")
            sizes = part.group_by(_G).agg(pl.len().alias("$n")).join(
                values.group_by(_G).agg(pl.len().alias("$m")), on=_G, how="left")
            small = sizes.filter(pl.col("$n") * pl.col("$m").fill_null(0) <= _PAIRS_PER_GROUP).select(_G)
            changes = part.join(small, on=_G, how="semi").select(_G, _STEP, pl.col(value).alias("$vk"), WEIGHT)
            # per (group, value), its changes in order: a run per value row
            pairs = values.with_row_index("$gv").join(changes, on=_G, maintain_order="left_right")
            moved = pl.when(pl.col("$vk") == pl.col("$v")).then(w).otherwise(0)
            pairs = pairs.select(_G, _STEP, "$v", (pl.col("$c0") + Runs("$gv").cum_sum(moved)).alias("$cnt"))
            below = pairs.filter(pl.col("$cnt") < 0).select(_G).unique()
            extremes = pairs.filter(pl.col("$cnt") > 0).group_by(_G, _STEP).agg(
                *((pl.col("$v").max() if self.stage.aggs[i].func == "MAX" else pl.col("$v").min()).alias(_c("xv", i))
                  for i in calls)
            )
            ok = small.join(below, on=_G, how="anti").join(never_below, on=_G, how="left").select(
                _G, pl.col("$nb").fill_null(True).alias("$ok"))
            df = df.join(extremes, on=[_G, _STEP], how="left", maintain_order="left").join(
                ok, on=_G, how="left", maintain_order="left")
            empty_where_emptied = pl.all_horizontal((pl.col(_ROWS) > 0) | pl.col(_c("xv", i)).is_null() for i in calls)
            xok = (pl.col("$ok").fill_null(False) & empty_where_emptied).all().over(_G)
            df = df.with_columns(
                *(retracting.alias(_c("xr", i)) for i in calls), *(xok.alias(_c("xok", i)) for i in calls),
            ).drop("$ok")
        return df

    def _last_values(
        self, df: pl.DataFrame, rows: list[str], gids: Sequence[int], olds: Sequence[GroupState | None]
    ) -> pl.DataFrame:
        """For each LAST_VALUE call: its value after each change (``$lv``) and whether the
        columnar path computes what the per-key replay does (``$lok``).

        Derivation: ``LastValueAcc`` holds each active value's positions, a retraction takes
        a value's earliest, and the result is the value whose latest position is greatest
        (ties by ``repr``). Removing the earliest leaves the latest until none is left, so a
        value's latest position after change ``k`` is the greatest of its adds since its
        count last reached 0 (the old latest too, if it never did), and the value takes part
        while its count (old count plus a running sum of its changes) is positive. Each
        candidate is ranked by one integer, ``position rank * R + repr rank``:

        - a group without a retraction of a value: the result is the running greatest of
          the old result's rank and the batch's adds' ranks (canonical order puts a later
          position later, but an old position may be greater than the batch's);
        - a group with one: the candidates are the values the group's batch touches and
          the best old value it does not touch (its rank fixed); at each change, the
          greatest rank among the candidates with a positive count
          (``_last_value_pairs``). A group above ``_PAIRS_PER_GROUP`` (changes x
          candidates) goes per group.

        The per-key replay takes a retraction of a value with no active instance as a
        no-op, and a group that empties starts again from nothing: where a count could go
        below 0, or a group empties with a value left, ``$lok`` is false. So is it for every
        group where the column's values do not map one to one onto their ``repr``
        (``_LastValueRanks.of``)."""
        stage = self.stage
        calls = [i for i, call in enumerate(stage.aggs) if call.func == "LAST_VALUE"]
        if not calls:
            return df
        w = pl.col(WEIGHT)
        pos = [c for c in df.columns if c.startswith(POS_PREFIX)]
        done: dict[int, int] = {}  # column -> the call whose pass it had: calls over one column share it
        for i in calls:
            column = stage.aggs[i].arg
            if column in done:
                j = done[column]
                df = df.with_columns(pl.col(_c("lv", j)).alias(_c("lv", i)), pl.col(_c("lok", j)).alias(_c("lok", i)))
                continue
            done[column] = i
            arg = rows[column]
            valued = pl.col(arg).is_not_null()
            retracting = (valued & (w < 0)).any().over(_G)
            touched = dict(df.filter(retracting & valued).group_by(_G).agg(pl.col(arg).unique()).iter_rows())
            # per group, Python values of its old state: candidates (group, value, old count, old latest)
            cands: list[tuple[int, Any, int, tuple | None]] = []
            for g, st in zip(gids, olds):
                acc = st.accs[i] if st is not None else None
                seen = touched.get(g)
                if seen is None:  # no retraction: the old result stands for every old value
                    if acc is not None and acc.cur is not None:
                        cands.append((g, acc.cur[2], 1, acc.cur[0]))
                    continue
                old = acc.positions if acc is not None else {}
                for v in seen:
                    ps = old.get(v)
                    cands.append((g, v, len(ps) if ps else 0, ps[-1] if ps else None))
                skip = set(seen)
                best = max(((ps[-1], repr(v), v) for v, ps in old.items() if v not in skip), default=None)
                if best is not None:
                    cands.append((g, best[2], 1, best[0]))
            ranked = _LastValueRanks.of(df, arg, pos, cands)
            if ranked is None:  # values polars cannot tell apart as Python does: every group per group
                df = df.with_columns(pl.lit(None, df[arg].dtype).alias(_c("lv", i)),
                                     pl.lit(False).alias(_c("lok", i)))
                continue
            n = len(ranked.values)
            df = df.with_columns(ranked.batch.alias("$prank"), ranked.value_rank(pl.col(arg)).alias("$vrank"))
            cand = pl.DataFrame({
                _G: pl.Series([c[0] for c in cands], dtype=pl.Int64),
                "$v": pl.Series(ranked.candidates, dtype=pl.Int64),
                "$c0": pl.Series([c[2] for c in cands], dtype=pl.Int64),
                "$p0": pl.Series(ranked.old, dtype=pl.Int64),
            })
            key = pl.when(valued & (w > 0)).then(pl.col("$prank") * n + pl.col("$vrank"))
            # groups without a retraction: the running greatest rank from the old result's
            retracted = pl.col(_G).is_in(pl.Series(list(touched), dtype=pl.Int64).implode())
            base = cand.filter(~retracted).select(_G, (pl.col("$p0") * n + pl.col("$v")).alias("$k0"))
            df = df.join(base, on=_G, how="left", maintain_order="left")
            df = df.with_columns(pl.max_horizontal("$k0", key.cum_max().forward_fill().over(_G)).alias("$lk"))
            ok = pl.lit(True)
            if touched:
                df = self._last_value_pairs(df, cand.filter(retracted), key, n)
                ok = pl.col("$lok").fill_null(True)
            value = ranked.value_of(pl.col("$lk") % n)
            lok = (ok & ((pl.col(_ROWS) > 0) | pl.col("$lk").is_null())).all().over(_G)
            df = df.with_columns(value.alias(_c("lv", i)), lok.alias(_c("lok", i))).drop(
                "$prank", "$vrank", "$k0", "$lk", "$lok", strict=False)
        return df

    def _last_value_pairs(self, df: pl.DataFrame, cand: pl.DataFrame, key: pl.Expr, n: int) -> pl.DataFrame:
        """``_last_values`` in the groups with a retraction: ``$lk`` (the greatest rank of a
        value with a positive count) after each change; ``$lok`` false where a count goes
        below 0 or the group is too large. Each value's rank (-1 while its count is 0)
        moves only at its own changes: computed there, then carried to every change of the
        group by pairing the two and filling forward."""
        w = pl.col(WEIGHT)
        groups = cand.select(_G).unique()
        part = df.join(groups, on=_G, how="semi", maintain_order="left")
        sizes = part.group_by(_G).agg(pl.len().alias("$n")).join(
            cand.group_by(_G).agg(pl.len().alias("$m")), on=_G)
        small = sizes.filter(pl.col("$n") * pl.col("$m") <= _PAIRS_PER_GROUP).select(_G)
        cand = cand.join(small, on=_G, how="semi").sort(_G, maintain_order=True).with_row_index("$gv")
        part = part.join(small, on=_G, how="semi", maintain_order="left")
        # each value's changes, in order: its count and, where positive, its rank after each
        own = part.select(_G, _STEP, pl.col("$vrank").alias("$v"), WEIGHT, key.alias("$add")).drop_nulls("$v")
        own = own.join(cand, on=[_G, "$v"], how="left", maintain_order="left")
        cnt = pl.col("$c0") + w.cum_sum().over("$gv")
        own = own.with_columns(cnt.alias("$cnt"))
        # a segment starts after each change that leaves the count at 0: its adds are all that is left
        seg = (pl.col("$cnt") == 0).cast(pl.Int64).cum_sum().over("$gv")
        own = own.with_columns(seg.alias("$seg"))
        added = pl.col("$add").cum_max().forward_fill().over("$gv", "$seg")
        old = pl.when(pl.col("$seg") == 0).then(pl.col("$p0") * n + pl.col("$v"))
        own = own.with_columns(pl.when(pl.col("$cnt") > 0).then(pl.max_horizontal(old, added)).otherwise(-1)
                               .alias("$k"))
        below = own.filter(pl.col("$cnt") < 0).select(_G).unique()
        # every (value, change) pair of a group: the value's rank as of its last change so far
        steps = part.select(_G, _STEP)
        initial = pl.when(pl.col("$c0") > 0).then(pl.col("$p0") * n + pl.col("$v")).otherwise(-1)
        pairs = cand.select(_G, "$gv", initial.alias("$k0")).join(steps, on=_G, maintain_order="left_right")
        pairs = pairs.join(own.select("$gv", _STEP, "$k"), on=["$gv", _STEP], how="left", maintain_order="left")
        first = (pl.col("$gv") != pl.col("$gv").shift(1)).fill_null(True)
        rank = pl.when(pl.col("$k").is_not_null()).then(pl.col("$k")).when(first).then(pl.col("$k0"))
        best = pairs.select(_G, _STEP, rank.forward_fill().alias("$k")).group_by(_G, _STEP).agg(
            pl.col("$k").max().alias("$kx"))
        good = small.join(below, on=_G, how="anti").with_columns(pl.lit(True).alias("$lok"))
        ok = groups.join(good, on=_G, how="left").select(_G, pl.col("$lok").fill_null(False))
        df = df.join(best, on=[_G, _STEP], how="left", maintain_order="left").join(
            ok, on=_G, how="left", maintain_order="left")
        found = pl.when(pl.col("$kx") >= 0).then(pl.col("$kx"))
        return df.with_columns(pl.when(pl.col("$lok").is_not_null()).then(found).otherwise(pl.col("$lk"))
                               .alias("$lk")).drop("$kx")

    def _net_retractions(self, net: pl.DataFrame, rows: list[str]) -> pl.DataFrame:
        """Per group: for each SUM/AVG/COUNT call, the sum of the negative net weights of the
        distinct rows with a value (what the per-key path's feed could retract first)."""
        negs = [pl.lit(0).alias("$none")]
        for i, call in enumerate(self.stage.aggs):
            if call.func in ("SUM", "AVG", "COUNT") and not call.counts_rows and not uses_distinct(call):
                counted = (pl.col("$net") < 0) & pl.col(rows[call.arg]).is_not_null()
                negs.append(pl.when(counted).then(pl.col("$net")).otherwise(0).sum().alias(_c("neg", i)))
        return net.group_by(_G).agg(negs)

    def _distinct_steps(
        self, df: pl.DataFrame, net: pl.DataFrame, rows: list[str], gids: list[int], olds: list[GroupState | None]
    ) -> pl.DataFrame:
        """For each DISTINCT call: per change, how it moves the call's count of distinct
        values (``$dc``: +1 when its value's multiplicity goes 0 -> 1, -1 for 1 -> 0), from the
        multiplicities in the group's old state; and whether no multiplicity can drop below
        0 in any order (``$dok``: the per-key path clamps it)."""
        at = {g: n for n, g in enumerate(gids)}
        w = pl.col(WEIGHT)
        for i, call in enumerate(self.stage.aggs):
            if not uses_distinct(call):
                continue
            arg = rows[call.arg]
            pairs = df.select(_G, arg).filter(pl.col(arg).is_not_null()).unique()
            seen = [olds[at[g]].distinct[i] if olds[at[g]] is not None else None for g in pairs[_G].to_list()]
            old_n = [s.get(v, 0) if s is not None else 0 for s, v in zip(seen, pairs[arg].to_list())]
            negs = net.filter(pl.col("$net") < 0).group_by(_G, arg).agg(pl.col("$net").sum().alias("$nneg"))
            pairs = pairs.with_columns(pl.Series("$seen", old_n, dtype=pl.Int64)).join(negs, on=[_G, arg], how="left")
            df = df.join(pairs, on=[_G, arg], how="left", nulls_equal=False, maintain_order="left")
            after = pl.col("$seen") + w.cum_sum().over([_G, arg])
            before = after - w
            moves = pl.when((before == 0) & (after > 0)).then(1).when((before > 0) & (after == 0)).then(-1)
            valued = pl.col(arg).is_not_null()
            ok = ~valued | ((after >= 0) & (pl.col("$seen") + pl.col("$nneg").fill_null(0) >= 0))
            df = df.with_columns(
                pl.when(valued).then(moves.otherwise(0)).otherwise(0).alias(_c("dc", i)), ok.alias(_c("dok", i))
            ).drop("$seen", "$nneg")
        return df

    def _delta_exprs(self, rows: list[str]) -> list[pl.Expr]:
        """Per group: each SUM/AVG call's total and non-null count delta, each COUNT's."""
        out = []
        w = pl.col(WEIGHT)
        for i, call in enumerate(self.stage.aggs):
            if call.counts_rows or call.func in ("MIN", "MAX", "LAST_VALUE") or uses_distinct(call):
                continue
            arg = pl.col(rows[call.arg])
            out.append(pl.when(arg.is_not_null()).then(w).otherwise(0).sum().alias(_c("dn", i)))
            if call.func in ("SUM", "AVG"):
                out.append((arg * w).sum().alias(_c("dt", i)))
        return out

    def _added_values(self, steps: pl.DataFrame, rows: list[str]) -> dict[int, list[tuple[int, int, int]]]:
        """Per group id: (call, a change holding the value, net weight) for each value of a
        MIN/MAX or DISTINCT call the batch adds or retracts (the value is taken from the
        change: the per-key path's Python value)."""
        out: dict[int, list[tuple[int, int, int]]] = {}
        for i, call in enumerate(self.stage.aggs):
            if call.func not in ("MIN", "MAX") and not uses_distinct(call):
                continue
            arg = rows[call.arg]
            added = (
                steps.filter(pl.col(arg).is_not_null() & pl.col(_SIMPLE))
                .group_by(_G, arg, maintain_order=True)
                .agg(pl.col(_I).first(), pl.col(WEIGHT).sum())
                .select(_G, _I, WEIGHT)
            )
            for g, at, n in added.iter_rows():
                out.setdefault(g, []).append((i, at, n))
        return out

    def _last_value_members(self, steps: pl.DataFrame) -> dict[int, list[int]]:
        """Per group id on the columnar path: its change indexes, which a LAST_VALUE call's
        ``LastValueAcc`` takes as the per-key path gives them (their positions)."""
        if not any(call.func == "LAST_VALUE" for call in self.stage.aggs):
            return {}
        return dict(steps.filter(pl.col(_SIMPLE)).group_by(_G).agg(pl.col(_I)).iter_rows())

    # ------------------------------------------------------------------ one group's state and output

    def _apply(
        self,
        key: tuple,
        st: GroupState | None,
        g: dict[str, Any],
        added: Sequence[tuple[int, int, int]],
        members: Sequence[int],
        n_changes: int,
        changes: list[Change],
        states: dict,
    ) -> list[Change]:
        """A group on the columnar path: its deltas into its state, and the changes the
        stage's rules emit (``GroupAggregate.process_key``)."""
        stage = self.stage
        old = stage._output(key, st) if st is not None else None
        pos = changes[g["$max"]].pos
        if st is None:
            st = GroupState(stage.aggs)
        st.rows += g["$drows"]
        if st.rows == 0:
            states.pop(key, None)
            return diff_to_changes(old, None, pos)
        for i, call in enumerate(stage.aggs):
            acc = st.accs[i]
            if call.counts_rows:
                acc.update(None, g["$drows"])
            elif uses_distinct(call):
                continue  # fed value by value below
            elif call.func in ("SUM", "AVG"):
                dn = g[_c("dn", i)]
                if dn or g[_c("dt", i)]:
                    acc.total += g[_c("dt", i)] or 0
                    acc.n += dn
                    if acc.n <= 0:
                        acc.total, acc.n = 0, 0
            elif call.func == "COUNT":
                acc.update(None, g[_c("dn", i)])
            elif call.func == "LAST_VALUE":
                stage._apply_last_value(acc, call.arg, [changes[j] for j in members])
        for i, at, n in added:
            value = changes[at].row[stage.aggs[i].arg]
            seen = st.distinct[i]
            if seen is None:
                st.accs[i].update(value, n)
                continue
            before = seen[value]
            if before + n > 0:
                seen[value] = before + n
            else:
                seen.pop(value, None)
            if (before > 0) != (before + n > 0):
                st.accs[i].update(value, 1 if before == 0 else -1)
        states[key] = st
        new = stage._output(key, st)
        if n_changes == 1:
            return diff_to_changes(old, new, pos)
        first, last = g["$first"], g["$last"]
        if new == old:
            if last is None:
                return []
            return [Change(UPDATE_BEFORE, old, changes[first].pos), Change(UPDATE_AFTER, old, changes[last].pos)]
        return diff_to_changes(old, new, changes[last].pos if last is not None else pos)


def _ranked_extremes(df: pl.DataFrame, rows: list[str], aggs: Sequence[Any]) -> pl.DataFrame:
    """Polars has no running min/max of strings: a MIN/MAX call over strings is compared by
    each value's rank among the batch's, the old extremes' and the untouched extremes' values
    of its column, one ranking per column (``$rank``, and ``$ov`` and ``$ob`` replaced by
    their ranks)."""
    by_column: dict[int, list[int]] = {}
    for i, call in enumerate(aggs):
        if call.func in ("MIN", "MAX") and df[rows[call.arg]].dtype == pl.String:
            by_column.setdefault(call.arg, []).append(i)
    for column, calls in by_column.items():
        olds = [c for i in calls for c in (_c("ov", i), _c("ob", i)) if c in df.columns]
        ordered = pl.concat([df[rows[column]], *(df[c] for c in olds)]).drop_nulls().unique().sort()
        ranks = pl.Series(range(len(ordered)), dtype=pl.Int64)
        rank = pl.col(rows[column]).replace_strict(ordered, ranks, default=None)
        df = df.with_columns(
            *(rank.alias(_c("rank", i)) for i in calls),
            *(pl.col(c).replace_strict(ordered, ranks, default=None).alias(c) for c in olds),
        )
    return df


class _LastValueRanks:
    """The ranks ``_last_values`` compares by: positions (the batch's and the candidates' old
    ones, one dense ranking) and values (by ``repr``, as ``LastValueAcc`` breaks ties)."""

    def __init__(self, batch: pl.Series, old: list[int | None], values: pl.Series, candidates: list[int]) -> None:
        self.batch, self.old, self.values, self.candidates = batch, old, values, candidates

    @classmethod
    def of(cls, df: pl.DataFrame, arg: str, pos: list[str], cands: Sequence[tuple]) -> _LastValueRanks | None:
        """None when the column's values do not map one to one onto their Python values'
        ``repr`` (NaN, ``0.0`` beside ``-0.0``, one DECIMAL at two scales)."""
        column = df[arg]
        if column.dtype.is_float() and column.is_nan().any():
            return None
        by_repr = {repr(v): v for v in column.drop_nulls().unique().to_list()}
        for c in cands:
            by_repr.setdefault(repr(c[1]), c[1])
        order = sorted(by_repr)
        values = pl.Series(arg, [by_repr[r] for r in order], dtype=column.dtype, strict=False)
        if values.is_duplicated().any() or values.null_count():
            return None
        rank_of = {r: k for k, r in enumerate(order)}
        olds = [c[3] for c in cands if c[3] is not None]
        width = max([len(pos), *(len(p) for p in olds)])
        names = [f"{POS_PREFIX}{k}" for k in range(width)]
        batch = df.select(*(pl.col(c).cast(pl.Int64) for c in pos),
                          *(pl.lit(None, pl.Int64).alias(c) for c in names[len(pos):]))
        old = pl.DataFrame([[p[k] if k < len(p) else None for p in olds] for k in range(width)],
                           schema=dict.fromkeys(names, pl.Int64), orient="col")
        ranks, _ = position_ranks(pl.concat([batch, old]))
        old_ranks = iter(ranks[df.height:].to_list())
        return cls(ranks[: df.height], [next(old_ranks) if c[3] is not None else None for c in cands], values,
                   [rank_of[repr(c[1])] for c in cands])

    def value_rank(self, column: pl.Expr) -> pl.Expr:
        return column.replace_strict(self.values, pl.int_range(len(self.values), eager=True), default=None)

    def value_of(self, rank: pl.Expr) -> pl.Expr:
        return rank.replace_strict(pl.int_range(len(self.values), eager=True), self.values, default=None)


def _untouched_extremes(
    df: pl.DataFrame, arg: str, i: int, gids: Sequence[int], olds: Sequence[GroupState | None]
) -> tuple[list[Any], list[Any]]:
    """Per group: the smallest and the largest value of call ``i``'s old multiset among the
    values the batch does not touch, for the groups where the column gets a retraction
    (``_retracted_extremes``); None for the others and where no such value is left."""
    none = [None] * len(gids)
    retracting = df.filter(pl.col(arg).is_not_null() & (pl.col(WEIGHT) < 0)).select(_G).unique()
    if retracting.is_empty():
        return none, none
    touched = dict(df.join(retracting, on=_G, how="semi").filter(pl.col(arg).is_not_null())
                   .group_by(_G).agg(pl.col(arg).unique()).iter_rows())
    lows, highs = [], []
    for g, st in zip(gids, olds):
        seen = touched.get(g)
        skip = set(seen) if seen is not None and st is not None else None
        left = [v for v in st.accs[i].values if v not in skip] if skip is not None else []
        lows.append(min(left, default=None))
        highs.append(max(left, default=None))
    return lows, highs


def _decimal_avg(call: Any, dtype: pl.DataType | None) -> bool:
    return call.func == "AVG" and isinstance(dtype, pl.Decimal)


def _groups_of(stage: GroupAggregate, changes: list[Change]) -> dict[tuple, list[int]]:
    groups: dict[tuple, list[int]] = {}
    for i, c in enumerate(changes):
        groups.setdefault(stage.key_of(c), []).append(i)
    return groups


def _store(states: dict, key: tuple, new_state: GroupState | None) -> None:
    if new_state is None:
        states.pop(key, None)
    else:
        states[key] = new_state

