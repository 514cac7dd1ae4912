"""The regular join (``tidemark.engine.stages.join``) under the batch contract: one polars pass
over (bucket state, left batch, right batch) that emits exactly what the per-key stage emits,
change for change, in the same order.

The per-key stage applies a key's input rows as *steps* in position order and, for each step,
walks the other side's rows: every joined row and every (un)padding is an *emission*. This
kernel computes the same emissions as columns, with the step order as a number:

- Consolidation and steps. Per side and distinct row: the net weight and the positions of its
  latest add and latest retraction (a group-by). A row gets at most two steps (the stage's
  ``_steps``: the net change, clamped to what state holds; or, for changes that cancel, the
  add/retract or retract/add "refresh" pair). Sorting all steps of the batch by (position,
  retractions first, side, the row's ``repr`` for ties only) numbers them: ``g``.
- A row's status at step ``g`` is arithmetic on its own at most two steps: its count
  (``cnt0`` plus the weights of its steps before ``g``), its position (of its latest add
  before ``g``), and its place in the other side's iteration order (``seq``: the stored
  insertion order, or, when the row was (re)created by a step before ``g``, after every
  stored row, in step order).
- Emissions. Candidate pairs are the equi-joined (changed row, any row) pairs of a key that
  pass the residual; each step of either row of a pair is an event, joined rows emitted with
  weight ``w * count of the other row`` and position ``max(step, other row's position)``.
  A row's number of passing partners (``$m``, stored) before a step is a running sum over
  its partners' steps in ``g`` order (a cumulative sum per row), from which the outer join's
  pad/un-pad emissions follow, at the moments the stage's loop produces them. Only padding
  reads it, so a join with no outer side neither computes nor moves it (stored as 0).
- Output. Per output row: net weight, greatest position, the sign and position of its first
  retraction and last add (the stage's refresh rule), the order of its first emission; per
  key: whether it both retracts and adds (``-U``/``+U`` vs ``-D``/``+I``). Keys come out in
  the order they first appear in the inputs (left batch, then right), as the per-key adapter
  groups them; within a key, retractions, then adds, then refresh pairs, each in first-emission
  order (``changelog.zset_to_changes``). Within a step the stage visits the other side's rows
  in insertion order: the order tuple of an emission is ``(g, seq of the other row, joined
  before pad)``, a step's own padding last.

NULL join keys never match: such rows are not stored; an outer side's rows pass through
padded, consolidated, in their first-appearance order (left, then right).

State: per side, the present rows with their count, position of latest add, passing partners
(``$m``) and insertion order (``$seq``); stored as one Arrow table (``state_to_table``) whose
``$side`` column says which side a row belongs to. Positions are compared as ranks over the
positions a call sees (batch and state), so one integer stands for a multi-column position.

The residual condition is evaluated per candidate pair on the joined Python row (the stage's
``RowPredicate``): no vectorized expression compiler exists yet.

Values compare as Arrow and polars compare them (``0.0`` and ``-0.0`` one key, one NaN equal
to another), the planner's typed columns; the per-key path compares Python values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import polars as pl
import pyarrow as pa

from tidemark.engine.arrow_types import python_values
from tidemark.engine.batch import KIND, POS_PREFIX, WEIGHT, ChangeBatch
from tidemark.engine.batch_columns import pos_columns, position_ranks
from tidemark.engine.driver import Bucket
from tidemark.engine.planner.rewrite import unique_names
from tidemark.engine.stage import BatchContext

if TYPE_CHECKING:
    from tidemark.engine.stages.join import Join

_W, _P, _I = "$w", "$p", "$i"  # weight, position rank, change index
_R = "$r"  # a stored row's index in its side's stored frame
_CNT, _M, _SEQ, _SIDE = "$cnt", "$m", "$seq", "$side"
_INF = 2**62  # a step's own padding comes after its walk over the other side


class JoinState:
    """One bucket of join state: per side a frame of present rows (``c0``... row columns,
    ``$cnt``, ``$m``, ``$seq`` and the position columns), or None."""

    __slots__ = ("sides",)

    def __init__(self, sides: Sequence[pl.DataFrame | None] = (None, None)) -> None:
        self.sides = list(sides)

    def next_wakeup(self) -> int | None:
        """A join has no timers (hosts ask every bucket, as of a ``Bucket``)."""
        return None


class JoinKernel:
    """``process_batch`` for a ``Join`` whose input schemas are known (module docstring)."""

    state_kind = "join"
    state_version = 1

    def __init__(self, stage: Join, schemas: tuple[pa.Schema, pa.Schema]) -> None:
        self.stage = stage
        self.name = stage.name
        self.n_inputs = 2
        self.schemas = schemas
        fields = [*schemas[0], *schemas[1]]
        names = unique_names([f.name for f in fields])  # the planner's already are; hand-built ones may repeat
        self.out_schema = pa.schema([f.with_name(n) for f, n in zip(fields, names)])

    # ------------------------------------------------------------------ typed state

    def empty_state(self) -> JoinState:
        return JoinState()

    def state_to_table(self, state: JoinState) -> pa.Table | None:
        parts = []
        for side, frame in enumerate(state.sides):
            if frame is None or frame.height == 0:
                continue
            prefix = "lr"[side]
            renamed = frame.rename({f"c{j}": f"{prefix}{j}" for j in range(len(self.schemas[side]))})
            parts.append(renamed.with_columns(pl.lit(side, pl.Int8).alias(_SIDE)))
        if not parts:
            return None
        table = pl.concat(parts, how="diagonal_relaxed").to_arrow()
        columns = [
            *(pa.field(f"l{j}", f.type) for j, f in enumerate(self.schemas[0])),
            *(pa.field(f"r{j}", f.type) for j, f in enumerate(self.schemas[1])),
            pa.field(_SIDE, pa.int8()),
            pa.field(_CNT, pa.int64()),
            pa.field(_M, pa.int64()),
            pa.field(_SEQ, pa.int64()),
            *(pa.field(n, pa.int64()) for n in table.column_names if n.startswith(POS_PREFIX)),
        ]
        for field in columns:  # the side without rows
            if field.name not in table.column_names:
                table = table.append_column(field.name, pa.nulls(table.num_rows, field.type))
        return _cast(table, pa.schema(columns))

    def state_from_table(self, table: pa.Table) -> JoinState:
        df = pl.from_arrow(table)
        pos = [c for c in df.columns if c.startswith(POS_PREFIX)]
        sides: list[pl.DataFrame | None] = []
        for side in (0, 1):
            prefix = "lr"[side]
            n = len(self.schemas[side])
            part = df.filter(pl.col(_SIDE) == side).select(
                *(pl.col(f"{prefix}{j}").alias(f"c{j}") for j in range(n)), _CNT, _M, _SEQ, *pos
            )
            sides.append(part if part.height else None)
        return JoinState(sides)

    # ------------------------------------------------------------------ processing

    def process_batch(
        self, inputs: Sequence[ChangeBatch], state: JoinState | Bucket, ctx: BatchContext
    ) -> tuple[JoinState, ChangeBatch]:
        if isinstance(state, Bucket):  # a host that has not stored anything yet
            if state.states:
                raise ValueError(f"stage '{self.name}': per-key join state cannot be read by the join kernel")
            state = JoinState()
        batches = [_side_frame(b, s) for b, s in zip(inputs, self.schemas)]
        if all(b.height == 0 for b in batches):
            return state, ChangeBatch(changes=[])
        run = _Run(self, batches, state)
        out, new_state, lost = run.execute()
        if lost:
            ctx.metrics["retractions_without_state"] += lost
        return new_state, out


class _Run:
    """One ``process_batch`` call's columnar work (module docstring)."""

    def __init__(self, kernel: JoinKernel, batches: list[pl.DataFrame], state: JoinState) -> None:
        self.kernel = kernel
        self.stage = kernel.stage
        self.widths = [len(s) for s in kernel.schemas]
        self.cols = [[f"c{j}" for j in range(w)] for w in self.widths]
        depth = max(
            [len(_pos_of(b)) for b in batches] + [len(_pos_of(f)) for f in state.sides if f is not None] + [1]
        )  # at least one column, all null for empty positions: positions join on it
        self.pos = pos_columns(depth)
        frames = [_pad_pos(b, self.pos) for b in batches]
        stored = [None if f is None else _pad_pos(f, self.pos) for f in state.sides]
        self.base = 1 + max((int(f[_SEQ].max()) for f in stored if f is not None and f.height), default=-1)
        self.key_names = [f"$k{j}" for j in range(len(self.stage.keys[0]))]
        self.key_types = self._key_types(frames)
        split = [self._split(side, f, frames) for side, f in enumerate(stored)]
        stored = [active for active, _ in split]
        self.untouched = [rest for _, rest in split]
        ranked, self.positions = _position_ranks([*frames, *(f for f in stored if f is not None)], self.pos)
        self.batches = ranked[:2]
        rest = iter(ranked[2:])
        self.stored = [None if f is None else next(rest) for f in stored]

    def _with_positions(self, frame: pl.DataFrame) -> pl.DataFrame:
        """``frame``'s ``$p`` ranks back as position columns."""
        return frame.drop(_P).hstack(self.positions[frame[_P]])

    # ------------------------------------------------------------------ the call

    def execute(self) -> tuple[ChangeBatch, JoinState, int]:
        universes = [self._universe(side) for side in (0, 1)]
        universes = self._with_key_groups(universes)
        lost = sum(int(u["$lost"].sum()) for u in universes)
        universes = self._number_steps(universes)
        pairs = self._pairs(universes)
        outer = any(self.stage.outer)  # ``$m`` decides only an outer side's padding
        if outer:
            universes = [self._with_m0(universes, pairs, side) for side in (0, 1)]
        else:
            universes = [u.with_columns(pl.lit(0, pl.Int64).alias("m0")) for u in universes]
        events = [self._events(pairs, universes, mover) for mover in (0, 1)]
        emissions = [self._null_key_emissions(universes)]
        emissions += [self._joined(ev) for ev in events]
        m_moves = [self._partner_moves(events, side) if outer else None for side in (0, 1)]
        for side in (0, 1):
            if self.stage.outer[side]:
                emissions.append(self._partner_pads(m_moves[side], side))
                emissions.append(self._self_pads(universes[side], m_moves[side], side))
        emitted = [e for e in emissions if e.height]
        out = self._output(pl.concat(emitted, how="vertical_relaxed") if emitted else None, universes)
        new_state = JoinState([self._new_side(universes[side], m_moves[side], side) for side in (0, 1)])
        return out, new_state, lost

    # ------------------------------------------------------------------ rows and steps

    def _universe(self, side: int) -> pl.DataFrame:
        """Every distinct row of the side that the batch or the state holds, with its stored
        values (``cnt0``, ``pos0``, ``m0``, ``seq0``) and the batch's net change of it."""
        cols = self.cols[side]
        batch = self.batches[side]
        stored = self.stored[side]
        parts = [] if stored is None else [stored]
        parts.append(batch)
        both = pl.concat(parts, how="diagonal_relaxed")
        for name, dtype in ((_CNT, pl.Int64), (_M, pl.Int64), (_SEQ, pl.Int64), (_W, pl.Int64), (_I, pl.Int64)):
            if name not in both.columns:
                both = both.with_columns(pl.lit(None, dtype).alias(name))
        # Stored rows are distinct, so a group holds at most one: its stored values are the
        # group's only non-null ones, and plain max/min aggregations (no filter inside the
        # groups, which polars runs several times slower) give them.
        w = pl.col(_W)
        both = both.with_columns(
            pl.when(pl.col(_CNT).is_not_null()).then(pl.col(_P)).alias("$stored_p"),
            pl.when(w > 0).then(pl.col(_P)).alias("$add_p"),
            pl.when(w < 0).then(pl.col(_P)).alias("$ret_p"),
        )
        u = both.group_by(cols, maintain_order=True).agg(
            pl.col(_CNT).sum().alias("cnt0"),
            pl.col("$stored_p").max().alias("pos0"),
            pl.col(_M).max().alias("m0"),
            pl.col(_SEQ).max().alias("seq0"),
            w.sum().alias("n"),
            pl.col("$add_p").max().alias("add_p"),
            pl.col("$ret_p").max().alias("ret_p"),
            pl.col(_I).min().alias("first_i"),
            *((pl.col(_R).max(),) if _R in both.columns else ()),
        )
        keys = [self.key_expr(side, j).alias(k) for j, k in enumerate(self.key_names)]
        u = u.with_row_index("id").with_columns(*keys)
        n, cnt0, add_p, ret_p = pl.col("n"), pl.col("cnt0"), pl.col("add_p"), pl.col("ret_p")
        null_key = pl.any_horizontal(*(pl.col(k).is_null() for k in self.key_names))
        cancel = (n == 0) & add_p.is_not_null() & ret_p.is_not_null() & ~null_key
        fwd = cancel & (add_p < ret_p)
        bwd = cancel & ~fwd & (cnt0 > 0)
        return u.with_columns(
            null_key.alias("null_key"),
            pl.when(null_key).then(0).when(n > 0).then(n).when(n < 0).then(pl.max_horizontal(n, -cnt0))
            .when(fwd).then(1).when(bwd).then(-1).otherwise(0).alias("w1"),
            pl.when(n > 0).then(add_p).when(n < 0).then(ret_p).when(fwd).then(add_p).when(bwd).then(ret_p).alias("p1"),
            pl.when(fwd).then(-1).when(bwd).then(1).otherwise(0).alias("w2"),
            pl.when(fwd).then(ret_p).when(bwd).then(add_p).alias("p2"),
            pl.when(n < 0, ~null_key).then(-(cnt0 + n)).otherwise(0).clip(lower_bound=0).alias("$lost"),
        ).with_columns(pl.col("w1", "w2").cast(pl.Int64))  # fmt: skip

    def key_expr(self, side: int, j: int) -> pl.Expr:
        return pl.col(f"c{self.stage.keys[side][j]}").cast(self.key_types[j])

    def _key_types(self, batches: list[pl.DataFrame]) -> list[pl.DataType]:
        """Per key column, the type both sides' values compare in (their supertype)."""
        types = []
        for a, b in zip(*self.stage.keys):
            left = batches[0].select(pl.col(f"c{a}").alias("k")).clear()
            right = batches[1].select(pl.col(f"c{b}").alias("k")).clear()
            types.append(pl.concat([left, right], how="vertical_relaxed")["k"].dtype)
        return types

    def _split(
        self, side: int, stored: pl.DataFrame | None, batches: list[pl.DataFrame]
    ) -> tuple[pl.DataFrame | None, pl.DataFrame | None]:
        """The side's stored rows that take part in this call, and the rest, each with its
        stored index (``$r``), so that the new state keeps the stored order.

        A stored row takes part when the batch changes it (the same row in its own side's
        batch) or a row it joins with (its key in the other side's batch). Any other stored
        row is in no candidate pair (a pair has a changed row, and the row's partners are
        unchanged), takes no step, and its partner count ``$m`` does not move: the call
        emits nothing for it and stores it as it was. Rows are matched whole by a join,
        which compares floats as the grouping in ``_universe`` may not (``-0.0``, NaN), so
        a side with float or nested columns is not split."""
        if stored is None or stored.height == 0 or not _splittable(self.kernel.schemas[side]):
            return stored, None
        stored = stored.with_row_index(_R)
        own, other = batches[side], batches[1 - side]
        keys = [self.key_expr(side, j).alias(k) for j, k in enumerate(self.key_names)]
        other_keys = other.select(self.key_expr(1 - side, j).alias(k) for j, k in enumerate(self.key_names))
        by_key = stored.select(_R, *keys).join(other_keys.unique(), on=self.key_names, how="semi")[_R]
        by_row = stored.select(_R, *self.cols[side]).join(
            own.select(self.cols[side]).unique(), on=self.cols[side], how="semi", nulls_equal=True
        )[_R]
        takes_part = stored[_R].is_in(pl.concat([by_key, by_row]).implode())
        rest = stored.filter(~takes_part)
        if rest.height == 0:
            return stored.drop(_R), None
        return stored.filter(takes_part), rest

    def _with_key_groups(self, universes: list[pl.DataFrame]) -> list[pl.DataFrame]:
        """``kg``: the order in which the key first appears in the inputs (left, then right)."""
        offset = self.batches[0].height
        firsts = pl.concat(
            [
                universes[0].filter(pl.col("first_i").is_not_null()).select(*self.key_names, "first_i"),
                universes[1].filter(pl.col("first_i").is_not_null()).select(*self.key_names, pl.col("first_i") + offset),
            ]
        )
        groups = firsts.group_by(self.key_names).agg(pl.col("first_i").min().alias("kg"))
        return [u.join(groups, on=self.key_names, how="left", nulls_equal=True, maintain_order="left") for u in universes]

    def _number_steps(self, universes: list[pl.DataFrame]) -> list[pl.DataFrame]:
        """``g1``/``g2``: each step's place in the batch's step order (module docstring)."""
        steps = pl.concat(
            [
                u.filter(pl.col(w) != 0).select(pl.lit(side, pl.Int8).alias("side"), "id", pl.lit(k).alias("k"),
                                                 pl.col(w).alias("w"), pl.col(p).alias("p"))
                for side, u in enumerate(universes)
                for k, w, p in ((1, "w1", "p1"), (2, "w2", "p2"))
            ],
            how="vertical_relaxed",
        )  # fmt: skip
        coarse = ["p", "add", "side"]
        steps = steps.with_columns((pl.col("w") > 0).alias("add"))
        tied = steps.select(pl.len().over(coarse) > 1).to_series()
        by = list(coarse)
        if tied.any():
            ties = steps.filter(tied)
            reprs = pl.Series("tie", [None] * steps.height, dtype=pl.String)
            texts: list[dict[int, str]] = []
            for side in (0, 1):
                ids = ties.filter(pl.col("side") == side)["id"]
                texts.append(dict(zip(ids.to_list(), (repr(r) for r in self._python_rows(universes[side], ids)))))
            values = [texts[s][i] for s, i in zip(ties["side"].to_list(), ties["id"].to_list())]
            steps = steps.with_columns(reprs.scatter(tied.arg_true(), values))
            by.append("tie")
        steps = steps.sort(by, nulls_last=False, maintain_order=True).with_row_index("g").with_columns(pl.col("g").cast(pl.Int64))
        out = []
        for side, u in enumerate(universes):
            mine = steps.filter(pl.col("side") == side)
            numbers = []
            for k in (1, 2):
                at = mine.filter(pl.col("k") == k)
                unnumbered = pl.repeat(None, u.height, dtype=pl.Int64, eager=True).alias(f"g{k}")
                numbers.append(unnumbered.scatter(at["id"], at["g"]))  # a universe's ``id`` is its row index
            out.append(u.with_columns(numbers))
        return out

    def _python_rows(self, universe: pl.DataFrame, ids: pl.Series) -> list[tuple]:
        """Rows of ``universe`` by id, as the per-key path holds them (Python tuples)."""
        cols = [c for c in universe.columns if c.startswith("c") and c[1:].isdigit()]
        picked = ids.to_frame("id").join(universe.select("id", *cols), on="id", how="left", maintain_order="left")
        arrow = picked.select(cols).to_arrow()
        values = [python_values(arrow.column(c)) for c in cols]
        return list(zip(*values)) if values else [() for _ in range(picked.height)]

    # ------------------------------------------------------------------ pairs and events

    def _pairs(self, universes: list[pl.DataFrame]) -> pl.DataFrame:
        """(l_id, r_id, kg) for every same-key pair with a step on either side that passes
        the residual; rows never present (a retraction of nothing) take no part."""
        live = [
            u.filter(~pl.col("null_key") & ((pl.col("cnt0") > 0) | (pl.col("w1") != 0)))
            .select("id", *self.key_names, "kg", (pl.col("w1") != 0).alias("changed"))
            for u in universes
        ]
        left, right = live
        a = left.filter("changed").join(right.drop("kg"), on=self.key_names, suffix="_r")
        b = left.filter(~pl.col("changed")).drop("kg").join(right.filter("changed"), on=self.key_names, suffix="_r")
        pairs = pl.concat(
            [a.select(pl.col("id").alias("l_id"), pl.col("id_r").alias("r_id"), "kg"),
             b.select(pl.col("id").alias("l_id"), pl.col("id_r").alias("r_id"), "kg")]
        )  # fmt: skip
        residual = self.stage.residual
        if residual is None or pairs.height == 0:
            return pairs
        lrows = dict(zip(pairs["l_id"].unique(maintain_order=True).to_list(),
                         self._python_rows(universes[0], pairs["l_id"].unique(maintain_order=True))))  # fmt: skip
        rrows = dict(zip(pairs["r_id"].unique(maintain_order=True).to_list(),
                         self._python_rows(universes[1], pairs["r_id"].unique(maintain_order=True))))  # fmt: skip
        keep = [bool(residual(lrows[a] + rrows[b])) for a, b in zip(pairs["l_id"].to_list(), pairs["r_id"].to_list())]
        return pairs.filter(pl.Series(keep, dtype=pl.Boolean))

    def _with_m0(self, universes: list[pl.DataFrame], pairs: pl.DataFrame, side: int) -> pl.DataFrame:
        """A row new to state gets ``m0``: its passing partners' stored counts."""
        mine, theirs = ("l_id", "r_id") if side == 0 else ("r_id", "l_id")
        other = universes[1 - side].select(pl.col("id").alias(theirs), "cnt0")
        partner_cnt = pairs.join(other, on=theirs).group_by(mine).agg(pl.col("cnt0").sum().alias("$m_new"))
        u = universes[side].join(partner_cnt, left_on="id", right_on=mine, how="left", maintain_order="left")
        return u.with_columns(pl.coalesce("m0", "$m_new", pl.lit(0, pl.Int64)).alias("m0")).drop("$m_new")

    def _events(self, pairs: pl.DataFrame, universes: list[pl.DataFrame], mover: int) -> pl.DataFrame:
        """One row per (pair, step of the ``mover`` side's row), with the other row's count,
        position and iteration place just before the step (module docstring)."""
        x_id, y_id = ("l_id", "r_id") if mover == 0 else ("r_id", "l_id")
        steps = pl.concat(
            [universes[mover].filter(pl.col(f"g{k}").is_not_null())
             .select(pl.col("id").alias(x_id), pl.col(f"g{k}").alias("g"), pl.col(f"w{k}").alias("w"),
                     pl.col(f"p{k}").alias("p"))
             for k in (1, 2)]
        )  # fmt: skip
        y = universes[1 - mover].select(
            pl.col("id").alias(y_id), "cnt0", "pos0", "seq0", "w1", "w2", "p1", "p2", "g1", "g2", "m0"
        )
        ev = pairs.join(steps, on=x_id).join(y, on=y_id, how="left")
        g = pl.col("g")
        before1, before2 = pl.col("g1") < g, pl.col("g2") < g
        w1, w2, cnt0 = pl.col("w1"), pl.col("w2"), pl.col("cnt0")
        create1 = (w1 > 0) & (cnt0 == 0)
        create2 = (w2 > 0) & (cnt0 + w1 == 0)
        return ev.select(
            "l_id", "r_id", "kg", "g", "w", "p", "m0",
            (cnt0 + pl.when(before1).then(w1).otherwise(0) + pl.when(before2).then(w2).otherwise(0)).alias("y_cnt"),
            pl.when(before2 & (w2 > 0)).then(pl.col("p2")).when(before1 & (w1 > 0)).then(pl.col("p1"))
            .otherwise(pl.col("pos0")).alias("y_pos"),
            pl.when(before2 & create2).then(self.base + pl.col("g2")).when(before1 & create1)
            .then(self.base + pl.col("g1")).otherwise(pl.col("seq0")).alias("y_seq"),
        )  # fmt: skip

    # ------------------------------------------------------------------ emissions

    def _joined(self, ev: pl.DataFrame) -> pl.DataFrame:
        return ev.filter(pl.col("y_cnt") > 0).select(
            "kg", pl.col("l_id").alias("a"), pl.col("r_id").alias("b"), (pl.col("w") * pl.col("y_cnt")).alias("w"),
            pl.max_horizontal("p", "y_pos").alias("pos"), pl.col("g").alias("o1"), pl.col("y_seq").alias("o2"),
            pl.lit(0).alias("o3"),
        )  # fmt: skip

    def _partner_moves(self, events: list[pl.DataFrame], side: int) -> pl.DataFrame:
        """The steps of ``side``'s rows' partners, per row in step order, with the row's
        passing-partner count just after each (``m_after``)."""
        mine = "l_id" if side == 0 else "r_id"
        ev = events[1 - side]  # the partner moved; the row of ``side`` is the event's other row
        return (
            ev.select(pl.col(mine).alias("id"), "kg", "g", "w", "p", "m0", "y_cnt", "y_pos", "y_seq")
            .sort("id", "g")
            .with_columns((pl.col("m0") + pl.col("w").cum_sum().over("id")).alias("m_after"))
        )

    def _partner_pads(self, moves: pl.DataFrame, side: int) -> pl.DataFrame:
        """(Un)padding of a present row when its passing-partner count leaves or reaches 0."""
        after = pl.col("m_after")
        before = after - pl.col("w")
        unpad = (before == 0) & (after > 0)
        repad = (before > 0) & (after == 0)
        flips = moves.filter((pl.col("y_cnt") > 0) & (unpad | repad))
        return flips.select(
            "kg", *self._pad_ids(pl.col("id"), side),
            pl.when(unpad).then(-pl.col("y_cnt")).otherwise(pl.col("y_cnt")).alias("w"),
            pl.max_horizontal("p", "y_pos").alias("pos"), pl.col("g").alias("o1"), pl.col("y_seq").alias("o2"),
            pl.lit(1).alias("o3"),
        )  # fmt: skip

    def _self_pads(self, universe: pl.DataFrame, moves: pl.DataFrame, side: int) -> pl.DataFrame:
        """A step of an outer side's row emits its padded row while it has no passing partner."""
        own = pl.concat(
            [universe.filter(pl.col(f"g{k}").is_not_null())
             .select("id", "kg", pl.col(f"g{k}").alias("g"), pl.col(f"w{k}").alias("w"), pl.col(f"p{k}").alias("p"))
             for k in (1, 2)]
        )  # fmt: skip
        stream = pl.concat(
            [own.select("id", "g", pl.lit(0, pl.Int64).alias("dw"), pl.lit(True).alias("own")),
             moves.select("id", "g", pl.col("w").cast(pl.Int64).alias("dw"), pl.lit(False).alias("own"))]
        ).sort("id", "g").with_columns(pl.col("dw").cum_sum().over("id").alias("moved"))  # fmt: skip
        at_own = stream.filter("own").select("id", "g", "moved")
        own = own.join(at_own, on=["id", "g"], how="left").join(universe.select("id", "m0"), on="id", how="left")
        return own.filter(pl.col("m0") + pl.col("moved") == 0).select(
            "kg", *self._pad_ids(pl.col("id"), side), "w", pl.col("p").alias("pos"), pl.col("g").alias("o1"),
            pl.lit(_INF, pl.Int64).alias("o2"), pl.lit(0).alias("o3"),
        )  # fmt: skip

    def _null_key_emissions(self, universes: list[pl.DataFrame]) -> pl.DataFrame:
        """Rows with a NULL key on an outer side, padded, consolidated (module docstring)."""
        parts = []
        for side in (0, 1):
            if not self.stage.outer[side]:
                continue
            u = universes[side].filter(pl.col("null_key") & (pl.col("n") != 0))
            all_null = pl.all_horizontal(*(pl.col(c).is_null() for c in self.cols[side]))
            a, b = self._pad_ids(pl.col("id"), side)
            parts.append(u.select(
                "kg",
                pl.when(all_null).then(-2).otherwise(a).alias("a"),
                pl.when(all_null).then(-2).otherwise(b).alias("b"),
                pl.col("n").alias("w"),
                pl.when(pl.col("n") > 0).then(pl.col("add_p")).otherwise(pl.col("ret_p")).alias("pos"),
                pl.lit(side, pl.Int64).alias("o1"), pl.col("first_i").alias("o2"), pl.lit(0).alias("o3"),
            ))  # fmt: skip
        return pl.concat(parts, how="vertical_relaxed") if parts else pl.DataFrame()

    @staticmethod
    def _pad_ids(ids: pl.Expr, side: int) -> tuple[pl.Expr, pl.Expr]:
        none = pl.lit(-1, pl.Int64)
        return (ids.cast(pl.Int64).alias("a"), none.alias("b")) if side == 0 else (none.alias("a"), ids.cast(pl.Int64).alias("b"))

    # ------------------------------------------------------------------ output and state

    def _output(self, emissions: pl.DataFrame | None, universes: list[pl.DataFrame]) -> ChangeBatch:
        if emissions is None:
            return ChangeBatch(changes=[])
        em = emissions.with_columns(pl.col(c).cast(pl.Int64) for c in ("a", "b", "w", "pos", "o1", "o2", "o3", "kg"))
        w, pos = pl.col("w"), pl.col("pos")
        # positions are ranks, never null: a masked column's first/last non-null is the filtered one
        em = em.with_columns(pl.when(w < 0).then(pos).alias("$ret"), pl.when(w > 0).then(pos).alias("$add"))
        rows = em.sort("kg", "a", "b", "o1", "o2", "o3").group_by("kg", "a", "b", maintain_order=True).agg(
            w.sum().alias("net"), pos.max().alias("pmax"), pl.col("o1").first(), pl.col("o2").first(),
            pl.col("o3").first(), (w.first() < 0).alias("first_neg"), (w.last() > 0).alias("last_add"),
            pl.col("$ret").first(ignore_nulls=True).alias("ret_pos"), pl.col("$add").last(ignore_nulls=True).alias("add_pos"),
        )  # fmt: skip
        net = pl.col("net")
        rows = rows.with_columns(((net < 0).any().over("kg") & (net > 0).any().over("kg")).alias("upd"))
        upd = pl.col("upd")
        changes = pl.concat(
            [
                rows.filter(net != 0).select(
                    "kg", "a", "b", "o1", "o2", "o3",
                    pl.when(net < 0).then(0).otherwise(1).alias("section"), pl.lit(0).alias("sub"),
                    pl.when(net < 0).then(pl.when(upd).then(pl.lit("-U")).otherwise(pl.lit("-D")))
                    .otherwise(pl.when(upd).then(pl.lit("+U")).otherwise(pl.lit("+I"))).alias(KIND),
                    net.alias(WEIGHT), pl.col("pmax").alias(_P),
                ),
                *(
                    rows.filter((net == 0) & pl.col("first_neg") & pl.col("last_add")).select(
                        "kg", "a", "b", "o1", "o2", "o3", pl.lit(2).alias("section"), pl.lit(sub).alias("sub"),
                        pl.lit(kind).alias(KIND), pl.lit(weight, pl.Int64).alias(WEIGHT), pl.col(at).alias(_P),
                    )
                    for sub, kind, weight, at in ((0, "-U", -1, "ret_pos"), (1, "+U", 1, "add_pos"))
                ),
            ]
        ).sort("kg", "section", "o1", "o2", "o3", "sub")  # fmt: skip
        if changes.height == 0:
            return ChangeBatch(changes=[])
        # a universe's row ``id`` is its index: gather the sides' values (a pad's other side: null)
        index = changes.select(pl.when(pl.col(c) >= 0).then(pl.col(c)).alias(c) for c in ("a", "b"))
        left = universes[0].select(pl.col(self.cols[0]).gather(index["a"]))
        right = universes[1].select(pl.col(c).gather(index["b"]).alias(f"r{c}") for c in self.cols[1])
        full = self._with_positions(changes.hstack(left).hstack(right))
        names = self.kernel.out_schema.names
        row_cols = [pl.col(c).alias(f"$o{j}") for j, c in enumerate([*self.cols[0], *(f"r{c}" for c in self.cols[1])])]
        table = full.select(*row_cols, KIND, WEIGHT, *self.pos).to_arrow()
        table = table.rename_columns([*names, KIND, WEIGHT, *self.pos])
        schema = pa.schema([*self.kernel.out_schema, pa.field(KIND, pa.string()), pa.field(WEIGHT, pa.int64()),
                            *(pa.field(p, pa.int64()) for p in self.pos)])  # fmt: skip
        return ChangeBatch.from_table(_cast(table, schema))

    def _new_side(self, universe: pl.DataFrame, moves: pl.DataFrame | None, side: int) -> pl.DataFrame | None:
        w1, w2, cnt0 = pl.col("w1"), pl.col("w2"), pl.col("cnt0")
        g1, g2 = pl.col("g1"), pl.col("g2")
        u = universe.filter(~pl.col("null_key"))
        if moves is None:
            u = u.with_columns(pl.lit(0, pl.Int64).alias("$moved"))
        else:
            moved = moves.group_by("id").agg(pl.col("w").sum().alias("$moved"))
            u = u.join(moved, on="id", how="left", maintain_order="left")
        create1 = (w1 > 0) & (cnt0 == 0)
        create2 = (w2 > 0) & (cnt0 + w1 == 0)
        new = u.filter(cnt0 + w1 + w2 > 0).select(
            *self.cols[side],
            (cnt0 + w1 + w2).alias(_CNT),
            (pl.col("m0") + pl.col("$moved").fill_null(0)).cast(pl.Int64).alias(_M),
            pl.when(g2.is_not_null() & create2).then(self.base + g2).when(g1.is_not_null() & create1)
            .then(self.base + g1).otherwise(pl.col("seq0")).cast(pl.Int64).alias(_SEQ),
            pl.when(w2 > 0).then(pl.col("p2")).when(w1 > 0).then(pl.col("p1")).otherwise(pl.col("pos0")).alias(_P),
            *((pl.col(_R),) if _R in u.columns else ()),
        )  # fmt: skip
        untouched = self.untouched[side]
        if untouched is not None:  # back in stored order, rows new to state after them (``_split``)
            new = pl.concat([untouched, self._with_positions(new)], how="diagonal_relaxed")
            return new.sort(_R, nulls_last=True, maintain_order=True).drop(_R)
        if new.height == 0:
            return None
        return self._with_positions(new).drop(_R, strict=False)


# ---------------------------------------------------------------------- helpers


def _splittable(schema: pa.Schema) -> bool:
    """Whether a side's rows can be matched whole by a join (``_Run._split``)."""
    return not any(pa.types.is_floating(f.type) or pa.types.is_nested(f.type) for f in schema)


def _pos_of(frame: pl.DataFrame) -> list[str]:
    return [c for c in frame.columns if c.startswith(POS_PREFIX)]


def _pad_pos(frame: pl.DataFrame, pos: list[str]) -> pl.DataFrame:
    missing = [pl.lit(None, pl.Int64).alias(p) for p in pos if p not in frame.columns]
    return frame.with_columns(*missing).with_columns(pl.col(p).cast(pl.Int64) for p in pos)


def _position_ranks(frames: list[pl.DataFrame], pos: list[str]) -> tuple[list[pl.DataFrame], pl.DataFrame]:
    """Each frame with its position columns replaced by ``$p``, a rank that compares as the
    positions do (field by field, nulls first: a shorter position sorts first); and the
    positions by rank (row ``$p`` of the second frame is that rank's position)."""
    allpos = pl.concat([f.select(pos) for f in frames])
    ranks, by_rank = position_ranks(allpos)
    ranks = ranks.alias(_P)
    ranked, offset = [], 0
    for f in frames:
        ranked.append(f.drop(pos).with_columns(ranks.slice(offset, f.height)))
        offset += f.height
    return ranked, by_rank


def _side_frame(batch: ChangeBatch, schema: pa.Schema) -> pl.DataFrame:
    """One input as ``c0``... row columns typed by ``schema``, ``$w``, ``$pos*`` and ``$i``
    (the index of the row's first change in the input)."""
    if batch.is_columnar:
        table = batch.table()
    else:
        table = ChangeBatch.from_changes(batch.changes(), schema).table()
    width = len(schema)
    names = table.column_names
    rows = table.select(list(range(width))).rename_columns([f"c{j}" for j in range(width)])
    rows = _cast(rows, pa.schema([pa.field(f"c{j}", f.type) for j, f in enumerate(schema)]))
    frame = pl.from_arrow(rows)
    if not isinstance(frame, pl.DataFrame):  # pragma: no cover - a table always gives a frame
        raise TypeError("expected a frame")
    weights = pl.from_arrow(table.column(WEIGHT))
    pos = [pl.from_arrow(table.column(n)).alias(n) for n in names if n.startswith(POS_PREFIX)]
    start = (weights.abs().cum_sum() - weights.abs()).alias(_I)
    return frame.with_columns(weights.alias(_W), *pos, start)


def _cast(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Polars widens some Arrow types (large strings, ...): back to the stored ones."""
    return table.select(schema.names).cast(schema)
