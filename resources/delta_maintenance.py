"""Maintenance of the lake's Delta tables: compaction and Z-order, the purge of deletion vectors, vacuum, checkpoints
and log cleanup, on Spark's Delta for the tables Spark writes and on delta-rs for the small ones the Dagster process
keeps. A part of :class:`resources.delta_lake.DeltaStore`, kept apart from its reads and writes."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from resources.delta_read import DeltaReader, PartitionSpec
from resources.delta_sql import partition_columns, session_confs, spark_errors, sql_partition_predicate
from resources.storage import DeltaLayerError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Maintenance purges a partition once its deletion vectors mark more than this share of its stored rows deleted:
# every read then still reads them to drop them (Delta's OPTIMIZE rewrites a file past 5 % on its own)
DELETED_ROWS_PURGE_FRACTION = 0.1


class DeltaMaintenance(DeltaReader):
    """Keeps a table's storage and reads bounded while its time-travel window stays readable."""

    if TYPE_CHECKING:  # the store's own
        time_travel_hours: int

        def spark_path(self, key: Sequence[str] | str) -> str: ...

        def _version(self, key: Sequence[str] | str) -> int: ...

    def optimize(
        self,
        key: Sequence[str] | str,
        partitions: Sequence[PartitionSpec] | None = None,
        zorder_by: Sequence[str] = (),
        target_size: int | None = None,
        spark: SparkSession | None = None,
    ) -> dict[str, Any]:
        """Compact (or Z-order) the given partitions; returns the metrics plus the duration and version.

        With ``spark`` it is Spark's ``OPTIMIZE ... [WHERE partitions] [ZORDER BY (columns)]``: files of about
        ``target_size`` bytes, committed as a rewrite (``dataChange=false``) that Delta's conflict detection
        refuses if a concurrent writer removed what it read. Without, delta-rs compacts (the small ops tables
        the Dagster process keeps without a JVM).
        """
        dt = self.table(key)
        if dt is None:
            raise DeltaLayerError(f"table {self.table_uri(key)} does not exist")
        started = time.monotonic()
        if spark is None:
            if zorder_by:
                raise DeltaLayerError(f"{self.table_uri(key)}: Z-order runs on Spark's Delta; pass a Spark session")
            filters = None
            if partitions:
                if len(partitions) != 1:
                    raise DeltaLayerError("compact one partition at a time")
                filters = [(c, "=", str(v)) for c, v in partitions[0].items()]
            result = dict(dt.optimize.compact(partition_filters=filters, target_size=target_size))
        else:
            where = ""
            if partitions:
                where = " WHERE " + sql_partition_predicate(None, partitions, partition_columns(partitions))
            zorder = f" ZORDER BY ({', '.join(f'`{c}`' for c in zorder_by)})" if zorder_by else ""
            confs = {
                "spark.databricks.delta.commitInfo.userMetadata": json.dumps(
                    {"warehouse.operation": "zorder" if zorder_by else "compact"}
                )
            }
            if target_size:
                confs["spark.databricks.delta.optimize.maxFileSize"] = str(int(target_size))
            with session_confs(spark, confs), spark_errors(self.table_uri(key), "optimize"):
                row = spark.sql(f"OPTIMIZE delta.`{self.spark_path(key)}`{where}{zorder}").first()
            metrics = row["metrics"] if row is not None else None
            result = {
                "numFilesAdded": int(metrics["numFilesAdded"]) if metrics else 0,
                "numFilesRemoved": int(metrics["numFilesRemoved"]) if metrics else 0,
            }
        result["duration_s"] = time.monotonic() - started
        result["delta_version"] = self._version(key)
        return result

    def purge_deletion_vectors(
        self, spark: SparkSession, key: Sequence[str] | str, max_deleted_fraction: float = DELETED_ROWS_PURGE_FRACTION
    ) -> dict[str, Any]:
        """Rewrite the files of every partition whose deletion vectors mark more than ``max_deleted_fraction`` of
        its stored rows deleted, without those rows (Spark's ``REORG TABLE ... APPLY (PURGE)``): readers stop
        reading rows only to drop them. A rewrite (``dataChange=false``): the versions before it still read as
        they did, until vacuum removes their files."""
        files, _ = self.live_files(key)
        stored: dict[tuple[tuple[str, str], ...], list[int]] = {}
        for action in files:
            values = {k.removeprefix("partition."): str(v) for k, v in action.items() if k.startswith("partition.")}
            partition = tuple(sorted(values.items()))
            totals = stored.setdefault(partition, [0, 0])
            totals[0] += int(action.get("num_records") or 0)
            totals[1] += int(action["deleted_records"])
        due = [
            dict(p)
            for p, (rows, deleted) in sorted(stored.items())
            if deleted and deleted > max_deleted_fraction * rows
        ]
        result: dict[str, Any] = {
            "partitions_purged": len(due),
            "rows_purged": sum(stored[tuple(sorted(p.items()))][1] for p in due),
            "files_rewritten": 0,
        }
        if not due:
            return result
        where = ""
        if due[0]:  # a partitioned table: only the partitions past the threshold
            where = " WHERE " + sql_partition_predicate(None, due, partition_columns(due))
        confs = {"spark.databricks.delta.commitInfo.userMetadata": json.dumps({"warehouse.operation": "purge"})}
        with session_confs(spark, confs), spark_errors(self.table_uri(key), "purge deletion vectors"):
            row = spark.sql(f"REORG TABLE delta.`{self.spark_path(key)}`{where} APPLY (PURGE)").first()
        metrics = row["metrics"] if row is not None else None
        result["files_rewritten"] = int(metrics["numFilesRemoved"]) if metrics else 0
        return result

    def maintain(
        self,
        key: Sequence[str] | str,
        retention_hours: int | None = None,
        compact: bool = False,
        spark: SparkSession | None = None,
        max_deleted_fraction: float = DELETED_ROWS_PURGE_FRACTION,
    ) -> dict[str, Any]:
        """Keep storage and reads bounded while the time-travel window stays readable.

        With ``compact``, first bin-packs each partition's small files into few (a table appended to in
        small commits, like the ops tables). With ``spark``, the partitions whose deletion vectors mark more
        than ``max_deleted_fraction`` of their rows deleted are purged (:meth:`purge_deletion_vectors`). Then
        vacuums data files removed longer than ``retention_hours`` ago (default: the store's window), writes a
        checkpoint of the log and drops log entries older than the table's log retention. With ``spark`` (the
        tables Spark writes) the compaction is Spark's ``OPTIMIZE`` and the vacuum Spark's ``VACUUM``; without,
        delta-rs does both (the ops tables).
        """
        dt = self.table(key)
        if dt is None:
            raise DeltaLayerError(f"table {self.table_uri(key)} does not exist")
        hours = self.time_travel_hours if retention_hours is None else retention_hours
        started = time.monotonic()
        purged: dict[str, Any] = {}
        if spark is None:
            compacted = dict(dt.optimize.compact()) if compact else {}
            vacuumed = len(dt.vacuum(retention_hours=hours, dry_run=False, enforce_retention_duration=False))
        else:
            compacted = self.optimize(key, spark=spark) if compact else {}
            if self.has_deletion_vectors(key):
                purged = self.purge_deletion_vectors(spark, key, max_deleted_fraction)
            vacuumed = self._vacuum_with_spark(spark, key, hours)
            dt = self.table(key) or dt  # the log as Spark left it
        dt.create_checkpoint()
        logs_before = self.log_entries(key)
        dt.cleanup_metadata()
        return {
            "files_compacted": int(compacted.get("numFilesRemoved", 0)),
            "partitions_purged": int(purged.get("partitions_purged", 0)),
            "rows_purged": int(purged.get("rows_purged", 0)),
            "files_vacuumed": vacuumed,
            "log_files_removed": logs_before - self.log_entries(key),
            "delta_version": dt.version(),
            "retention_hours": hours,
            "duration_s": round(time.monotonic() - started, 3),
        }

    def _vacuum_with_spark(self, spark: SparkSession, key: Sequence[str] | str, hours: int) -> int:
        """Spark's ``VACUUM``: deletes the files no version younger than ``hours`` reads; returns their count."""
        command = f"VACUUM delta.`{self.spark_path(key)}` RETAIN {int(hours)} HOURS"
        # Delta refuses a retention below the table's own window unless told: the caller chose it. No
        # VACUUM START/END commits: deleting unread files is no change of the table (the count is returned)
        # VACUUM lists the table's directories in parallelPartitionDiscovery.parallelism tasks, 10,000 by default:
        # 161 s for a 12-file table on 2 cores, 8 s with the session's shuffle width (sized to the cluster)
        confs = {
            "spark.databricks.delta.retentionDurationCheck.enabled": "false",
            "spark.databricks.delta.vacuum.logging.enabled": "false",
            "spark.sql.sources.parallelPartitionDiscovery.parallelism": spark.conf.get("spark.sql.shuffle.partitions")
            or "8",
        }
        with session_confs(spark, confs), spark_errors(self.table_uri(key), "vacuum"):
            listed = [row[0] for row in spark.sql(f"{command} DRY RUN").collect()]
            spark.sql(command).collect()
        # the dry run lists directories too (those of the change data feed, which stay while they hold files)
        return sum(1 for path in listed if "." in str(path).rsplit("/", 1)[-1])
