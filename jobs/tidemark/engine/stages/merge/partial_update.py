"""``partial-update``: a row is completed field by field across records.

Without sequence groups, every non-null value overwrites (nulls never do). With sequence
groups (``fields.<seq>[,<seq>...].sequence-group = <fields>``) a group's fields only change
when the record's sequence for that group is not all null and not older than the row's;
inside a group a field may have an aggregate function, and an *older* record still reaches
it (``agg_reversed``) so e.g. ``sum`` never loses a value to disorder. Fields outside any
group keep the non-null overwrite rule.

Retractions, as Paimon:
- ``ignore-delete``: dropped before they get here.
- sequence groups: a retraction whose group sequence is not older nulls the group's fields
  (or retracts them through their aggregate function) and advances the group's sequence;
  for an older one only aggregate functions retract. A ``-D`` whose group sequence field is
  listed in ``partial-update.remove-record-on-sequence-group`` removes the whole row.
- ``partial-update.remove-record-on-delete``: a ``-D`` removes the row (``-U`` is ignored).
A later add in the same fold starts the row again from what that add carries.

The comparisons within a group are done once per record against the row as it was before
the record: Paimon compares field by field while updating, which gives the same result
because it compares with ``>=``.
"""

from __future__ import annotations

from collections.abc import Sequence

from tidemark.engine.changelog import ADDS, DELETE
from tidemark.engine.stages.merge.aggregators import FieldAgg, MergeError
from tidemark.engine.stages.merge.options import MergeConfig
from tidemark.engine.stages.merge.ordering import Item, sequence_key


class PartialUpdateMerge:
    def __init__(self, cfg: MergeConfig):
        self.width = len(cfg.columns)
        self.columns = cfg.columns
        self.pk = frozenset(cfg.pk)
        self.value_fields = cfg.value_fields
        self.groups = cfg.groups
        grouped = {i for g in cfg.groups for i in g.seq_fields + g.members}
        #: fields outside any group, with their aggregator (only last_non_null_value or none)
        self.free: tuple[tuple[int, FieldAgg | None], ...] = tuple(
            (i, cfg.aggs.get(i)) for i in self.value_fields if i not in grouped
        )
        self.members: tuple[tuple[tuple[int, FieldAgg | None], ...], ...] = tuple(
            tuple((i, cfg.aggs.get(i)) for i in g.members) for g in cfg.groups
        )
        self.remove_on_delete = cfg.remove_record_on_delete
        self.remove_on_group = cfg.remove_record_on_sequence_group

    def merge(self, items: Sequence[Item]) -> tuple[tuple | None, tuple | None]:
        """(merged row, None), or (None, the ``-D`` that removed the row), or (None, None)
        when only retractions met a key without a row."""
        row: list = [None] * self.width
        touched: set[int] = set()
        deleted: tuple | None = None
        met_insert = False
        if items[0].is_state and items[0].kind in ADDS:
            # Fast path: the merged row comes first; applying it to an empty row gives the
            # row itself (group members are only ever set along with their sequence), so
            # copy it. Functions count as started only in groups that have a sequence.
            row = list(items[0].row)
            touched = {i for i, _ in self.free}
            for group, members in zip(self.groups, self.members):
                if any(row[s] is not None for s in group.seq_fields):
                    touched.update(i for i, _ in members)
            met_insert = True
            items = items[1:]
        for item in items:
            if item.kind in ADDS:
                deleted = None
                if self.groups:
                    self._update_with_groups(row, item, touched)
                else:
                    for i in self.value_fields:
                        v = item.row[i]
                        if v is not None:
                            row[i] = v
                met_insert = True
                continue
            deleted = None
            if self.groups:
                if self._retract_with_groups(row, item):
                    row = [None] * self.width
                    touched = set()
                    deleted = item.row
            elif self.remove_on_delete:
                if item.kind == DELETE:
                    row = [None] * self.width
                    touched = set()
                    deleted = item.row
            else:
                raise MergeError(
                    "merge-engine 'partial-update' cannot take retractions (-U/-D); set "
                    "'ignore-delete', 'partial-update.remove-record-on-delete' or sequence groups"
                )
        if deleted is not None:
            return None, deleted
        if not met_insert:
            return None, None
        return tuple(row), None

    def _update_with_groups(self, row: list, item: Item, touched: set[int]) -> None:
        values = item.row
        for i, agg in self.free:
            v = values[i]
            if agg is not None:
                row[i] = self._call(agg, "absorb" if item.is_state else "agg", i, row[i], v, touched)
            elif v is not None:
                row[i] = v
        for group, members in zip(self.groups, self.members):
            seq = group.seq_fields
            if all(values[s] is None for s in seq):
                continue  # the record says nothing about this group
            newer = sequence_key(values, seq) >= sequence_key(row, seq)
            if newer:
                for s in seq:
                    row[s] = values[s]
            for i, agg in members:
                v = values[i]
                if newer:
                    row[i] = v if agg is None else self._call(
                        agg, "absorb" if item.is_state else "agg", i, row[i], v, touched)
                elif agg is not None:
                    row[i] = self._call(
                        agg, "absorb_reversed" if item.is_state else "agg_reversed",
                        i, row[i], v, touched)

    def _retract_with_groups(self, row: list, item: Item) -> bool:
        """Applies a retraction; True when it removes the whole row."""
        values = item.row
        for group, members in zip(self.groups, self.members):
            seq = group.seq_fields
            if all(values[s] is None for s in seq):
                continue
            newer = sequence_key(values, seq) >= sequence_key(row, seq)
            if newer:
                if item.kind == DELETE and any(s in self.remove_on_group for s in seq):
                    return True
                for s in seq:
                    row[s] = values[s]
            for i, agg in members:
                if agg is not None:
                    try:
                        row[i] = agg.retract(row[i], values[i])
                    except MergeError as exc:
                        raise MergeError(f"column '{self.columns[i]}': {exc}") from None
                elif newer:
                    row[i] = None
        return False

    def _call(self, agg: FieldAgg, method: str, i: int, acc, v, touched: set[int]):
        try:
            out = getattr(agg, method)(acc, v, i not in touched)
        except MergeError as exc:
            raise MergeError(f"column '{self.columns[i]}': {exc}") from None
        touched.add(i)
        return out
