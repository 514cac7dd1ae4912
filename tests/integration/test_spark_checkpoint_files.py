"""Which file manager Spark writes a query's checkpoint with (``use_checkpoint_file_manager``):
the FileSystem-based one for a local checkpoint (no child process per rename), Spark's own
choice for a remote one, and whatever the user named. Asked of Spark itself: the manager
class its ``CheckpointFileManager.create`` builds from the session's settings."""

from __future__ import annotations

import pytest

from tidemark.spark.session import CHECKPOINT_FILE_MANAGER, LOCAL_CHECKPOINT_FILE_MANAGER, use_checkpoint_file_manager

pytestmark = pytest.mark.integration

FILE_CONTEXT_MANAGER = "org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager"


def _manager_spark_builds(spark, checkpoint: str) -> str:
    jvm = spark._jvm
    path = jvm.org.apache.hadoop.fs.Path(checkpoint)
    manager_of = jvm.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager
    return manager_of.create(path, spark._jsparkSession.sessionState().newHadoopConf()).getClass().getName()


@pytest.fixture
def restore_manager(spark):
    before = spark.conf.get(CHECKPOINT_FILE_MANAGER, None)
    yield
    if before is None:
        spark.conf.unset(CHECKPOINT_FILE_MANAGER)
    else:
        spark.conf.set(CHECKPOINT_FILE_MANAGER, before)


@pytest.mark.parametrize("form", ["plain", "file-url"])
def test_a_local_checkpoint_is_written_without_file_context(spark, tmp_path, restore_manager, form):
    checkpoint = str(tmp_path / "ck") if form == "plain" else (tmp_path / "ck").as_uri()
    spark.conf.unset(CHECKPOINT_FILE_MANAGER)
    assert _manager_spark_builds(spark, checkpoint) == FILE_CONTEXT_MANAGER  # Spark's own default
    use_checkpoint_file_manager(spark, checkpoint)
    assert _manager_spark_builds(spark, checkpoint) == LOCAL_CHECKPOINT_FILE_MANAGER


def test_a_remote_checkpoint_after_a_local_one_gets_sparks_default_back(spark, tmp_path, restore_manager):
    use_checkpoint_file_manager(spark, str(tmp_path / "ck"))
    use_checkpoint_file_manager(spark, "hdfs://namenode:8020/checkpoints/job")
    assert spark.conf.get(CHECKPOINT_FILE_MANAGER, None) is None
    assert _manager_spark_builds(spark, (tmp_path / "other").as_uri()) == FILE_CONTEXT_MANAGER


def test_a_manager_the_user_named_is_kept(spark, tmp_path, restore_manager):
    spark.conf.set(CHECKPOINT_FILE_MANAGER, FILE_CONTEXT_MANAGER)
    use_checkpoint_file_manager(spark, str(tmp_path / "ck"))
    assert _manager_spark_builds(spark, str(tmp_path / "ck")) == FILE_CONTEXT_MANAGER
