"""Spark's Delta by key: where keys' rows are now, which keys the commits since a version changed (Delta's change
data feed), and the replacement of exactly those keys' rows in one ``MERGE``: what a key-scoped rebuild for late
data reads and writes (:mod:`warehouse_assets.materialize.key_scope`). :class:`resources.delta_lake.DeltaStore`
has them as its own.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from resources.delta_read import DeltaReader, PartitionSpec, ReadStats
from resources.delta_sql import (
    COMMIT_ATTEMPTS,
    PartitionWritten,
    Predicate,
    WriteResult,
    is_conflict,
    partition_columns,
    session_confs,
    snake,
    spark_errors,
    sql_partition_predicate,
)
from resources.spark import arrow_frame
from resources.storage import DeltaLayerError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)


class KeyScopedWrites(DeltaReader):
    """Key-level reads and writes on Spark's Delta, beside the store's whole-partition ones."""

    if TYPE_CHECKING:  # the store's own, on Spark's Delta

        def spark_path(self, key: Sequence[str] | str) -> str: ...

        def read(
            self,
            spark: SparkSession,
            key: Sequence[str] | str,
            partitions: Sequence[PartitionSpec] | None = None,
            predicates: Sequence[Predicate] = (),
            version: int | None = None,
        ) -> tuple[DataFrame, ReadStats]: ...

        def _commit_of(self, key: Sequence[str] | str, write_id: str, limit: int = 50) -> dict[str, Any]: ...

    def live_rows_of_keys(
        self,
        spark: SparkSession,
        key: Sequence[str] | str,
        keys: pa.Table,
        columns: Sequence[str],
        *,
        partitions: Sequence[PartitionSpec] | None = None,
        tombstone_column: str | None = None,
    ) -> pa.Table:
        """The live rows of the keys ``keys`` holds (its columns are the key's), as the key plus ``columns``, read
        by Spark's Delta reader in ``partitions`` (the whole table without): where those keys are now."""
        from pyspark.sql import functions as F

        names = list(keys.column_names)
        if not self.exists(key) or not keys.num_rows or (partitions is not None and not partitions):
            return pa.table({name: pa.array([], pa.null()) for name in [*names, *columns]})
        df, _ = self.read(spark, key, partitions)
        if tombstone_column is not None:
            df = df.where(~F.col(tombstone_column))
        wanted = arrow_frame(spark, keys.group_by(names).aggregate([]))
        return df.join(F.broadcast(wanted), names, "left_semi").select(*names, *columns).toArrow()

    def changed_values(
        self,
        spark: SparkSession,
        key: Sequence[str] | str,
        columns: Sequence[str],
        partitions: Sequence[PartitionSpec],
        after: int,
        until: int,
        limit: int,
    ) -> pa.Table | None:
        """The distinct values of ``columns`` in every row the commits after version ``after`` up to ``until`` changed
        in ``partitions``: inserted and deleted rows, and each updated row before and after (Delta's change data feed),
        so a row moved from one key to another names both. Net of rows deleted and written again the same (a
        partition overwritten whole with mostly the same rows changed only those that differ). At most ``limit`` + 1
        of them (more than ``limit``: too many to be worth it, whatever the number). None when the feed does not
        cover those commits (the table records none, or did not when they were made): then nobody knows what
        changed."""
        from pyspark.sql import functions as F

        if until <= after:
            return None if until < after else pa.table({c: pa.array([], pa.string()) for c in columns})
        reader = spark.read.format("delta").option("readChangeFeed", "true")
        reader = reader.option("startingVersion", after + 1).option("endingVersion", until)
        predicate = sql_partition_predicate(None, partitions, partition_columns(partitions)) or "false"
        try:
            with spark_errors(self.table_uri(key), "read the change data feed"):
                changes = reader.load(self.spark_path(key)).where(predicate)
                # each row image counted in (written) and out (removed): an image whose count is not 0 changed
                sign = F.when(F.col("_change_type").isin("insert", "update_postimage"), 1).otherwise(-1)
                images = [
                    c for c in changes.columns if c not in ("_change_type", "_commit_version", "_commit_timestamp")
                ]
                net = changes.groupBy(*images).agg(F.sum(sign).alias("__net")).where("__net != 0")
                return net.select(*columns).distinct().limit(limit + 1).toArrow()
        except DeltaLayerError as exc:
            log.info("%s: no change data feed from version %d to %d (%s)", key, after + 1, until, exc)
            return None

    def replace_keys(
        self,
        spark: SparkSession,
        key: Sequence[str] | str,
        rows: DataFrame,
        changed: DataFrame,
        key_columns: Sequence[str],
        partition_by: Sequence[str],
        partitions: Sequence[PartitionSpec],
    ) -> WriteResult:
        """Replace the rows of the keys ``changed`` names (its columns: the key's and the partition's) with ``rows``
        (the table's columns, those keys' new rows): one Delta ``MERGE`` commit, which updates a key's row, inserts a
        new key's, and deletes the row of a key that has none any more, in ``partitions`` only. A key's rows are the
        same as a whole partition overwrite would leave them; the other rows stay as they are (deletion vectors mark
        the replaced ones: no file is copied)."""
        from pyspark.sql import functions as F

        started = time.monotonic()
        uri = self.table_uri(key)
        columns = list(rows.columns)
        on = [*partition_by, *key_columns]
        flag = "__warehouse_gone"
        source_frame = changed.select(*on).distinct().join(rows.withColumn(flag, F.lit(False)), on, "left")
        source_frame = source_frame.withColumn(flag, F.coalesce(F.col(flag), F.lit(True)))
        source = f"__replace_keys_{uuid.uuid4().hex[:12]}"
        source_frame.createOrReplaceTempView(source)
        conditions = [sql_partition_predicate("t", partitions, partition_by), *(f"t.`{c}` = s.`{c}`" for c in on)]
        updates = ", ".join(f"t.`{c}` = s.`{c}`" for c in columns)
        names = ", ".join(f"`{c}`" for c in columns)
        inserts = f"({names}) VALUES ({', '.join(f's.`{c}`' for c in columns)})"
        write_id = f"k-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:12]}"
        confs = {
            "spark.databricks.delta.commitInfo.userMetadata": json.dumps(
                {"warehouse.operation": "replace-keys", "warehouse.write_id": write_id}
            )
        }
        try:
            for attempt in range(1, COMMIT_ATTEMPTS + 1):
                try:
                    with session_confs(spark, confs), spark_errors(uri, "replace keys"):
                        spark.sql(
                            f"MERGE INTO delta.`{self.spark_path(key)}` AS t USING {source} AS s "
                            f"ON {' AND '.join(conditions)} "
                            f"WHEN MATCHED AND s.`{flag}` THEN DELETE "
                            f"WHEN MATCHED THEN UPDATE SET {updates} "
                            f"WHEN NOT MATCHED AND NOT s.`{flag}` THEN INSERT {inserts}"
                        ).collect()
                    break
                except DeltaLayerError as exc:
                    if not is_conflict(exc) or attempt == COMMIT_ATTEMPTS:
                        raise
                    log.warning("%s: commit conflict (%s), merging again on the new version (%d)", key, exc, attempt)
        finally:
            spark.catalog.dropTempView(source)
        commit = self._commit_of(key, write_id)
        metrics = {snake(k): int(v) for k, v in (commit.get("operationMetrics") or {}).items()}
        version = int(commit["version"])
        actions, _ = self.live_files(key, partitions, version)
        by_partition = []
        for spec in partitions:
            mine = [a for a in actions if all(str(a.get(f"partition.{c}")) == str(v) for c, v in spec.items())]
            by_partition.append(
                PartitionWritten(
                    rows=sum(int(a["live_records"]) for a in mine),
                    files=len(mine),
                    bytes=sum(int(a["size_bytes"]) for a in mine),
                )
            )
        return WriteResult(
            table=uri,
            version=version,
            rows=metrics.get("num_target_rows_inserted", 0) + metrics.get("num_target_rows_updated", 0),
            files_added=metrics.get("num_target_files_added", 0),
            files_removed=metrics.get("num_target_files_removed", 0),
            bytes_added=metrics.get("num_target_bytes_added", 0),
            partitions=[dict(p) for p in partitions],
            duration_s=time.monotonic() - started,
            by_partition=by_partition,
            keys_replaced=metrics.get("num_source_rows", 0),
            rows_deleted=metrics.get("num_target_rows_deleted", 0),
        )
