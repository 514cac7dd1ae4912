"""Property tests (hypothesis) for every stage, on generated valid changelogs.

A valid changelog here is what a source table produces: per row identity, an insert, then
updates (``-U`` old / ``+U`` new at one position) and maybe a delete, so every retraction
comes after its add. It is cut into batches at random points (pairs may be split).

Properties:
- shuffling the records inside each batch (and the order of keys) changes neither any
  batch's output nor the final state;
- each stage's output, accumulated as a Z-set, equals a from-scratch recomputation on the
  accumulated input (join/aggregate/normalize/deduplicate of the whole input so far) — the
  strongest oracle: it checks every emitted change at once;
- the materializer's state never holds a retracted row (DEDUPLICATE: it holds exactly the
  active rows; NOTHING/ERROR: its row is active), and what the sink shows is its state.
"""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from stage_harness import Harness
from tidemark.engine.changelog import Change, zset
from tidemark.engine.errors import ConflictError
from tidemark.engine.stages.aggregate import AggCall, GroupAggregate
from tidemark.engine.stages.join import Join
from tidemark.engine.stages.materializer import ActiveRows, SinkMaterializer
from tidemark.engine.stages.normalize import Normalize

SETTINGS = settings(max_examples=150, deadline=None)


# --- generators -----------------------------------------------------------------------


def table_changelog(steps, make_row, first_pos=0) -> list[Change]:
    """Turn (identity, values, delete?) steps into a valid retract changelog."""
    current: dict = {}
    out: list[Change] = []
    for i, (ident, vals, delete) in enumerate(steps):
        pos = (first_pos + i,)
        row = make_row(ident, vals)
        old = current.get(ident)
        if old is None:
            if not delete:
                out.append(Change("+I", row, pos))
                current[ident] = row
        elif delete:
            out.append(Change("-D", old, pos))
            del current[ident]
        elif old != row:
            out += [Change("-U", old, pos), Change("+U", row, pos)]
            current[ident] = row
    return out


def cut(changes: list, flags: list[bool]) -> list[list]:
    batches, cur = [], []
    for ch, f in zip(changes, flags):
        cur.append(ch)
        if f:
            batches.append(cur)
            cur = []
    return batches + [cur] if cur else batches


small = st.integers(0, 3)
maybe_null = st.one_of(st.none(), st.integers(-3, 3))


@st.composite
def batched(draw, changes: list) -> list[list]:
    flags = draw(st.lists(st.booleans(), min_size=len(changes), max_size=len(changes)))
    return cut(changes, flags)


# --- running ----------------------------------------------------------------------------


def run_all(stage, batches: list[list[list[Change]]], rng: random.Random | None):
    h = Harness(stage)
    outs = [sorted(h.run(*b, shuffle=rng), key=repr) for b in batches]
    return h, outs


def canon_state(state) -> object:
    if isinstance(state, ActiveRows):
        return (state.rows_in_order(), {k: (n.row, n.pos, n.copies) for k, n in state.nodes.items()})
    if hasattr(state, "accs"):  # GroupState
        return (state.rows, [getattr(a, "positions", None) for a in state.accs])
    return state


def assert_shuffle_invariant(stage, batches, seed):
    h1, out1 = run_all(stage, batches, None)
    h2, out2 = run_all(stage, batches, random.Random(seed))
    assert out1 == out2
    assert {k: canon_state(s) for k, s in h1.state.items()} == {k: canon_state(s) for k, s in h2.state.items()}
    return h1


# --- normalize --------------------------------------------------------------------------


@st.composite
def upsert_stream(draw):
    steps = draw(st.lists(st.tuples(small, small, st.booleans()), max_size=30))
    changes = [
        Change("-D", (k, None), (i,)) if d else Change("+U", (k, v), (i,))
        for i, (k, v, d) in enumerate(steps)
    ]
    return [[b] for b in draw(batched(changes))], changes


@SETTINGS
@given(upsert_stream(), st.integers())
def test_normalize(data, seed):
    batches, changes = data
    h = assert_shuffle_invariant(Normalize(pk=(0,), width=2), batches, seed)
    last = {}
    for ch in changes:  # positions are unique and increasing: the last record wins
        last[ch.row[0]] = ch.row if ch.is_add else None
    assert h.table() == Counter({r: 1 for r in last.values() if r is not None})


# --- aggregate --------------------------------------------------------------------------

AGGS = [
    AggCall("SUM", 1),
    AggCall("COUNT", 1),
    AggCall("COUNT_STAR"),
    AggCall("MIN", 1),
    AggCall("MAX", 1),
    AggCall("AVG", 1),
    AggCall("LAST_VALUE", 1),
    AggCall("SUM", 1, distinct=True),
    AggCall("COUNT", 1, distinct=True),
]


@st.composite
def projected_changelog(draw):
    """(group, value) rows projected from a table keyed by id: identical rows do occur."""
    steps = draw(st.lists(st.tuples(small, st.tuples(st.integers(0, 2), maybe_null), st.booleans()), max_size=30))
    changes = table_changelog(steps, lambda ident, vals: vals)
    return [[b] for b in draw(batched(changes))], changes


def aggregate_oracle(changes: list[Change]) -> Counter:
    rows = zset(changes)
    groups: dict = {}
    for (g, v), w in rows.items():
        groups.setdefault(g, []).extend([v] * w)
    # LAST_VALUE: all adds of a value minus its earliest k, k = its retractions
    adds: dict = {}
    rets: Counter = Counter()
    for ch in changes:
        g, v = ch.row
        if v is None:
            continue
        if ch.is_add:
            adds.setdefault((g, v), []).append(ch.pos)
        else:
            rets[(g, v)] += 1
    latest: dict = {}
    for (g, v), ps in adds.items():
        alive = sorted(ps)[rets[(g, v)]:]
        if alive and (g not in latest or (alive[-1], repr(v)) > latest[g][:2]):
            latest[g] = (alive[-1], repr(v), v)
    out = Counter()
    for g, vs in groups.items():
        nn = [v for v in vs if v is not None]
        s = sum(nn) if nn else None
        avg = None if not nn else (abs(s) // len(nn)) * (1 if s >= 0 else -1)
        distinct = set(nn)
        out[(g, s, len(nn), len(vs), min(nn, default=None), max(nn, default=None), avg,
             latest[g][2] if g in latest else None,
             sum(distinct) if distinct else None, len(distinct))] = 1
    return out


@SETTINGS
@given(projected_changelog(), st.integers())
def test_aggregate(data, seed):
    batches, changes = data
    h = assert_shuffle_invariant(GroupAggregate(group_by=(0,), aggs=AGGS), batches, seed)
    assert h.table() == aggregate_oracle(changes)


# --- join -------------------------------------------------------------------------------


@st.composite
def two_sided(draw):
    """Left (id, key) keyed by id; right (key, val) projected from a table keyed by id, so
    duplicate right rows occur. Keys include NULL. Steps interleave the two sides."""
    key = st.one_of(st.none(), st.integers(0, 2))
    steps = draw(st.lists(st.tuples(st.booleans(), small, key, small, st.booleans()), max_size=30))
    per_side: list[list[Change]] = [[], []]
    for side in (0, 1):
        # global step index as position, so the two sides interleave
        mine = [(i, s) for i, s in enumerate(steps) if s[0] == (side == 1)]
        current: dict = {}
        for i, (_, ident, k, v, d) in mine:
            row = (ident, k) if side == 0 else (k, v)
            pos = (i,)
            old = current.get(ident)
            if old is None:
                if not d:
                    per_side[side].append(Change("+I", row, pos))
                    current[ident] = row
            elif d:
                per_side[side].append(Change("-D", old, pos))
                del current[ident]
            elif old != row:
                per_side[side] += [Change("-U", old, pos), Change("+U", row, pos)]
                current[ident] = row
    allc = sorted([(ch.pos, s, ch) for s in (0, 1) for ch in per_side[s]], key=lambda t: (t[0], t[1]))
    flags = draw(st.lists(st.booleans(), min_size=len(allc), max_size=len(allc)))
    batches, cur = [], [[], []]
    for (_, s, ch), f in zip(allc, flags):
        cur[s].append(ch)
        if f:
            batches.append(cur)
            cur = [[], []]
    batches.append(cur)
    return batches, per_side


def join_oracle(kind: str, left: Counter, right: Counter, residual) -> Counter:
    out = Counter()
    matched_r: Counter = Counter()
    for lrow, lw in left.items():
        m = 0
        for r, rw in right.items():
            if lrow[1] is not None and lrow[1] == r[0] and (residual is None or residual(lrow + r)):
                out[lrow + r] += lw * rw
                m += rw
                matched_r[r] += 1
        if m == 0 and kind in ("left", "full"):
            out[lrow + (None, None)] += lw
    if kind in ("right", "full"):
        for r, rw in right.items():
            if matched_r[r] == 0:
                out[(None, None) + r] += rw
    return +out


@SETTINGS
@given(two_sided(), st.sampled_from(["inner", "left", "right", "full"]), st.booleans(), st.integers())
def test_join(data, kind, with_residual, seed):
    batches, per_side = data
    residual = (lambda row: row[0] != row[3]) if with_residual else None  # left.id <> right.val
    stage = Join(kind, (1,), (0,), 2, 2, residual=residual)
    h = assert_shuffle_invariant(stage, batches, seed)
    assert h.table() == join_oracle(kind, zset(per_side[0]), zset(per_side[1]), residual)
    assert all(w > 0 for w in h.table().values())


# --- materializer -----------------------------------------------------------------------


@st.composite
def sink_changelog(draw):
    """Rows (sink pk, upsert key, value): upsert key u is the source PK; the sink PK is a
    non-key column, so several upsert keys compete for one sink PK."""
    steps = draw(st.lists(st.tuples(small, st.tuples(st.integers(0, 1), st.integers(0, 2)), st.booleans()), max_size=30))
    changes = table_changelog(steps, lambda u, vals: (vals[0], u, vals[1]))
    return [[b] for b in draw(batched(changes))], changes


@SETTINGS
@given(sink_changelog(), st.sampled_from(["DEDUPLICATE", "NOTHING", "ERROR"]), st.booleans(), st.integers())
def test_materializer(data, strategy, with_upsert_key, seed):
    batches, _ = data
    stage = SinkMaterializer("t", (0,), ("pk",), (1,) if with_upsert_key else None, strategy)
    plain, shuffled = Harness(stage), Harness(stage)
    rng = random.Random(seed)
    seen: list[Change] = []
    for (batch,) in batches:
        seen += batch
        active = zset(seen)
        by_pk: dict = {}
        for row, w in active.items():
            assert w == 1
            by_pk.setdefault(row[0], []).append(row)
        if strategy == "ERROR" and any(len(rows) > 1 for rows in by_pk.values()):
            for h in (plain, shuffled):
                try:
                    h.run(batch)
                except ConflictError as err:
                    assert len(by_pk[err.pk["pk"]]) > 1
                else:
                    raise AssertionError("two active rows for one PK must raise")
            return
        out1 = sorted(plain.run(batch), key=repr)
        out2 = sorted(shuffled.run(list(batch), shuffle=rng), key=repr)
        assert out1 == out2
        for key, state in plain.state.items():
            assert canon_state(state) == canon_state(shuffled.state[key])
            if isinstance(state, ActiveRows):
                # DEDUPLICATE holds exactly the active rows, never a retracted one
                assert sorted(state.rows_in_order()) == sorted(by_pk[key[0]])
                assert state.rows_in_order() == sorted(by_pk[key[0]], key=lambda r: pos_of(seen, r))
            else:
                assert state.row in active, "state holds a retracted row"
        assert set(shuffled.state) == set(plain.state)
        # what the sink shows is exactly the state's visible row
        visible = Counter(
            {(s.latest() if isinstance(s, ActiveRows) else s.row): 1 for s in plain.state.values()}
        )
        assert plain.table() == visible
        if strategy == "DEDUPLICATE":  # from scratch: latest active row per PK
            expect = Counter({max(rows, key=lambda r: pos_of(seen, r)): 1 for rows in by_pk.values()})
            assert plain.table() == expect
        if strategy == "ERROR":
            assert plain.table() == Counter({rows[0]: 1 for rows in by_pk.values()})


def pos_of(changes: list[Change], row: tuple) -> tuple:
    """Position of the add that made ``row`` active (the last add of that row)."""
    return max(ch.pos for ch in changes if ch.row == row and ch.is_add)


@st.composite
def projected_sink_changelog(draw):
    """(name, v) projected from a source table keyed by id, sink PK name and no upsert key:
    several source rows give identical sink rows, so the sink holds copies of one value."""
    name = st.sampled_from([0, 0, 0, 1])  # mostly one PK: copies meet often
    steps = draw(st.lists(st.tuples(small, st.tuples(name, st.integers(0, 1)), st.booleans()), min_size=4, max_size=30))
    changes = table_changelog(steps, lambda ident, vals: vals)
    return [[b] for b in draw(batched(changes))], changes


def flink_list_model(changes: list[Change]) -> Counter:
    """Flink 2.3's SinkUpsertMaterializer without an upsert key, one record at a time in
    position order (the -U of an update before its +U): an add appends to the PK's list, a
    retraction removes the first equal row, the sink shows the last row of the list."""
    lists: dict = {}
    for ch in sorted(changes, key=lambda ch: (ch.pos, ch.is_add)):
        rows = lists.setdefault(ch.row[0], [])
        if ch.is_add:
            rows.append(ch.row)
        else:
            rows.remove(ch.row)
    return Counter({rows[-1]: 1 for rows in lists.values() if rows})


@SETTINGS
@given(projected_sink_changelog(), st.integers())
def test_deduplicate_identical_copies_match_flink(data, seed):
    batches, _ = data
    stage = SinkMaterializer("t", (0,), ("name",), None, "DEDUPLICATE")
    plain, shuffled = Harness(stage), Harness(stage)
    rng = random.Random(seed)
    seen: list[Change] = []
    for (batch,) in batches:
        seen += batch
        out1 = sorted(plain.run(batch), key=repr)
        out2 = sorted(shuffled.run(list(batch), shuffle=rng), key=repr)
        assert out1 == out2
        assert {k: canon_state(s) for k, s in plain.state.items()} == {
            k: canon_state(s) for k, s in shuffled.state.items()
        }
        assert plain.table() == flink_list_model(seen)
        # the state holds exactly the active copies
        copies = Counter({row: len(s.copies(row)) for s in plain.state.values() for row in s.rows_in_order()})
        assert copies == zset(seen)
