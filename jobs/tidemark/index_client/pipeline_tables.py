"""Which source tables a pipeline needs in the index service, and the DDL to register them.

A delta join looks up each side's rows in the index service, so every source table on a
delta-join side must be registered there (``POST /v1/tables``) before the job runs. The
registration carries the table's own ``CREATE TABLE`` text, cut out of the pipeline's SQL
rather than re-rendered: the index service parses it with the same front end, so the
table it indexes is exactly the one the planner saw (options, types, watermark and all).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp
from sqlglot.tokens import TokenType

from tidemark.engine.pipeline import Pipeline
from tidemark.engine.sql import Tidemark, _table_def, parse_statements


@dataclass(frozen=True)
class IndexedTable:
    """One table the index service must follow for this pipeline."""

    name: str
    ddl: str
    history: bool  # keep versions for as-of lookups: only a strong delta join asks for them


def statement_texts(sql: str) -> list[str]:
    """The script's statements as they were written (comments and the ``;`` dropped)."""
    out: list[str] = []
    first = last = None
    for tok in Tidemark().tokenize(sql):
        if tok.token_type == TokenType.SEMICOLON:
            if first is not None:
                out.append(sql[first.start:last.end + 1])
            first = last = None
            continue
        first = first or tok
        last = tok
    if first is not None:
        out.append(sql[first.start:last.end + 1])
    return out


def create_table_texts(sql: str) -> dict[str, str]:
    """Table name -> its ``CREATE TABLE`` statement text, for every table of the script."""
    texts: dict[str, str] = {}
    for text in statement_texts(sql):
        stmts = parse_statements(text)
        if len(stmts) == 1 and isinstance(stmts[0], exp.Create):
            texts[_table_def(stmts[0]).name] = text
    return texts


def indexed_tables(pipeline: Pipeline) -> list[IndexedTable]:
    """The source tables of every delta join of the pipeline (both sides) and the dimension
    of every lookup join that has an index to be looked up by (with history: its lookups
    are as of a batch's start), in plan order; empty when there is neither."""
    from tidemark.engine.stages.delta_join import DeltaJoin
    from tidemark.engine.stages.lookup_join import LookupJoin

    wanted: dict[str, bool] = {}
    for node in pipeline.nodes:
        stage = node.stage
        if isinstance(stage, LookupJoin) and stage.index is not None:
            wanted[stage.table] = True
        if not isinstance(stage, DeltaJoin):
            continue
        for side in stage.sides:
            if side is not None:
                wanted[side.table] = wanted.get(side.table, False) or stage.consistency == "strong"
    if not wanted:
        return []
    texts = create_table_texts(pipeline.sql)
    return [IndexedTable(name, texts[name], history) for name, history in wanted.items()]
