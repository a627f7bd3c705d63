"""A local Spark writes the lake through the warehouse's local file system (resources/jvm): each new folder's and
file's permissions set in process, as Hadoop's `chmod` process would have set them."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from resources.spark import LOCAL_FILE_SYSTEM, local_file_system_conf


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_local_spark_sets_the_permissions_of_what_it_writes_in_process(spark: Any, tmp_path: Path) -> None:
    assert local_file_system_conf("local[2]") == {"spark.hadoop.fs.file.impl": LOCAL_FILE_SYSTEM}
    assert local_file_system_conf("spark://spark-master:7077") == {}  # a cluster's executors keep Hadoop's
    jvm = spark.sparkContext._jvm
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    fs = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI(tmp_path.as_uri()), hadoop)
    assert fs.getClass().getName() == LOCAL_FILE_SYSTEM

    table = tmp_path / "t"
    frame = spark.range(6).selectExpr("id", "CAST(id % 3 AS STRING) AS p")
    frame.write.format("delta").partitionBy("p").save(str(table))
    folders = [table / f"p={n}" for n in range(3)]
    files = [f for folder in folders for f in folder.iterdir()]
    assert files and all(f.is_file() for f in files)
    # what Hadoop's own file system gives with its default umask (022): folders 755, files (data, checksum) 644
    assert {_mode(folder) for folder in folders} == {0o755}
    assert {_mode(f) for f in files} == {0o644}

    # a permission asked for explicitly is set as asked
    data = next(f for f in folders[0].iterdir() if f.suffix == ".parquet")
    owner_only = jvm.org.apache.hadoop.fs.permission.FsPermission(0o600)
    fs.setPermission(jvm.org.apache.hadoop.fs.Path(str(data)), owner_only)
    assert _mode(data) == 0o600
    assert spark.read.format("delta").load(str(table)).count() == 6
