"""The Spark settings a Tidemark session starts with, and how a user overrides them
(``tidemark.spark.session``): no Spark is started, the settings are what is checked."""

from __future__ import annotations

import pytest

from tidemark.spark.session import CONF_ENV, SparkConfError, conf_from_env, session_conf

POOL = "spark.python.factory.idleWorkerMaxPoolSize"


def test_one_machine_keeps_four_idle_python_workers_per_core(monkeypatch):
    monkeypatch.delenv(CONF_ENV, raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 6)
    assert session_conf("local[*]", 2)[POOL] == "24"
    assert session_conf("local[3]", 2)[POOL] == "12"
    assert POOL not in session_conf("spark://master:7077", 2)  # a cluster's executors size their own


def test_state_stores_compact_at_each_commit_unless_turned_off(monkeypatch):
    """Buckets are rewritten whole each batch: without compaction the store keeps stale copies."""
    key = "spark.sql.streaming.stateStore.rocksdb.compactOnCommit"
    monkeypatch.delenv(CONF_ENV, raising=False)
    assert session_conf("local[2]", 2)[key] == "true"
    monkeypatch.setenv(CONF_ENV, f'{{"{key}": false}}')
    assert session_conf("local[2]", 2)[key] == "false"


def test_every_python_function_gets_the_simplified_traceback_variable_so_workers_share_one_pool(monkeypatch):
    """Spark keys its Python worker pools by the function's environment and sets this variable
    for UDFs only: without it for every function, the data source readers get a second pool."""
    env_key, setting = "spark.executorEnv.SPARK_SIMPLIFIED_TRACEBACK", "spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled"
    monkeypatch.delenv(CONF_ENV, raising=False)
    conf = session_conf("local[2]", 2)
    assert (conf[setting], conf[env_key]) == ("true", "1")
    monkeypatch.setenv(CONF_ENV, f'{{"{setting}": false}}')
    assert env_key not in session_conf("local[2]", 2)  # UDFs then do not set it either


@pytest.mark.parametrize("key", ["spark.executorEnv.POLARS_MAX_THREADS", "spark.executorEnv.OMP_NUM_THREADS"])
def test_polars_and_arrow_in_a_python_worker_get_the_cores_of_one_task_unless_set(monkeypatch, key):
    """Spark runs one task per core; a pool the machine's size in each worker oversubscribes it."""
    monkeypatch.delenv(CONF_ENV, raising=False)
    assert session_conf("local[*]", 2)[key] == "1"
    assert session_conf("spark://master:7077", 2, extra_conf={"spark.task.cpus": "4"})[key] == "4"
    monkeypatch.setenv(CONF_ENV, f'{{"{key}": 3}}')
    assert session_conf("local[*]", 2)[key] == "3"


def test_the_environment_overrides_the_defaults_and_the_caller_overrides_both(monkeypatch):
    monkeypatch.setenv(CONF_ENV, '{"spark.python.factory.idleWorkerMaxPoolSize": 8, "spark.driver.memory": "2g", "spark.ui.enabled": true}')
    conf = session_conf("local[2]", 2, extra_conf={"spark.driver.memory": "3g"})
    assert (conf[POOL], conf["spark.driver.memory"], conf["spark.ui.enabled"]) == ("8", "3g", "true")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("spark.driver.memory=2g", r"^\$TIDEMARK_SPARK_CONF: not JSON \(Expecting value: line 1 column 1 \(char 0\)\)"),
        ('["spark.driver.memory"]', r"^\$TIDEMARK_SPARK_CONF: expected a JSON object of setting names to values, got '\[\"spark.driver.memory\"\]'$"),
        ('{"spark.driver.memory": {"size": "2g"}}', r"^\$TIDEMARK_SPARK_CONF: expected a JSON object"),
    ],
)
def test_a_malformed_override_is_refused_naming_the_variable(monkeypatch, text, message):
    monkeypatch.setenv(CONF_ENV, text)
    with pytest.raises(SparkConfError, match=message) as err:
        conf_from_env()
    assert err.value.exit_status == 2


def test_one_machine_collects_with_the_serial_collector_from_a_small_heap(monkeypatch):
    """The embedded default's JVM holds a few blobs per task: G1 and a 1/64-of-RAM first heap
    cost resident memory for nothing (docs/benchmarks.md, "The JVM's collector on one machine")."""
    key = "spark.driver.extraJavaOptions"
    monkeypatch.delenv(CONF_ENV, raising=False)
    local = session_conf("local[2]", 2)[key].split()
    assert local[-3:] == ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xms64m"]
    assert local[0].startswith("-Dlog4j2.configurationFile=")
    assert "-XX:+UseSerialGC" not in session_conf("spark://master:7077", 2)[key]
    monkeypatch.setenv(CONF_ENV, f'{{"{key}": "-XX:+UseG1GC"}}')
    assert session_conf("local[2]", 2)[key] == "-XX:+UseG1GC"  # a user's choice replaces the default
