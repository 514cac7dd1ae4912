"""Flink 2.3's plan for Tidemark pipeline SQL: which operators Flink would run it with.

Run with the Flink venv's python (``$TIDEMARK_FLINK_PYTHON``) as a subprocess. It reads
``{"cases": [{"id": ..., "sql": ...}]}`` on stdin and writes ``{"plans": {id: text}}``, the
text of ``EXPLAIN`` (its optimized physical plan) per case, or ``"error: ..."`` when Flink
rejects the SQL. Every table is re-pointed at a connector that only has to plan (sources
``datagen``, the sink ``blackhole``), with ``flink_oracle``'s statement parsing.
"""

from __future__ import annotations

import json
import sys

from flink_oracle import parse_case_sql, rewrite_create_table


def explain(sql: str) -> str:
    from pyflink.table import EnvironmentSettings, TableEnvironment

    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    case = parse_case_sql(sql)
    for name, stmt in case["creates"].items():
        options = {"connector": "blackhole"} if name == case["sink"] else {"connector": "datagen"}
        env.execute_sql(rewrite_create_table(stmt, options, add_watermark=False))
    for stmt in case["passthrough"]:
        env.execute_sql(stmt)
    try:
        return env.explain_sql(case["insert"])
    except Exception as e:  # Flink's rejection, reported as text
        return f"error: {str(e).splitlines()[0]}"


def main() -> None:
    spec = json.load(sys.stdin)
    json.dump({"plans": {c["id"]: explain(c["sql"]) for c in spec["cases"]}}, sys.stdout)


if __name__ == "__main__":
    main()
