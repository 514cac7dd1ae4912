"""Every command block of README.md and docs/*.md that is marked runnable runs as written,
from what a fresh clone holds.

The convention, for whoever writes docs:

- Put ``<!-- runnable -->`` on the line right before a fenced code block to have this test
  run it; ``<!-- runnable slow -->`` for a block that starts Spark or a service (those run
  under ``pytest -m slow``, not in ``make test``). Unmarked blocks are not run.
- A block in which some line starts with ``$ `` is a transcript: each ``$ `` line is one
  command; the lines after it, up to the next ``$ `` line, are what it prints (stdout, then
  stderr), compared line for line; ``[exit N]`` says it exits with N (else 0 is expected).
- Any other block (```` ```bash ````) is one script, run with ``bash -e``; it must exit 0.

Blocks run in order, per file, in one temporary directory holding the repository's files
(``git ls-files``: what a clone has; files the docs create, such as ``body.json``, must be
created by the docs) with ``.venv`` linked in and ``.venv/bin`` first on PATH, so both
``tidemark`` and ``.venv/bin/tidemark`` work as the README says. Anything a block leaves
running is killed with its process group."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"^<!-- runnable( slow)? -->\n```[a-z]*\n(.*?)^```", re.M | re.S)
BLOCK_TIMEOUT_S = {False: 120, True: 600}


@dataclass
class Command:
    line: str
    expected: list[str] = field(default_factory=list)
    status: int = 0


@dataclass
class Block:
    doc: Path
    line: int
    slow: bool
    text: str

    @property
    def transcript(self) -> list[Command] | None:
        """The ``$ `` commands with what they print, or None for a plain script."""
        if not any(line.startswith("$ ") for line in self.text.splitlines()):
            return None
        commands: list[Command] = []
        for line in self.text.splitlines():
            if line.startswith("$ "):
                commands.append(Command(line[2:]))
            elif m := re.fullmatch(r"\[exit (\d+)\]", line):
                commands[-1].status = int(m.group(1))
            elif line and commands:
                commands[-1].expected.append(line)
        return commands


def blocks(doc: Path) -> list[Block]:
    text = doc.read_text(encoding="utf-8")
    return [Block(doc, text.count("\n", 0, m.start()) + 2, bool(m.group(1)), m.group(2))
            for m in MARKER.finditer(text)]


def _clone(dest: Path) -> None:
    """The repository's files as a clone has them (tracked, plus new files not ignored)."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                            cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    (dest / ".venv").symlink_to(ROOT / ".venv")


def _run(script: str, cwd: Path, timeout_s: float) -> subprocess.CompletedProcess:
    """Run ``script`` with bash; its output goes to files, not pipes, so a process it left
    in the background cannot keep the test waiting for the end of its output."""
    env = {**os.environ, "PATH": f"{cwd / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}", "COLUMNS": "200"}
    env.pop("KAFKA_BOOTSTRAP_SERVERS", None)
    out_path, err_path = cwd.parent / f"{cwd.name}.stdout", cwd.parent / f"{cwd.name}.stderr"
    with out_path.open("w") as out, err_path.open("w") as err:
        proc = subprocess.Popen(["bash", "-e", "-c", script], cwd=cwd, env=env, text=True,
                                start_new_session=True, stdout=out, stderr=err)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        finally:
            try:
                os.killpg(proc.pid, signal.SIGTERM)  # whatever the block left running in the background
            except ProcessLookupError:
                pass
    stdout, stderr = out_path.read_text(), err_path.read_text()
    if proc.returncode == -signal.SIGKILL:
        raise AssertionError(f"timed out after {timeout_s}s:\n{stdout}\n{stderr}")
    return subprocess.CompletedProcess(script, proc.returncode, stdout, stderr)


def _check(block: Block, cwd: Path) -> None:
    where = f"{block.doc.relative_to(ROOT)}:{block.line}"
    timeout_s = BLOCK_TIMEOUT_S[block.slow]
    commands = block.transcript
    if commands is None:
        done = _run(block.text, cwd, timeout_s)
        assert done.returncode == 0, f"{where}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        return
    for command in commands:
        done = _run(command.line, cwd, timeout_s)
        got = done.stdout.splitlines() + done.stderr.splitlines()
        assert done.returncode == command.status, f"{where}: $ {command.line}: exit {done.returncode}\n" + "\n".join(got)
        assert got == command.expected, f"{where}: $ {command.line} printed something else"


def _docs_with(slow: bool) -> list[Path]:
    return [doc for doc in DOCS if any(b.slow == slow for b in blocks(doc))]


@pytest.mark.parametrize("doc", _docs_with(False), ids=lambda d: str(d.relative_to(ROOT)))
def test_runnable_blocks(doc: Path, tmp_path: Path) -> None:
    _clone(tmp_path)
    for block in blocks(doc):
        if not block.slow:
            _check(block, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("doc", _docs_with(True), ids=lambda d: str(d.relative_to(ROOT)))
def test_slow_runnable_blocks(doc: Path, tmp_path: Path) -> None:
    _clone(tmp_path)
    for block in blocks(doc):
        _check(block, tmp_path)


def test_the_docs_mark_their_examples_runnable() -> None:
    """The quick start and the replay page must keep being checked."""
    assert blocks(ROOT / "README.md"), "README.md has no runnable block"
    assert len(blocks(ROOT / "docs" / "replay.md")) >= 5
