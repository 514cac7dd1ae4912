"""Statement sets: several INSERTs planned into one DAG that shares its sources and the
views they read, one sink (and sink policy) per INSERT, run by the replay host in one walk."""

from __future__ import annotations

import pytest

from tidemark.engine.changelog import Change
from tidemark.engine.errors import PlanError, SqlError
from tidemark.engine.pipeline import compile_sql
from tidemark.engine.replay import ReplayHost

TABLES = """
CREATE TABLE orders (id BIGINT, customer BIGINT, amount BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('format' = 'changelog-json');
CREATE TABLE big_orders (id BIGINT, customer BIGINT, amount BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('format' = 'upsert-json');
CREATE TABLE totals (customer BIGINT, total BIGINT, n BIGINT, PRIMARY KEY (customer) NOT ENFORCED)
  WITH ('format' = 'changelog-json');
CREATE TABLE by_amount (amount BIGINT, customer BIGINT, PRIMARY KEY (amount) NOT ENFORCED)
  WITH ('format' = 'upsert-json');
CREATE VIEW large AS SELECT id, customer, amount FROM orders WHERE amount >= 100;
"""
BIG = "INSERT INTO big_orders SELECT * FROM large"
TOTALS = "INSERT INTO totals SELECT customer, SUM(amount), COUNT(*) FROM large GROUP BY customer"
SET = f"EXECUTE STATEMENT SET BEGIN\n  {BIG};\n  {TOTALS};\nEND;\n"


def kinds(pipeline, kind):
    return [n for n in pipeline.nodes if n.kind == kind]


@pytest.mark.parametrize("form", [SET, f"BEGIN STATEMENT SET;\n{BIG};\n{TOTALS};\nEND;\n"])
def test_both_forms_plan_one_dag_with_a_sink_per_insert_sharing_source_and_view(form):
    p = compile_sql(TABLES + form)
    assert p.statement_set
    assert [t.table.name for t in p.sinks] == ["big_orders", "totals"]
    assert [n.table for n in kinds(p, "source")] == ["orders"]  # read once
    (view,) = kinds(p, "calc")  # the view's filter, planned once for both INSERTs
    assert [(n.kind, n.table) for n in p.consumers(view.id)] == [("sink", "big_orders"), ("aggregate", None)]
    assert {p.node(t.node_id).table for t in p.sinks} == {"big_orders", "totals"}
    text = p.explain_text()
    assert text.startswith("Pipeline EXECUTE STATEMENT SET (INSERT INTO big_orders; INSERT INTO totals)")
    assert f"[{view.id}] calc <- [0]   (shared by big_orders, totals)" in text
    assert [s["sink"] for s in p.explain()["sinks"]] == ["big_orders", "totals"]


def test_each_sink_gets_its_own_conflict_policy():
    sql = TABLES + (
        "EXECUTE STATEMENT SET BEGIN\n"
        f"  {BIG};\n"
        "  INSERT INTO by_amount SELECT amount, customer FROM orders ON CONFLICT DO DEDUPLICATE;\n"
        "END;"
    )
    p = compile_sql(sql)
    by_sink = {s["sink"]: s for s in p.explain()["sinks"]}
    assert by_sink["big_orders"]["materializer"] is None
    assert by_sink["by_amount"]["materializer"]["strategy"] == "DEDUPLICATE"
    assert p.sinks[1].materializer_reason is not None and "by_amount" in p.sinks[1].materializer_reason
    assert p.sinks[0].materializer_reason is None
    # without the clause, the second INSERT alone fails planning, naming its sink
    with pytest.raises(PlanError, match="sink table 'by_amount'"):
        compile_sql(sql.replace(" ON CONFLICT DO DEDUPLICATE", ""))


def test_replay_writes_every_sink_from_one_walk_with_retractions():
    host = ReplayHost(compile_sql(TABLES + SET))
    first = host.run_batch(
        {"orders": [Change("+I", (1, 10, 150), (0, 0, 0, 1)), Change("+I", (2, 10, 50), (0, 0, 0, 2)),
                    Change("+I", (3, 20, 300), (0, 0, 0, 3))]},
        now_ms=0,
    )
    assert sorted(c.row for c in first) == [(1, 10, 150), (3, 20, 300)]  # the first sink's changes
    assert sorted(c.row for c in host.last_changes["totals"]) == [(10, 150, 1), (20, 300, 1)]
    host.run_batch(
        {"orders": [Change("-U", (1, 10, 150), (1, 0, 0, 4)), Change("+U", (1, 10, 80), (1, 0, 0, 5)),
                    Change("-U", (2, 10, 50), (1, 0, 0, 6)), Change("+U", (2, 10, 120), (1, 0, 0, 7)),
                    Change("-D", (3, 20, 300), (1, 0, 0, 8))]},
        now_ms=1,
    )
    assert host.rows("big_orders") == [(2, 10, 120)]
    assert host.rows("totals") == [(10, 120, 1)]
    assert host.rows() == host.rows("big_orders")


@pytest.mark.parametrize(
    "body, message",
    [
        (f"{BIG};\n{TOTALS};", "only one INSERT INTO statement per pipeline is supported outside a statement set"),
        (f"{BIG};\n{SET}", "nothing beside it, but this one follows an INSERT INTO outside it"),
        (f"{SET}{SET}", "this one follows another statement set"),
        (f"EXECUTE STATEMENT SET BEGIN\n{BIG};", "the statement set is not closed: end it with END;"),
        ("EXECUTE STATEMENT SET BEGIN END;", "the statement set holds no INSERT INTO statement"),
        (f"EXECUTE STATEMENT SET BEGIN\n{BIG};\nSET 'a' = 'b';\nEND;", "a statement set holds only INSERT INTO"),
        (f"{BIG};\nEND;", "END without a statement set to close"),
        ("EXECUTE my_procedure;", "EXECUTE is supported only as EXECUTE STATEMENT SET BEGIN ... END"),
    ],
)
def test_malformed_statement_sets_are_refused_by_name(body, message):
    with pytest.raises(SqlError, match=message.replace("(", r"\(").replace(".", r"\.")):
        compile_sql(TABLES + body)


def test_lone_second_insert_points_at_statement_sets_with_its_position():
    with pytest.raises(SqlError) as info:
        compile_sql(TABLES + f"{BIG};\n{TOTALS};")
    assert "EXECUTE STATEMENT SET BEGIN INSERT INTO ...; INSERT INTO ...; END;" in str(info.value)
    assert info.value.line == TABLES.count("\n") + 2


@pytest.mark.parametrize(
    "second, message",
    [
        ("INSERT INTO big_orders SELECT * FROM orders", "table 'big_orders' is written by two INSERTs"),
        ("INSERT INTO by_amount SELECT amount, customer FROM big_orders",
         "table 'big_orders' is written by one INSERT of the statement set and read by another"),
    ],
)
def test_sinks_are_distinct_and_never_read_back(second, message):
    with pytest.raises(SqlError, match=message):
        compile_sql(TABLES + f"EXECUTE STATEMENT SET BEGIN {BIG}; {second}; END;")


def test_a_single_insert_plans_as_before():
    p = compile_sql(TABLES + BIG)
    assert not p.statement_set
    assert [t.table.name for t in p.sinks] == ["big_orders"]
    assert p.explain_text().startswith("Pipeline INSERT INTO big_orders\n")
    assert "shared by" not in p.explain_text()


def test_two_sinks_of_a_set_on_one_topic_are_refused():
    sql = TABLES.replace("WITH ('format' = 'changelog-json');\nCREATE TABLE by_amount",
                         "WITH ('format' = 'changelog-json', 'topic' = 'big_orders');\nCREATE TABLE by_amount")
    with pytest.raises(SqlError, match="tables 'big_orders' and 'totals' of the statement set both write topic 'big_orders'"):
        compile_sql(sql + SET)
