"""The benchmark workload generator: deterministic per seed, the sizes and shapes the suite
relies on, and expected final tables that Tidemark's reference host agrees with."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import pytest
from compare import compare_tables, key_positions
from replay_reference import replay_table
from workloads import NAMES, QUICK_SCALE, generate

SCALE = 0.02


def _digest(wl) -> dict[str, str]:
    return {t: hashlib.sha256(Path(p).read_bytes()).hexdigest() for t, p in wl.tables.items()}


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_bytes_other_seed_other_bytes(name: str, tmp_path: Path) -> None:
    a = generate(name, SCALE, 7, tmp_path / "a")
    b = generate(name, SCALE, 7, tmp_path / "b")
    c = generate(name, SCALE, 8, tmp_path / "c")
    assert _digest(a) == _digest(b)
    assert a.expected == b.expected and a.tidemark_variants == b.tidemark_variants
    assert _digest(a) != _digest(c)


@pytest.mark.parametrize("name", NAMES)
def test_input_rows_counts_every_line_and_scale_sizes_it(name: str, tmp_path: Path) -> None:
    small = generate(name, SCALE, 1, tmp_path / "s")
    big = generate(name, SCALE * 4, 1, tmp_path / "b")
    for wl in (small, big):
        assert wl.input_rows == sum(len(_records(p)) for p in wl.tables.values())
        assert list(wl.tables) == list(wl.formats)
    assert 3 * small.input_rows < big.input_rows < 5 * small.input_rows


@pytest.mark.parametrize("name", NAMES)
def test_lines_are_what_the_declared_format_reads(name: str, tmp_path: Path) -> None:
    wl = generate(name, SCALE, 1, tmp_path)
    for table, path in wl.tables.items():
        cols = set(wl.specs[table].column_names)
        for rec in _records(path):
            if wl.formats[table] == "json":
                assert set(rec) == cols
            else:
                assert rec["op"] in ("c", "u", "d")
                images = [rec[f] for f in ("before", "after") if rec[f] is not None]
                assert images and all(set(i) == cols for i in images)
                assert (rec["before"] is None) == (rec["op"] == "c")
                assert (rec["after"] is None) == (rec["op"] == "d")


def test_w2_variants_share_data_and_error_input_has_one_row_per_sink_key(tmp_path: Path) -> None:
    wls = {s: generate(f"W2-{s}", SCALE, 3, tmp_path / s) for s in ("DEDUPLICATE", "NOTHING", "ERROR")}
    assert len({tuple(_digest(w).values()) for w in wls.values()}) == 1
    assert {w.strategy for w in wls.values()} == {"DEDUPLICATE", "NOTHING", "ERROR"}
    assert "ON CONFLICT DO ERROR" in wls["ERROR"].tidemark_sql and "ON CONFLICT DO ERROR" in wls["ERROR"].select
    # conflict-free: the sink key is s1.id, and after every s1 record each id has at most one
    # row (a move between join keys is one record) whose level exists in s2
    levels = {r["after"]["id"] for r in _records(wls["ERROR"].tables["s2"]) if r["op"] == "c"}
    live: dict[int, int] = {}
    moves = 0
    for rec in _records(wls["ERROR"].tables["s1"]):
        if rec["op"] == "c":
            assert rec["after"]["id"] not in live
            live[rec["after"]["id"]] = rec["after"]["level"]
        elif rec["op"] == "u":
            assert live[rec["before"]["id"]] == rec["before"]["level"] != rec["after"]["level"]
            live[rec["after"]["id"]] = rec["after"]["level"]
            moves += 1
        else:
            assert live.pop(rec["before"]["id"]) == rec["before"]["level"]
        assert set(live.values()) <= levels
    assert moves > len(live)  # updates that change the join key dominate


def test_w3_one_sink_key_many_upsert_keys_all_but_one_retracted(tmp_path: Path) -> None:
    wl = generate("W3", SCALE, 5, tmp_path)
    recs = _records(wl.tables["s"])
    inserts = [r["after"] for r in recs if r["op"] == "c"]
    deletes = [r["before"] for r in recs if r["op"] == "d"]
    n = wl.params["keys"]
    assert len(inserts) == n and len(deletes) == n - 1 and len(recs) == wl.input_rows
    assert {r["grp"] for r in inserts} == {1} and len({r["id"] for r in inserts}) == n
    assert recs[:n] == [{"before": None, "after": i, "op": "c", "ts_ms": k + 1} for k, i in enumerate(inserts)]
    deleted = [d["id"] for d in deletes]
    assert len(set(deleted)) == n - 1 and deleted != sorted(deleted)  # random order
    (survivor,) = {r["id"] for r in inserts} - set(deleted)
    assert wl.expected == {(1,): (1, survivor, next(r["v"] for r in inserts if r["id"] == survivor))}
    assert wl.sink_pk == ["grp"] and set(wl.flink_variants) == {"LEGACY", "ADAPTIVE"}
    assert {v["table.exec.sink.upsert-materialize-strategy.type"] for v in wl.flink_variants.values()} == \
        {"LEGACY", "ADAPTIVE"}


def test_w1_names_are_shared_and_end_with_at_most_one_active_product(tmp_path: Path) -> None:
    wl = generate("W1", SCALE, 2, tmp_path)
    names = Counter(r["after"]["name"] for r in _records(wl.tables["products"]))
    assert set(names.values()) == {4}
    totals: Counter = Counter()
    for o in _records(wl.tables["orders"]):
        totals[o["product_id"]] += o["quantity"]
    name_of = {r["after"]["id"]: r["after"]["name"] for r in _records(wl.tables["products"])}
    below = Counter(name_of[p] for p, t in totals.items() if t < 10)
    assert max(below.values()) == 1
    assert sum(t >= 10 for t in totals.values()) > len(below)  # most products are rolled back


def test_w4_variants_force_and_disable_the_delta_join(tmp_path: Path) -> None:
    from tidemark.engine.pipeline import compile_sql

    wl = generate("W4", SCALE, 1, tmp_path)
    kinds = {}
    for variant, sql in wl.tidemark_variants.items():
        text = compile_sql(sql).explain_text()
        kinds[variant] = "delta join" in text
    assert kinds == {"delta": True, "regular": False}
    assert "index." not in wl.flink_sql() and "'connector' = 'filesystem'" in wl.flink_sql()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("batch_size", [1, 997])
def test_expected_table_is_what_tidemark_replay_computes(name: str, batch_size: int, tmp_path: Path) -> None:
    wl = generate(name, QUICK_SCALE / 2, 11, tmp_path)
    key = key_positions(wl.sink_columns, wl.sink_pk)
    assert wl.expected
    for variant in wl.tidemark_variants:
        assert compare_tables(list(wl.expected.values()), replay_table(wl, variant, batch_size), key) == []


def test_compare_tables_normalizes_types_and_reports_every_kind_of_difference() -> None:
    from decimal import Decimal

    assert compare_tables([[1, "a", "1.50"]], [(1.0, "a", Decimal("1.5"))], [0]) == []
    assert compare_tables([[1, None]], [(1, 0)], [0]) == ["key (1,): flink (1, None) != tidemark (1, 0)"]
    assert compare_tables([[1, 2.0000000001]], [(1, 2.0)], [0]) == []
    assert compare_tables([[1, 2.1]], [(1, 2)], [0]) == ["key (1,): flink (1, 2.1) != tidemark (1, 2)"]
    assert compare_tables([[1, "x"], [2, "y"]], {(1,): (1, "x"), (3,): (3, "z")}, [0]) == [
        "only in flink: (2, 'y')", "only in tidemark: (3, 'z')"]
    assert compare_tables([[1, True]], [(1, 1)], [0]) != []
