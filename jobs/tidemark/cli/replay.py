"""``tidemark replay``: run a pipeline in-process over JSON Lines files, one per source.

It is the offline twin of the Spark job: the same compiled stages, fed one batch at a
time by the in-process ``ReplayHost``, so a user (or a test) can see exactly what the
sink receives for a given changelog and batching, without Spark or Kafka.

Exit status: 0 ok; 2 bad SQL, plan, arguments or input (one line per problem on
stderr); 3 an ``ON CONFLICT DO ERROR`` violation (changes of the batches before it
are already printed). A summary line goes to stderr at the end of a good run.

A statement set writes several sinks: each line then names its sink (``"sink"``), and
``--emit table`` prints the sinks one after another as ``{"sink", "row"}`` lines.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, TextIO

import typer

from tidemark.cli.script import InitOption, compile_script, read_init
from tidemark.engine.catalog import TableDef
from tidemark.engine.errors import InputError, TidemarkError
from tidemark.engine.records import MAX_LINE_BYTES, InputSpec, batch_by_table, batches, read_inputs
from tidemark.engine.types import to_json_value


class Batching(str, Enum):
    barrier = "barrier"
    record = "record"


class Emit(str, Enum):
    changelog = "changelog"
    table = "table"


class UsageError(TidemarkError):
    """A bad command line (unknown table in --input, a source without input...)."""

    exit_status = 2


def parse_inputs(pairs: Sequence[str], sources: dict[str, TableDef], sql_name: str) -> list[InputSpec]:
    """``TABLE=PATH`` flags -> one InputSpec per source, in flag order. Every source needs
    exactly one input: a missing one would replay as "no changes", which is a silent
    wrong answer, not a default."""
    by_lower = {name.lower(): name for name in sources}
    specs: list[InputSpec] = []
    given: dict[str, str] = {}
    for pair in pairs:
        table, sep, path = pair.partition("=")
        if not sep or not table or not path:
            raise UsageError(f"--input {pair!r}: expected TABLE=PATH")
        name = table if table in sources else by_lower.get(table.lower())
        if name is None:
            known = ", ".join(sources) or "none"
            raise UsageError(f"--input {pair!r}: {sql_name} has no source table '{table}' (sources: {known})")
        if name in given:
            raise UsageError(f"--input {pair!r}: table '{name}' already has an input ({given[name]})")
        given[name] = path
        specs.append(InputSpec(sources[name], Path(path), path))
    missing = [name for name in sources if name not in given]
    if missing:
        flags = " ".join(f"--input {m}=PATH" for m in missing)
        raise UsageError(f"no input for source table(s) {', '.join(missing)}: add {flags}")
    return specs


def row_json(table: TableDef, row: tuple) -> dict[str, Any]:
    return {c.name: to_json_value(c.type, v) for c, v in zip(table.columns, row)}


def _pk_sort_key(pk: tuple) -> tuple:
    # NULLs last; a PK never mixes types within one column, so the rest compares
    return tuple((v is None, v if v is not None else 0) for v in pk)


def _named(statement_set: bool, sink: str, line: dict[str, Any]) -> dict[str, Any]:
    return {"sink": sink, **line} if statement_set else line


def run(
    sql_path: Path,
    input_pairs: Sequence[str],
    batching: str = "barrier",
    emit: str = "changelog",
    out: TextIO | None = None,
    err: TextIO | None = None,
    max_line_bytes: int = MAX_LINE_BYTES,
    init: Sequence[Path] = (),
) -> int:
    """The whole command; returns the exit status. Imports the planner lazily so that
    ``tidemark --help`` stays fast. Streams default to the current sys.stdout/stderr,
    looked up per call (a test runner may have replaced them)."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    from tidemark.engine.replay import ReplayHost

    try:
        try:
            sql = sql_path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise InputError(str(sql_path), f"cannot read pipeline SQL: {reason}") from None
        pipeline = compile_script(sql, read_init(init))
        specs = parse_inputs(input_pairs, dict(pipeline.sources), sql_path.name)
        records = read_inputs(specs, max_line_bytes)
        plan = batches(records, batching)
        sinks = {t.table.name: t.table for t in pipeline.sinks}
        host = ReplayHost(pipeline)
        changes_out = 0
        steps = [lambda batch=batch: host.run_batch(batch_by_table(batch, pipeline.sources)) for batch in plan]
        if pipeline.watermark_delays:  # end of input: the event-time windows still open fire
            steps.append(host.finish)
        for number, step in enumerate(steps, start=1):
            step()
            for name, emitted in host.last_changes.items():
                changes_out += len(emitted)
                if emit == "changelog":
                    for c in emitted:
                        line = {"kind": c.kind, "row": row_json(sinks[name], c.row), "batch": number}
                        out.write(json.dumps(_named(pipeline.statement_set, name, line)) + "\n")
            out.flush()
        if emit == "table":
            for name, sink in sinks.items():
                table = host.table(name)
                for pk in sorted(table, key=_pk_sort_key):
                    row = row_json(sink, table[pk])
                    out.write(json.dumps({"sink": name, "row": row} if pipeline.statement_set else row) + "\n")
            out.flush()
    except TidemarkError as e:
        out.flush()
        err.write(f"{e}\n")
        return e.exit_status
    m = host.metrics
    n_records = sum(len(b) for b in plan)
    err.write(
        f"replay: {len(plan)} batch(es), {n_records} record(s) in, {changes_out} change(s) out, "
        f"{m.get('conflicts_dropped', 0)} conflict(s) dropped, "
        f"{m.get('retractions_without_state', 0)} retraction(s) without state"
        + (f", {m.get('late_records_dropped', 0)} late record(s) dropped" if pipeline.watermark_delays else "")
        + "\n"
    )
    return 0


def replay(
    sql_file: Annotated[Path, typer.Argument(help="Pipeline SQL: CREATE TABLE ... and one INSERT INTO.")],
    input: Annotated[
        list[str],
        typer.Option("--input", "-i", metavar="TABLE=PATH", help="A JSON Lines file for a source table; give one per source."),
    ] = [],  # noqa: B006 - typer reads the default, never mutates it
    batching: Annotated[
        Batching,
        typer.Option(help="barrier: records between barrier lines form one batch; record: one batch per record."),
    ] = Batching.barrier,
    emit: Annotated[
        Emit,
        typer.Option(help="changelog: every sink change as JSON Lines; table: the final sink table, sorted by PK."),
    ] = Emit.changelog,
    max_line_bytes: Annotated[
        int,
        typer.Option(min=1, help="Longest input line read, in bytes; a longer line is an error naming it."),
    ] = MAX_LINE_BYTES,
    init: InitOption = [],  # noqa: B006 - typer reads the default, never mutates it
) -> None:
    """Replay JSON Lines changelogs through a pipeline, in-process, batch by batch.

    A line is {"kind": "+I", "row": {...}} (optional "seq": source position) or {"barrier": true}. See docs/replay.md.
    --init files run first (e.g. --init sources.sql holding the CREATE TABLEs several pipelines share).
    """
    status = run(sql_file, input, batching.value, emit.value, max_line_bytes=max_line_bytes, init=init)
    if status:
        raise typer.Exit(status)
