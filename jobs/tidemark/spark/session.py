"""Build the one SparkSession a Tidemark job (or test run) uses.

Everything here exists because a default would bite: stateful stages need the RocksDB
state store (transformWithState refuses the HDFS-backed one, and RocksDB keeps large keyed
state off the JVM heap); the default 200 shuffle partitions make every micro-batch of a
small pipeline spawn 200 tasks, one state store each; Python workers started with a
different interpreter than the driver miss the project's packages; and without Java 17+
Spark dies with a JVM stack trace nobody can act on, so we check first and say so.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from tidemark.engine.checkpoint_path import local_dir
from tidemark.engine.errors import TidemarkError
from tidemark.java_build import jdk_tool
from tidemark.spark.local_file_system import local_file_system_conf

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: RocksDB state stores commit a changelog per batch (``session_conf``)
CHANGELOG_CHECKPOINTING = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"

#: Spark settings as a JSON object (``{"spark.driver.memory": "2g"}``), applied over the
#: defaults below and under a caller's ``extra_conf``: how a user sizes a job without code
CONF_ENV = "TIDEMARK_SPARK_CONF"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
_SIMPLIFIED_TRACEBACK = "spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled"
MIN_JAVA = 17
#: the Python worker daemon of a local master (``tidemark.spark.worker_daemon``)
WORKER_DAEMON = "tidemark.spark.worker_daemon"
#: Spark's default checkpoint file manager goes through Hadoop's FileContext, and Hadoop's
#: local file system without its native library (pyspark ships none) starts a child
#: process for each ``readlink`` a FileContext rename makes, and a micro-batch renames a
#: file for each log entry and state store file it writes. The FileSystem-based manager
#: renames with one system call, as atomic on a local disk (docs/benchmarks.md,
#: "Checkpoint files without child processes").
CHECKPOINT_FILE_MANAGER = "spark.sql.streaming.checkpointFileManagerClass"
LOCAL_CHECKPOINT_FILE_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)


#: the sizes of polars' and Arrow's thread pools in each Python worker. Spark already runs
#: one task per core (``spark.task.cpus`` each), and a task is one Python worker: pools the
#: size of the machine in every worker put several threads on each core, and a kernel's many
#: small operations pay the hand-offs between them (docs/benchmarks.md, "Thread pools of a
#: task's size"). Like every ``spark.executorEnv`` variable, they are the same for every
#: Python function, so the workers stay in one pool.
WORKER_THREADS = ("spark.executorEnv.POLARS_MAX_THREADS", "spark.executorEnv.OMP_NUM_THREADS")

#: the JVM's collector on one machine. There the JVM holds a few blobs per task and the
#: state stores' handles, a live set of 100-300 MB, while the work is in the Python workers
#: on the same cores; G1's remembered sets and concurrent threads and a first heap of 1/64
#: of the machine's memory cost a few hundred MB of resident memory for it. The serial
#: collector with a small first heap grows the heap only as far as the live set needs
#: (docs/benchmarks.md, "The JVM's collector on one machine").
LOCAL_JVM_OPTIONS = "-XX:+UseSerialGC -Xms64m"


class SparkConfError(TidemarkError):
    """``$TIDEMARK_SPARK_CONF`` is not a JSON object of setting names to values."""

    exit_status = 2


def conf_from_env() -> dict[str, str]:
    """The settings of ``$TIDEMARK_SPARK_CONF`` (none when unset)."""
    text = os.environ.get(CONF_ENV, "").strip()
    if not text:
        return {}
    try:
        conf = json.loads(text)
    except json.JSONDecodeError as err:
        raise SparkConfError(f"${CONF_ENV}: not JSON ({err}); expected an object such as {{\"spark.driver.memory\": \"2g\"}}") from None
    if not isinstance(conf, dict) or not all(isinstance(v, (str, int, float, bool)) for v in conf.values()):
        raise SparkConfError(f"${CONF_ENV}: expected a JSON object of setting names to values, got {text!r}")
    return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in conf.items()}


class JavaMissingError(TidemarkError):
    """No usable Java runtime: Spark cannot start."""

    exit_status = 4


def parse_java_major(version_output: str) -> int | None:
    """The major version from ``java -version`` output (``"1.8.0_392"`` -> 8,
    ``"17.0.15"`` -> 17), or None when the text has no version string."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if not match:
        return None
    major = int(match.group(1))
    if major == 1 and match.group(2):  # pre-9 scheme: 1.8 means 8
        major = int(match.group(2))
    return major


def check_java(min_major: int = MIN_JAVA) -> int:
    """Return the Java major version, or raise JavaMissingError saying what to install."""
    hint = (
        f"Spark needs Java {min_major} or newer: install a JDK/JRE {min_major}+ "
        f"(e.g. `apt-get install openjdk-{min_major}-jre-headless`) and put `java` on PATH "
        "or set JAVA_HOME"
    )
    java = jdk_tool("java")
    if java is None:
        raise JavaMissingError(f"no `java` found on PATH or in JAVA_HOME. {hint}")
    try:
        proc = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise JavaMissingError(f"`{java} -version` failed ({err}). {hint}") from None
    major = parse_java_major(proc.stderr + proc.stdout)
    if major is None:
        raise JavaMissingError(f"could not read a version from `{java} -version`. {hint}")
    if major < min_major:
        raise JavaMissingError(f"`{java}` is Java {major}. {hint}")
    return major


_LOG4J2 = """\
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{HH:mm:ss}} %p %c{{1}}: %m%n%ex
logger.nativecode.name = org.apache.hadoop.util.NativeCodeLoader
logger.nativecode.level = error
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = {level}
"""


def _log_config(level: str) -> str:
    """A log4j2 file for the driver JVM, so startup chatter (default-profile notices,
    native-hadoop and hostname warnings) is gone before ``setLogLevel`` can act."""
    path = os.path.join(tempfile.gettempdir(), f"tidemark-log4j2-{level.lower()}.properties")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(_LOG4J2.format(level=level.lower()))
        os.replace(tmp, path)
    return path


#: idle Python workers kept per core (``local_python_workers``)
IDLE_PYTHON_WORKERS_PER_CORE = 4


def local_python_workers(cores: int | None = None) -> dict[str, str]:
    """Python worker settings for one machine. Spark keeps every Python worker a task ever
    used alive in its pool, and each holds its own copy of pyarrow, pandas, polars and the
    stages, so an unbounded pool grows past what the cores ever run at once. Too small a
    pool costs more than memory: a worker dropped after one batch is started again for the
    next, which for a stage that writes an upsert sink means a new Kafka producer before its
    first record. ``IDLE_PYTHON_WORKERS_PER_CORE`` per core measured faster than one;
    docs/benchmarks.md, "Memory" and "Outside the Python workers", has both measurements."""
    return {"spark.python.factory.idleWorkerMaxPoolSize": str(IDLE_PYTHON_WORKERS_PER_CORE * (cores or os.cpu_count() or 1))}


def session_conf(
    master: str, shuffle_partitions: int, extra_conf: dict[str, str] | None = None, log_level: str = "ERROR"
) -> dict[str, str]:
    """The Spark settings of a Tidemark session: the defaults below, then
    ``$TIDEMARK_SPARK_CONF``, then ``extra_conf`` (each overrides the one before)."""
    conf = {
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.default.parallelism": str(shuffle_partitions),
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
        # A keyed stage rewrites each touched state bucket whole every batch, so without a
        # compaction the store's files keep every overwritten version of a bucket until
        # RocksDB compacts them on its own; compacting at each commit keeps the state on disk
        # (and each checkpoint's copy) to the current values (docs/benchmarks.md, "State on
        # disk: compacting on commit").
        "spark.sql.streaming.stateStore.rocksdb.compactOnCommit": "true",
        # A commit writes what the batch changed (one file per store) instead of syncing a
        # RocksDB snapshot; snapshots are taken in the background. Each stateful operator
        # pays a snapshot's fixed cost in every batch otherwise (docs/benchmarks.md,
        # "Changelog checkpointing"). Either setting reads a checkpoint the other wrote.
        # The SST files then follow the state only at snapshots, so the state size a job
        # reports is Tidemark's own measure (``tidemark.spark.state_bytes``).
        CHANGELOG_CHECKPOINTING: "true",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # Python errors reach the driver with the user's frames only, so a stage error
        # message is not buried under pyspark internals. Spark passes the setting to the
        # workers of Python UDFs as an environment variable, and keeps one pool of workers
        # per environment: the same variable for every Python function (below) keeps the data
        # source readers' workers in the UDFs' pool instead of a second pool with its own
        # daemon and idle workers.
        _SIMPLIFIED_TRACEBACK: "true",
        "spark.ui.enabled": "false",
        # Python workers connect back to the JVM within this time; the 15 s default fails
        # spuriously on a loaded machine ("Python worker failed to connect back").
        "spark.python.authenticate.socketTimeout": "120s",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.streaming.stopGracefullyOnShutdown": "true",
        # A laptop-sized default: pipelines are many small batches, not one big one.
        "spark.sql.adaptive.enabled": "false",
        # No Java generated at run time: the rows Spark itself evaluates are a few blobs per
        # task, while Spark generates the sorts' orderings and the projections' code again in
        # every task of every batch, before the task's Python worker can start
        # (docs/benchmarks.md, "Spark's code generation off").
        "spark.sql.codegen.wholeStage": "false",
        "spark.sql.codegen.factoryMode": "NO_CODEGEN",
        # C1 only (-XX:TieredStopAtLevel=1): the per-record work is in Python, and C2's
        # compiling cost the JVM more CPU than its faster code saved (docs/benchmarks.md,
        # "Changelog checkpointing", measured, not kept).
        "spark.driver.extraJavaOptions": (
            f"-Dlog4j2.configurationFile=file:{_log_config(log_level)} -XX:TieredStopAtLevel=1"
        ),
        # Python workers import pyspark from site-packages (bytecode cached), not from
        # the pyspark.zip Spark puts first on their path: see worker_site/sitecustomize.py
        "spark.executorEnv.PYTHONPATH": str(Path(__file__).parent / "worker_site"),
    }
    if master.startswith("local"):
        cores = re.match(r"local\[(\d+)", master)
        conf.update(local_python_workers(int(cores.group(1)) if cores else None))
        # workers are forked with Tidemark's modules already imported (worker_daemon.py).
        # Only where the executors are this process's machine and environment: a cluster's
        # executors get Tidemark as the job's archive, which Spark puts on a worker's path
        # after the daemon forked it, so a daemon there could not import the module.
        conf["spark.python.daemon.module"] = WORKER_DAEMON
        conf["spark.driver.extraJavaOptions"] += f" {LOCAL_JVM_OPTIONS}"
    conf.update(conf_from_env())
    conf.update(extra_conf or {})
    if master.startswith("local"):
        conf.update(local_file_system_conf(conf))
    if conf.get(_SIMPLIFIED_TRACEBACK, "").lower() == "true":
        conf.setdefault("spark.executorEnv.SPARK_SIMPLIFIED_TRACEBACK", "1")
    for threads in WORKER_THREADS:
        conf.setdefault(threads, conf.get("spark.task.cpus", "1"))
    return conf


def use_checkpoint_file_manager(spark: SparkSession, checkpoint: str) -> None:
    """Set the checkpoint file manager of the next query on ``checkpoint``: the one for a
    local disk when the checkpoint is local, Spark's default for a remote one (whose file
    system may have no atomic rename but FileContext's). A manager named in
    ``$TIDEMARK_SPARK_CONF`` stays."""
    current = spark.conf.get(CHECKPOINT_FILE_MANAGER, None)
    if current not in (None, LOCAL_CHECKPOINT_FILE_MANAGER):
        return
    if local_dir(checkpoint) is not None:
        spark.conf.set(CHECKPOINT_FILE_MANAGER, LOCAL_CHECKPOINT_FILE_MANAGER)
    else:
        spark.conf.unset(CHECKPOINT_FILE_MANAGER)


def build_session(
    app_name: str = "tidemark",
    master: str | None = None,
    shuffle_partitions: int = 2,
    extra_conf: dict[str, str] | None = None,
    log_level: str = "ERROR",
) -> SparkSession:
    """Create (or return the running) SparkSession configured for Tidemark.

    ``master`` defaults to ``$TIDEMARK_SPARK_MASTER`` or ``local[*]``. ``shuffle_partitions``
    is also the number of state store partitions of every stateful stage; it is fixed by
    the first run of a checkpoint (Spark reuses the checkpoint's value on restart).
    """
    check_java()
    # Workers must run the same interpreter (and so see the same packages) as the driver.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    master = master or os.environ.get("TIDEMARK_SPARK_MASTER") or "local[*]"
    if master.startswith("local"):
        # one machine: bind to loopback instead of warning about the hostname
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    from pyspark.sql import SparkSession

    conf = session_conf(master, shuffle_partitions, extra_conf, log_level)
    builder = SparkSession.builder.appName(app_name).master(master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    return spark
