"""Bounds on planning work, all in one place.

Planning runs on SQL a user (or a client of the control service) hands in, so its cost
must be bounded by the limits below, not by what the text asks for. Each limit guards a
cost that would otherwise grow without bound: wide tables and SELECT lists (work per
column), large or deep expressions (sqlglot's parser and generators and Python's compiler
recurse once per nesting level; a deep tree ends in RecursionError), many statements.
A query over the limits is refused with a SqlError naming the limit, its value and the
position, before the expensive part runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlglot import exp
from sqlglot.tokens import Token, TokenType

from tidemark.engine.errors import SqlError


@dataclass(frozen=True)
class Limit:
    """One bound: ``name`` is how errors and docs call it."""

    name: str
    value: int
    meaning: str

    def refuse(self, what: str, line: int | None, col: int | None) -> SqlError:
        return SqlError(f"{what}: over the limit of {self.value} {self.name}", line, col)


COLUMNS = Limit("columns per table or SELECT", 4096, "columns of a CREATE TABLE, items of a SELECT, width of a join")
EXPRESSION_NODES = Limit("syntax nodes per expression", 5000, "size of one expression (a SELECT item, WHERE, ON...)")
EXPRESSION_DEPTH = Limit("levels of expression nesting", 100, "depth of one expression's syntax tree")
NESTING = Limit("levels of nested parentheses and CASE", 32, "nesting of (...), [...], CASE ... END and prefix operators")
STATEMENTS = Limit("statements per script", 256, "CREATE TABLE, SET and INSERT statements of one pipeline")
JOINS = Limit("tables per FROM clause", 64, "tables and subqueries joined in one SELECT")

ALL: tuple[Limit, ...] = (COLUMNS, EXPRESSION_NODES, EXPRESSION_DEPTH, NESTING, STATEMENTS, JOINS)

_OPEN = {TokenType.L_PAREN, TokenType.L_BRACKET, TokenType.CASE}
_CLOSE = {TokenType.R_PAREN, TokenType.R_BRACKET, TokenType.END}
_PREFIX = {TokenType.NOT, TokenType.DASH, TokenType.PLUS, TokenType.TILDE}

# nodes that structure a statement rather than compute a value: an expression starts below them
_STRUCTURE = (
    exp.Query, exp.Subquery, exp.From, exp.Join, exp.Where, exp.Having, exp.Group, exp.Insert,
    exp.Create, exp.Schema, exp.Table, exp.TableAlias, exp.Set, exp.SetItem, exp.Properties,
    exp.Property, exp.ColumnDef, exp.OnConflict, exp.Alias,
)  # fmt: skip


def check_tokens(tokens: Sequence[Token]) -> None:
    """Nesting of brackets, CASE and chains of prefix operators (``NOT NOT ...``,
    ``- - ...``), checked on tokens because the parser recurses once per level (about 20
    Python frames per parenthesis) and cannot parse deep text at all."""
    depth = chain = 0
    for tok in tokens:
        chain = chain + 1 if tok.token_type in _PREFIX else 0
        if tok.token_type in _OPEN:
            depth += 1
        elif tok.token_type in _CLOSE and depth:
            depth -= 1
        if depth + chain > NESTING.value:
            what = "opens" if tok.token_type in _OPEN else "is a prefix operator at"
            raise NESTING.refuse(f"'{tok.text}' {what} nesting level {depth + chain}", tok.line, tok.col - len(tok.text) + 1)


def check_statements(statements: Sequence[exp.Expr], position: Callable[[exp.Expr], tuple]) -> None:
    """Statement count, then every expression's size and depth and every SELECT's and
    table's width, in one iterative walk per statement."""
    if len(statements) > STATEMENTS.value:
        raise STATEMENTS.refuse(f"the script has {len(statements)} statements", *position(statements[STATEMENTS.value]))
    for stmt in statements:
        _check_tree(stmt, position)


def _check_tree(root: exp.Expr, position: Callable[[exp.Expr], tuple]) -> None:
    sizes: dict[int, int] = {}
    stack: list[tuple[exp.Expr, int, exp.Expr | None]] = [(root, 0, None)]
    while stack:
        node, depth, top = stack.pop()
        if isinstance(node, _STRUCTURE):
            depth, top = 0, None
            _check_width(node, position)
        else:
            depth, top = depth + 1, top or node
            if depth > EXPRESSION_DEPTH.value:
                raise EXPRESSION_DEPTH.refuse(f"an expression nests {depth} levels deep", *position(node))
            sizes[id(top)] = size = sizes.get(id(top), 0) + 1
            if size > EXPRESSION_NODES.value:
                raise EXPRESSION_NODES.refuse("an expression has more syntax nodes", *position(top))
        stack.extend((child, depth, top) for child in node.iter_expressions())


def _check_width(node: exp.Expr, position: Callable[[exp.Expr], tuple]) -> None:
    if isinstance(node, exp.Select):
        items, what = node.expressions, "the SELECT has {} items"
        joins = node.args.get("joins") or []
        if len(joins) + 1 > JOINS.value:
            raise JOINS.refuse(f"the FROM clause joins {len(joins) + 1} tables", *position(joins[JOINS.value - 1]))
    elif isinstance(node, exp.Schema) and isinstance(node.parent, exp.Create):
        items, what = node.expressions, "the table has {} columns"
    else:
        return
    if len(items) > COLUMNS.value:
        raise COLUMNS.refuse(what.format(len(items)), *position(items[COLUMNS.value]))


def measure(expr: exp.Expr, inputs: Sequence[tuple[int, int]] | None = None) -> tuple[int, int]:
    """(nodes, depth) of ``expr``; with ``inputs``, as if every positional column ``i``
    were replaced by an expression of size ``inputs[i]`` (what composing two calcs would
    build), computed without building it."""
    from tidemark.engine.expressions import col_index

    nodes = deepest = 0
    stack = [(expr, 1)]
    while stack:
        node, depth = stack.pop()
        i = col_index(node) if inputs is not None else None
        if i is not None:
            n, d = inputs[i]
            nodes, deepest = nodes + n, max(deepest, depth - 1 + d)
            continue
        nodes, deepest = nodes + 1, max(deepest, depth)
        stack.extend((child, depth + 1) for child in node.iter_expressions())
    return nodes, deepest


def within(nodes: int, depth: int) -> bool:
    """Whether an expression of this size and depth is one the planner may build."""
    return nodes <= EXPRESSION_NODES.value and depth <= EXPRESSION_DEPTH.value
