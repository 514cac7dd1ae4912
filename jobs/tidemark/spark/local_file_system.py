"""Hadoop's local file system without a child process per file, for a local master.

Without Hadoop's native library, which pyspark does not ship, Hadoop's local file system sets
the permission of every file and directory it creates by starting ``chmod``, and a streaming
checkpoint creates several in every micro-batch (the offset and commit logs, each state
store's changelog, each with its checksum file): each a process started by a JVM of several
hundred MB, some on the driver between batches.
``tidemark.hadoop.NioLocalFileSystem`` (Java, beside this module) sets them with java.nio.

The classes are compiled once per machine with the JDK's ``javac`` against pyspark's Hadoop
jar and kept in the user's cache directory (``tidemark.java_build``). Where there is no
``javac`` (a JRE only) or the build fails, the session keeps Hadoop's class and says so
once: the job runs the same, with the child processes.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

from tidemark.java_build import cache_dir, compiled_jar

log = logging.getLogger(__name__)

FILE_SYSTEM_CLASS = "tidemark.hadoop.NioLocalFileSystem"
#: the Hadoop setting that names the class of ``file://`` paths
FILE_IMPL = "spark.hadoop.fs.file.impl"
DRIVER_CLASS_PATH = "spark.driver.extraClassPath"
SOURCES = Path(__file__).with_name("local_file_system")
_JAR_NAME = "tidemark-local-fs"


def _hadoop_api_jar() -> Path | None:
    import pyspark

    jars = sorted((Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar"))
    return jars[-1] if jars else None


def local_file_system_jar(cache: Path | None = None) -> Path:
    """The compiled classes' jar (built on the first call on a machine); raises
    ``RuntimeError`` naming what is missing or what ``javac`` said."""
    hadoop = _hadoop_api_jar()
    if hadoop is None:
        raise RuntimeError("pyspark's Hadoop jar (hadoop-client-api-*.jar) was not found")
    return compiled_jar(SOURCES, [hadoop], _JAR_NAME, cache or cache_dir())


@functools.cache
def _usable_jar() -> Path | None:
    """The jar, or None after saying once why the session keeps Hadoop's class."""
    try:
        return local_file_system_jar()
    except (OSError, RuntimeError) as err:
        log.warning("Hadoop's local file system stays (a chmod process per checkpoint file): %s", err)
        return None


def local_file_system_conf(conf: dict[str, str]) -> dict[str, str]:
    """The settings that make a local master's ``file://`` paths use the class, the jar added
    to ``conf``'s driver class path; none when ``conf`` names its own ``fs.file.impl`` or the
    classes cannot be built."""
    jar = None if FILE_IMPL in conf else _usable_jar()
    if jar is None:
        return {}
    path = os.pathsep.join(p for p in (conf.get(DRIVER_CLASS_PATH), str(jar)) if p)
    return {FILE_IMPL: FILE_SYSTEM_CLASS, DRIVER_CLASS_PATH: path}
