"""Helpers for the acceptance tests: run the real ``tidemark replay`` and read its output.

Two ways to run it: ``cli`` starts the installed console script in a subprocess (the
strongest evidence: exit status, stdout and stderr exactly as a user sees them);
``in_process`` invokes the same typer app through CliRunner, used where a test runs the
command hundreds of times (every ordering of a changelog).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
TIDEMARK = Path(sys.executable).parent / "tidemark"


@dataclass
class Result:
    status: int
    stdout: str
    stderr: str

    def json_lines(self) -> list[dict]:
        return [json.loads(line) for line in self.stdout.splitlines() if line.strip()]


def replay_args(sql: Path, inputs: dict[str, Path], *flags: str) -> list[str]:
    args = ["replay", str(sql)]
    for table, path in inputs.items():
        args += ["--input", f"{table}={path}"]
    return args + list(flags)


def cli(sql: Path, inputs: dict[str, Path], *flags: str, cwd: Path = ROOT) -> Result:
    proc = subprocess.run(
        [str(TIDEMARK), *replay_args(sql, inputs, *flags)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def in_process(sql: Path, inputs: dict[str, Path], *flags: str) -> Result:
    from tidemark.cli.main import app

    r = CliRunner().invoke(app, replay_args(sql, inputs, *flags))
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return Result(r.exit_code, r.stdout, r.stderr)


def write_jsonl(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def table_after_batches(changes: list[dict], pk: tuple[str, ...], n_batches: int) -> list[dict[tuple, dict]]:
    """Apply ``--emit changelog`` output to a table; returns the table after each batch
    1..n_batches (a batch that emitted nothing leaves the previous table). Asserts the
    changelog is well formed for an upsert sink: a retraction retracts exactly the row
    the sink holds, an add (``+I``, or ``+U`` after its ``-U``) finds no row."""
    by_batch: dict[int, list[dict]] = {}
    for c in changes:
        by_batch.setdefault(c["batch"], []).append(c)
    table: dict[tuple, dict] = {}
    out = []
    for b in range(1, n_batches + 1):
        for c in by_batch.get(b, []):
            key = tuple(c["row"][k] for k in pk)
            if c["kind"] in ("-U", "-D"):
                assert table.get(key) == c["row"], f"retraction of a row the sink does not hold: {c}, sink={table}"
                del table[key]
            else:
                assert c["kind"] in ("+I", "+U"), c
                assert key not in table, f"add for a key the sink holds without retracting it: {c}, sink={table}"
                table[key] = c["row"]
        out.append(dict(table))
    return out


def summary(stderr: str) -> dict[str, int]:
    """The numbers of the summary line ``replay: 3 batch(es), 5 record(s) in, ...``."""
    line = [ln for ln in stderr.splitlines() if ln.startswith("replay: ")][-1]
    out = {}
    for part in line[len("replay: "):].split(", "):
        n, _, what = part.partition(" ")
        out[what] = int(n)
    return out
