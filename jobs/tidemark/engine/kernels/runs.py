"""Window arithmetic over runs of a frame sorted by its group column (each group's rows
together, in their order): running sums, step numbers and the previous row without
``over()``, each one pass over the whole column.

Derivation, for a group whose first row is ``s`` and a column ``x`` without nulls, with
``C`` the running sum of the whole column:

- the running sum within the group at row ``i`` is ``x[s] + ... + x[i] = C[i] - (C[s] - x[s])``;
- the step number at row ``i`` is ``i - s``;
- the previous row within the group is ``x[i - 1]``, or null at ``i = s``.

``C[s] - x[s]`` and ``s`` are carried forward from each group's first row. In two's
complement the difference is exact whenever the group's own sum fits, so integer columns
only: a float running sum over the whole column would round differently from the group's.
A window function (``over``) instead groups, evaluates and scatters back once per
expression (docs/benchmarks.md, "The aggregate kernel's windows as runs").
"""

from __future__ import annotations

import polars as pl


class Runs:
    """Expressions over the runs of equal values of ``group`` in a frame sorted by it."""

    def __init__(self, group: str):
        self.first = (pl.col(group) != pl.col(group).shift(1)).fill_null(True)

    def step(self) -> pl.Expr:
        """Each row's index within its group, from 0."""
        index = pl.int_range(pl.len())
        return index - pl.when(self.first).then(index).forward_fill()

    def cum_sum(self, x: pl.Expr) -> pl.Expr:
        """The running sum of the integer expression ``x`` (no nulls) within each group."""
        total = x.cum_sum()
        return total - pl.when(self.first).then(total - x).forward_fill()

    def previous(self, x: pl.Expr) -> pl.Expr:
        """``x`` of the row before within the group; null at each group's first row."""
        return pl.when(self.first).then(None).otherwise(x.shift(1))
