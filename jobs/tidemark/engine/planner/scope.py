"""Name resolution: the relations one SELECT sees, and which column a reference means."""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from tidemark.engine.sql import sql_error
from tidemark.engine.types import SqlType


@dataclass
class Relation:
    alias: str
    columns: list[str]
    types: list[SqlType | None]
    offset: int

    def __post_init__(self) -> None:
        # case-folded name -> positions: a reference is resolved once per use, so a scan
        # of the columns per reference made a wide SELECT quadratic
        self.by_folded: dict[str, list[int]] = {}
        for i, c in enumerate(self.columns):
            self.by_folded.setdefault(c.lower(), []).append(i)


class Scope:
    """The relations visible in one SELECT, laid side by side in one row (join order)."""

    def __init__(self) -> None:
        self.relations: list[Relation] = []

    @property
    def width(self) -> int:
        return sum(len(r.columns) for r in self.relations)

    def add(self, alias: str, columns: list[str], types: list[SqlType | None], where: exp.Expr) -> Relation:
        if alias and any(r.alias.lower() == alias.lower() for r in self.relations):
            raise sql_error(f"table alias '{alias}' is used twice in one FROM clause", where)
        rel = Relation(alias, list(columns), list(types), self.width)
        self.relations.append(rel)
        return rel

    @property
    def names(self) -> list[str]:
        return [c for r in self.relations for c in r.columns]

    @property
    def types(self) -> list[SqlType | None]:
        return [t for r in self.relations for t in r.types]

    def resolve(self, col: exp.Column) -> int:
        name, qualifier = col.name, col.table
        if col.args.get("db") or col.args.get("catalog"):
            raise sql_error(f"column reference {col.sql()} is not supported (use alias.column)", col)
        if qualifier:
            rels = [r for r in self.relations if r.alias.lower() == qualifier.lower()]
            if not rels:
                raise sql_error(f"unknown table or alias '{qualifier}' in {col.sql()}", col)
            candidates = rels
        else:
            candidates = self.relations
        folded = name.lower()
        hits = [(r, i) for r in candidates for i in r.by_folded.get(folded, ())]
        exact = [(r, i) for r, i in hits if r.columns[i] == name]
        if len(hits) > 1 and len(exact) == 1:
            hits = exact
        if not hits:
            where = f" in '{qualifier}'" if qualifier else ""
            raise sql_error(f"unknown column '{name}'{where}", col)
        if len(hits) > 1:
            owners = ", ".join(sorted({r.alias or '(subquery)' for r, _ in hits}))
            raise sql_error(f"column '{name}' is ambiguous (in {owners}); qualify it", col)
        r, i = hits[0]
        return r.offset + i

    def star(self, qualifier: str | None, where: exp.Expr) -> list[tuple[str, int]]:
        rels = self.relations
        if qualifier:
            rels = [r for r in rels if r.alias.lower() == qualifier.lower()]
            if not rels:
                raise sql_error(f"unknown table or alias '{qualifier}' in {qualifier}.*", where)
        return [(c, r.offset + i) for r in rels for i, c in enumerate(r.columns)]

