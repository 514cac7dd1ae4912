"""docs/replay.md shows real runs: every ``$ tidemark replay ...`` in it whose files ship with
the repo is run again and must print exactly what the page shows (stdout, then stderr) and
exit as shown (``[exit N]``, else 0)."""

from __future__ import annotations

import re
import shlex

import pytest
from replaykit import ROOT, in_process

DOC = ROOT / "docs" / "replay.md"


def documented_runs() -> list[tuple[list[str], list[str], int]]:
    runs = []
    for block in re.findall(r"```\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S):
        current = None
        for line in block.splitlines():
            if line.startswith("$ "):
                current = [shlex.split(line[2:]), [], 0]
                runs.append(current)
            elif current is not None:
                m = re.fullmatch(r"\[exit (\d+)\]", line)
                if m:
                    current[2] = int(m.group(1))
                elif line:
                    current[1].append(line)
    return [tuple(r) for r in runs if r[0][:2] == ["tidemark", "replay"] and (ROOT / r[0][2]).exists()]


RUNS = documented_runs()


def test_the_page_documents_the_examples():
    assert len(RUNS) >= 10


@pytest.mark.parametrize(("argv", "expected", "status"), RUNS, ids=[" ".join(r[0][2:]) for r in RUNS])
def test_documented_run_prints_what_the_page_shows(monkeypatch, argv, expected, status):
    monkeypatch.chdir(ROOT)
    sql, rest = argv[2], argv[3:]
    result = in_process(sql, {}, *rest)
    assert result.status == status, result.stderr
    assert result.stdout.splitlines() + result.stderr.splitlines() == expected
