"""Flink 2.3's ``WatermarkCompactingSinkMaterializer`` replayed in Python, with provenance.

Why: the named Flink defect ``wcsm-nothing-stale-current-value`` must be *proven* on each
workload it excludes. Looking at values alone is not enough: a stale row Flink keeps can be
equal to another source row's copy that Flink had dropped, and then "Flink shows a row the
query does not produce" is silent. So this module replays Flink's own algorithm (read with
``javap -c`` from ``flink-table-runtime-2.3.0.jar``, see docs/conformance.md) on the records
the query sends to the sink - computed from scratch per source change by
``generate.lineage_changes``, each record tagged with the identity (source row, join pair,
group) it comes from - and

1. checks that the replay gives Flink's observed sink table after every step (so the replay
   *is* what Flink did on this workload, not a guess), and
2. finds the step where ``compactAndEmit`` took the "more than one row" branch with a current
   value although the current value had been removed from the compacted list (the defect),
   and shows that every identity the kept row may have come from no longer produces it at
   the end of that step: the sink shows a row that has been retracted.

Provenance under value matching is kept conservative: when a retraction removes (or cancels)
a row of another identity with the same value - Flink matches by value, so it cannot know
which copy is meant - the removed row's identities are added to every remaining row with
that value. A proof then needs *all* identities of the kept row to be retracted.

Flink's algorithm, per sink key (``currentValue`` + a buffer per watermark; one step here):

- buffering: an add cancels the earliest earlier retraction of the identical row in the
  buffer, a retraction the earliest earlier identical add; otherwise the record is appended;
- compaction: ``list = [currentValue]``; each buffered add replaces the first row with the
  same upsert key (with an upsert key) or is appended; each retraction removes the first row
  with the same upsert key, or the same value (not found: ignored);
- size > 1: ERROR throws; NOTHING emits ``list[0]`` as ``+I`` if there is no current value,
  else emits nothing and keeps the current value; size 1: ``+I``/``+U`` if it differs from
  the current value; size 0: ``-D`` of the current value.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import generate


@dataclass
class Item:
    row: tuple
    tags: set
    is_add: bool = True
    current: bool = False  # this list entry is the current value
    seq: int | None = None  # source position of the record that added it


@dataclass
class Stale:
    """One step where Flink kept a current value that its own compaction had removed."""
    batch: int
    key: tuple
    row: tuple
    tags: set
    since_batch: int  # the step that set the current value
    since_seq: int | None  # the source position of the add that set it
    removed_by: list[tuple[int, Any]]  # (seq, identity) of the retraction(s) that removed it
    active: list[tuple]  # rows still in the compacted list (what Flink drops)


@dataclass
class Replay:
    steps: list[list[list]] = field(default_factory=list)  # sink table after each step
    stale: list[Stale] = field(default_factory=list)
    conflict_batch: int | None = None  # ERROR: the step that throws


class _Key:
    """One sink key's state: the current value (row, tags, set-at step)."""

    def __init__(self) -> None:
        self.current: tuple | None = None
        self.tags: set = set()
        self.since = 0
        self.since_seq: int | None = None
        self.buffer: list[tuple[Item, int]] = []  # (item, seq)


def _match(row: tuple, other: tuple, upsert_key: tuple[int, ...] | None) -> bool:
    if upsert_key is None:
        return row == other
    return all(row[i] == other[i] for i in upsert_key)


def _spread(removed: Item, by_tags: set, rest: list[Item], upsert_key: tuple[int, ...] | None) -> None:
    """A retraction of ``by_tags`` removed ``removed``: if that was another identity's copy,
    the retracted identity's copy is one of the equal rows left, which may therefore be
    ``removed``'s identities."""
    extra = removed.tags - by_tags
    if not extra:
        return
    for it in rest:
        if it.is_add and _match(it.row, removed.row, upsert_key):
            it.tags |= extra


def replay(w: generate.Workload, upsert_key: tuple[int, ...] | None, pk: tuple[int, ...],
           strategy: str) -> Replay:
    """Run Flink's algorithm on the workload's query records, one step per batch."""
    keys: dict[tuple, _Key] = {}
    out = Replay()
    for b, changes in enumerate(generate.lineage_changes(w), start=1):
        touched: dict[tuple, None] = {}  # keys with records this step (a timer each)
        for seq, recs in changes:
            for is_add, row, ident in recs:
                k = tuple(row[i] for i in pk)
                st = keys.setdefault(k, _Key())
                touched[k] = None
                _buffer(st, Item(row, {ident}, is_add, seq=seq), seq)
        for k in touched:
            st = keys[k]
            if _compact(st, k, b, strategy, upsert_key, out) == "conflict":
                out.conflict_batch = b
                return out
            if st.current is None and not st.buffer:
                del keys[k]
        out.steps.append(sorted((list(st.current) for st in keys.values()),
                                key=lambda r: json.dumps(r, sort_keys=True, default=str)))
    return out


def _buffer(st: _Key, item: Item, seq: int) -> None:
    for i, (it, _) in enumerate(st.buffer):
        if it.is_add != item.is_add and it.row == item.row:  # Flink's recordEquals: full row
            del st.buffer[i]
            added, retracted = (it, item) if it.is_add else (item, it)
            rest = [x for x, _ in st.buffer]
            if st.current is not None:
                rest.append(Item(st.current, st.tags))  # shares st.tags: spreading updates it
            _spread(added, retracted.tags, rest, None)
            return
    st.buffer.append((item, seq))


def _compact(st: _Key, key: tuple, b: int, strategy: str, upsert_key: tuple[int, ...] | None,
             out: Replay) -> str | None:
    lst: list[Item] = []
    cur = Item(st.current, set(st.tags), current=True, seq=st.since_seq)  # tags spread into it
    if st.current is not None:
        lst.append(cur)
    removed_by: list[tuple[int, Any]] = []
    for it, seq in st.buffer:
        pos = next((i for i, x in enumerate(lst) if _match(x.row, it.row, upsert_key)), None)
        if it.is_add:
            if upsert_key is not None and pos is not None:
                if lst[pos].current:
                    removed_by.append((seq, sorted(it.tags, key=repr)))
                lst[pos] = Item(it.row, set(it.tags), seq=seq)  # in place: no longer the current value
            else:
                lst.append(Item(it.row, set(it.tags), seq=seq))
        elif pos is not None:
            gone = lst.pop(pos)
            if gone.current:
                removed_by.append((seq, sorted(it.tags, key=repr)))
            _spread(gone, it.tags, lst, upsert_key)
    st.buffer = []
    if len(lst) > 1:
        if strategy == "ERROR":
            return "conflict"
        if st.current is None:
            st.current, st.tags, st.since, st.since_seq = lst[0].row, lst[0].tags, b, lst[0].seq
            return None
        st.tags = cur.tags  # the current value is kept either way, with what was spread into it
        if not any(x.current for x in lst):
            out.stale.append(Stale(b, key, st.current, set(st.tags), st.since, st.since_seq, removed_by,
                                   [x.row for x in lst]))
        return None
    if not lst:
        st.current, st.tags, st.since_seq = None, set(), None
        return None
    only = lst[0]
    if st.current is None or only.row != st.current:
        st.current, st.tags, st.since, st.since_seq = only.row, only.tags, b, only.seq
    else:
        st.tags = st.tags | only.tags if not only.current else only.tags
    return None


def prove_stale_current_value(w: generate.Workload, flink_steps: list[list[list]],
                              canon) -> tuple[int, str] | tuple[None, str]:
    """``(batch, proof)`` when Flink provably shows a retracted row on this workload because
    of ``wcsm-nothing-stale-current-value``; ``(None, why not)`` otherwise."""
    from tidemark.engine.pipeline import compile_sql

    pipeline = compile_sql(w.sql)
    m = pipeline.materializer
    upsert_key = m.stage.upsert_key if m is not None else None
    pk = tuple(pipeline.sink.pk_indexes)
    rep = replay(w, upsert_key, pk, w.strategy)
    canon_steps = [canon(s) for s in rep.steps]
    n = min(len(canon_steps), len(flink_steps))
    for i in range(n):
        if canon_steps[i] != flink_steps[i]:
            return None, (f"the replay of Flink's algorithm differs from Flink after batch {i + 1} "
                          f"(replay {canon_steps[i]}, Flink {flink_steps[i]}): no proof")
    for s in rep.stale:
        if s.batch > n:
            break
        producing = [ident for ident, row in generate.lineage_after(w, s.batch)
                     if ident in s.tags and row == s.row]
        if producing:
            continue  # the kept row's source still produces it: Flink is right by luck
        what = generate.LINEAGE_IDENTITY[w.shape]
        others = sorted((ident for ident, row in generate.lineage_after(w, s.batch)
                         if row == s.row and ident not in s.tags), key=repr)
        coincidence = (f" ({what} {_names(set(others))} produce{'s' if len(others) == 1 else ''} an "
                       f"equal row, but Flink never took that copy as its current value: it dropped "
                       f"it or removed it)" if others else "")
        removed = "; ".join(f"{what} {_names(set(t))} at seq {q}" for q, t in s.removed_by)
        return s.batch, (
            f"after batch {s.batch}, sink key {list(s.key)}: Flink keeps showing {list(s.row)}, "
            f"set at batch {s.since_batch} by the add at seq {s.since_seq} from {what} "
            f"{_names(s.tags)}; in batch {s.batch} its compaction removed that row (retraction/"
            f"update by {removed}), was left with {len(s.active)} rows {[list(r) for r in s.active]} "
            f"and took the 'more than one row, current value set' branch, keeping it; at the end "
            f"of batch {s.batch} {what} {_names(s.tags)} no longer produces {list(s.row)}: the sink "
            f"shows a retracted row{coincidence}. (Replay of Flink's algorithm with provenance = Flink's table "
            f"after each of the {n} batches.)")
    return None, "no step keeps a current value whose every source was retracted"


def _names(tags: set) -> str:
    return " or ".join(repr(t) for t in sorted(tags, key=repr))
