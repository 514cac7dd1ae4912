"""The lookup index of one source table: latest row per primary key, secondary indexes,
and (optionally) a bounded version history so a lookup can be answered *as of* an offset.

This is the data structure behind the index service (``tidemark.index``); it lives here,
free of HTTP and Kafka, so the same code answers in-process lookups in tests and replay.

Model. Records of a table's topic are applied in offset order per partition. Each record's
changes are one step: retractions (``-U``/``-D``) delete the key's row, then adds
(``+I``/``+U``) set it, so ``-U(old) +U(new)`` is an update and a Debezium update that
changes the primary key moves the row. An upsert tombstone (``-D`` of a key-only row)
deletes by key. ``applied[p]`` is the next offset to apply on partition ``p``: everything
below it is visible.

As-of lookups (``as_of={partition: offset}``: the state made of records with offsets below
``as_of[p]``; a partition missing from the fence contributes nothing) need the versions a
key had since the oldest fence a client may still ask for. With ``keep_history`` every key
keeps a list of versions ``(partition, offset, row | None, pos)``; ``release(horizon)``
says no client will ask for a fence below ``horizon`` any more, which drops every version
that a newer version below the horizon hides. Without history only the current version is
kept (and as-of lookups are refused).

Index postings map an index key to the primary keys that have (or, in retained history,
had) that index key, so both latest and as-of lookups touch only candidate keys.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from tidemark.engine.changelog import ADDS, Change

PRIMARY = "PRIMARY"

# one version of a key: (partition, offset, row or None for deleted, source position)
Version = tuple[int, int, "tuple | None", tuple]


class AsOfUnavailable(ValueError):
    """An as-of lookup the index cannot answer exactly (history disabled or released)."""


@dataclass(frozen=True)
class IndexSpec:
    name: str
    columns: tuple[int, ...]  # positions in the table's row


class TableIndex:
    def __init__(
        self,
        name: str,
        width: int,
        pk: Sequence[int],
        indexes: Iterable[IndexSpec] = (),
        keep_history: bool = True,
    ) -> None:
        if not pk:
            raise ValueError(f"table '{name}': an index needs a PRIMARY KEY")
        self.name = name
        self.width = width
        self.pk = tuple(pk)
        self.indexes: dict[str, IndexSpec] = {PRIMARY: IndexSpec(PRIMARY, self.pk)}
        for spec in indexes:
            self.indexes[spec.name] = spec
        self.keep_history = keep_history
        self.versions: dict[tuple, list[Version]] = {}
        self.postings: dict[str, dict[tuple, set[tuple]]] = {n: {} for n in self.indexes if n != PRIMARY}
        self.applied: dict[int, int] = {}
        self.horizon: dict[int, int] = {}
        # (offset that made an older version hidable, pk) per partition, in offset order
        self._superseded: dict[int, deque] = {}
        self.rows = 0  # keys whose current version is a row
        self.history_versions = 0  # versions kept beyond the current one

    # ------------------------------------------------------------------ writing

    def apply(self, changes: Sequence[Change], partition: int, offset: int) -> None:
        """Apply the changes of one record (or of one source position) at ``offset``."""
        retracts = [c for c in changes if c.kind not in ADDS]
        adds = [c for c in changes if c.kind in ADDS]
        for c in retracts:
            self._set(self._pk_of(c.row), None, partition, offset, c.pos)
        for c in adds:
            self._set(self._pk_of(c.row), c.row, partition, offset, c.pos)
        nxt = offset + 1
        if nxt > self.applied.get(partition, 0):
            self.applied[partition] = nxt

    def mark_applied(self, partition: int, next_offset: int) -> None:
        """Advance ``applied`` past offsets that carried no change (control records,
        transaction markers, Debezium tombstones)."""
        if next_offset > self.applied.get(partition, 0):
            self.applied[partition] = next_offset

    def _pk_of(self, row: tuple) -> tuple:
        return tuple(row[i] for i in self.pk)

    def _set(self, pk: tuple, row: tuple | None, partition: int, offset: int, pos: tuple) -> None:
        vs = self.versions.get(pk)
        cur = vs[-1][2] if vs else None
        if vs is None:
            if row is None:
                return  # deleting a key that does not exist
            vs = self.versions[pk] = []
        if cur is not None:
            self.rows -= 1
        if row is not None:
            self.rows += 1
        version = (partition, offset, row, pos)
        if not self.keep_history:
            if row is None:
                self._unpost(pk, vs)
                del self.versions[pk]
                return
            self._unpost(pk, vs)
            vs[:] = [version]
            self._post(pk, row)
            return
        if vs and vs[-1][0] == partition and vs[-1][1] == offset:
            vs[-1] = version  # a second change of one record: it replaces the first
        else:
            vs.append(version)
            if len(vs) > 1:
                self.history_versions += 1
                self._superseded.setdefault(partition, deque()).append((offset, pk))
        if row is not None:
            self._post(pk, row)

    def _post(self, pk: tuple, row: tuple) -> None:
        for name, postings in self.postings.items():
            ikey = tuple(row[i] for i in self.indexes[name].columns)
            postings.setdefault(ikey, set()).add(pk)

    def _unpost(self, pk: tuple, versions: list[Version]) -> None:
        for name, postings in self.postings.items():
            cols = self.indexes[name].columns
            for v in versions:
                if v[2] is None:
                    continue
                ikey = tuple(v[2][i] for i in cols)
                s = postings.get(ikey)
                if s is not None:
                    s.discard(pk)
                    if not s:
                        del postings[ikey]

    def release(self, horizon: Mapping[int, int]) -> int:
        """No lookup will ask for a fence below ``horizon[p]`` any more: drop versions
        hidden below it. Returns how many versions were dropped."""
        dropped = 0
        for p, h in horizon.items():
            if h <= self.horizon.get(p, 0):
                continue
            self.horizon[p] = h
            queue = self._superseded.get(p)
            while queue and queue[0][0] < h:
                _, pk = queue.popleft()
                dropped += self._prune(pk)
        return dropped

    def _prune(self, pk: tuple) -> int:
        vs = self.versions.get(pk)
        if not vs:
            return 0
        hidden_below = lambda v: v[1] < self.horizon.get(v[0], 0)  # noqa: E731
        # the newest version below the horizon is what every allowed fence sees first
        keep_from = max((i for i, v in enumerate(vs) if hidden_below(v)), default=0)
        rest = vs[keep_from:]
        while rest and rest[0][2] is None and hidden_below(rest[0]):
            rest = rest[1:]  # deleted before every allowed fence: same as absent
        if len(rest) == len(vs):
            return 0
        self._unpost(pk, vs)
        dropped = (len(vs) - 1) - max(len(rest) - 1, 0)
        self.history_versions -= dropped
        if rest:
            self.versions[pk] = rest
            for v in rest:
                if v[2] is not None:
                    self._post(pk, v[2])
        else:
            del self.versions[pk]
        return len(vs) - len(rest)

    # ------------------------------------------------------------------ reading

    def caught_up(self, offsets: Mapping[int, int]) -> bool:
        """True when every record below ``offsets[p]`` has been applied."""
        return all(self.applied.get(p, 0) >= off for p, off in offsets.items())

    def check_as_of(self, as_of: Mapping[int, int]) -> None:
        if not self.keep_history:
            raise AsOfUnavailable(f"table '{self.name}': the index keeps no history, so it cannot answer as of offsets")
        for p, off in as_of.items():
            if off < self.horizon.get(p, 0):
                raise AsOfUnavailable(
                    f"table '{self.name}': as_of offset {off} of partition {p} is below the released "
                    f"history (kept from offset {self.horizon[p]})"
                )

    def lookup(
        self, index: str, keys: Sequence[tuple], as_of: Mapping[int, int] | None = None
    ) -> list[list[tuple[tuple, tuple]]]:
        """For each key, the rows (with their source positions) whose index columns equal
        it: the latest ones, or those visible at the ``as_of`` fence."""
        spec = self.indexes.get(index)
        if spec is None:
            raise KeyError(f"table '{self.name}' has no index '{index}' (it has: {', '.join(self.indexes)})")
        if as_of is not None:
            self.check_as_of(as_of)
        out: list[list[tuple[tuple, tuple]]] = []
        for key in keys:
            key = tuple(key)
            if len(key) != len(spec.columns):
                raise ValueError(
                    f"index '{index}' of table '{self.name}' has {len(spec.columns)} column(s); "
                    f"got a key of {len(key)} value(s): {list(key)!r}"
                )
            if index == PRIMARY:
                candidates: Iterable[tuple] = (key,) if key in self.versions else ()
            else:
                candidates = self.postings[index].get(key, ())
            found = []
            for pk in candidates:
                v = self._visible(self.versions[pk], as_of)
                if v is not None and v[2] is not None and tuple(v[2][i] for i in spec.columns) == key:
                    found.append((v[2], v[3]))
            out.append(found)
        return out

    @staticmethod
    def _visible(vs: list[Version], as_of: Mapping[int, int] | None) -> Version | None:
        if as_of is None:
            return vs[-1]
        for v in reversed(vs):
            if v[1] < as_of.get(v[0], 0):
                return v
        return None
