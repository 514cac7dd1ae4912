"""The shared Spark session's ``file://`` paths go through ``tidemark.hadoop.NioLocalFileSystem``
(``tidemark.spark.local_file_system``), and what it sets is what chmod would have set."""

from __future__ import annotations

import os
import stat

import pytest

from tidemark.spark.local_file_system import FILE_SYSTEM_CLASS

pytestmark = pytest.mark.integration


def test_local_paths_get_their_permissions_without_chmod(spark, tmp_path):
    jvm = spark._jvm
    path = jvm.org.apache.hadoop.fs.Path(f"file://{tmp_path}")
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    assert fs.getClass().getName() == FILE_SYSTEM_CLASS
    assert fs.getRawFileSystem().getClass().getName() == "tidemark.hadoop.NioRawLocalFileSystem"
    perm = jvm.org.apache.hadoop.fs.permission.FsPermission
    # as a checkpoint writes a log entry: Hadoop's default permissions under its umask (022)
    out = fs.create(jvm.org.apache.hadoop.fs.Path(f"file://{tmp_path}/log/0"))
    out.write(bytearray(b"v1\n"))
    out.close()
    assert stat.S_IMODE(os.stat(tmp_path / "log" / "0").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(tmp_path / "log").st_mode) == 0o755
    for mode in ("640", "751", "000", "777"):
        fs.setPermission(jvm.org.apache.hadoop.fs.Path(f"file://{tmp_path}/log/0"), perm(mode))
        assert stat.S_IMODE(os.stat(tmp_path / "log" / "0").st_mode) == int(mode, 8)
