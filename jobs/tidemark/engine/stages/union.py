"""Union: ``UNION ALL`` of two or more inputs, a stateless stage with several inputs.

The output changelog is the inputs' changelogs side by side: a change keeps its kind, row
and source position, so a retraction still cancels the add it retracts (both came through
the same input). Nothing is consolidated here: two inputs emitting one row is two rows,
as ``UNION ALL`` means. Branches already have the union's column types (the planner casts
a branch that needs widening before it reaches the union).
"""

from __future__ import annotations

from collections.abc import Sequence

from tidemark.engine.changelog import Change


class Union:
    """Concatenates ``n_inputs`` inputs' changes (``StatelessMultiStage`` in ``stage``)."""

    def __init__(self, n_inputs: int, name: str = "union") -> None:
        if n_inputs < 2:
            raise ValueError(f"a union needs at least two inputs, not {n_inputs}")
        self.n_inputs = n_inputs
        self.name = name

    def process_inputs(self, inputs: Sequence[list[Change]]) -> list[Change]:
        if len(inputs) != self.n_inputs:
            raise ValueError(f"stage '{self.name}' has {self.n_inputs} inputs, got {len(inputs)} lists of changes")
        return [c for changes in inputs for c in changes]
