"""The README, docs/, the Makefile and the CLI's help are read by people who have only a
clone of this repository: they must not send them to files outside it, nor speak in words
that only mean something to whoever wrote the project ("the seed", "the proposal",
"issue 7", "session 2"). Examples are named by what they are: "the s1/s2 join example".

Inline code spans are not checked for words (they hold identifiers such as a test's
name); links and paths are checked everywhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tidemark.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "Makefile", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]

#: paths that exist only next to the repository, never in a clone of it
OUTSIDE = re.compile(r"\.\./shared|\bshared/seeds\b|\bDESIGN\.md\b")
#: words that name the project's own history instead of the thing
INTERNAL = [
    (re.compile(r"\bthe seeds?\b|\bseeds?'s?(?=\s)|\bseed (example|ordering|requires)", re.I), "the seed"),
    (re.compile(r"\bproposal('s)?\b", re.I), "the proposal"),
    (re.compile(r"\bissues?\b(?:'s)?", re.I), "issue"),
    (re.compile(r"(?<!Spark )(?<!test )(?<![.-])\bsessions?\b(?![.(])", re.I), "session"),
    (re.compile(r"\bthe brief\b|\bthe lead\b|\bhelpers?\b(?= \w+ (adds|did|wrote))", re.I), "the brief"),
    (re.compile(r"\bdesign card\b", re.I), "design card"),
]
CODE_SPAN = re.compile(r"`[^`\n]+`")


def _problems(text: str) -> list[str]:
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        if m := OUTSIDE.search(line):
            found.append(f"line {n}: points outside the repository ({m.group(0)}): {line.strip()}")
        prose = CODE_SPAN.sub("", line)
        for pattern, what in INTERNAL:
            if m := pattern.search(prose):
                found.append(f"line {n}: internal word '{m.group(0)}' ({what}): {line.strip()}")
    return found


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_doc_stands_alone(path: Path) -> None:
    assert path.exists(), f"{path.relative_to(ROOT)} is missing"
    problems = _problems(path.read_text(encoding="utf-8"))
    assert not problems, f"{path.relative_to(ROOT)}:\n" + "\n".join(problems)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_inside_the_repository(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        resolved = (path.parent / target).resolve()
        assert resolved.is_relative_to(ROOT), f"{path.name} links outside the repository: {target}"
        assert resolved.exists(), f"{path.name} links to a missing file: {target}"


def test_cli_help_stands_alone() -> None:
    runner = CliRunner()
    commands = [[], ["explain"], ["replay"], ["run"], ["control"], ["index"], ["dlq"]]
    for command in commands:
        result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
        assert result.exit_code == 0, result.output
        assert not _problems(result.output), (command, _problems(result.output))


def test_the_checker_catches_what_it_is_for() -> None:
    assert _problems("The spec is `../shared/DESIGN.md`.")
    assert _problems("all three orderings end at (id, 20, 'b1'), as the seed requires.")
    assert _problems("Profiles first (issue 7), then the proposal's example.")
    assert _problems("two sessions of 3 repetitions each")
    assert not _problems("one Spark session per test session; seeds 1-150 (`test_run_seed_orderings.py`)")
