"""The changelog-disorder example (seed: changelog-disorder-and-sink-upsert-materializer)
through the real ``tidemark replay``.

s1 = {id 1: level 10 -> 20}, s2 = {10: 'a1', 20: 'b1'}; t1 = s1 JOIN s2 ON level = s2.id.
Whatever order the changes arrive in, and however they are cut into batches (as long as a
retraction never comes before its add), t1 must end as {(1, 20, 'b1')}; and when the
-U/+U pair sits inside one batch the sink must never see the intermediate row.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from replaykit import EXAMPLES, cli, in_process, summary, table_after_batches, write_jsonl

SQL = EXAMPLES / "s1_s2_join.sql"
FINAL = {(1,): {"id": 1, "level": 20, "attr": "b1"}}

# the five source changes; "-U" of s1 must come after the "+I" it retracts
A = ("s2", "+I", {"id": 10, "attr": "a1"})
B = ("s2", "+I", {"id": 20, "attr": "b1"})
C = ("s1", "+I", {"id": 1, "level": 10})
D = ("s1", "-U", {"id": 1, "level": 10})
E = ("s1", "+U", {"id": 1, "level": 20})
RECORDS = (A, B, C, D, E)

# the seed's three orderings at the sink: the s2 rows are there, then s1's changes arrive as
CASES = {
    "case1_ideal": (A, B, C, D, E),
    "case2_add_overtakes_both": (A, B, E, C, D),
    "case3_add_overtakes_retraction": (A, B, C, E, D),
}


def valid_orderings() -> list[tuple]:
    return [p for p in itertools.permutations(RECORDS) if p.index(C) < p.index(D)]


def write_inputs(tmp: Path, order: tuple, cuts: frozenset[int] = frozenset(), sql: Path = SQL) -> dict[str, Path]:
    """One file per table; ``seq`` = position in ``order`` (so the replay interleaves the
    two files exactly in that order); a barrier after position i for every i in cuts."""
    lines: dict[str, list[dict]] = {"s1": [], "s2": []}
    for i, (table, kind, row) in enumerate(order, start=1):
        lines[table].append({"kind": kind, "row": row, "seq": i})
        if i in cuts:
            lines[table].append({"barrier": True})
    return {t: write_jsonl(tmp / f"{t}.jsonl", ls) for t, ls in lines.items()}


def final_table(result) -> dict:
    assert result.status == 0, result.stderr
    n = summary(result.stderr)["batch(es)"]
    return table_after_batches(result.json_lines(), ("id",), n)[-1]


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_seed_ordering_with_the_pair_in_one_batch_emits_only_the_final_row(tmp_path, case):
    inputs = write_inputs(tmp_path, CASES[case])
    result = cli(SQL, inputs)
    assert result.status == 0, result.stderr
    # internal consistency: no +I(1,10,a1) / -U flicker reaches the sink
    assert result.json_lines() == [{"kind": "+I", "row": {"id": 1, "level": 20, "attr": "b1"}, "batch": 1}]
    table = cli(SQL, inputs, "--emit", "table")
    assert table.status == 0, table.stderr
    assert table.json_lines() == [{"id": 1, "level": 20, "attr": "b1"}]


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_seed_ordering_one_record_per_batch_ends_with_the_final_row(tmp_path, case):
    result = in_process(SQL, write_inputs(tmp_path, CASES[case]), "--batching", "record")
    assert summary(result.stderr)["batch(es)"] == 5
    assert final_table(result) == FINAL


def test_every_valid_ordering_one_record_per_batch_ends_with_the_final_row(tmp_path):
    orderings = valid_orderings()
    assert len(orderings) == 60  # 5! / 2: half the permutations put -U before its +I
    for n, order in enumerate(orderings):
        d = tmp_path / str(n)
        d.mkdir()
        result = in_process(SQL, write_inputs(d, order), "--batching", "record")
        assert final_table(result) == FINAL, [r[1:] for r in order]


def all_cuts() -> list[tuple[int, ...]]:
    """Every way to cut five records into consecutive batches (2^4 = 16)."""
    return [c for k in range(len(RECORDS)) for c in itertools.combinations(range(1, len(RECORDS)), k)]


def check_cut_into_batches(tmp_path: Path, orderings: list[tuple]) -> int:
    runs = 0
    for n, order in enumerate(orderings):
        for cuts in all_cuts():
            d = tmp_path / f"{n}_{'-'.join(map(str, cuts))}"
            d.mkdir()
            result = in_process(SQL, write_inputs(d, order, frozenset(cuts)))
            assert summary(result.stderr)["batch(es)"] == len(cuts) + 1
            tables = table_after_batches(result.json_lines(), ("id",), len(cuts) + 1)
            assert tables[-1] == FINAL, ([r[1:] for r in order], cuts)
            runs += 1
    return runs


def test_the_seed_orderings_cut_into_batches_every_possible_way_end_with_the_final_row(tmp_path):
    assert check_cut_into_batches(tmp_path, list(CASES.values())) == 3 * 16


@pytest.mark.slow
def test_every_valid_ordering_cut_into_batches_every_possible_way_ends_with_the_final_row(tmp_path):
    assert check_cut_into_batches(tmp_path, valid_orderings()) == 60 * 16


def test_the_shipped_example_shows_the_update_landing_in_its_own_batch():
    result = cli(SQL, {"s1": EXAMPLES / "s1.jsonl", "s2": EXAMPLES / "s2.jsonl"})
    assert result.status == 0, result.stderr
    assert result.json_lines() == [
        {"kind": "+I", "row": {"id": 1, "level": 10, "attr": "a1"}, "batch": 1},
        {"kind": "-U", "row": {"id": 1, "level": 10, "attr": "a1"}, "batch": 2},
        {"kind": "+U", "row": {"id": 1, "level": 20, "attr": "b1"}, "batch": 2},
    ]
    assert summary(result.stderr) == {
        "batch(es)": 2,
        "record(s) in": 5,
        "change(s) out": 3,
        "conflict(s) dropped": 0,
        "retraction(s) without state": 0,
    }


@pytest.mark.parametrize("s1_file", ["s1.jsonl", "s1_case2.jsonl", "s1_case3.jsonl"])
def test_the_shipped_orderings_end_with_the_final_row(s1_file):
    result = cli(SQL, {"s1": EXAMPLES / s1_file, "s2": EXAMPLES / "s2.jsonl"}, "--emit", "table")
    assert result.status == 0, result.stderr
    assert result.json_lines() == [{"id": 1, "level": 20, "attr": "b1"}]
