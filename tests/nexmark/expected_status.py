"""The progress board of the Flink dialect: what each Nexmark query does in Tidemark today.

``STATUS`` is for the queries as adapted (``queries/qN.sql``), ``TODAY_DIALECT`` for the same
queries with backtick identifiers written plain and the ``WATERMARK`` clause dropped
(``harness.today_dialect``: without a watermark the window queries have no event time). A value is ``"equal"`` (plans, runs in replay and gives Flink
2.3's table) or ``"not planned: <the planner's message>"`` (for q6 that is equal too: Flink 2.3
refuses the query for the same reason). ``test_nexmark.py`` marks every
"not planned" case ``xfail(strict=True)``: when a query starts to plan, its test fails until
this file says ``"equal"``, so the file can only ever tell the truth.

``CONSTRUCTS`` lists what each query needs beyond today's dialect (docs/conformance.md,
"Nexmark"); ``WATERMARK_DRIVEN`` the queries whose results appear as the watermark passes,
compared on the final table only (the oracle's watermark never passes an event: see
``generator.py``); ``NO_ORACLE`` the queries Flink itself gives no deterministic answer for,
and ``COMPARED_INSTEAD`` what such a query's "equal" compares: the table Tidemark must give
after every batch, and why it is Flink's too.
"""

from __future__ import annotations

#: q6 as published filters on ``rownum`` in the SELECT that defines it: Flink 2.3 refuses it
#: for that ("Column 'rownum' not found in any table"), and so does Tidemark (queries/README.md)
_Q6 = "not planned: unknown column 'rownum'"

#: the adapted queries as a user pastes them (with ``queries/sources.sql``'s WATERMARK clauses)
STATUS: dict[str, str] = {
    **{f"q{n}": "equal" for n in range(24)},
    "q6": _Q6,
}

#: with backticks and WATERMARK removed: the first construct each query stops at
TODAY_DIALECT: dict[str, str] = {
    "q0": "equal",
    "q1": "equal",
    "q2": "equal",
    "q3": "equal",
    "q4": "equal",
    "q5": "not planned: HOP: 'dateTime' is not an event-time column",
    "q6": _Q6,
    "q7": "not planned: TUMBLE: 'dateTime' is not an event-time column",
    "q8": "not planned: TUMBLE: 'dateTime' is not an event-time column",
    "q9": "equal",
    "q10": "equal",
    "q11": "not planned: SESSION: 'dateTime' is not an event-time column",
    "q12": "equal",
    "q13": "equal",
    "q14": "equal",
    "q15": "equal",
    "q16": "equal",
    "q17": "equal",
    "q18": "equal",
    "q19": "equal",
    "q20": "equal",
    "q21": "equal",
    "q22": "equal",
    "q23": "equal",
}

#: the adapted queries on the Spark job host (``test_nexmark_spark.py``): "equal", "not
#: planned: <the planner's message>" as in ``STATUS``, "not run: <the host's message>" for a
#: pipeline the host refuses before its job starts, "differs: <why>" for a job whose final
#: table is not Flink's, or "fails: <the job's error>" for a job
#: that stops with an error (each message a part of the error's text: it names the stage first);
#: "not compared: <why>" leaves a query off this board
SPARK_STATUS: dict[str, str] = {
    **{f"q{n}": "equal" for n in range(24)},
    "q6": STATUS["q6"],
    "q12": "not compared: processing-time windows (which bids share a window depends on the wall clock, "
           "and Flink's bounded job ends before any fires); test_q12_on_spark_counts_every_bid_once_in_its_"
           "windows_as_flink_counts_them runs the job until every window fired and compares its windows' "
           "counts summed per bidder with Flink 2.3's SELECT bidder, COUNT(*) FROM bid GROUP BY bidder",
}

_DIALECT = "backtick identifiers, WATERMARK"
CONSTRUCTS: dict[str, str] = {
    "q0": _DIALECT,
    "q1": _DIALECT,
    "q2": _DIALECT,
    "q3": _DIALECT,
    "q4": _DIALECT + "; comma join, BETWEEN beside the equi key",
    "q5": _DIALECT + "; HOP window aggregation, window join",
    "q6": _DIALECT + "; comma join, ROW_NUMBER Top-1, OVER aggregation (ROWS)",
    "q7": _DIALECT + "; TUMBLE window aggregation, join on a time range",
    "q8": _DIALECT + "; TUMBLE window aggregation, window join",
    "q9": _DIALECT + "; comma join, BETWEEN beside the equi key, ROW_NUMBER Top-1",
    "q10": _DIALECT + "; DATE_FORMAT",
    "q11": _DIALECT + "; group-window SESSION, SESSION_START / SESSION_END",
    "q12": _DIALECT + "; CREATE VIEW, PROCTIME(), TUMBLE on processing time",
    "q13": _DIALECT + "; PROCTIME(), lookup join FOR SYSTEM_TIME AS OF",
    "q14": _DIALECT + "; CREATE FUNCTION (a Python UDF for Nexmark's Java CountChar), HOUR()",
    "q15": _DIALECT + "; DATE_FORMAT, GROUP BY an expression, FILTER (WHERE), COUNT(DISTINCT)",
    "q16": _DIALECT + "; DATE_FORMAT, GROUP BY an expression, FILTER (WHERE), COUNT(DISTINCT)",
    "q17": _DIALECT + "; DATE_FORMAT, GROUP BY an expression, FILTER (WHERE)",
    "q18": _DIALECT + "; ROW_NUMBER deduplication (keep last by event time)",
    "q19": _DIALECT + "; ROW_NUMBER Top-10",
    "q20": _DIALECT,
    "q21": _DIALECT + "; REGEXP_EXTRACT",
    "q22": _DIALECT + "; SPLIT_INDEX",
    "q23": _DIALECT,
}

WATERMARK_DRIVEN = {"q5", "q6", "q7", "q8", "q11", "q12"}

#: query -> why Flink's table cannot be the oracle (the comparison then cannot pass)
NO_ORACLE: dict[str, str] = {
    "q6": "Flink 2.3 rejects the query as published (SqlValidatorException: Column 'rownum' not "
          "found in any table; Nexmark's file says Flink does not support it)",
    "q12": "processing-time windows: which bids share a window depends on the wall clock "
           "(Flink's table on the generated data is empty, the job ends before a window fires)",
}

#: query in NO_ORACLE -> (the sink table after every batch, why that is what Flink gives)
COMPARED_INSTEAD: dict[str, tuple[list, str]] = {
    "q12": ([], "both write nothing: the harness processes every batch within one 10 s window (batch b at "
                "processing time b ms) and the bounded input ends before the window closes; Flink 2.3 fires "
                "no open processing-time window at the end of input (tests/conformance/"
                "test_proctime_window_oracle.py), and neither does Tidemark"),
}
