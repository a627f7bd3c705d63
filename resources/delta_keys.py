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
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from resources.delta_read import DeltaReader, PartitionSpec, ReadStats, _commit, _identifier, _sql_partitions
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
    sql_literal,
    sql_partition_predicate,
)
from resources.spark import arrow_frame
from resources.storage import DeltaLayerError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

NET = "__net"  # a changed row image's count in the change feed: +1 written, -1 removed
# A key-scoped write names its keys as literals (``IN``) up to this many values: Delta skips files by their min/max
# for each, and Parquet row groups and pages by their column index, once Spark pushes an IN list that long down to
# Parquet (by default only up to 10 values; past that it pushes the list's min and max, which span the partition)
MAX_LITERAL_VALUES = 2_000
IN_LIST_PUSHDOWN = {"spark.sql.parquet.pushdown.inFilterThreshold": str(MAX_LITERAL_VALUES)}
GROUP_ROWS = '"__key_rows"'  # a key's rows in a grouped count, named apart from any key column
KEYED = f"{GROUP_ROWS} > 0 AND k IS NOT NULL"  # a value the partition holds, not null: one of its keys
# :meth:`KeyScopedWrites.replaced_values` reads at most this many commits' log entries, each a file; past it, the feed
MAX_RECORDED_COMMITS = 50
# a referenced input as a build read it: its table, the version, the partitions and the row predicates
Referenced = tuple[Sequence[str] | str, int, Sequence[PartitionSpec], Sequence[Predicate]]


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

    def changed_rows(
        self,
        spark: SparkSession,
        key: Sequence[str] | str,
        partitions: Sequence[PartitionSpec],
        after: int,
        until: int,
        limit: int,
    ) -> pa.Table | None:
        """The row images the commits after version ``after`` up to ``until`` changed in ``partitions``, net (as
        :meth:`changed_values` counts them), each with ``__net``: above 0 a row there at ``until`` and not at
        ``after``, below 0 one there at ``after`` and gone by ``until``. Of a table whose rows are unique by the key
        a reader looks up, the rows above 0 are every changed key's rows now: what a key-scoped rebuild would read
        back from the partitions, without reading them. At most ``limit`` + 1 images; None when the feed does not
        cover those commits."""
        if until <= after:
            return None if until < after else pa.table({NET: pa.array([], pa.int64())})
        try:
            with spark_errors(self.table_uri(key), "read the change data feed"):
                net = self._net_changes(spark, key, partitions, after, until)
                return net.limit(limit + 1).toArrow()
        except DeltaLayerError as exc:
            log.info("%s: no change data feed from version %d to %d (%s)", key, after + 1, until, exc)
            return None

    def _net_changes(
        self, spark: SparkSession, key: Sequence[str] | str, partitions: Sequence[PartitionSpec], after: int, until: int
    ) -> DataFrame:
        from pyspark.sql import functions as F

        reader = spark.read.format("delta").option("readChangeFeed", "true")
        reader = reader.option("startingVersion", after + 1).option("endingVersion", until)
        predicate = sql_partition_predicate(None, partitions, partition_columns(partitions)) or "false"
        changes = reader.load(self.spark_path(key)).where(predicate)
        # each row image counted in (written) and out (removed): an image whose count is not 0 changed
        sign = F.when(F.col("_change_type").isin("insert", "update_postimage"), 1).otherwise(-1)
        images = [c for c in changes.columns if c not in ("_change_type", "_commit_version", "_commit_timestamp")]
        return changes.groupBy(*images).agg(F.sum(sign).alias(NET)).where(f"{NET} != 0")

    def distinct_keys(
        self, key: Sequence[str] | str, version: int, partition: PartitionSpec, columns: Sequence[str]
    ) -> tuple[int, int, int]:
        """Of one partition at ``version`` (its live rows, by DataFusion, reading the key's columns only): the rows,
        the distinct keys of ``columns`` with no null part, and the rows with a null part (Spark's ``count(*)``,
        ``count(DISTINCT ...)`` and ``count_if``, as the unique check counts them). One read of the partition: its
        rows grouped by the key, each group's rows counted, the three figures summed from the groups (a key with a
        null part is a group of its own, so its rows are the null ones)."""
        cols = ", ".join(_identifier(c) for c in columns)
        null = " OR ".join(f"{_identifier(c)} IS NULL" for c in columns)
        found = self.live_aggregates(
            {"t": (key, version)},
            f"SELECT coalesce(sum({GROUP_ROWS}), 0) AS n, count(*) FILTER (WHERE NOT ({null})) AS keys, "
            f"coalesce(sum({GROUP_ROWS}) FILTER (WHERE {null}), 0) AS nulls "
            f"FROM (SELECT {cols}, count(*) AS {GROUP_ROWS} FROM t WHERE {_sql_partitions([partition])} "
            f"GROUP BY {cols}) g",
        )
        return int(found["n"]), int(found["keys"]), int(found["nulls"])

    def count_live(
        self, key: Sequence[str] | str, version: int, partitions: Sequence[PartitionSpec], where: Sequence[Predicate]
    ) -> int:
        """The live rows of ``partitions`` at ``version`` that hold ``where``, counted by DataFusion (deletion vectors
        applied, only the predicates' columns read)."""
        condition = " AND ".join(f"({c})" for c in [_sql_partitions(partitions), *map(_datafusion, where)])
        return int(self.live_aggregates({"t": (key, version)}, f"SELECT count(*) AS n FROM t WHERE {condition}")["n"])

    def key_references(
        self,
        key: Sequence[str] | str,
        version: int,
        partition: PartitionSpec,
        column: str,
        referenced: Referenced,
        referenced_column: str,
    ) -> tuple[int, int, int, int]:
        """Of one partition at ``version``, its column ``column`` as a key: the rows, the distinct non-null values,
        the rows holding null (:meth:`distinct_keys` of that one column), and how many of those values no live row of
        ``referenced`` (a table, its version, its partitions read and the predicates they were read with) holds in
        ``referenced_column``. By DataFusion, reading those two columns only, each table once: what the unique
        check of a table keyed by the column it references by (a user's daily total, by user) and its references
        check count, in one query.

        Both sides' values are grouped in one aggregation, each value with the partition's rows holding it and
        whether the referenced rows hold it: the partition's distinct values built once, not once for the count and
        again for the anti-join (DataFusion shares no subquery)."""
        ref_key, ref_version, ref_partitions, ref_where = referenced
        col, ref_col = _identifier(column), _identifier(referenced_column)
        condition = " AND ".join(f"({c})" for c in [_sql_partitions(ref_partitions), *map(_datafusion, ref_where)])
        mine = f"SELECT {col} AS k, 1 AS mine FROM a WHERE {_sql_partitions([partition])}"
        theirs = f"SELECT {ref_col} AS k, 0 AS mine FROM b WHERE {condition} AND {ref_col} IS NOT NULL"
        found = self.live_aggregates(
            {"a": (key, version), "b": (ref_key, ref_version)},
            f"SELECT coalesce(sum({GROUP_ROWS}), 0) AS n, count(*) FILTER (WHERE {KEYED}) AS keys, "
            f"coalesce(sum({GROUP_ROWS}) FILTER (WHERE k IS NULL), 0) AS nulls, "
            f"count(*) FILTER (WHERE {KEYED} AND NOT theirs) AS missing "
            f"FROM (SELECT k, sum(mine) AS {GROUP_ROWS}, bool_or(mine = 0) AS theirs "
            f"FROM ({mine} UNION ALL {theirs}) u GROUP BY k) g",
        )
        return int(found["n"]), int(found["keys"]), int(found["nulls"]), int(found["missing"])

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
        if until <= after:
            return None if until < after else pa.table({c: pa.array([], pa.string()) for c in columns})
        try:
            with spark_errors(self.table_uri(key), "read the change data feed"):
                net = self._net_changes(spark, key, partitions, after, until)
                return net.select(*columns).distinct().limit(limit + 1).toArrow()
        except DeltaLayerError as exc:
            log.info("%s: no change data feed from version %d to %d (%s)", key, after + 1, until, exc)
            return None

    def replaced_values(
        self, key: Sequence[str] | str, column: str, partitions: Sequence[PartitionSpec], after: int, until: int
    ) -> list[Any] | None:
        """The values of ``column`` that every row the commits after version ``after`` up to ``until`` changed in
        ``partitions`` holds, as those commits recorded them (:meth:`replace_rows_where` records the values its
        ``replaceWhere`` held each column to), read from their log entries: a superset of :meth:`changed_values`'s
        without reading the change data feed. A commit changing none of those partitions' rows (another partition's
        write, an ``OPTIMIZE``) adds none. None when one that changed them recorded none for ``column`` (any other
        write), or when its log entry is gone or they are too many to read one by one."""
        if until - after > MAX_RECORDED_COMMITS:
            return None
        wanted = [set(spec.items()) for spec in partitions]
        uri = self.table_uri(key)
        values: dict[Any, None] = {}
        for version in range(after + 1, until + 1):
            try:
                commit = _commit(uri, version)
            except FileNotFoundError:
                return None
            if not any(spec <= set(changed) for spec in wanted for changed in commit.partitions):
                continue
            recorded = (commit.replaced or {}).get(column)
            if recorded is None:
                return None
            values.update(dict.fromkeys(recorded))
        return list(values)

    def replace_keys(
        self,
        spark: SparkSession,
        key: Sequence[str] | str,
        rows: DataFrame,
        changed: DataFrame,
        key_columns: Sequence[str],
        partition_by: Sequence[str],
        partitions: Sequence[PartitionSpec],
        narrow: Mapping[str, Sequence[Any]] | None = None,
    ) -> WriteResult:
        """Replace the rows of the keys ``changed`` names (its columns: the key's and the partition's) with ``rows``
        (the table's columns, those keys' new rows): one Delta ``MERGE`` commit, which updates a key's row, inserts a
        new key's, and deletes the row of a key that has none any more, in ``partitions`` only. A key's rows are the
        same as a whole partition overwrite would leave them; the other rows stay as they are (deletion vectors mark
        the replaced ones: no file is copied).

        ``narrow``: column → values every replaced row holds in it (the keys themselves, or where the rows sit), at
        most :data:`MAX_LITERAL_VALUES` each. They join the condition as literals on the target, so Delta skips the
        files whose statistics hold none of them and Parquet the pages whose column index holds none: the MERGE reads
        what holds the keys, not the partition. The same Parquet setting lets a source read by literal keys
        (:meth:`KeyScope.only_keys`) skip pages too."""
        from pyspark.sql import functions as F

        started = time.monotonic()
        columns = list(rows.columns)
        on = [*partition_by, *key_columns]
        flag = "__warehouse_gone"
        source_frame = changed.select(*on).distinct().join(rows.withColumn(flag, F.lit(False)), on, "left")
        source_frame = source_frame.withColumn(flag, F.coalesce(F.col(flag), F.lit(True)))
        source = f"__replace_keys_{uuid.uuid4().hex[:12]}"
        conditions = [sql_partition_predicate("t", partitions, partition_by), *(f"t.`{c}` = s.`{c}`" for c in on)]
        conditions += [literal_in(f"t.`{c}`", values) for c, values in (narrow or {}).items()]
        updates = ", ".join(f"t.`{c}` = s.`{c}`" for c in columns)
        names = ", ".join(f"`{c}`" for c in columns)
        inserts = f"({names}) VALUES ({', '.join(f's.`{c}`' for c in columns)})"
        write_id = f"k-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:12]}"
        confs = {
            "spark.databricks.delta.commitInfo.userMetadata": json.dumps(
                {"warehouse.operation": "replace-keys", "warehouse.write_id": write_id}
            ),
            **IN_LIST_PUSHDOWN,
        }
        sql = (
            f"MERGE INTO delta.`{self.spark_path(key)}` AS t USING {source} AS s "
            f"ON {' AND '.join(conditions)} "
            f"WHEN MATCHED AND s.`{flag}` THEN DELETE "
            f"WHEN MATCHED THEN UPDATE SET {updates} "
            f"WHEN NOT MATCHED AND NOT s.`{flag}` THEN INSERT {inserts}"
        )
        self._merge_retrying(spark, key, source_frame, source, sql, confs, "replace keys")
        version, metrics = self._committed(key, write_id)
        return self._write_result(
            key,
            version,
            partitions,
            started,
            rows=metrics.get("num_target_rows_inserted", 0) + metrics.get("num_target_rows_updated", 0),
            files_added=metrics.get("num_target_files_added", 0),
            files_removed=metrics.get("num_target_files_removed", 0),
            bytes_added=metrics.get("num_target_bytes_added", 0),
            keys_replaced=metrics.get("num_source_rows", 0),
            rows_deleted=metrics.get("num_target_rows_deleted", 0),
        )

    def _merge_retrying(
        self,
        spark: SparkSession,
        key: Sequence[str] | str,
        frame: DataFrame,
        source: str,
        sql: str,
        confs: Mapping[str, str],
        what: str,
    ) -> None:
        """Run the ``MERGE`` ``sql``, which reads ``frame`` as the temporary view ``source`` (dropped after, whatever
        happens), again on the table's new version when a concurrent commit conflicts with it, up to
        :data:`COMMIT_ATTEMPTS` times."""
        frame.createOrReplaceTempView(source)
        try:
            for attempt in range(1, COMMIT_ATTEMPTS + 1):
                try:
                    with session_confs(spark, confs), spark_errors(self.table_uri(key), what):
                        spark.sql(sql).collect()
                    return
                except DeltaLayerError as exc:
                    if not is_conflict(exc) or attempt == COMMIT_ATTEMPTS:
                        raise
                    log.warning("%s: commit conflict (%s), merging again on the new version (%d)", key, exc, attempt)
        finally:
            spark.catalog.dropTempView(source)

    def _committed(self, key: Sequence[str] | str, write_id: str) -> tuple[int, dict[str, int]]:
        """The version of the commit that carries ``write_id`` and its operation metrics (snake case names)."""
        commit = self._commit_of(key, write_id)
        return int(commit["version"]), {snake(k): int(v) for k, v in (commit.get("operationMetrics") or {}).items()}

    def _write_result(
        self,
        key: Sequence[str] | str,
        version: int,
        partitions: Sequence[PartitionSpec],
        started: float,
        *,
        rows: int,
        files_added: int,
        files_removed: int,
        bytes_added: int,
        keys_replaced: int,
        rows_deleted: int,
    ) -> WriteResult:
        """A key-scoped write's result: the figures its commit's metrics give, and what each of ``partitions`` holds
        at ``version`` by the Delta log (the live rows, deletion vectors subtracted: the partition whole, not only
        the keys written)."""
        actions, _ = self.live_files(key, partitions, version)
        by_partition = []
        for spec in partitions:
            mine = [a for a in actions if all(str(a.get(f"partition.{c}")) == str(v) for c, v in spec.items())]
            by_partition.append(
                PartitionWritten(
                    rows=sum(int(a["live_records"]) for a in mine),
                    files=len(mine),
                    bytes=sum(int(a["size_bytes"]) for a in mine),
                    live_files=tuple(mine),
                )
            )
        return WriteResult(
            table=self.table_uri(key),
            version=version,
            rows=rows,
            files_added=files_added,
            files_removed=files_removed,
            bytes_added=bytes_added,
            partitions=[dict(p) for p in partitions],
            duration_s=time.monotonic() - started,
            by_partition=by_partition,
            keys_replaced=keys_replaced,
            rows_deleted=rows_deleted,
        )


def literal_in(column: str, values: Sequence[Any], limit: int | None = MAX_LITERAL_VALUES) -> str:
    """``column IN (...)`` of literal values: a predicate Delta's data skipping and Parquet's filters read. At most
    ``limit`` of them (None: any number; Spark holds a long list as a hash set)."""
    if not values or (limit is not None and len(values) > limit):
        raise DeltaLayerError(f"{column}: {len(values)} values to narrow by, not 1 to {limit}")
    if any(v is None for v in values):
        raise DeltaLayerError(f"{column}: a null value narrows by nothing (IN never holds for null)")
    return f"{column} IN ({', '.join(sql_literal(v) for v in values)})"


def _datafusion(predicate: Predicate) -> str:
    """A predicate as DataFusion's SQL (double-quoted names; booleans as ``true``/``false``)."""
    value = predicate.value
    literal = str(value).lower() if isinstance(value, bool) else sql_literal(value)
    if predicate.op == "in":
        values = ", ".join(str(v).lower() if isinstance(v, bool) else sql_literal(v) for v in value)
        return f"{_identifier(predicate.column)} IN ({values})"
    return f"{_identifier(predicate.column)} {predicate.op} {literal}"
