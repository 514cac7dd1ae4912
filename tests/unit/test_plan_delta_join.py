"""The planner's delta join choice: every qualifying rule, with the reason FORCE fails with
(and AUTO shows in EXPLAIN), and what an eventual delta join does to the sink plan."""

from __future__ import annotations

import pytest

from tidemark.engine.errors import PlanError
from tidemark.engine.pipeline import compile_sql
from tidemark.engine.stages.delta_join import DeltaJoin
from tidemark.engine.stages.join import Join

TABLES = """
CREATE TABLE a (id BIGINT, k BIGINT, v BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('format' = 'debezium-json', 'index.by_k.columns' = 'k');
CREATE TABLE b (id BIGINT, k BIGINT, w BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('format' = 'debezium-json', 'index.by_k.columns' = 'k');
CREATE TABLE c (id BIGINT, k BIGINT, w BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('format' = 'json', 'index.by_k.columns' = 'k');
CREATE TABLE u (id BIGINT, k BIGINT, w BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('format' = 'upsert-json', 'index.by_k.columns' = 'k');
CREATE TABLE nopk (id BIGINT, k BIGINT, w BIGINT) WITH ('format' = 'json');
CREATE TABLE t (aid BIGINT, bid BIGINT, v BIGINT, w BIGINT, PRIMARY KEY (aid, bid) NOT ENFORCED)
  WITH ('format' = 'upsert-json');
CREATE TABLE tc (aid BIGINT, bid BIGINT, v BIGINT, w BIGINT, PRIMARY KEY (aid, bid) NOT ENFORCED)
  WITH ('format' = 'changelog-json');
CREATE TABLE tk (k BIGINT, n BIGINT, PRIMARY KEY (k) NOT ENFORCED) WITH ('format' = 'upsert-json');
"""


def plan(query: str, strategy: str = "FORCE", consistency: str = "strong", extra: str = ""):
    return compile_sql(
        f"SET 'table.optimizer.delta-join.strategy' = '{strategy}';\n"
        f"SET 'table.exec.delta-join.consistency' = '{consistency}';\n{extra}" + TABLES + query
    )


def join_node(p, nth: int = 0):
    return [n for n in p.nodes if n.kind == "join"][nth]


AB = "INSERT INTO t SELECT a.id, b.id, a.v, b.w FROM a JOIN b ON a.k = b.k ON CONFLICT DO DEDUPLICATE;"
AC = "INSERT INTO t SELECT a.id, c.id, a.v, c.w FROM a JOIN c ON a.k = c.k ON CONFLICT DO DEDUPLICATE;"

FORCE_FAILURES = [
    # (consistency, query, reason)
    ("strong", "INSERT INTO t SELECT a.id, u.id, a.v, u.w FROM a JOIN u ON a.k = u.k ON CONFLICT DO DEDUPLICATE;",
     "the right input reads table 'u' with the upsert format 'upsert-json', which is normalized by a stateful stage"),
    ("strong", "INSERT INTO t SELECT a.id, x.k, a.v, x.n FROM a JOIN (SELECT k, COUNT(*) AS n FROM b GROUP BY k) x "
               "ON a.k = x.k ON CONFLICT DO DEDUPLICATE;",
     "the right input comes from an aggregate stage [2]; only calc stages (projection/filter) may sit between a source"),
    ("strong", "INSERT INTO t SELECT a.id, x.id, a.v, x.w FROM a JOIN (SELECT id, k + 1 AS k1, w FROM b) x "
               "ON a.k = x.k1 ON CONFLICT DO DEDUPLICATE;",
     "the right join key column 'k1' is computed by a calc stage; delta join keys must be columns of table 'b'"),
    ("strong", "INSERT INTO t SELECT a.id, nopk.id, a.v, nopk.w FROM a JOIN nopk ON a.k = nopk.k ON CONFLICT DO DEDUPLICATE;",
     "table 'nopk' has no PRIMARY KEY; its index keeps the latest row per primary key"),
    ("strong", "INSERT INTO t SELECT a.id, b.id, a.v, b.w FROM a JOIN b ON a.v = b.w ON CONFLICT DO DEDUPLICATE;",
     "the join key (v) of table 'a' includes none of its indexes (PRIMARY(id), by_k(k)); declare one with "
     "'index.<name>.columns' = '<columns>'"),
    ("eventual", "INSERT INTO t SELECT a.id, c.id, a.v, c.w FROM a LEFT JOIN c ON a.k = c.k ON CONFLICT DO DEDUPLICATE;",
     "an eventually consistent delta join supports INNER joins only (this is a LEFT join); "
     "SET 'table.exec.delta-join.consistency' = 'strong' for an exact delta join of any type"),
    ("eventual", AB,
     "both inputs may delete rows or move them between join keys ('a' is debezium-json, 'b' is debezium-json); an "
     "eventually consistent delta join allows that on one input only, the other must be append-only"),
    ("eventual", "INSERT INTO t SELECT x.k, c.id, x.v, c.w FROM (SELECT k, v FROM a) x JOIN c ON x.k = c.k "
                 "ON CONFLICT DO DEDUPLICATE;",
     "the input from table 'a' drops primary key column(s) (id); an eventually consistent delta join's output is "
     "applied by the pair of primary keys"),
    ("eventual", "INSERT INTO tk SELECT a.k, COUNT(*) FROM a JOIN c ON a.k = c.k GROUP BY a.k;",
     "its output feeds an aggregate stage [3]; an eventually consistent delta join emits duplicates and deletes by key"),
]


@pytest.mark.parametrize("consistency, query, reason", FORCE_FAILURES)
def test_force_fails_with_the_reason(consistency: str, query: str, reason: str) -> None:
    with pytest.raises(PlanError) as err:
        plan(query, "FORCE", consistency)
    assert "SET 'table.optimizer.delta-join.strategy' = 'FORCE': join [" in str(err.value)
    assert "cannot be a delta join: " + reason in str(err.value)


@pytest.mark.parametrize("consistency, query, reason", FORCE_FAILURES)
def test_auto_falls_back_to_the_regular_join_and_says_why(consistency: str, query: str, reason: str) -> None:
    p = plan(query, "AUTO", consistency)
    node = join_node(p)
    assert isinstance(node.stage, Join)
    assert node.detail["strategy"] == "regular"
    assert reason in node.detail["strategy_reason"]
    assert reason in p.explain_text()


def test_cascading_joins_are_not_delta_joins() -> None:
    q = ("INSERT INTO t SELECT a.id, c.id, a.v, c.w FROM a JOIN b ON a.k = b.k JOIN c ON b.k = c.k "
         "ON CONFLICT DO DEDUPLICATE;")
    with pytest.raises(PlanError, match=r"join \[4\] ON .* cannot be a delta join: the left input is the output of "
                                        r"join \[2\]: cascading joins are not supported"):
        plan(q, "FORCE", "strong")
    p = plan(q, "AUTO", "strong")
    assert isinstance(join_node(p, 0).stage, DeltaJoin)  # the first join qualifies on its own
    assert isinstance(join_node(p, 1).stage, Join)


def test_strong_qualifies_for_any_changelog_and_join_type() -> None:
    for join in ("JOIN", "LEFT JOIN", "RIGHT JOIN", "FULL JOIN"):
        p = plan(AB.replace(" JOIN ", f" {join} "), "FORCE", "strong")
        node = join_node(p)
        assert isinstance(node.stage, DeltaJoin) and node.stage.consistency == "strong"
        assert node.changelog_mode == "retract"  # exact: downstream plans as for the regular join
        assert "strong consistency" in node.detail["strategy_reason"]


def test_eventual_qualifies_with_one_append_only_input_and_explains_the_choice() -> None:
    p = plan(AC, "AUTO", "eventual")
    node = join_node(p)
    assert isinstance(node.stage, DeltaJoin)
    assert node.changelog_mode == "upsert"
    text = p.explain_text()
    assert "join inner (delta join, eventual)" in text
    assert ("strategy: delta join; join keys include index a.by_k(k) and c.by_k(k); only calc stages between the "
            "sources and the join; eventual consistency: one input is append-only") in text
    assert "indexes: left a.by_k(k), right c.by_k(k)" in text
    assert "cache: 10000 left / 10000 right join keys (LRU)" in text


def test_primary_key_index_is_preferred_and_filters_are_whitelisted() -> None:
    q = "INSERT INTO t SELECT a.id, c.id, a.v, c.w FROM a JOIN c ON a.id = c.id AND a.k = c.k WHERE c.w > 1 ON CONFLICT DO DEDUPLICATE;"
    node = join_node(plan(q, "FORCE", "eventual"))
    assert node.detail["delta_join"]["indexes"] == {"left": "a.PRIMARY(id)", "right": "c.PRIMARY(id)"}


def test_upsert_sink_keyed_by_the_pair_needs_no_materializer_but_a_changelog_sink_gets_one() -> None:
    assert plan(AC, "FORCE", "eventual").materializer is None
    p = plan(AC.replace("INTO t ", "INTO tc ").replace(" ON CONFLICT DO DEDUPLICATE", ""), "FORCE", "eventual")
    mat = p.materializer
    assert mat is not None and mat.detail["strategy"] == "DEDUPLICATE"
    assert "an eventually consistent delta join emits duplicates and deletes by key" in mat.detail["reason"]


def test_none_keeps_the_regular_join() -> None:
    node = join_node(plan(AC, "NONE", "eventual"))
    assert isinstance(node.stage, Join) and not isinstance(node.stage, DeltaJoin)
    assert node.detail["strategy_reason"] == "SET 'table.optimizer.delta-join.strategy' = 'NONE'"


@pytest.mark.parametrize(
    "setting, message",
    [
        ("SET 'table.optimizer.delta-join.strategy' = 'SOMETIMES';",
         "SET 'table.optimizer.delta-join.strategy' = 'SOMETIMES': expected one of AUTO, FORCE, NONE"),
        ("SET 'table.exec.delta-join.consistency' = 'exact';",
         "SET 'table.exec.delta-join.consistency' = 'exact': expected one of eventual, strong"),
        ("SET 'table.exec.delta-join.left.cache-size' = 'lots';",
         "SET 'table.exec.delta-join.left.cache-size' = 'lots': expected a number of join keys"),
        ("SET 'table.exec.delta-join.cache-enabled' = 'maybe';",
         "SET 'table.exec.delta-join.cache-enabled' = 'maybe': expected true or false"),
    ],
)
def test_bad_options_are_refused(setting: str, message: str) -> None:
    with pytest.raises(PlanError, match=message.replace("(", r"\(").replace(")", r"\)")):
        compile_sql(setting + TABLES + AC)


def test_index_naming_an_unknown_column_is_refused() -> None:
    bad = TABLES.replace("'index.by_k.columns' = 'k');\nCREATE TABLE c", "'index.by_k.columns' = 'kk');\nCREATE TABLE c")
    with pytest.raises(PlanError, match="table 'b': index 'by_k' \\('index.by_k.columns'\\) names unknown column 'kk'"):
        compile_sql("SET 'table.exec.delta-join.consistency' = 'strong';" + bad + AB)


def test_cache_options_reach_the_stage_and_seed_spellings_are_accepted() -> None:
    p = plan(AC, "FORCE", "eventual",
             "SET 'table.exec.delta-join.cache-enable' = 'false';\n"
             "SET 'table.exec.delta-join.left-cache-size' = '5L';\n"
             "SET 'table.exec.delta-join.right.cache-size' = '7';\n")
    stage = join_node(p).stage
    assert stage.cache_enabled is False and stage.cache_sizes == (5, 7)
