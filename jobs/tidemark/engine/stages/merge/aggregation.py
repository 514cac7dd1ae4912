"""``aggregation``: every value field folds with its aggregate function, in merge order.

Adds go through ``agg``, retractions (``-U``/``-D``) through ``retract``; the merged row
from state re-enters through ``absorb``. Sequence fields are not aggregated: they take the
value of the last add (Paimon's ``last_value``), so the row keeps the sequence it was
merged up to. With ``aggregation.remove-record-on-delete`` a ``-D`` removes the row, and
adds after it in the same fold start a fresh one.
"""

from __future__ import annotations

from collections.abc import Sequence

from tidemark.engine.changelog import ADDS, DELETE
from tidemark.engine.stages.merge.aggregators import FieldAgg, MergeError
from tidemark.engine.stages.merge.options import MergeConfig
from tidemark.engine.stages.merge.ordering import Item


class AggregationMerge:
    def __init__(self, cfg: MergeConfig):
        self.width = len(cfg.columns)
        self.columns = cfg.columns
        self.seq_fields = tuple(cfg.sequence_fields)
        self.fields: tuple[tuple[int, FieldAgg], ...] = tuple(sorted(cfg.aggs.items()))
        self.remove_on_delete = cfg.aggregation_remove_record_on_delete

    def merge(self, items: Sequence[Item]) -> tuple[tuple | None, tuple | None]:
        """(merged row, None) or (None, the ``-D`` that removed the row)."""
        row: list = [None] * self.width
        touched: set[int] = set()
        deleted: tuple | None = None
        if items[0].is_state and items[0].kind in ADDS:
            # Fast path: the merged row comes first. Absorbing it into an empty row gives
            # the row itself for every function (each one's agg(None, v) is v for the
            # values a merged row can hold), so copy it instead of folding it.
            row = list(items[0].row)
            touched = {i for i, _ in self.fields}
            items = items[1:]
        for item in items:
            values = item.row
            if item.kind == DELETE and self.remove_on_delete:
                row = [None] * self.width
                touched = set()
                deleted = values
                continue
            deleted = None
            if item.kind in ADDS:
                for i in self.seq_fields:
                    row[i] = values[i]
            for i, agg in self.fields:
                try:
                    if item.kind not in ADDS:
                        row[i] = agg.retract(row[i], values[i])
                    elif item.is_state:
                        row[i] = agg.absorb(row[i], values[i], i not in touched)
                        touched.add(i)
                    else:
                        row[i] = agg.agg(row[i], values[i], i not in touched)
                        touched.add(i)
                except MergeError as exc:
                    raise MergeError(f"column '{self.columns[i]}': {exc}") from None
        return (None, deleted) if deleted is not None else (tuple(row), None)
