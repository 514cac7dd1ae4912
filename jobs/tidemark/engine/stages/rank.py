"""Rank: ``ROW_NUMBER() OVER (PARTITION BY p ORDER BY o) AS rn ... WHERE rn <= N`` (Top-N,
and with ``rn = 1`` deduplication), keyed by the partition columns.

Why a stage of its own: a changelog input may retract any row, so a partition must keep
every active row (Flink's ``RetractableTopNFunction``), and when a top row leaves, the next
one enters. An append-only input never retracts, so only the top rows are kept (Flink's
``AppendOnlyTopNFunction``).

The order within a partition is the ORDER BY, then arrival: among rows with equal sort keys
the one added first ranks first (Flink appends each row to the list of its sort key; a row
updated to the same sort key goes to the end of that list). ``ties="last"`` reverses that
for Flink's ``Deduplicate`` keeping the last row by event time (``ORDER BY rowtime DESC``,
``rn = 1``), where a row with an equal event time replaces the current one. An empty ORDER BY
ranks by arrival alone: ``ORDER BY`` a processing-time attribute, where the rows that arrive
first are first (``ties="first"``, ascending) or last (``ties="last"``, descending). Arrival here is the source
position, never the order inside a micro-batch. A retraction removes the oldest active copy
of an identical row (Flink removes the first equal row of its list). NULLs sort as Flink
sorts them: first ascending, last descending, unless the query says ``NULLS FIRST|LAST``.

Output per batch and partition, the net change (compaction on barriers):
- with ``rn`` in the output (``output_rank``): per rank in the range whose row changed,
  ``-U`` old / ``+U`` new (``+I`` / ``-D`` where the rank was empty before / is empty after),
  as Flink updates every rank a new row pushes down;
- without it: the rows that left the range ``-D``, the rows that entered ``+I``; for a Top-1
  (one row per partition) the pair is ``-U`` / ``+U``. The rank column is then NULL (the
  enclosing query does not read it).
Every change is emitted at the greatest source position of the partition's changes in the batch.

Upsert keys (Flink's ``FlinkRelMdUpsertKeys`` for Rank, set by the planner): a Top-1 is
unique by its partition key; otherwise the input's keys that contain the partition key, and
with ``rn`` also the partition key plus ``rn``.

Not supported, refused by the planner: RANK/DENSE_RANK, a rank range given by a column.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change
from tidemark.engine.errors import PlanError
from tidemark.engine.stage import BatchContext
from tidemark.engine.types import SqlType


@dataclass(frozen=True)
class SortKey:
    """One ORDER BY item: input column ``column``, descending or not, where NULLs go."""

    column: int
    descending: bool = False
    nulls_first: bool = True


class Rank:
    """The stage object the planner builds; its kernel (``tidemark.engine.kernels.rank``)
    does the work under the batch contract."""

    n_inputs = 1

    def __init__(
        self,
        partition: Sequence[int],
        order: Sequence[SortKey],
        start: int,
        end: int,
        types: Sequence[SqlType | None],
        output_rank: bool = True,
        append_only: bool = False,
        name: str = "rank",
        ties: str = "first",
    ) -> None:
        if not 1 <= start <= end:
            raise PlanError(f"rank range {start}..{end} is empty; ranks start at 1")
        self.partition = tuple(partition)
        self.order = tuple(order)
        self.start, self.end = start, end
        self.types = list(types)
        self.output_rank = output_rank
        self.append_only = append_only
        if ties not in ("first", "last"):
            raise PlanError(f"rank ties: expected 'first' or 'last', not {ties!r}")
        self.ties = ties
        self.name = name
        self._kernel: Any = None

    @property
    def width(self) -> int:
        return len(self.types)

    @property
    def top1(self) -> bool:
        return self.start == self.end == 1

    def key_columns(self, input_index: int = 0) -> tuple[int, ...]:
        """The row columns the key is (``tidemark.engine.bucketing``)."""
        return self.partition

    def key_of(self, change: Change, input_index: int) -> tuple:
        return tuple(change.row[i] for i in self.partition)

    def batch_kernel(self) -> Any:
        from tidemark.engine.kernels.rank import RankKernel

        if self._kernel is None:
            self._kernel = RankKernel(self)
        return self._kernel

    def process_key(
        self, key: tuple, inputs: Sequence[list[Change]], state: Any, ctx: BatchContext
    ) -> tuple[Any, list[Change]]:
        """One partition through the kernel, for a host that still calls stages per key
        (the state is then that partition's rows)."""
        kernel = self.batch_kernel()
        state, out = kernel.process_batch([ChangeBatch(changes=list(inputs[0]))], state, ctx)
        return state, out.changes()

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_kernel": None}
