"""The local file system class a local master's session uses (``tidemark.spark.local_file_system``):
built once per cache directory, refused with the reason when there is no ``javac``, and set only
where the driver is the executor and the user has not named a class of their own. No Spark is
started; ``tests/integration/test_local_file_system_spark.py`` checks the class in the JVM."""

from __future__ import annotations

import zipfile

import pytest

from tidemark import java_build
from tidemark.spark import local_file_system as lfs
from tidemark.spark.session import CONF_ENV, session_conf


def test_the_jar_is_built_once_per_cache_directory(tmp_path):
    jar = lfs.local_file_system_jar(tmp_path)
    assert {"tidemark/hadoop/NioLocalFileSystem.class", "tidemark/hadoop/NioRawLocalFileSystem.class"} <= set(
        zipfile.ZipFile(jar).namelist())
    built = jar.stat().st_mtime_ns
    assert lfs.local_file_system_jar(tmp_path) == jar and jar.stat().st_mtime_ns == built
    assert [p.name for p in tmp_path.iterdir()] == [jar.name]  # no build directory left behind


def test_without_javac_the_reason_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setattr(java_build.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="no javac"):
        lfs.local_file_system_jar(tmp_path)


def test_a_local_master_gets_the_class_and_keeps_a_users_class_path(monkeypatch):
    monkeypatch.delenv(CONF_ENV, raising=False)
    conf = session_conf("local[2]", 2)
    assert conf[lfs.FILE_IMPL] == lfs.FILE_SYSTEM_CLASS
    assert conf[lfs.DRIVER_CLASS_PATH].endswith(".jar")
    mine = session_conf("local[2]", 2, {lfs.DRIVER_CLASS_PATH: "/opt/my.jar"})[lfs.DRIVER_CLASS_PATH]
    assert mine.startswith("/opt/my.jar:") and mine.endswith(".jar")


def test_a_cluster_or_a_users_own_class_keeps_what_it_has(monkeypatch):
    monkeypatch.delenv(CONF_ENV, raising=False)
    assert lfs.FILE_IMPL not in session_conf("spark://master:7077", 2)  # executors would lack the jar
    theirs = session_conf("local[2]", 2, {lfs.FILE_IMPL: "org.apache.hadoop.fs.LocalFileSystem"})
    assert theirs[lfs.FILE_IMPL] == "org.apache.hadoop.fs.LocalFileSystem"
    assert lfs.DRIVER_CLASS_PATH not in theirs
