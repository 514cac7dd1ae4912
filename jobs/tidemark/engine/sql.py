"""Pipeline SQL front end: a sqlglot dialect for Flink-style DDL and ``ON CONFLICT``.

The dialect extends sqlglot's parser rather than rewriting text, so every node keeps its
source position and every syntax error names its line and column. This module only
parses and checks statements (DDL, SET, the INSERT, or several INSERTs in one statement
set); what the query means is the planner's job (``tidemark.engine.planner``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ErrorLevel, ParseError, TokenError
from sqlglot.parser import Parser
from sqlglot.tokens import Tokenizer, TokenType

from tidemark.engine import limits
from tidemark.engine import options as options_check
from tidemark.engine.catalog import Column, ComputedColumn, TableDef
from tidemark.engine.errors import PlanError, SqlError
from tidemark.engine.expressions import DateFormat, SplitIndex
from tidemark.engine.types import ALIASES, KNOWN, SqlType, array_of, make_type, map_of, row_of

ON_CONFLICT_ACTIONS = ("NOTHING", "ERROR", "DEDUPLICATE")


#: the window functions of Flink SQL: as table functions over ``TABLE t`` or, legacy, in GROUP BY
WINDOW_FUNCTIONS = ("TUMBLE", "HOP", "CUMULATE", "SESSION")


class TidemarkParser(Parser):
    """sqlglot's ANSI parser plus Flink's ``WATERMARK FOR col AS expr`` schema entry, the
    window table functions' arguments (``TUMBLE(TABLE t, DESCRIPTOR(ts), INTERVAL ...)``) and the FLIP's ``ON CONFLICT DO NOTHING | DO ERROR | DO DEDUPLICATE`` actions (``DO UPDATE``
    is parsed only so that it can be rejected with a clear message)."""

    CONFLICT_ACTIONS = {"DO": ("NOTHING", "ERROR", "DEDUPLICATE", "UPDATE")}

    CONSTRAINT_PARSERS = {
        **Parser.CONSTRAINT_PARSERS,
        "WATERMARK": lambda self: self.expression(
            exp.WatermarkColumnConstraint(
                this=self._match(TokenType.FOR) and self._parse_column(),
                expression=self._match(TokenType.ALIAS) and self._parse_disjunction(),
            )
        ),
    }

    SCHEMA_UNNAMED_CONSTRAINTS = {*Parser.SCHEMA_UNNAMED_CONSTRAINTS, "WATERMARK"}

    FUNCTIONS = {
        **Parser.FUNCTIONS,
        "SPLIT_INDEX": SplitIndex.from_arg_list,
        "DATE_FORMAT": DateFormat.from_arg_list,
        "REGEXP_EXTRACT": lambda args: _regexp_extract(args),
    }

    # SESSION is a keyword (SET SESSION ...) that Flink also uses as a window function
    FUNC_TOKENS = {*Parser.FUNC_TOKENS, TokenType.SESSION}

    STATEMENT_PARSERS = {
        **Parser.STATEMENT_PARSERS,
        TokenType.EXECUTE: lambda self: self._parse_execute(),
        TokenType.BEGIN: lambda self: self._parse_begin(),
    }

    FUNCTION_PARSERS = {
        **Parser.FUNCTION_PARSERS,
        **{name: (lambda self, n=name: self._parse_window_function(n)) for name in WINDOW_FUNCTIONS},
    }

    def _parse_execute(self) -> exp.Expr:
        """``EXECUTE STATEMENT SET BEGIN``: sqlglot splits a script at semicolons, so the
        first INSERT of the set shares this statement and is parsed as its argument."""
        start = self._prev
        if not self._match_text_seq("STATEMENT", "SET", "BEGIN"):
            self.raise_error("EXECUTE is supported only as EXECUTE STATEMENT SET BEGIN ... END")
        if self._match(TokenType.END):
            self.raise_error("the statement set holds no INSERT INTO statement")
        first = self._parse_statement() if self._curr else None
        return self._positioned(StatementSetBegin(this=first), start)

    def _parse_begin(self) -> exp.Expr:
        """Flink's SQL client form ``BEGIN STATEMENT SET;``; any other BEGIN is sqlglot's
        (a transaction, which the pipeline script refuses by name)."""
        start = self._prev
        if self._match_text_seq("STATEMENT", "SET"):
            return self._positioned(StatementSetBegin(this=None), start)
        return Parser.STATEMENT_PARSERS[TokenType.BEGIN](self)

    @staticmethod
    def _positioned(node: exp.Expr, token: Any) -> exp.Expr:
        node.meta.update(line=token.line, col=token.col, start=token.start, end=token.end)
        return node

    def _parse_window_function(self, name: str) -> exp.Expr:
        """A window function's arguments, where the first may be ``TABLE t`` (a window
        table function) rather than a column (the legacy ``GROUP BY TUMBLE(ts, ...)``)."""
        name_token = self._tokens[self._index - 2]  # before the "(" just consumed
        args: list[exp.Expr] = []
        table_arg = False
        while True:
            if not args and self._match(TokenType.TABLE):
                table_arg = True
                args.append(self.expression(exp.Table(this=self._parse_id_var())))
            else:
                args.append(self._parse_assignment())
            if not self._match(TokenType.COMMA):
                break
        call = self.expression(WindowCall(this=exp.Var(this=name), expressions=args, table_arg=table_arg))
        # messages point at the function's name (position_of reads these)
        call.meta.update(line=name_token.line, col=name_token.col, start=name_token.start, end=name_token.end)
        return call


class WindowCall(exp.Expression, exp.Func):
    """``TUMBLE(...)``, ``HOP(...)``, ``CUMULATE(...)`` or ``SESSION(...)`` as written; the
    planner decides what it means where it stands (``tidemark.engine.planner.window``)."""

    arg_types = {"this": True, "expressions": True, "table_arg": False}
    _sql_names = ["WINDOW_CALL"]

    @property
    def function(self) -> str:
        return self.this.name


class StatementSetBegin(exp.Expression):
    """The start of a statement set; ``this`` is the set's first INSERT when it was written
    in the same statement (``EXECUTE STATEMENT SET BEGIN INSERT ...;``)."""

    arg_types = {"this": False}


def _regexp_extract(args: list) -> exp.RegexpExtract:
    """Flink's third argument is the group (sqlglot's default reads it as a position)."""
    if len(args) not in (2, 3):
        raise ParseError(f"REGEXP_EXTRACT takes 2 or 3 arguments, not {len(args)}")
    return exp.RegexpExtract(this=args[0], expression=args[1], group=args[2] if len(args) > 2 else None)


class Tidemark(Dialect):
    """Flink SQL as far as Tidemark pipelines need it."""

    class Tokenizer(Tokenizer):
        # Flink's ROW<name type, ...> / ROW(name type, ...) is sqlglot's STRUCT type
        KEYWORDS = {**Tokenizer.KEYWORDS, "STRING": TokenType.TEXT, "ROW": TokenType.STRUCT}
        # Flink quotes identifiers with backticks (`dateTime`); double quotes stay accepted
        IDENTIFIERS = ['"', "`"]
        # EXECUTE starts a statement set (parsed), not an opaque command
        COMMANDS = Tokenizer.COMMANDS - {TokenType.EXECUTE}

    Parser = TidemarkParser


# --------------------------------------------------------------------------- positions


def position_of(node: exp.Expr | None) -> tuple[int | None, int | None]:
    """Line and column of the first token under ``node`` (sqlglot records positions on
    identifiers, literals and functions, so take the earliest of those beneath)."""
    if node is None:
        return None, None
    best = None
    for n in node.walk():
        meta = getattr(n, "_meta", None) or {}
        if "line" in meta and "start" in meta:
            if best is None or meta["start"] < best["start"]:
                best = meta
    if best is None:
        return None, None
    return best["line"], best["col"] - _token_len(best) + 1


def _token_len(meta: dict) -> int:
    # sqlglot's "col" is the column of the token's LAST character; start/end are offsets
    return meta["end"] - meta["start"] + 1 if "end" in meta else 1


def sql_error(message: str, node: exp.Expr | None) -> SqlError:
    line, col = position_of(node)
    return SqlError(message, line, col)


def plan_error(message: str, node: exp.Expr | None) -> PlanError:
    line, col = position_of(node)
    return PlanError(message, line, col)


def describe(node: exp.Expr, limit: int = 60) -> str:
    text = node.sql(dialect=Tidemark)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------- statements


@dataclass
class InsertStatement:
    """``INSERT INTO table [(cols)] query [ON CONFLICT DO action]``."""

    table: str
    columns: list[str] | None
    query: exp.Query
    on_conflict: str | None
    node: exp.Insert


@dataclass
class ViewDef:
    """``CREATE [TEMPORARY] VIEW name [(cols)] AS query``: a named query, planned where it is read."""

    name: str
    columns: list[str] | None
    query: exp.Query
    node: exp.Create


@dataclass
class FunctionDef:
    """``CREATE [TEMPORARY [SYSTEM]] FUNCTION name AS 'module.function' LANGUAGE PYTHON``."""

    name: str
    path: str
    node: exp.Expr



@dataclass
class Script:
    """A parsed pipeline: its tables (in declaration order), views, SET options and its
    INSERTs: one, or several in a statement set (``statement_set``)."""

    tables: dict[str, TableDef] = field(default_factory=dict)
    views: dict[str, ViewDef] = field(default_factory=dict)
    options: dict[str, str] = field(default_factory=dict)
    inserts: list[InsertStatement] = field(default_factory=list)
    statement_set: bool = False
    #: table name -> its processing-time attribute (``name AS PROCTIME()``), usable only in
    #: ``FOR SYSTEM_TIME AS OF`` (a lookup join); it is not one of the table's columns
    proctime: dict[str, str] = field(default_factory=dict)
    functions: dict[str, FunctionDef] = field(default_factory=dict)

    @property
    def insert(self) -> InsertStatement | None:
        """The first (in a plain pipeline: the only) INSERT."""
        return self.inserts[0] if self.inserts else None

    def function(self, name: str) -> FunctionDef | None:
        """Look a user-defined function up by name (case-insensitively, as Flink does)."""
        return _lookup(self.functions, name)

    def table(self, name: str) -> TableDef | None:
        """Look a table up by name (exact first, then case-insensitive)."""
        return _lookup(self.tables, name)

    def view(self, name: str) -> ViewDef | None:
        """Look a view up by name (exact first, then case-insensitive)."""
        return _lookup(self.views, name)


def _lookup(named: dict[str, Any], name: str) -> Any:
    if name in named:
        return named[name]
    for key, value in named.items():
        if key.lower() == name.lower():
            return value
    return None


def parse_statements(sql: str) -> list[exp.Expr]:
    """Parse a script into statements, turning sqlglot's errors into SqlError."""
    dialect = Tidemark()
    try:
        tokens = dialect.tokenize(sql)
        limits.check_tokens(tokens)
        statements = dialect.parser(error_level=ErrorLevel.RAISE).parse(tokens, sql)
    except RecursionError:
        raise too_deep() from None
    except ParseError as e:
        err = e.errors[0] if e.errors else {}
        desc = err.get("description") or str(e)
        line, col = err.get("line"), err.get("col")
        hl = err.get("highlight")
        if col is not None and hl:
            col = col - len(hl) + 1
        near = f" near '{hl}'" if hl else ""
        raise SqlError(f"syntax error: {desc}{near}", line, col) from None
    except TokenError as e:
        raise SqlError(f"syntax error: {e}") from None
    statements = [s for s in statements if s is not None]
    limits.check_statements(statements, position_of)
    return statements


def too_deep() -> SqlError:
    """What a RecursionError in parsing or planning means for the user: nesting the
    token and tree limits did not catch (a long chain of prefix operators, say)."""
    return SqlError(
        f"the SQL nests too deeply to plan (limits: {limits.NESTING.value} {limits.NESTING.name}, "
        f"{limits.EXPRESSION_DEPTH.value} {limits.EXPRESSION_DEPTH.name})"
    )


def parse_script(sql: str) -> Script:
    """Parse and check a whole pipeline script: CREATE TABLE, SET, and exactly one INSERT
    or one statement set of INSERTs."""
    script = Script()
    statement_set = _StatementSet(script)
    for stmt in parse_statements(sql):
        stmt = _system_function(stmt)
        if statement_set.takes(stmt):
            continue
        if isinstance(stmt, exp.Create) and (stmt.args.get("kind") or "").upper() == "FUNCTION":
            fn = _function_def(stmt)
            if script.function(fn.name) is not None:
                raise sql_error(f"function '{fn.name}' is declared twice", stmt.this)
            script.functions[fn.name] = fn
        elif isinstance(stmt, exp.Create) and (stmt.args.get("kind") or "").upper() == "VIEW":
            view = _view_def(stmt)
            if script.table(view.name) is not None or script.view(view.name) is not None:
                raise sql_error(f"'{view.name}' is declared twice (as a table or view)", stmt.this)
            script.views[view.name] = view
        elif isinstance(stmt, exp.Create):
            table = _table_def(stmt)
            if script.table(table.name) is not None or script.view(table.name) is not None:
                raise sql_error(f"table '{table.name}' is declared twice", stmt.this)
            script.tables[table.name] = table
            attribute = next((c.name for c in stmt.this.expressions if _is_proctime_column(c)), None)
            if attribute is not None:
                script.proctime[table.name] = attribute
        elif isinstance(stmt, exp.Set):
            script.options.update(_set_options(stmt))
        elif isinstance(stmt, exp.Insert):
            if script.inserts:
                raise sql_error(
                    "only one INSERT INTO statement per pipeline is supported outside a statement set; to "
                    "write several tables from the same sources in one pipeline, write EXECUTE STATEMENT SET "
                    "BEGIN INSERT INTO ...; INSERT INTO ...; END;",
                    stmt.this,
                )
            script.inserts.append(_insert(stmt))
        else:
            kind = type(stmt).__name__.upper()
            raise sql_error(
                f"unsupported statement {kind} ({describe(stmt)}): a pipeline holds CREATE TABLE, "
                "SET and one INSERT INTO (or one EXECUTE STATEMENT SET BEGIN ... END)",
                stmt,
            )
    statement_set.close()
    if not script.inserts:
        raise SqlError("the pipeline has no INSERT INTO statement")
    return script


class _StatementSet:
    """Reads ``EXECUTE STATEMENT SET BEGIN ... END;`` (or ``BEGIN STATEMENT SET; ... END;``)
    into ``script.inserts``: only INSERTs inside, one set per pipeline, and no INSERT
    beside it (a pipeline is one job; Flink's client would submit a lone INSERT as its
    own job)."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.open: exp.Expr | None = None

    def takes(self, stmt: exp.Expr) -> bool:
        """Whether ``stmt`` belongs to the statement set (and was taken into the script)."""
        if isinstance(stmt, StatementSetBegin):
            if self.open is not None:
                raise sql_error("a statement set cannot begin inside another: close the first with END;", stmt)
            if self.script.inserts:
                what = "another statement set" if self.script.statement_set else "an INSERT INTO outside it"
                raise sql_error(
                    f"a pipeline holds one statement set and nothing beside it, but this one follows {what}; "
                    "put every INSERT of the pipeline in one statement set",
                    stmt,
                )
            self.open = stmt
            self.script.statement_set = True
            if stmt.this is not None:
                self._add(stmt.this)
            return True
        if isinstance(stmt, exp.EndStatement):
            if self.open is None:
                raise SqlError("END without a statement set to close (write EXECUTE STATEMENT SET BEGIN ... END;)")
            if not self.script.inserts:
                raise sql_error("the statement set holds no INSERT INTO statement", self.open)
            self.open = None
            return True
        if self.open is not None:
            self._add(stmt)
            return True
        return False

    def _add(self, stmt: exp.Expr) -> None:
        if not isinstance(stmt, exp.Insert):
            raise sql_error(
                f"a statement set holds only INSERT INTO statements, not {type(stmt).__name__.upper()} "
                f"({describe(stmt)}); declare tables, views and options before EXECUTE STATEMENT SET",
                stmt,
            )
        self.script.inserts.append(_insert(stmt))

    def close(self) -> None:
        if self.open is not None:
            raise sql_error("the statement set is not closed: end it with END;", self.open)


def _system_function(stmt: exp.Expr) -> exp.Expr:
    """sqlglot reads ``CREATE TEMPORARY SYSTEM FUNCTION`` as an opaque command: read it as
    ``CREATE TEMPORARY FUNCTION`` (a pipeline's functions are all its own)."""
    if isinstance(stmt, exp.Command) and stmt.name.upper() == "CREATE":
        text = stmt.expression.sql() if isinstance(stmt.expression, exp.Expr) else str(stmt.expression)
        words = text.split(None, 2)
        if len(words) == 3 and words[0].upper() == "TEMPORARY" and words[1].upper() == "SYSTEM":
            return parse_statements(f"CREATE TEMPORARY {words[2]}")[0]
    return stmt


def _function_def(stmt: exp.Create) -> FunctionDef:
    from tidemark.udf import UdfError, load

    name = stmt.this.name if isinstance(stmt.this, exp.Table) else ""
    path = stmt.expression
    if not name or not (isinstance(path, exp.Literal) and path.is_string):
        raise sql_error("CREATE FUNCTION needs a name and AS 'module.function'", stmt)
    props = stmt.args.get("properties")
    languages = [p.this.name.upper() for p in (props.expressions if props else []) if isinstance(p, exp.LanguageProperty)]
    if languages != ["PYTHON"]:
        raise sql_error(
            f"function '{name}': only LANGUAGE PYTHON functions are supported (a Java class such as "
            f"'{path.this}' cannot run here): CREATE FUNCTION {name} AS 'module.function' LANGUAGE PYTHON",
            stmt,
        )
    try:
        load(path.this)
    except UdfError as e:
        raise sql_error(f"function '{name}': {e}", path) from None
    return FunctionDef(name, path.this, stmt)


def _view_def(stmt: exp.Create) -> ViewDef:
    target = stmt.this
    columns = None
    if isinstance(target, exp.Schema):
        columns = [c.name for c in target.expressions]
        target = target.this
    if not isinstance(target, exp.Table) or target.args.get("db") or target.args.get("catalog"):
        raise sql_error(f"CREATE VIEW needs a plain view name, not {describe(target)}", stmt)
    for prop in (stmt.args.get("properties") or exp.Properties(expressions=[])).expressions:
        if not isinstance(prop, exp.TemporaryProperty):
            raise sql_error(f"CREATE VIEW ... {describe(prop)} is not supported", stmt)
    query = stmt.expression
    if not isinstance(query, exp.Query):
        raise sql_error("CREATE VIEW needs AS followed by a SELECT query", stmt)
    return ViewDef(target.name, columns, query, stmt)


def _set_options(stmt: exp.Set) -> dict[str, str]:
    out = {}
    for item in stmt.expressions:
        eq = item.this if isinstance(item, exp.SetItem) else None
        if not isinstance(eq, exp.EQ):
            raise sql_error("SET expects 'key' = 'value'", stmt)
        key = _option_text(eq.this)
        problem = options_check.check_pipeline_option(key)
        if problem is not None:
            raise plan_error(problem, eq.this)
        out[key] = _option_text(eq.expression)
    return out


def _option_text(node: exp.Expr) -> str:
    if isinstance(node, (exp.Literal, exp.Identifier, exp.Var)):
        return str(node.this)
    if isinstance(node, exp.Column):
        return node.sql(dialect=Tidemark).replace('"', "")
    if isinstance(node, exp.Boolean):
        return "true" if node.this else "false"
    return node.sql(dialect=Tidemark)


def _insert(stmt: exp.Insert) -> InsertStatement:
    for arg in ("overwrite", "partition", "where", "returning", "alternative", "by_name"):
        if stmt.args.get(arg):
            raise sql_error(f"INSERT ... {arg.upper().replace('_', ' ')} is not supported", stmt)
    target = stmt.this
    columns: list[str] | None = None
    if isinstance(target, exp.Schema):
        columns = [c.name for c in target.expressions]
        target = target.this
    if not isinstance(target, exp.Table):
        raise sql_error("INSERT INTO needs a table name", stmt)
    query = stmt.expression
    if isinstance(query, exp.Values):
        raise sql_error("INSERT ... VALUES is not supported: a pipeline inserts a SELECT", query)
    if not isinstance(query, exp.Query):
        raise sql_error("INSERT INTO needs a SELECT query", stmt)
    outer_with = stmt.args.get("with_")
    if outer_with is not None:  # WITH c AS (...) INSERT INTO ...: the CTEs belong to the query
        inner = query.args.get("with_")
        if inner is not None:
            outer_with.set("expressions", [*outer_with.expressions, *inner.expressions])
        query.set("with_", outer_with)
    return InsertStatement(target.name, columns, query, _on_conflict(stmt), stmt)


def _on_conflict(stmt: exp.Insert) -> str | None:
    oc = stmt.args.get("conflict")
    if oc is None:
        return None
    if oc.args.get("duplicate"):
        raise sql_error("ON DUPLICATE KEY is not supported; use ON CONFLICT DO ...", oc)
    for arg, what in (
        ("conflict_keys", "a conflict target (ON CONFLICT (cols))"),
        ("constraint", "ON CONFLICT ON CONSTRAINT"),
        ("index_predicate", "ON CONFLICT ... WHERE"),
        ("where", "ON CONFLICT ... WHERE"),
    ):
        if oc.args.get(arg):
            raise sql_error(f"{what} is not supported: the conflict target is the sink's primary key", oc)
    action = oc.args.get("action")
    text = action.name.upper() if action is not None else ""
    verb = text.split()[-1] if text else ""
    if verb not in ON_CONFLICT_ACTIONS:
        raise sql_error(
            f"ON CONFLICT {text or '(no action)'} is not supported; use ON CONFLICT DO NOTHING, "
            "ON CONFLICT DO ERROR or ON CONFLICT DO DEDUPLICATE",
            oc,
        )
    return verb


# --------------------------------------------------------------------------- DDL


_DTYPE_NAMES = {
    "TEXT": "STRING",
    "NVARCHAR": "VARCHAR",
    "NCHAR": "CHAR",
    "TIMESTAMPLTZ": "TIMESTAMP",
    "TIMESTAMPTZ": "TIMESTAMP",
    "BIGDECIMAL": "DECIMAL",
    "UBIGINT": None,
}


def sql_type_of(dtype: exp.DataType, where: exp.Expr | None = None) -> SqlType:
    """Convert a sqlglot DataType (as written in DDL or CAST) into a SqlType."""
    name = dtype.this.name if hasattr(dtype.this, "name") else str(dtype.this)
    if name in ("ARRAY", "MAP", "STRUCT"):
        return _composite_type_of(name, dtype, where)
    mapped = _DTYPE_NAMES.get(name, name)
    if mapped is None or ALIASES.get(mapped, mapped) not in KNOWN:
        raise sql_error(f"unsupported column type {dtype.sql()}", where or dtype)
    params: list[int] = []
    for p in dtype.expressions:
        lit = p.this if isinstance(p, exp.DataTypeParam) else p
        if not (isinstance(lit, exp.Literal) and not lit.is_string):
            raise sql_error(f"unsupported type parameter in {dtype.sql()}", where or dtype)
        params.append(int(lit.this))
    try:
        return make_type(mapped, tuple(params))
    except ValueError as e:
        raise sql_error(str(e), where or dtype) from None


def _composite_type_of(name: str, dtype: exp.DataType, where: exp.Expr | None) -> SqlType:
    args = list(dtype.expressions)
    shown = "ROW" if name == "STRUCT" else name
    usage = {"ARRAY": "ARRAY<INT>", "MAP": "MAP<STRING, BIGINT>", "ROW": "ROW<a INT, b STRING>"}[shown]
    try:
        if name == "ARRAY" and len(args) == 1 and isinstance(args[0], exp.DataType):
            return array_of(sql_type_of(args[0], where))
        if name == "MAP" and len(args) == 2 and all(isinstance(a, exp.DataType) for a in args):
            return map_of(sql_type_of(args[0], where), sql_type_of(args[1], where))
        if name == "STRUCT" and args and all(isinstance(a, exp.ColumnDef) and a.args.get("kind") for a in args):
            return row_of((a.name, sql_type_of(a.args["kind"], where)) for a in args)
    except ValueError as e:
        raise sql_error(str(e), where or dtype) from None
    raise sql_error(f"unsupported column type {dtype.sql(dialect=Tidemark)} (write e.g. {usage})", where or dtype)


def parse_type_text(text: str) -> SqlType:
    """A type written as in DDL (``ARRAY<ROW<id BIGINT, v STRING>>``) -> SqlType; raises
    ValueError naming the text."""
    try:
        dtype = exp.DataType.build(text, dialect=Tidemark)
    except (ParseError, TokenError, ValueError) as e:
        raise ValueError(f"unsupported column type {text!r}: {e}") from None
    try:
        return sql_type_of(dtype)
    except SqlError as e:
        raise ValueError(str(e)) from None


def _table_def(stmt: exp.Create) -> TableDef:
    kind = (stmt.args.get("kind") or "").upper()
    if kind != "TABLE":
        raise sql_error(f"CREATE {kind} is not supported: only CREATE TABLE", stmt)
    if stmt.expression is not None:
        raise sql_error("CREATE TABLE ... AS SELECT is not supported", stmt.expression)
    schema = stmt.this
    if not isinstance(schema, exp.Schema):
        raise sql_error("CREATE TABLE needs a column list", stmt)
    name = schema.this.name
    columns: list[Column] = []
    declared: set[str] = set()
    pk: list[str] = []
    pk_node: exp.Expr | None = None
    computed: list[ComputedColumn] = []
    watermark: exp.WatermarkColumnConstraint | None = None
    for item in schema.expressions:
        if _is_proctime_column(item):
            continue  # a processing-time attribute, not a column (Script.proctime)
        if isinstance(item, exp.ColumnDef):
            col_name = item.name
            if col_name.lower() in declared:
                raise sql_error(f"table '{name}': column '{col_name}' is declared twice", item)
            declared.add(col_name.lower())
            computed_expr = _computed_expression(item)
            if computed_expr is not None:
                computed.append(ComputedColumn(col_name, computed_expr))
                continue
            kind_node = item.args.get("kind")
            if kind_node is None:
                raise sql_error(f"table '{name}': column '{col_name}' has no type", item)
            columns.append(Column(col_name, sql_type_of(kind_node, item)))
            for constraint in item.constraints:
                ckind = constraint.kind
                if isinstance(ckind, exp.PrimaryKeyColumnConstraint):
                    if pk_node is not None:
                        raise sql_error(f"table '{name}' declares more than one PRIMARY KEY", item)
                    pk, pk_node = [col_name], item
                elif isinstance(ckind, (exp.NotNullColumnConstraint, exp.CommentColumnConstraint)):
                    pass
                else:
                    raise sql_error(
                        f"table '{name}': column constraint {describe(constraint)} is not supported", constraint
                    )
        elif isinstance(item, exp.PrimaryKey):
            if pk_node is not None:
                raise sql_error(f"table '{name}' declares more than one PRIMARY KEY", item)
            pk = [e.name for e in item.expressions]
            pk_node = item
        elif isinstance(item, exp.WatermarkColumnConstraint):
            if watermark is not None:
                raise sql_error(f"table '{name}' declares more than one WATERMARK", item)
            watermark = item
        else:
            raise sql_error(f"table '{name}': {describe(item)} is not supported in CREATE TABLE", item)
    if not columns:
        raise sql_error(f"table '{name}' has no columns", stmt)
    spelled = {c.name.lower(): c.name for c in columns}
    for k in pk:
        if k.lower() not in spelled:
            raise sql_error(f"table '{name}': primary key column '{k}' is not a column of the table", pk_node)
    # canonical spelling of PK names = the column's declared spelling
    pk = [spelled[k.lower()] for k in pk]
    options = _with_options(stmt, name)
    wm = None
    if watermark is not None:
        from tidemark.engine.event_time import watermark_def

        wm = watermark_def(name, watermark, [c.name for c in columns] + [c.name for c in computed])
    return TableDef(name, tuple(columns), tuple(pk), options, tuple(computed), wm)


def _computed_expression(item: exp.ColumnDef) -> exp.Expr | None:
    """``name AS expr`` (a computed column): its expression; None for a physical column.
    Flink's ``VIRTUAL`` / ``PERSISTED`` metadata forms are not computed columns."""
    for constraint in item.constraints:
        if isinstance(constraint.kind, exp.ComputedColumnConstraint):
            if item.args.get("kind") is not None or len(item.constraints) > 1 or constraint.kind.args.get("persisted"):
                raise sql_error(f"computed column '{item.name}': write it as `{item.name} AS expression`", item)
            return constraint.kind.this
    return None


def _is_proctime_column(item: exp.Expr) -> bool:
    """``name AS PROCTIME()`` in CREATE TABLE: Flink's processing-time attribute."""
    if not isinstance(item, exp.ColumnDef) or item.args.get("kind") is not None or len(item.constraints) != 1:
        return False
    computed = item.constraints[0].kind
    return isinstance(computed, exp.ComputedColumnConstraint) and is_proctime_call(computed.this)


def is_proctime_call(node: exp.Expr | None) -> bool:
    """Whether ``node`` is the call ``PROCTIME()``."""
    return isinstance(node, exp.Func) and node.sql(dialect=Tidemark).replace(" ", "").upper() == "PROCTIME()"


def _with_options(stmt: exp.Create, table: str) -> dict[str, str]:
    props = stmt.args.get("properties")
    options: dict[str, str] = {}
    if props is None:
        return options
    for p in props.expressions:
        if isinstance(p, exp.Property) and isinstance(p.this, exp.Literal) and p.this.is_string:
            value = p.args.get("value")
            if not (isinstance(value, exp.Literal) and value.is_string):
                raise sql_error(f"table '{table}': option '{p.this.this}' needs a quoted string value", p)
            key = str(p.this.this)
            problem = options_check.check_table_option(table, key, str(value.this))
            if problem is not None:
                raise plan_error(problem, p)
            options[key] = str(value.this)
        else:
            raise sql_error(
                f"table '{table}': {describe(p)} is not supported; table options are WITH ('key' = 'value', ...)",
                p,
            )
    problem = options_check.check_table(table, options)
    if problem is not None:
        raise plan_error(problem, props)
    return options
