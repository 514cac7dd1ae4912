"""Fixtures shared by every suite: ONE Spark session per test session (Spark startup costs
seconds; suites that need Spark share it)."""

from conftest_spark import spark, spark_stream  # noqa: F401
