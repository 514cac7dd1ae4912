"""Consecutive keyed stages that share their key, run by a host as one keyed operator.

A keyed stage B whose input ``i`` is the output of keyed stage A, with nothing between them,
can run in A's operator when every row A emits belongs to the bucket the rows that made it
came from: B's key columns on input ``i`` are where A's own key lands in A's output
(``output_key_columns``). A's output for a bucket is then B's input ``i`` for the same
bucket, so the shuffle between the two carries nothing a bucket does not already hold, and a
host can hand A's output to B in the same call instead of encoding, shuffling and decoding
it. W1's ``GROUP BY product_id`` followed by ``JOIN products ON product_id = id`` is the
shape.

Why it is sound for any number of buckets: bucketing is a function of the key values only
(``tidemark.engine.bucketing``: equal keys, one bucket, whatever types carry them), A's
rows of bucket ``b`` have A-keys in ``b``, and each output row's B-key equals the A-key of
its group. B's other inputs are keyed for B as before.

Filters between the two (a calc that passes its rows through unchanged or drops them, such
as a WHERE conjunct moved below a join, ``tidemark.engine.planner.pushdown``) run inside the
operator on A's output before B sees it: a filter keeps every column where it was, so the
rows it passes are still in their bucket.

What is not fused: stages with timers or event time (their hosts keep a clock per bucket
and operator), a stage whose output has another consumer, and a delta or lookup join (it has
no state of its own to share a bucket with).

Which stages fuse is part of a checkpoint's fingerprint (``tidemark.engine.fingerprint``):
a host keeps one state store per operator, so a plan that fuses differently cannot read it.
So is how the operator keeps its members' states (``FUSED_STATE_LAYOUTS``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change
from tidemark.engine.expressions import col_index
from tidemark.engine.stage import KeyedStage, StatelessStage, uses_timers

if TYPE_CHECKING:
    from tidemark.engine.pipeline import Pipeline

#: how a host keeps the states of a fused operator's members in a bucket, by layout number;
#: a checkpoint records the layout it was written with (a record without one: layout 1)
FUSED_STATE_LAYOUTS = {1: "a value state per member", 2: "one value state with a field per member"}
FUSED_STATE_LAYOUT = 2


def output_key_columns(stage: Any) -> tuple[int, ...] | None:
    """Where ``stage``'s key lands in the rows it emits; None when no column set holds it
    for every output row."""
    fn = getattr(stage, "output_key_columns", None)
    return fn() if fn is not None else None


def _key_columns(stage: Any, index: int) -> tuple[int, ...] | None:
    fn = getattr(stage, "key_columns", None)
    return tuple(fn(index)) if fn is not None else None


def _hostable(node: Any) -> bool:
    from tidemark.engine.stages.delta_join import DeltaJoin
    from tidemark.engine.stages.lookup_join import LookupJoin

    stage = node.stage
    return (
        stage is not None
        and hasattr(stage, "key_of")
        and not isinstance(stage, (DeltaJoin, LookupJoin))
        and not uses_timers(stage)
        and not getattr(stage, "watermark_sources", ())
        and "event_time" not in node.detail
    )


def _is_filter(node: Any) -> bool:
    """A calc that only drops rows: its output rows are its input rows, column for column."""
    if node.kind != "calc" or "event_time" in node.detail:
        return False
    stage = node.stage
    if stage.projections is None:
        return True
    return (list(stage.output_names) == list(stage.input_names) and len(stage.projections) == len(stage.input_names)
            and all(col_index(e) == i for i, e in enumerate(stage.projections)))


def filters_between(pipeline: Pipeline, first: int, second: int, index: int) -> list[int]:
    """The filter nodes from ``first``'s output to input ``index`` of ``second``, in the
    order the rows pass them (empty when ``first`` feeds it directly)."""
    chain: list[int] = []
    node_id = pipeline.node(second).inputs[index]
    while node_id != first:
        chain.append(node_id)
        node_id = pipeline.node(node_id).inputs[0]
    return chain[::-1]


def fused_pairs(pipeline: Pipeline) -> dict[int, tuple[int, int]]:
    """``{A's node id: (B's node id, B's input A feeds)}`` for every keyed stage A whose
    only consumer is keyed stage B on A's key, directly or through filters that have no
    other consumer (module docstring). A stage that receives another's output is not
    itself fused into a third: pairs, never chains."""
    consumers: dict[int, list[tuple[int, int]]] = {}
    for node in pipeline.nodes:
        for index, upstream in enumerate(node.inputs):
            consumers.setdefault(upstream, []).append((node.id, index))
    pairs: dict[int, tuple[int, int]] = {}
    taken: set[int] = set()
    for node in pipeline.nodes:
        if node.id in taken or not _hostable(node):
            continue
        uses = consumers.get(node.id, [])
        while len(uses) == 1 and _is_filter(pipeline.node(uses[0][0])):
            uses = consumers.get(uses[0][0], [])
        if len(uses) != 1:
            continue
        consumer_id, index = uses[0]
        consumer = pipeline.node(consumer_id)
        if consumer_id in taken or not _hostable(consumer):
            continue
        lands = output_key_columns(node.stage)
        if lands is None or lands != _key_columns(consumer.stage, index):
            continue
        pairs[node.id] = (consumer_id, index)
        taken.update((node.id, consumer_id))
    return pairs


@dataclass(frozen=True)
class FusedStage:
    """Keyed stage ``first`` feeding input ``fed`` of keyed stage ``second``, as one keyed
    stage for a host: its inputs are ``first``'s, then ``second``'s other inputs in order,
    and each is keyed as the member it goes to keys it. Each member keeps its own state;
    the host runs them one after the other per bucket (``member_inputs``)."""

    first: KeyedStage
    second: KeyedStage
    fed: int
    #: filters between the two (``filters_between``), which a host applies to ``first``'s
    #: output before it passes it on as ``fed``
    between: tuple[StatelessStage, ...] = ()

    @property
    def members(self) -> tuple[KeyedStage, KeyedStage]:
        return (self.first, self.second)

    @property
    def name(self) -> str:
        return f"{self.first.name}+{self.second.name}"

    @property
    def n_inputs(self) -> int:
        return self.first.n_inputs + self.second.n_inputs - 1

    def _slot(self, input_index: int) -> tuple[KeyedStage, int]:
        """The member and member input that operator input ``input_index`` goes to."""
        if not 0 <= input_index < self.n_inputs:
            raise IndexError(f"stage '{self.name}' has {self.n_inputs} input(s); no input {input_index}")
        if input_index < self.first.n_inputs:
            return self.first, input_index
        rest = input_index - self.first.n_inputs
        return self.second, rest if rest < self.fed else rest + 1

    def key_columns(self, input_index: int = 0) -> tuple[int, ...] | None:
        """The row columns the key is, for the member the input goes to."""
        stage, index = self._slot(input_index)
        return _key_columns(stage, index)

    def key_of(self, change: Change, input_index: int = 0) -> tuple:
        stage, index = self._slot(input_index)
        return stage.key_of(change, index)

    def member_inputs(self, member: int, inputs: Sequence[ChangeBatch], fed: ChangeBatch | None = None) -> list[ChangeBatch]:
        """Member ``member``'s inputs out of the operator's ``inputs``; for ``second``,
        ``fed`` (what ``first`` emitted) at the input ``first`` feeds."""
        n_first = self.first.n_inputs
        if member == 0:
            return list(inputs[:n_first])
        if fed is None:
            raise ValueError(f"stage '{self.second.name}' needs what '{self.first.name}' emitted")
        rest = list(inputs[n_first:])
        return [*rest[: self.fed], fed, *rest[self.fed:]]
