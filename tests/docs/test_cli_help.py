"""What ``tidemark --help``, ``--version`` and the commands' help tell a user before they read
any doc: the version that is installed, how the control service wants its token, and
which options are flags (shown without a value, because they refuse one)."""

from __future__ import annotations

import re
from importlib.metadata import version

from typer.testing import CliRunner

from tidemark.cli.main import app

runner = CliRunner()
WIDE = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}


def _help(*command: str) -> str:
    result = runner.invoke(app, [*command, "--help"], env=WIDE)
    assert result.exit_code == 0, result.output
    return result.output


def _option_line(help_text: str, option: str) -> str:
    return next(line for line in help_text.splitlines() if re.search(rf"\s{re.escape(option)}\s", line))


def test_version_is_the_installed_package_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"tidemark {version('tidemark')}\n"


def test_control_help_says_how_to_give_the_token() -> None:
    assert "TIDEMARK_API_TOKEN" in _help("control")


def test_flags_are_shown_without_a_value() -> None:
    run_help = _help("run")
    for flag in ("--until-idle", "--verbose"):
        assert "<bool>" not in _option_line(run_help, flag), flag
    assert "<bool>" not in _option_line(_help("control"), "--insecure-dev")


def test_a_flag_given_a_value_is_refused_with_status_2(tmp_path) -> None:
    sql = tmp_path / "p.sql"
    sql.write_text("-- never read: the command line is refused first\n")
    result = runner.invoke(app, ["run", str(sql), "--until-idle", "true"], env=WIDE)
    assert result.exit_code == 2
    assert "true" in result.output
