"""``--init FILE`` of ``tidemark explain``, ``replay`` and ``run``: the Nexmark queries keep
their sources in ``queries/sources.sql``, and a user runs one with
``tidemark explain --init queries/sources.sql queries/qN.sql``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import harness
from typer.testing import CliRunner

from tidemark.cli.main import app

runner = CliRunner()
#: ``tidemark run`` writes its errors to the terminal's own stream, so it runs as a process
TIDEMARK = str(Path(sys.executable).parent / "tidemark")

SOURCES = """CREATE TABLE s (id BIGINT, v STRING, PRIMARY KEY (id) NOT ENFORCED)
WITH ('topic' = 's', 'format' = 'upsert-json');
"""
PIPELINE = """CREATE TABLE t (id BIGINT, v STRING, PRIMARY KEY (id) NOT ENFORCED)
WITH ('topic' = 't', 'format' = 'upsert-json');
INSERT INTO t SELECT id, v FROM s;
"""


def _files(tmp_path: Path, **texts: str) -> dict[str, Path]:
    paths = {}
    for name, text in texts.items():
        paths[name] = tmp_path / f"{name}.sql"
        paths[name].write_text(text, encoding="utf-8")
    return paths


def test_explain_runs_the_init_statements_first(tmp_path: Path) -> None:
    f = _files(tmp_path, sources=SOURCES, pipeline=PIPELINE)
    alone = runner.invoke(app, ["explain", str(f["pipeline"])])
    assert alone.exit_code == 2
    assert "'s'" in alone.stderr
    result = runner.invoke(app, ["explain", "--init", str(f["sources"]), str(f["pipeline"]), "--json"])
    assert result.exit_code == 0, result.stderr
    stages = json.loads(result.stdout)["stages"]
    assert [(s["kind"], s.get("table")) for s in stages if s["kind"] in ("source", "sink")] == [
        ("source", "s"), ("sink", "t")]


def test_init_files_run_in_the_order_given(tmp_path: Path) -> None:
    second = SOURCES.replace("CREATE TABLE s ", "CREATE TABLE s2 ")
    f = _files(tmp_path, a=SOURCES, b=second, pipeline=PIPELINE.replace("FROM s;", "FROM s2;"))
    result = runner.invoke(app, ["explain", "--init", str(f["a"]), "--init", str(f["b"]), str(f["pipeline"])])
    assert result.exit_code == 0, result.stderr
    assert "source s2" in result.stdout


def test_an_error_names_the_file_and_line_it_is_in(tmp_path: Path) -> None:
    bad_init = "-- sources\n\n" + SOURCES.replace("BIGINT", "BIGINT BIGINT", 1)
    f = _files(tmp_path, sources=SOURCES, bad=bad_init, pipeline=PIPELINE,
               bad_pipeline=PIPELINE.replace("SELECT id, v", "SELECT id, v ORDER BY id"))
    in_init = runner.invoke(app, ["explain", "--init", str(f["bad"]), str(f["pipeline"])])
    assert in_init.exit_code == 2
    assert in_init.stderr.startswith(f"{f['pipeline']}: --init {f['bad']}: syntax error")
    assert "(line 3, column" in in_init.stderr

    alone = runner.invoke(app, ["explain", str(f["bad_pipeline"])])
    with_init = runner.invoke(app, ["explain", "--init", str(f["sources"]), str(f["bad_pipeline"])])
    assert with_init.exit_code == 2
    assert "(line 3, column" in with_init.stderr
    assert with_init.stderr.split("(line")[1] == alone.stderr.split("(line")[1]
    assert "--init" not in with_init.stderr


def test_an_unreadable_init_file_is_one_line_exit_2(tmp_path: Path) -> None:
    f = _files(tmp_path, pipeline=PIPELINE)
    missing = tmp_path / "nope.sql"
    for command in ("explain", "replay"):
        result = runner.invoke(app, [command, "--init", str(missing), str(f["pipeline"])])
        assert result.exit_code == 2, (command, result.output)
        assert f"--init {missing}: cannot read" in result.stderr, command
        assert "Traceback" not in result.stderr
    run = _run(tmp_path, "--init", str(missing), str(f["pipeline"]))
    assert run.returncode == 2, run.stderr
    assert run.stderr == f"error: --init {missing}: cannot read: No such file or directory\n"


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([TIDEMARK, "run", "--checkpoint", str(tmp_path / "ck"), *args],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)


def test_run_plans_with_the_init_statements(tmp_path: Path) -> None:
    """A planning error in an init file stops ``tidemark run`` before Spark or Kafka."""
    f = _files(tmp_path, bad=SOURCES.replace("upsert-json", "no-such-format"), pipeline=PIPELINE)
    result = _run(tmp_path, "--init", str(f["bad"]), str(f["pipeline"]))
    assert result.returncode == 2, result.stderr
    assert "no-such-format" in result.stderr
    assert not (tmp_path / "ck").exists()


def test_replay_with_init(tmp_path: Path) -> None:
    f = _files(tmp_path, sources=SOURCES, pipeline=PIPELINE)
    changes = tmp_path / "s.jsonl"
    changes.write_text('{"kind": "+I", "row": {"id": 1, "v": "a"}}\n', encoding="utf-8")
    result = runner.invoke(app, ["replay", "--init", str(f["sources"]), str(f["pipeline"]),
                                 "--input", f"s={changes}", "--emit", "table"])
    assert result.exit_code == 0, result.stderr
    assert [json.loads(line) for line in result.stdout.splitlines()] == [{"id": 1, "v": "a"}]


def test_a_nexmark_query_explains_with_its_sources(tmp_path: Path) -> None:
    """q0 in the dialect Tidemark plans (``harness.today_dialect``), sources from ``--init``."""
    f = _files(tmp_path, sources=harness.today_dialect(harness.SOURCES.read_text(encoding="utf-8")),
               q0=harness.today_dialect((harness.QUERIES / "q0.sql").read_text(encoding="utf-8")))
    result = runner.invoke(app, ["explain", "--init", str(f["sources"]), str(f["q0"])])
    assert result.exit_code == 0, result.stderr
    assert "source bid" in result.stdout
    as_published = runner.invoke(app, ["explain", "--init", str(harness.SOURCES), str(harness.QUERIES / "q0.sql")])
    assert as_published.exit_code == 0, as_published.stderr
    assert "source bid" in as_published.stdout
    # an error in the init file names that file and its own line, not the joined text's
    bad = tmp_path / "bad_sources.sql"
    bad.write_text(harness.SOURCES.read_text(encoding="utf-8").replace("`dateTime` - INTERVAL", "`dateTime` + INTERVAL", 1),
                   encoding="utf-8")
    refused = runner.invoke(app, ["explain", "--init", str(bad), str(harness.QUERIES / "q0.sql")])
    assert refused.exit_code == 2
    assert f"--init {bad}: table 'person': WATERMARK FOR dateTime AS " in refused.stderr
    assert "(line 16, column 33)" in refused.stderr  # the strategy: `dateTime` + ...
