"""A statement set registers with the control service like any pipeline: its plan shows
every sink, and its second sink's topic follows the one-writer rule against the other
registered pipelines (the first sink's alone would not catch it)."""

from __future__ import annotations

from pathlib import Path

from control_support import register

ROOT = Path(__file__).resolve().parents[2]
STATEMENT_SET = (ROOT / "examples" / "orders_statement_set.sql").read_text(encoding="utf-8")


def test_a_statement_set_registers_and_its_second_sink_keeps_its_topic(service):
    r = register(service, "open-orders", sql=STATEMENT_SET)
    assert r.status_code == 201, r.text
    plan = r.json()["plan"]
    assert plan["statement_set"] is True
    assert [s["sink"] for s in plan["sinks"]] == ["open_orders", "open_revenue"]
    other = STATEMENT_SET.split("CREATE VIEW")[0] + (
        "INSERT INTO open_revenue SELECT customer_id, COUNT(*), SUM(amount) FROM orders GROUP BY customer_id;")
    r = register(service, "revenue-again", sql=other)
    assert r.status_code == 422, r.text
    assert "already the sink of pipeline 'open-orders'" in r.text
