"""The Delta lake layer's writes: Spark computes and writes the lake's tables through Delta Lake for Spark;
delta-rs writes the small tables the warehouse keeps about itself and maintains every table's log, where no JVM
should start. Reads without Spark are :mod:`resources.delta_read`'s; where the lake lives and how each engine
reaches it, :mod:`resources.storage`'s.

Every table lives at ``<lake root>/<layer>/<table>`` and is partitioned by string columns
(``dt`` for daily tables, ``dt`` + ``hh`` for hourly ones). On Spark's Delta:

* :meth:`DeltaStore.read` — ``spark.read.format("delta")`` (``versionAsOf`` for time travel), filtered to
  the wanted partitions: Spark's planner prunes partitions and skips files by their statistics;
* :meth:`DeltaStore.overwrite` — one atomic partition overwrite (``replaceWhere``): a crashed write leaves
  the previous version, a re-run gives the same content, a commit race is written again;
* :meth:`DeltaStore.merge` — ``MERGE INTO`` of a change batch (deduplicated by key) whose condition names the
  batch's partition values, so Delta scans only the partitions the batch touches, with the ingestion's app
  transaction in the same commit;
* :meth:`DeltaStore.optimize` — ``OPTIMIZE ... [WHERE partition] [ZORDER BY]``;
* :meth:`DeltaStore.maintain` with a session — ``REORG TABLE ... APPLY (PURGE)`` of the partitions with many rows
  marked deleted, then ``VACUUM ... RETAIN n HOURS`` of the tables Spark writes.

With delta-rs, in the Dagster process and without Spark: the small tables the warehouse keeps about itself
(:meth:`DeltaStore.append` with app transactions for exactly-once appends,
:meth:`DeltaStore.commit_app_transactions`), and :meth:`DeltaStore.maintain` (the ops tables' vacuum; every
table's checkpoint and log cleanup, which read and write only the log). :class:`DeltaStore` also answers the
reads (versions, history, live files and their counts, :meth:`DeltaStore.read_rows`,
:meth:`DeltaStore.app_versions`) through its :class:`~resources.delta_read.DeltaReader`. Tables use only
features both engines read (no column mapping); the tables Spark merges into have deletion vectors
(:meth:`DeltaStore.create_merged_table`; :meth:`DeltaStore.enable_deletion_vectors` for older ones), which delta-rs
reads through DataFusion only, so every read of rows without a JVM is :meth:`DeltaStore.read_rows`; maintenance purges
them (:meth:`DeltaStore.purge_deletion_vectors`).

This module and :mod:`resources.delta_read` are the only ones importing ``deltalake`` (an import-linter
contract). The lake root's storage options come from dagster-deltalake's storage configuration
(:func:`resources.storage.storage_config`).
"""

from __future__ import annotations

import json
import logging
import shutil
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from dagster import ConfigurableResource
from deltalake import CommitProperties, DeltaTable, Schema, write_deltalake
from deltalake.transaction import Transaction
from pydantic import Field

from resources.column_types import normalize_arrow_schema, spark_schema, spark_type
from resources.delta_keys import IN_LIST_PUSHDOWN, MAX_LITERAL_VALUES, KeyScopedWrites, literal_in
from resources.delta_maintenance import DeltaMaintenance
from resources.delta_read import REPLACED, PartitionSpec, ReadStats, _identifier, _literal, _sql_partitions
from resources.delta_sql import (
    COMMIT_ATTEMPTS,
    MergeResult,
    PartitionWritten,
    Predicate,
    WriteResult,
    create_table_sql,
    is_conflict,
    merge_clauses,
    partition_columns,
    session_confs,
    snake,
    spark_errors,
    sql_partition_predicate,
)
from resources.spark import arrow_frame, merge_scan_metrics
from resources.storage import DeltaLayerError, normalize_root, spark_uri, storage_options

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)
# What a table whose changes are read by key needs (:meth:`DeltaStore.create_merged_table`, and every derived
# table from its creation): its commits record the rows they changed, and a key-scoped rebuild's MERGE marks the rows
# it replaces instead of copying the rest of their files
CHANGE_FEED = "delta.enableChangeDataFeed"
CHANGE_TRACKING = {CHANGE_FEED: "true", "delta.enableDeletionVectors": "true"}
# A replaceWhere naming many keys: Delta's check that the new rows hold the predicate off (it tests a row against
# the list's values one by one), and no Parquet filter pushdown (Spark would copy the list's hash set into every task
# to skip row groups by it, when keys spread over a partition are in every row group)
MANY_KEYS = {
    "spark.databricks.delta.replaceWhere.constraintCheck.enabled": "false",
    "spark.sql.parquet.filterPushdown": "false",
}

__all__ = [
    "CHANGE_FEED",
    "CHANGE_TRACKING",
    "COMMIT_ATTEMPTS",
    "DeltaLakeResource",
    "DeltaLayerError",
    "DeltaStore",
    "MergeResult",
    "PartitionWritten",
    "PartitionSpec",
    "Predicate",
    "ReadStats",
    "WriteResult",
    "batch_partitions",
    "normalize_root",
    "storage_options",
]


# --- the store ---------------------------------------------------------------------------------------------


@dataclass
class DeltaStore(KeyScopedWrites, DeltaMaintenance):
    """Reads and writes the lake's Delta tables: delta-rs's reads (no JVM) as :class:`DeltaReader`, writes with
    delta-rs for the warehouse's own small tables and with Spark for the lake's. Plain Python;
    :class:`DeltaLakeResource` configures it."""

    time_travel_hours: int = 168
    checkpoint_interval: int = 10

    def __post_init__(self) -> None:
        self.root = normalize_root(self.root)

    def table_configuration(self, retention_hours: int | None = None) -> dict[str, str | None]:
        """Table properties every table is created with: the time-travel window (the store's unless
        ``retention_hours`` says otherwise) and checkpoint cadence."""
        window = f"interval {self.time_travel_hours if retention_hours is None else retention_hours} hours"
        return {
            "delta.logRetentionDuration": window,
            "delta.deletedFileRetentionDuration": window,
            "delta.checkpointInterval": str(self.checkpoint_interval),
            # off unless a table asks for them (:meth:`enable_deletion_vectors`): delta-rs writes the ops tables
            # and cannot write deletion vectors, and a partition overwrite gains nothing from them
            "delta.enableDeletionVectors": "false",
        }

    def create_table(
        self, key: Sequence[str] | str, schema: pa.Schema, partition_by: Sequence[str], description: str | None = None
    ) -> DeltaTable:
        return DeltaTable.create(
            self.table_uri(key),
            Schema.from_arrow(schema),
            partition_by=list(partition_by),
            description=description,
            configuration=self.table_configuration(),
            storage_options=self.storage_options or None,
        )

    def create_merged_table(
        self,
        spark: SparkSession,
        key: Sequence[str] | str,
        schema: pa.Schema,
        partition_by: Sequence[str],
        description: str | None = None,
    ) -> None:
        """A table Spark's MERGE writes, created by Spark with its change tracking (:data:`CHANGE_TRACKING`) in one
        commit: the protocol and properties :meth:`enable_deletion_vectors` gives a table :meth:`create_table`
        made, without its second commit and the Spark jobs that read the first one back. A no-op on a table that
        exists (another writer's)."""
        properties = {**self.table_configuration(), **CHANGE_TRACKING}
        columns = spark_schema([(f.name, spark_type(f.type)) for f in normalize_arrow_schema(schema)])
        sql = create_table_sql(self.spark_path(key), columns, partition_by, properties, description)
        with spark_errors(self.table_uri(key), "create"):
            spark.sql(sql).collect()

    def enable_deletion_vectors(self, spark: SparkSession, key: Sequence[str] | str) -> bool:
        """Let Spark's MERGE, UPDATE and DELETE mark replaced and deleted rows in deletion vectors instead of
        rewriting every file that holds one, and record what each commit changed (Delta's change data feed, which a
        key-scoped rebuild downstream reads): table properties, and the protocol's ``deletionVectors`` and
        ``changeDataFeed`` features (reader 3, writer 7), in one commit; no data file is rewritten. False when the
        table had both already.

        Readers then need deletion vectors: delta-rs reads the table through :meth:`read_rows` only (its
        DataFusion reader); Delta for Spark reads it as any table."""
        dt = self.table(key)
        if dt is None:
            raise DeltaLayerError(f"table {self.table_uri(key)} does not exist")
        configuration = dt.metadata().configuration
        missing = {name: "true" for name in CHANGE_TRACKING if configuration.get(name) != "true"}
        if not missing:
            return False
        confs = {"spark.databricks.delta.commitInfo.userMetadata": json.dumps({"warehouse.operation": "upgrade"})}
        properties = ", ".join(f"'{name}' = 'true'" for name in missing)
        with session_confs(spark, confs), spark_errors(self.table_uri(key), "enable deletion vectors"):
            spark.sql(f"ALTER TABLE delta.`{self.spark_path(key)}` SET TBLPROPERTIES ({properties})").collect()
        return True

    # writes with delta-rs: the small tables the warehouse keeps about itself ------------------------------
    def append(
        self,
        key: Sequence[str] | str,
        rows: pa.Table,
        partition_by: Sequence[str],
        *,
        app_transactions: Mapping[str, int] | None = None,
        retention_hours: int | None = None,
        operation: str = "append",
    ) -> int:
        """Append ``rows`` in one commit that also records application transaction versions; returns the version.

        Exactly-once appends: the caller skips the rows of app ids whose :meth:`app_versions` already
        reached theirs, so a re-run after a crash appends nothing twice. Creates the table on first use; a column
        new to the table is added (older rows read it as null).
        """
        write_deltalake(
            self.table_uri(key),
            rows,
            mode="append",
            schema_mode="merge",
            partition_by=list(partition_by),
            configuration=self.table_configuration(retention_hours),
            storage_options=self.storage_options or None,
            commit_properties=CommitProperties(
                custom_metadata={"warehouse.operation": operation},
                app_transactions=[Transaction(app_id, v) for app_id, v in (app_transactions or {}).items()],
            ),
        )
        return self._version(key)

    def overwrite_rows(
        self, key: Sequence[str] | str, rows: pa.Table, partitions: Sequence[PartitionSpec], *, operation: str
    ) -> None:
        """Replace exactly ``partitions`` of the existing table ``key`` with ``rows`` (its columns, in any order and
        types that cast to its own): one commit by delta-rs, in this process. For the few rows a caller already
        holds (a maintained total's states), which Spark would spend a few jobs and its commit's log reads writing."""
        if not partitions:
            raise DeltaLayerError("overwrite needs at least one target partition")
        write_deltalake(
            self.table_uri(key),
            self._as_stored(key, rows),
            mode="overwrite",
            predicate=_sql_partitions(partitions),
            storage_options=self.storage_options or None,
            commit_properties=CommitProperties(custom_metadata={"warehouse.operation": operation}),
        )

    def merge_counts(
        self,
        key: Sequence[str] | str,
        rows: pa.Table,
        on: Sequence[str],
        count: str,
        partitions: Sequence[PartitionSpec],
    ) -> None:
        """Upsert ``rows`` (the few a caller holds, in the table's columns) matched on the partition columns and
        ``on`` null-safely, in ``partitions`` only: one ``MERGE`` commit by delta-rs, in this process (no Spark job).
        A row whose ``count`` is 0 or less is deleted (not inserted); one whose ``count`` is NULL is a stamp, updated
        or inserted whatever. What the MERGE does not name stays."""
        dt = self.table(key)
        if dt is None:
            raise DeltaLayerError(f"table {self.table_uri(key)} does not exist")
        columns = [*dt.metadata().partition_columns, *on]
        within = " OR ".join(
            "(" + " AND ".join(f"t.{_identifier(c)} = {_literal(v)}" for c, v in spec.items()) + ")"
            for spec in partitions
        )
        matched = [f"(t.{_identifier(c)} IS NOT DISTINCT FROM s.{_identifier(c)})" for c in columns]
        counted = f"s.{_identifier(count)}"
        metadata = CommitProperties(custom_metadata={"warehouse.operation": "merge-counts"})
        merger = dt.merge(
            self._as_stored(key, rows),
            " AND ".join([f"({within})", *matched]),
            source_alias="s",
            target_alias="t",
            commit_properties=metadata,
        )
        merger = merger.when_matched_delete(f"{counted} <= 0").when_matched_update_all()
        merger.when_not_matched_insert_all(f"coalesce({counted} > 0, true)").execute()

    def _as_stored(self, key: Sequence[str] | str, rows: pa.Table) -> pa.Table:
        """``rows`` in the columns and types of the table ``key`` (Spark's Arrow types may differ in width)."""
        schema = self.arrow_schema(key)
        if schema is None:
            raise DeltaLayerError(f"table {self.table_uri(key)} does not exist")
        return rows.select(schema.names).cast(schema)

    # Spark's Delta: read, overwrite, merge, optimize ------------------------------------------------------
    def spark_path(self, key: Sequence[str] | str) -> str:
        """The table's location as Spark's Hadoop file systems name it (``s3a://`` for ``s3://``)."""
        return spark_uri(self.table_uri(key))

    def read(
        self,
        spark: SparkSession,
        key: Sequence[str] | str,
        partitions: Sequence[PartitionSpec] | None = None,
        predicates: Sequence[Predicate] = (),
        version: int | None = None,
    ) -> tuple[DataFrame, ReadStats]:
        """The rows of ``partitions`` (all without) read by Spark's Delta reader, which prunes partitions and
        skips files by their statistics; ``predicates`` filter the rows. The stats count the partition
        pruning from the log (Spark's own file skipping shows in its plan's metrics): file counts, for which the
        table's deletion vectors are not read (delta-rs reads all of them, on every read of a merged ODS table)."""
        _, stats = self.live_files(key, partitions, version, deletions=False)
        reader = spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        df = reader.load(self.spark_path(key))
        if partitions is not None:
            df = df.where(sql_partition_predicate(None, partitions, partition_columns(partitions)) or "false")
        for p in predicates:
            df = df.where(p.spark_sql())
        return df, stats

    def overwrite(
        self,
        key: Sequence[str] | str,
        df: DataFrame,
        partition_by: Sequence[str],
        partitions: Sequence[PartitionSpec],
        *,
        configuration: Mapping[str, str | None] | None = None,
        operation: str = "overwrite",
    ) -> WriteResult:
        """Replace exactly ``partitions`` with the rows of ``df`` that belong to them: one Delta commit by
        Spark (``replaceWhere``); an unpartitioned table (no ``partition_by``, no ``partitions``) is replaced
        whole. Until it lands nothing is visible, so a failed write leaves the previous
        version (its orphan files are removed by vacuum). A concurrent writer that replaced the same
        partitions first makes Delta refuse ours; it is written again on the new version (last writer wins,
        nothing mixed). Creates the table on first use."""
        started = time.monotonic()
        whole = not partition_by  # an unpartitioned table (a static one) is replaced whole, its schema included
        if not partitions and not whole:
            raise DeltaLayerError("overwrite needs at least one target partition")
        if partitions and whole:
            raise DeltaLayerError(f"{self.table_uri(key)} is unpartitioned: it is replaced whole, not by partition")
        missing = [c for c in partition_by if c not in df.columns]
        if missing:
            raise DeltaLayerError(f"the DataFrame lacks partition column(s) {missing} for {self.table_uri(key)}")
        for spec in partitions:
            if set(spec) != set(partition_by):
                raise DeltaLayerError(f"partition {dict(spec)} does not match partition columns {list(partition_by)}")
        predicate = "" if whole else sql_partition_predicate(None, partitions, partition_by)
        rows = df if whole else df.where(predicate)
        write_id = f"w-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:12]}"
        metadata = json.dumps({"warehouse.operation": operation, "warehouse.write_id": write_id})
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            writer = rows.write.format("delta").mode("overwrite").option("userMetadata", metadata)
            writer = writer.option("overwriteSchema", "true") if whole else writer.option("replaceWhere", predicate)
            if not self.exists(key):  # the first write creates the table, with the lake's table properties
                writer = writer.partitionBy(*partition_by) if partition_by else writer
                properties = {**self.table_configuration(), **(configuration or {})}
                for name, value in properties.items():
                    if value is not None:
                        writer = writer.option(name, value)
            try:
                with spark_errors(self.table_uri(key), operation):
                    writer.save(self.spark_path(key))
                break
            except DeltaLayerError as exc:
                if not is_conflict(exc) or attempt == COMMIT_ATTEMPTS:
                    raise
                log.warning("%s: commit conflict (%s), writing again on the new version (%d)", key, exc, attempt)
        commit = self._commit_of(key, write_id)
        metrics = commit.get("operationMetrics") or {}
        version, written = int(commit["version"]), int(metrics.get("numOutputRows", 0))
        return WriteResult(
            table=self.table_uri(key),
            version=version,
            rows=written,
            files_added=int(metrics.get("numFiles", 0)),
            files_removed=int(metrics.get("numRemovedFiles", 0)),
            bytes_added=int(metrics.get("numOutputBytes", 0)),
            partitions=[dict(p) for p in partitions],
            duration_s=time.monotonic() - started,
            by_partition=self._partitions_at(key, partitions, version, written) if len(partitions) > 1 else [],
        )

    def _partitions_at(
        self, key: Sequence[str] | str, partitions: Sequence[PartitionSpec], version: int, rows: int
    ) -> list[PartitionWritten]:
        """What each of ``partitions`` holds at ``version``, an overwrite's commit: its live files' record counts
        from the Delta log (the commit's metrics count only the whole write). The counts must add up to the rows the
        commit wrote: a file without statistics would make a partition's count wrong, so it is refused."""
        actions, _ = self.live_files(key, partitions, version, deletions=False)
        found: dict[tuple[tuple[str, str], ...], list[int]] = {}
        for action in actions:
            if action.get("num_records") is None:
                raise DeltaLayerError(
                    f"{self.table_uri(key)} v{version}: file {action['path']} has no row count in the Delta log "
                    "(statistics collection is off), so the rows of each partition written are unknown"
                )
            spec = tuple(sorted((c, str(action.get(f"partition.{c}"))) for c in partitions[0]))
            figures = found.setdefault(spec, [0, 0, 0])
            figures[0] += int(action["num_records"])
            figures[1] += 1
            figures[2] += int(action["size_bytes"])
        out = []
        for p in partitions:
            r, f, b = found.get(tuple(sorted((c, str(v)) for c, v in p.items())), [0, 0, 0])
            out.append(PartitionWritten(rows=r, files=f, bytes=b))
        if sum(p.rows for p in out) != rows:
            raise DeltaLayerError(
                f"{self.table_uri(key)} v{version}: the partitions written hold {sum(p.rows for p in out)} rows "
                f"by the Delta log, the commit wrote {rows}"
            )
        return out

    def _commit_of(self, key: Sequence[str] | str, write_id: str, limit: int = 50) -> dict[str, Any]:
        """The commit that carries ``write_id`` in its user metadata (other writers may have committed since)."""
        for commit in self.history(key, limit):
            if commit.get("warehouse.write_id") == write_id:
                return commit
        raise DeltaLayerError(f"{self.table_uri(key)}: the commit of write {write_id} is not in the last {limit}")

    def replace_rows_where(
        self,
        spark: SparkSession,
        key: Sequence[str] | str,
        rows: DataFrame,
        partition_by: Sequence[str],
        partition: PartitionSpec,
        key_column: str,
        where: Mapping[str, Sequence[Any]],
    ) -> WriteResult:
        """Replace, in one partition, the rows holding one of ``where``'s values in each of its columns (the changed
        values of ``key_column``, the table's key, among them: exactly those keys' rows) with ``rows``: one Delta
        commit, an overwrite whose ``replaceWhere`` names the partition and those values as literals. Delta deletes by
        that predicate (deletion vectors; files and Parquet pages skipped by the literals) and appends, with no join
        of the rows against the table, which is what makes a ``MERGE`` cost tens of Spark jobs and two reads of the
        partition.

        Up to :data:`MAX_LITERAL_VALUES` keys, ``rows`` (the table's columns) are computed once, here, into the driver,
        and a column of ``where`` that is not the key (where the replaced rows sit) also takes the new rows' values,
        which the predicate must hold for Delta to accept them; it is left out when that makes it more than
        :data:`MAX_LITERAL_VALUES` values or a new row holds null there; a new row outside the predicate (another
        key's) fails the write: Delta checks them. Past that many keys, only the key narrows: Spark's optimizer makes
        the long ``IN`` list a hash set, so the delete reads the partition's key column once, and ``rows`` go from
        their query straight into the write (computed once there, never collected), with :data:`MANY_KEYS`: Delta's
        check of the new rows tests each against the list one value after another (100,000 keys: 247 s against 27 s
        without, on 3 million rows); a key-local table's rows of the changed keys are those keys' by its proof."""
        started = time.monotonic()
        uri = self.table_uri(key)
        keys = where.get(key_column, [])
        if not keys or any(v is None for v in keys):
            raise DeltaLayerError(f"{uri}: {len(keys)} values of the key {key_column} to replace the rows of")
        few = len(keys) <= MAX_LITERAL_VALUES
        frame, held, confs = (
            self._collected(spark, rows, key_column, where) if few else (rows, {key_column: list(keys)}, MANY_KEYS)
        )
        terms = [sql_partition_predicate(None, [partition], partition_by)]
        limit = MAX_LITERAL_VALUES if few else None
        terms += [literal_in(f"`{column}`", values, limit) for column, values in held.items()]
        predicate = " AND ".join(terms)
        write_id = f"k-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:12]}"
        # every row this commit removes or writes holds one of each column's values: recorded, its readers' key-scoped
        # rebuilds take their changed keys from here, not from its change data feed (JSON keeps integers and strings).
        # Not past MAX_LITERAL_VALUES: a million keys would make every read of the log megabytes longer, and the
        # readers read the change data feed instead
        recorded = {c: v for c, v in held.items() if len(v) <= MAX_LITERAL_VALUES and all(_json_exact(x) for x in v)}
        metadata = json.dumps(
            {"warehouse.operation": "replace-keys", "warehouse.write_id": write_id, REPLACED: recorded}
        )
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            writer = frame.coalesce(1).write.format("delta").mode("overwrite")
            writer = writer.option("replaceWhere", predicate).option("userMetadata", metadata)
            try:
                with session_confs(spark, confs), spark_errors(uri, "replace keys"):
                    writer.save(self.spark_path(key))
                break
            except DeltaLayerError as exc:
                if not is_conflict(exc) or attempt == COMMIT_ATTEMPTS:
                    raise
                log.warning("%s: commit conflict (%s), writing again on the new version (%d)", key, exc, attempt)
        version, metrics = self._committed(key, write_id)
        return self._write_result(
            key,
            version,
            [partition],
            started,
            rows=metrics.get("num_output_rows", 0),
            files_added=metrics.get("num_files", 0),
            files_removed=metrics.get("num_removed_files", 0),
            bytes_added=metrics.get("num_output_bytes", 0),
            keys_replaced=len(keys),
            rows_deleted=metrics.get("num_deleted_rows", 0),
        )

    def _collected(
        self, spark: SparkSession, rows: DataFrame, key_column: str, where: Mapping[str, Sequence[Any]]
    ) -> tuple[DataFrame, dict[str, list[Any]], dict[str, str]]:
        """A few keys' new rows computed once into the driver and back as a DataFrame, the values the replaced and
        the new rows hold in each column of ``where`` (the key's, and where they sit as far as the new rows allow),
        and the Parquet setting that lets the write's scans skip pages by them."""
        from pyspark.sql import functions as F

        with session_confs(spark, IN_LIST_PUSHDOWN):  # a scan of an input by the keys as literals skips pages too
            local = rows.toArrow()
        held = {key_column: list(where[key_column])}
        for column, values in where.items():
            if column == key_column or column not in local.column_names:
                continue
            new = local.column(column)
            found = list(dict.fromkeys([*values, *new.unique().to_pylist()]))
            if new.null_count or len(found) > MAX_LITERAL_VALUES:
                continue
            held[column] = found
        frame = arrow_frame(spark, local).select(*[F.col(c).cast(t).alias(c) for c, t in rows.dtypes])
        return frame, held, IN_LIST_PUSHDOWN

    def merge(
        self,
        spark: SparkSession,
        key: Sequence[str] | str,
        batch: pa.Table,
        *,
        primary_key: Sequence[str],
        partition_by: Sequence[str],
        order_by: Sequence[str] = ("_es", "_pos"),
        op_column: str = "_op",
        app_transaction: tuple[str, int] | None = None,
        prune: bool = True,
        tombstone_column: str | None = None,
        merge_schema: bool = False,
        moved_out: pa.Table | None = None,
    ) -> MergeResult:
        """Merge a change batch by primary key with Spark's ``MERGE INTO``; the newest change (by ``order_by``) wins.

        ``batch`` holds at most one row per key (the caller deduplicates) with ``op_column`` = INSERT /
        UPDATE / DELETE. Rows of ``op_column`` are not stored. With ``prune`` the merge condition names the
        batch's partition values, so Delta scans only those partitions.
        ``app_transaction`` (app id, version) is committed in the same transaction (Delta's idempotent
        writes): a version not above the one recorded makes the merge a no-op, so a batch is applied once.
        With ``merge_schema`` the batch's new columns join the table (Delta's schema evolution).

        With ``tombstone_column`` a DELETE is kept as a row flagged in that column (the batch carries the
        flag) instead of being removed, so an older change delivered again later cannot resurrect it.

        The key is matched within a partition, so a change that moves a row to another partition cannot
        find its old row. ``moved_out`` (the batch's columns) names, per moved key, each partition it left,
        with the order values of its newest change: it is merged as a DELETE there (a tombstone with
        ``tombstone_column``), so a key is live in one partition only. The caller excludes the key's new
        partition and sends one row per key and partition.
        """
        started = time.monotonic()
        uri = self.table_uri(key)
        target_columns = [c for c in batch.schema.names if c != op_column]
        if not self.exists(key):
            # a merged table marks the rows a batch replaces or deletes instead of rewriting their files
            self.create_merged_table(spark, key, batch.select(target_columns).schema, partition_by)
        moved = 0
        if moved_out is not None and moved_out.num_rows:
            moved = moved_out.num_rows
            leave = _with_column(moved_out, op_column, pa.array(["DELETE"] * moved, pa.string()))
            if tombstone_column is not None:
                leave = _with_column(leave, tombstone_column, pa.array([True] * moved, pa.bool_()))
            # the left partitions join the batch's: the condition below then prunes to both, no more
            batch = pa.concat_tables([batch, leave.select(batch.schema.names).cast(batch.schema)])
        specs = batch_partitions(batch, partition_by)
        conditions = [f"t.`{c}` = s.`{c}`" for c in [*partition_by, *primary_key]]
        if prune and specs:
            conditions.insert(0, sql_partition_predicate("t", specs, partition_by))
        clauses = merge_clauses(target_columns, order_by, op_column, tombstone_column)
        source = f"__merge_source_{uuid.uuid4().hex[:12]}"
        arrow_frame(spark, batch).createOrReplaceTempView(source)
        write_id = f"m-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:12]}"
        confs = {
            "spark.databricks.delta.commitInfo.userMetadata": json.dumps(
                {"warehouse.operation": "merge", "warehouse.write_id": write_id}
            ),
            # the source is the batch, in memory: read twice it gives the same rows, so Delta need not copy it first
            # (its copy is a Spark job, and the cached rows, on every merge)
            "spark.databricks.delta.merge.materializeSource": "none",
        }
        if app_transaction is not None:
            confs["spark.databricks.delta.write.txnAppId"] = app_transaction[0]
            confs["spark.databricks.delta.write.txnVersion"] = str(app_transaction[1])
        evolution = " WITH SCHEMA EVOLUTION" if merge_schema else ""
        try:
            with session_confs(spark, confs), spark_errors(uri, "merge"):
                done = spark.sql(
                    f"MERGE{evolution} INTO delta.`{self.spark_path(key)}` AS t USING {source} AS s "
                    f"ON {' AND '.join(conditions)} {clauses}"
                )
        finally:
            spark.catalog.dropTempView(source)
        try:
            commit = self._commit_of(key, write_id)
            scan = merge_scan_metrics(done)  # what it scanned, as Delta measured it (files, partitions)
        except DeltaLayerError:  # the app transaction was already at this version: Delta skipped the batch
            commit = {"version": self._version(key), "operationMetrics": {}}
            scan = {}
        metrics = {snake(k): int(v) for k, v in (commit.get("operationMetrics") or {}).items()}
        metrics.update({f"num_target_{name}": value for name, value in scan.items()})
        return MergeResult(
            table=uri,
            version=int(commit["version"]),
            metrics=metrics,
            partitions=specs,
            duration_s=time.monotonic() - started,
            moved_out=moved,
        )

    def commit_app_transactions(self, key: Sequence[str] | str, app_transactions: Mapping[str, int]) -> int:
        """A commit that adds no data and only records application transaction versions."""
        dt = self.table(key)
        if dt is None:
            raise DeltaLayerError(f"table {self.table_uri(key)} does not exist")
        dt.create_write_transaction(
            [],
            mode="append",
            schema=dt.schema(),
            partition_by=list(dt.metadata().partition_columns),
            commit_properties=CommitProperties(
                custom_metadata={"warehouse.operation": "record-position"},
                app_transactions=[Transaction(app_id, version) for app_id, version in app_transactions.items()],
            ),
        )
        return self._version(key)

    def _version(self, key: Sequence[str] | str) -> int:
        dt = self.table(key)
        if dt is None:
            raise DeltaLayerError(f"table {self.table_uri(key)} vanished after a commit")
        return int(dt.version())


def warm_up(spark: SparkSession, scratch: str) -> float:
    """Run the ingestion's write path once on a throw-away table under the local directory ``scratch`` (created,
    merged twice with an update, a tombstone and an insert, pruned as ingestion prunes), then remove it; returns the
    seconds it took.

    A fresh Spark JVM spends its first Delta merge loading and compiling the merge path: tens of seconds of both
    cores on a small machine. Paid by a server's first ingestion run instead, it starves whatever starts beside
    it (the downstream run that hour just made ready waited seconds to start), and it delays the first hour."""
    started = time.monotonic()
    store = DeltaStore(root=scratch)

    def batch(ids: list[int], ops: list[str], deleted: list[bool], pos: int) -> pa.Table:
        return pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "dt": pa.array(["2000-01-01"] * len(ids), pa.string()),
                "_deleted": pa.array(deleted, pa.bool_()),
                "_es": pa.array([pos] * len(ids), pa.int64()),
                "_pos": pa.array(range(len(ids)), pa.int64()),
                "_op": pa.array(ops, pa.string()),
            }
        )

    try:
        for rows in (
            batch([1, 2], ["INSERT", "INSERT"], [False, False], 1),
            batch([1, 2, 3], ["UPDATE", "DELETE", "INSERT"], [False, True, False], 2),
        ):
            store.merge(spark, "warm_up", rows, primary_key=["id"], partition_by=["dt"], tombstone_column="_deleted")
        rows, _ = store.read(spark, "warm_up", [{"dt": "2000-01-01"}])  # Spark: delta-rs cannot read the deletions
        merged = sorted((row["id"], row["_deleted"]) for row in rows.select("id", "_deleted").collect())
        if merged != [(1, False), (2, True), (3, False)]:  # a server that cannot merge says so before anything runs
            raise DeltaLayerError(f"the warm-up merge left {merged} instead of ids 1 and 3 live and 2 deleted")
        return time.monotonic() - started
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def batch_partitions(batch: pa.Table, partition_by: Sequence[str]) -> list[dict[str, str]]:
    """A batch's distinct partitions, by an Arrow hash aggregate (not a Python dict per row), sorted."""
    columns = list(partition_by)
    if not columns or batch.num_rows == 0:
        return []
    keys = batch.select(columns).group_by(columns).aggregate([])
    values = zip(*(keys.column(c).cast(pa.string()).to_pylist() for c in columns), strict=True)
    return [dict(zip(columns, v, strict=True)) for v in sorted(values)]


def _with_column(table: pa.Table, name: str, values: pa.Array) -> pa.Table:
    index = table.schema.get_field_index(name)
    return table.append_column(name, values) if index < 0 else table.set_column(index, name, values)


class DeltaLakeResource(ConfigurableResource):  # type: ignore[misc]
    """Where the lake lives. ``root`` is a path or URI (``s3://bucket/lake``); storage options pass to delta-rs."""

    root: str = Field(default="data/lake", description="lake root path or URI")
    storage_options: dict[str, str] = Field(default_factory=dict)
    time_travel_hours: int = Field(default=168, description="versions readable this long after they are replaced")
    checkpoint_interval: int = Field(default=10, description="commits between two log checkpoints")

    def store(self) -> DeltaStore:
        """The store; explicit ``storage_options`` override those the root's object store takes from the
        environment (:func:`storage_options`)."""
        options = {**storage_options(self.root), **self.storage_options}
        return DeltaStore(self.root, options, self.time_travel_hours, self.checkpoint_interval)


def _json_exact(value: object) -> bool:
    """Whether JSON gives ``value`` back as it was: an integer or a string (a bool, decimal or time would not be)."""
    return isinstance(value, int | str) and not isinstance(value, bool)
