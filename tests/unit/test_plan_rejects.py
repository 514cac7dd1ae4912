"""Constructs outside the supported subset are rejected with a message naming the construct
and its position (line, column), and INSERT mapping errors name the column and types."""

from __future__ import annotations

import pytest

from tidemark.engine.errors import PlanError, SqlError
from tidemark.engine.pipeline import compile_sql

DDL = """CREATE TABLE a (k BIGINT, v BIGINT, w BIGINT, s STRING, PRIMARY KEY (k) NOT ENFORCED) WITH ('format' = 'debezium-json');
CREATE TABLE b (k BIGINT, x BIGINT, PRIMARY KEY (k) NOT ENFORCED) WITH ('format' = 'debezium-json');
CREATE TABLE ka (k BIGINT, v BIGINT, x BIGINT, PRIMARY KEY (k) NOT ENFORCED) WITH ('format' = 'upsert-json');
"""  # the query starts on line 4


@pytest.mark.parametrize(
    "query, message, col",
    [
        ("INSERT INTO ka SELECT k, v, SUM(w) OVER (PARTITION BY v) FROM a", "window function SUM(w) OVER (PARTITION BY v) is not supported", 29),
        ("INSERT INTO ka SELECT k, v, w FROM a INTERSECT SELECT k, x, x FROM b", "INTERSECT is not supported (UNION ALL and UNION are)", None),
        ("INSERT INTO ka SELECT DISTINCT v, COUNT(*), 1 FROM a GROUP BY v", "SELECT DISTINCT with GROUP BY or aggregates is not supported", None),
        ("INSERT INTO ka SELECT k, v, w FROM a LIMIT 10", "LIMIT in a streaming query is not supported", 44),
        ("INSERT INTO ka SELECT k, v, w FROM a WHERE k IN (SELECT k FROM b)", "subquery in an expression", None),
        ("INSERT INTO ka SELECT a.k, a.v, b.x FROM a JOIN b ON a.v > b.x", "has no equality between a column of each side; only equi-joins are supported", 54),
        ("INSERT INTO ka SELECT a.k, a.v, b.x FROM a, b", "comma join with b has no join condition in WHERE (a cross join)", 45),
        ("INSERT INTO ka SELECT a.k, a.v, b.x FROM a, b WHERE k = x", "column 'k' is ambiguous (in a, b); qualify it", 53),
        ("INSERT INTO ka SELECT a.k, a.v, b.x FROM a CROSS JOIN b", "CROSS JOIN is not supported", None),
        ("INSERT INTO ka SELECT a.k, a.v, b.x FROM a JOIN b USING (k)", "JOIN ... USING is not supported", None),
        ("INSERT INTO ka SELECT k, v, w FROM nope", "unknown table 'nope'", 36),
        ("INSERT INTO nope SELECT k, v, w FROM a", "unknown sink table 'nope'", 13),
        ("INSERT INTO ka SELECT k, v, nope FROM a", "unknown column 'nope'", 29),
        ("INSERT INTO ka SELECT k, v, c.w FROM a", "unknown table or alias 'c' in c.w", 29),
        ("INSERT INTO ka SELECT k, v, x FROM a JOIN b ON a.k = b.k", "column 'k' is ambiguous (in a, b); qualify it", 23),
        ("INSERT INTO ka SELECT v, w, COUNT(*) FROM a GROUP BY v", "column w must appear in GROUP BY or inside an aggregate function", 26),
        ("INSERT INTO ka SELECT k, v, MY_UDF(w) FROM a", "unsupported function MY_UDF()", 29),
        ("INSERT INTO ka SELECT k, v, TIMESTAMPADD(HOUR, 2, w) FROM a", "unsupported function TIMESTAMPADD()", 29),
        ("INSERT INTO ka SELECT k, v, TIMESTAMPDIFF(SECOND, w, w) FROM a", "unsupported function TIMESTAMPDIFF()", 29),
        ("INSERT INTO ka SELECT v, STDDEV(w), COUNT(*) FROM a GROUP BY v", "aggregate function STDDEV is not supported", 26),
        ("INSERT INTO ka SELECT k, v, w FROM a WHERE SUM(w) > 1", "aggregate SUM(w) is not allowed in WHERE; use HAVING", 44),
        ("INSERT INTO ka SELECT v, COUNT(*), 1 FROM a GROUP BY 1", "GROUP BY position numbers are not supported", None),
        ("INSERT INTO ka SELECT v, COUNT(*), 1 FROM a GROUP BY ROLLUP (v)", "GROUP BY ROLLUP is not supported", None),
        ("INSERT INTO ka SELECT k, v FROM a", "the query produces 2 columns (k, v) but 3 are expected (k, v, x)", None),
        ("INSERT INTO ka SELECT * FROM a", "the query produces 4 columns (k, v, w, s) but 3 are expected", None),
        ("INSERT INTO ka SELECT k, v, w FROM (SELECT k, v, w FROM a ORDER BY v) t", "ORDER BY in a streaming query is not supported", None),
        ("WITH c AS (SELECT k, v, w FROM c) INSERT INTO ka SELECT k, v, w FROM c", "'c' refers to itself (recursive views and CTEs are not supported)", None),
        ("INSERT INTO ka SELECT k, v, w FROM a\nEXCEPT SELECT k, x, x FROM b", "EXCEPT is not supported", None),
        ("INSERT INTO ka SELECT k, v, w FROM a UNION ALL SELECT k, x FROM b", "UNION branches give different numbers of columns: the first gives 3 (k, v, w), SELECT k, x FROM b gives 2 (k, x)", 55),
        ("INSERT INTO ka SELECT k, v, w FROM a UNION ALL SELECT k, v, s FROM a", "UNION column 3 ('w') is BIGINT in the first branch but STRING in SELECT k, v, s FROM a; the types have no common type (add a CAST)", 55),
    ],
)
def test_rejected_constructs_name_what_and_where(query, message, col):
    with pytest.raises(SqlError) as info:
        compile_sql(DDL + query)
    err = info.value
    if message is not None:
        assert message in str(err)
    assert err.line is not None and err.line >= 4, str(err)
    if col is not None:
        assert err.col == col, str(err)
        assert f"(line 4, column {col})" in str(err)


def test_type_mismatch_names_sink_column_and_types():
    with pytest.raises(PlanError) as info:
        compile_sql(DDL + "INSERT INTO ka SELECT k, v, s FROM a")
    assert str(info.value) == (
        "INSERT INTO ka: column 'x' is BIGINT but the query gives STRING (query column 3, 's'); add a CAST"
    )


def test_explicit_cast_fixes_the_mismatch():
    p = compile_sql(DDL + "INSERT INTO ka SELECT k, v, CAST(s AS BIGINT) FROM a")
    assert p.materializer is None


def test_primary_key_column_must_be_written():
    with pytest.raises(PlanError, match="primary key column 'k' must be written"):
        compile_sql(DDL + "INSERT INTO ka (v, x) SELECT v, w FROM a")


def test_unlisted_columns_are_null():
    p = compile_sql(DDL + "INSERT INTO ka (k, v) SELECT k, v FROM a")
    calc = p.node(p.sink_node.inputs[0])
    assert calc.kind == "calc"
    assert calc.stage.process.__self__.to_spark_sql()["columns"][2][1] == "CAST(NULL AS BIGINT)"


def test_reading_and_writing_one_table_is_rejected():
    with pytest.raises(SqlError, match="table 'a' is both read and written"):
        compile_sql(DDL + "INSERT INTO a SELECT k, v, w, s FROM a")


def test_upsert_source_without_primary_key_is_a_plan_error():
    sql = "CREATE TABLE u (k BIGINT, v BIGINT) WITH ('format' = 'upsert-json');\n" + DDL
    with pytest.raises(PlanError, match="table 'u': format 'upsert-json' is an upsert format and needs a PRIMARY KEY"):
        compile_sql(sql + "INSERT INTO ka SELECT k, v, v FROM u ON CONFLICT DO NOTHING")


def test_append_sink_cannot_take_updates():
    sql = DDL + "CREATE TABLE logsink (k BIGINT, c BIGINT) WITH ('format' = 'json');\n"
    with pytest.raises(PlanError, match="sink 'logsink' has the append-only format 'json' but the query produces updates"):
        compile_sql(sql + "INSERT INTO logsink SELECT v, COUNT(*) FROM a GROUP BY v")


def test_unknown_format_is_a_plan_error():
    sql = "CREATE TABLE f (k BIGINT) WITH ('format' = 'parquet');\n" + DDL
    with pytest.raises(PlanError, match="table 'f': unknown format 'parquet'"):
        compile_sql(sql + "INSERT INTO ka SELECT k, k, k FROM f ON CONFLICT DO NOTHING")


def test_bad_compaction_mode_is_a_plan_error():
    with pytest.raises(PlanError, match="expected one of CHECKPOINT, WATERMARK"):
        compile_sql("SET 'table.exec.sink.upserts.compaction-mode' = 'SOMETIMES';\n" + DDL + "INSERT INTO ka SELECT k, v, w FROM a")
