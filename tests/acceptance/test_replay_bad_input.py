"""Bad input to ``tidemark replay``: one clear line per problem on stderr, naming the file
and line, exit status 2, nothing on stdout, never a traceback, nothing silently dropped."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from replaykit import EXAMPLES, cli, in_process

GOOD_S2 = '{"kind": "+I", "row": {"id": 10, "attr": "a1"}}\n'
GOOD_S1 = '{"kind": "+I", "row": {"id": 1, "level": 10}}\n'


@pytest.fixture
def work(tmp_path: Path) -> Path:
    for name in ("s1_s2_join.sql", "inventory.sql", "products.jsonl"):
        shutil.copy(EXAMPLES / name, tmp_path / name)
    (tmp_path / "s2.jsonl").write_text(GOOD_S2, encoding="utf-8")
    return tmp_path


def run_s1(work: Path, s1_text: str, *flags: str, subprocess: bool = True):
    (work / "s1.jsonl").write_text(s1_text, encoding="utf-8")
    if subprocess:
        return cli(Path("s1_s2_join.sql"), {"s1": Path("s1.jsonl"), "s2": Path("s2.jsonl")}, *flags, cwd=work)
    # same command in-process, with paths as a user in ``work`` would type them
    inputs = {"s1": work / "s1.jsonl", "s2": work / "s2.jsonl"}
    result = in_process(work / "s1_s2_join.sql", inputs, *flags)
    result.stderr = result.stderr.replace(f"{work}/", "")
    return result


def assert_one_error_line(result, prefix: str) -> str:
    assert result.status == 2, (result.status, result.stdout, result.stderr)
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(prefix), lines[0]
    return lines[0]


# the four kinds of bad input the acceptance names, through the installed console script
@pytest.mark.parametrize(
    ("bad_line", "expected"),
    [
        ('{"kind": "+I", "row": {"id": 1, "level": 10}', "s1.jsonl:2: malformed JSON"),
        ('{"kind": "+X", "row": {"id": 1, "level": 10}}', 's1.jsonl:2: unknown kind "+X"'),
        ('{"kind": "+I", "row": {"level": 10}}', "s1.jsonl:2: missing primary key column 'id'"),
        ('{"kind": "+I", "row": {"id": 2, "level": "x"}}', "s1.jsonl:2: column 'level': expected BIGINT, got 'x'"),
    ],
)
def test_a_bad_line_is_one_error_line_with_file_and_line_and_exit_2(work, bad_line, expected):
    assert_one_error_line(run_s1(work, GOOD_S1 + bad_line + "\n"), expected)


# more variants of the same, in-process (same typer command, faster)
@pytest.mark.parametrize(
    ("bad_line", "expected"),
    [
        ("not json at all", "s1.jsonl:2: malformed JSON"),
        ('{"kind": "UPDATE", "row": {"id": 1, "level": 10}}', 's1.jsonl:2: unknown kind "UPDATE"'),
        ('{"kind": "-U", "row": {"id": null, "level": 10}}', "s1.jsonl:2: primary key column 'id' is null"),
        ('{"kind": "+I", "row": {"id": true, "level": 1}}', "s1.jsonl:2: column 'id': expected BIGINT, got true"),
        ('{"kind": "+I", "row": {"id": 2, "level": 1, "lvl": 1}}', "s1.jsonl:2: unknown column 'lvl'"),
        ('{"kind": "+I", "row": {"id": 2}}', "s1.jsonl:2: missing column(s) 'level'"),
    ],
)
def test_more_bad_lines_in_process(work, bad_line, expected):
    assert_one_error_line(run_s1(work, GOOD_S1 + bad_line + "\n", subprocess=False), expected)


def test_a_kind_the_source_format_cannot_carry_is_an_error(work):
    (work / "orders.jsonl").write_text('{"kind": "-D", "row": {"product_id": 1, "quantity": 5}}\n', encoding="utf-8")
    result = cli(Path("inventory.sql"), {"orders": Path("orders.jsonl"), "products": Path("products.jsonl")}, cwd=work)
    assert_one_error_line(result, "orders.jsonl:1: kind -D not allowed: source 'orders' is append (json) and takes +I")


def test_every_bad_line_is_reported_not_just_the_first(work):
    result = run_s1(work, "oops\n" + GOOD_S1 + '{"kind": "+I", "row": {"id": "1", "level": 1}}\n')
    assert result.status == 2
    assert [ln.split(": ")[0] for ln in result.stderr.splitlines()] == ["s1.jsonl:1", "s1.jsonl:3"]
    assert result.stdout == ""


def test_errors_are_found_before_anything_runs(work):
    """A bad last line fails the replay before the first batch: no partial output."""
    result = run_s1(work, subprocess=False, s1_text=GOOD_S1 + '{"barrier": true}\n' + GOOD_S1.replace("10", "20") + "{\n")
    assert_one_error_line(result, "s1.jsonl:4: malformed JSON")


def test_unknown_table_in_input_is_exit_2(work):
    result = cli(Path("s1_s2_join.sql"), {"s1": Path("s2.jsonl"), "s3": Path("s2.jsonl")}, cwd=work)
    line = assert_one_error_line(result, "--input 's3=s2.jsonl': s1_s2_join.sql has no source table 's3'")
    assert "(sources: s1, s2)" in line


def test_the_sink_is_not_an_input(work):
    result = cli(Path("s1_s2_join.sql"), {"s1": Path("s2.jsonl"), "s2": Path("s2.jsonl"), "t1": Path("s2.jsonl")}, cwd=work)
    assert_one_error_line(result, "--input 't1=s2.jsonl': s1_s2_join.sql has no source table 't1'")


def test_missing_input_for_a_source_is_exit_2(work):
    result = cli(Path("s1_s2_join.sql"), {"s2": Path("s2.jsonl")}, cwd=work)
    assert_one_error_line(result, "no input for source table(s) s1: add --input s1=PATH")


def test_input_flag_without_a_table_is_exit_2(work):
    result = cli(Path("s1_s2_join.sql"), {}, "--input", "s2.jsonl", cwd=work)
    assert_one_error_line(result, "--input 's2.jsonl': expected TABLE=PATH")


def test_unreadable_input_file_is_exit_2(work):
    result = cli(Path("s1_s2_join.sql"), {"s1": Path("nope.jsonl"), "s2": Path("s2.jsonl")}, cwd=work)
    assert_one_error_line(result, "nope.jsonl: cannot read input for table 's1'")


def test_missing_sql_file_is_exit_2(work):
    result = cli(Path("nope.sql"), {"s1": Path("s2.jsonl")}, cwd=work)
    assert_one_error_line(result, "nope.sql: cannot read pipeline SQL")


def test_sql_outside_the_subset_is_exit_2(work):
    (work / "bad.sql").write_text("DROP TABLE s1;\n", encoding="utf-8")
    result = cli(Path("bad.sql"), {}, cwd=work)
    assert result.status == 2 and result.stdout == "" and "Traceback" not in result.stderr
    assert result.stderr.strip(), "an error message is expected"


def test_missing_on_conflict_is_a_plan_error_exit_2(work):
    sql = (work / "s1_s2_join.sql").read_text(encoding="utf-8").replace("ON CONFLICT DO DEDUPLICATE", "")
    (work / "no_clause.sql").write_text(sql, encoding="utf-8")
    result = cli(Path("no_clause.sql"), {"s1": Path("s2.jsonl"), "s2": Path("s2.jsonl")}, cwd=work)
    assert result.status == 2 and result.stdout == "" and "Traceback" not in result.stderr
    for clause in ("DO NOTHING", "DO ERROR", "DO DEDUPLICATE"):
        assert clause in result.stderr


def test_a_bad_batching_mode_is_a_usage_error(work):
    result = run_s1(work, GOOD_S1, "--batching", "nightly", subprocess=False)
    assert result.status == 2 and result.stdout == "" and "Traceback" not in result.stderr
    assert "nightly" in result.stderr


def test_the_shipped_bad_example_reports_every_bad_line_as_documented():
    result = cli(EXAMPLES / "s1_s2_join.sql", {"s1": Path("examples/bad_s1.jsonl"), "s2": EXAMPLES / "s2.jsonl"})
    assert result.status == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "examples/bad_s1.jsonl:2: column 'level': expected BIGINT, got '20'",
        'examples/bad_s1.jsonl:3: unknown kind "-X" (expected one of +I, -U, +U, -D)',
        "examples/bad_s1.jsonl:4: missing primary key column 'id'",
        "examples/bad_s1.jsonl:5: malformed JSON: Expecting ',' delimiter (column 55)",
    ]


# bounded reading: limits on line length and nesting, short quotes, the line of every error


def write_s1_bytes(work: Path, data: bytes) -> None:
    (work / "s1.jsonl").write_bytes(data)


def run_s1_bytes(work: Path, data: bytes, *flags: str):
    write_s1_bytes(work, data)
    return cli(Path("s1_s2_join.sql"), {"s1": Path("s1.jsonl"), "s2": Path("s2.jsonl")}, *flags, cwd=work)


def test_a_deeply_nested_line_is_an_error_line_not_a_recursion_error(work):
    result = run_s1_bytes(work, GOOD_S1.encode() + b"[" * 100_000 + b"\n")
    assert_one_error_line(result, "s1.jsonl:2: JSON nested deeper than 64 levels")


def test_nesting_within_json_but_over_the_limit_is_refused_too(work):
    nested = '{"kind": "+I", "row": {"id": 2, "level": ' + "[" * 70 + "]" * 70 + "}}\n"
    result = run_s1(work, GOOD_S1 + nested, subprocess=False)
    assert_one_error_line(result, "s1.jsonl:2: JSON nested deeper than 64 levels")


def test_a_line_over_the_default_limit_without_any_newline_is_an_error_not_a_memory_error(work):
    result = run_s1_bytes(work, b'{"kind": "+I", "row": {"id": 1, "level": "' + b"9" * (17 * 1024 * 1024))
    line = assert_one_error_line(result, "s1.jsonl:1: line longer than 16777216 bytes")
    assert "--max-line-bytes" in line


def test_max_line_bytes_sets_the_limit_and_the_lines_after_a_long_one_are_still_read(work):
    long_line = '{"kind": "+I", "row": {"id": 7, "level": ' + "1" * 200 + "}}\n"
    result = run_s1_bytes(work, (GOOD_S1 + long_line + "oops\n").encode(), "--max-line-bytes", "100")
    assert result.status == 2 and result.stdout == "" and "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        "s1.jsonl:2: line longer than 100 bytes (raise the limit with --max-line-bytes)",
        "s1.jsonl:3: malformed JSON: Expecting value (column 1)",
    ]


def test_a_huge_bad_value_is_quoted_by_a_short_prefix_only(work):
    huge = "x" * 5_000_000
    bad = '{"kind": "+I", "row": {"id": 2, "level": "' + huge + '", "' + huge + '": 1}}\n'
    result = run_s1(work, GOOD_S1 + bad, subprocess=False)
    line = assert_one_error_line(result, "s1.jsonl:2: ")
    assert len(line) < 400, len(line)
    assert "'xxxxxxxx" in line and "..." in line


def test_invalid_utf8_names_the_line_and_the_byte(work):
    result = run_s1_bytes(work, GOOD_S1.encode() + b'{"kind": "+I", "row": {"id": 2, "level": "\xff"}}\n')
    assert_one_error_line(result, "s1.jsonl:2: not UTF-8 text: byte 0xff at byte 43 of the line")


def test_crlf_line_ends_are_read_as_line_ends(work):
    result = run_s1_bytes(work, GOOD_S1.replace("\n", "\r\n").encode())
    assert result.status == 0, result.stderr
