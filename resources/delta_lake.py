"""The Delta lake layer: Spark computes, delta-rs writes the transaction log (design AD-1).

Every table lives at ``<lake root>/<layer>/<table>`` and is partitioned by string columns
(``dt`` for daily tables, ``dt`` + ``hh`` for hourly ones). The operations:

* :meth:`DeltaStore.read` — the live files of the wanted partitions, pruned by partition values and then by
  file min/max statistics (data skipping), read natively by Spark;
* :meth:`DeltaStore.overwrite` — Spark tasks write parquet files into a fresh directory per write; the
  driver reads their footers for statistics and one delta-rs transaction swaps them in for the replaced
  partitions. Until that commit nothing is visible, so a crashed write leaves the previous version intact
  (its orphan files are removed by vacuum);
* :meth:`DeltaStore.merge` — a change batch (already deduplicated by key) merged by primary key with an
  explicit predicate on the batch's partition values, so only those partitions are scanned;
* :meth:`DeltaStore.optimize` (compaction / Z-order), :meth:`DeltaStore.maintain`, :meth:`DeltaStore.history`;
* without Spark, for the small tables the warehouse keeps about itself and a producer's table:
  :meth:`DeltaStore.append` (rows plus application transactions in one commit, for exactly-once appends),
  :meth:`DeltaStore.app_versions`, :meth:`DeltaStore.read_rows` (pruned to partitions by the log),
  :meth:`DeltaStore.version`, :meth:`DeltaStore.live_files`.

This module is the one seam to ``deltalake`` (an import-linter contract). The lake root's storage options
come from dagster-deltalake's storage configuration (:func:`storage_config`). Nothing here collects a
partition into the driver: only file metadata crosses to it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from dagster import ConfigurableResource
from dagster_deltalake import AzureConfig, GcsConfig, LocalConfig, S3Config
from deltalake import CommitProperties, DeltaTable, Schema, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction, Transaction, create_table_with_add_actions
from pydantic import Field

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)
COMMIT_ATTEMPTS = 4

PartitionSpec = Mapping[str, str]
"""One partition: partition column → value, e.g. ``{"dt": "2024-03-05", "hh": "13"}``."""


class DeltaLayerError(RuntimeError):
    """A Delta operation could not be carried out; the message names the table and the reason."""


# --- results -----------------------------------------------------------------------------------------------


@dataclass
class ReadStats:
    files_in_table: int = 0
    files_after_partition_pruning: int = 0
    files_read: int = 0
    bytes_read: int = 0
    version: int | None = None

    @property
    def files_skipped_by_stats(self) -> int:
        return self.files_after_partition_pruning - self.files_read


@dataclass
class WriteResult:
    table: str
    version: int
    rows: int
    files_added: int
    files_removed: int
    bytes_added: int
    partitions: list[dict[str, str]]
    duration_s: float

    def metadata(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "files_added": self.files_added,
            "files_removed": self.files_removed,
            "bytes_added": self.bytes_added,
            "delta_version": self.version,
            "write_seconds": round(self.duration_s, 3),
            "table_uri": self.table,
        }


@dataclass
class MergeResult:
    table: str
    version: int
    metrics: dict[str, Any]
    partitions: list[dict[str, str]]
    duration_s: float
    moved_out: int = 0  # source rows that retired a key from a partition it moved out of

    def metadata(self) -> dict[str, Any]:
        m = self.metrics
        return {
            "source_rows": m.get("num_source_rows", 0),  # the batch's changes + moved_out
            "rows_moved_out": self.moved_out,
            "rows_inserted": m.get("num_target_rows_inserted", 0),
            "rows_updated": m.get("num_target_rows_updated", 0),
            "rows_deleted": m.get("num_target_rows_deleted", 0),
            "files_added": m.get("num_target_files_added", 0),
            "files_removed": m.get("num_target_files_removed", 0),
            "files_scanned": m.get("num_target_files_scanned", 0),
            "files_skipped": m.get("num_target_files_skipped_during_scan", 0),
            "partitions_touched": len(self.partitions),
            "delta_version": self.version,
            "merge_seconds": round(self.duration_s, 3),
        }


@dataclass(frozen=True)
class Predicate:
    """A row condition used both to skip files by min/max statistics and to filter rows in Spark.

    ``op`` is one of ``= != < <= > >= in``; ``value`` is a Python scalar (a list for ``in``).
    """

    column: str
    op: str
    value: Any

    def spark_sql(self) -> str:
        if self.op == "in":
            return f"`{self.column}` IN ({', '.join(_sql_literal(v) for v in self.value)})"
        return f"`{self.column}` {self.op} {_sql_literal(self.value)}"

    def may_match(self, lo: Any, hi: Any) -> bool:
        """False only if no value in [lo, hi] can satisfy the predicate."""
        if lo is None or hi is None:
            return True
        try:
            if self.op == "=":
                return bool(lo <= self.value <= hi)
            if self.op == "in":
                return any(lo <= v <= hi for v in self.value)
            if self.op == "<":
                return bool(lo < self.value)
            if self.op == "<=":
                return bool(lo <= self.value)
            if self.op == ">":
                return bool(hi > self.value)
            if self.op == ">=":
                return bool(hi >= self.value)
        except TypeError:
            return True
        return True


def _sql_literal(value: Any) -> str:
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, datetime):
        return f"TIMESTAMP '{value.isoformat(sep=' ')}'"
    if isinstance(value, date):
        return f"DATE '{value.isoformat()}'"
    if value is None:
        return "NULL"
    return str(value)


# --- type mapping ------------------------------------------------------------------------------------------


def spark_ddl(schema: pa.Schema) -> str:
    """A Spark DDL schema string for an Arrow schema (the subset of types the warehouse uses)."""
    return ", ".join(f"`{f.name}` {spark_type(f.type)}" for f in schema)


def spark_type(t: pa.DataType) -> str:
    """The Spark type name of an Arrow type (``timestamp`` for an aware timestamp, ``timestamp_ntz`` otherwise)."""
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_int8(t):
        return "tinyint"
    if pa.types.is_int16(t):
        return "smallint"
    if pa.types.is_int32(t):
        return "int"
    if pa.types.is_int64(t):
        return "bigint"
    if pa.types.is_float32(t):
        return "float"
    if pa.types.is_float64(t):
        return "double"
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "binary"
    if pa.types.is_date32(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "timestamp" if t.tz else "timestamp_ntz"
    raise DeltaLayerError(f"unsupported column type {t}")


def normalize_arrow_schema(schema: pa.Schema) -> pa.Schema:
    """Arrow schema as Delta stores it: plain strings, microsecond UTC timestamps."""
    fields = []
    for f in schema:
        t = f.type
        if pa.types.is_large_string(t) or pa.types.is_string_view(t):
            t = pa.string()
        elif pa.types.is_timestamp(t):
            t = pa.timestamp("us", tz="UTC") if t.tz else pa.timestamp("us")
        fields.append(pa.field(f.name, t, nullable=True))
    return pa.schema(fields)


# --- statistics --------------------------------------------------------------------------------------------


def _stat_json(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            return value.isoformat(timespec="microseconds")
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, bytes):
        return None
    return value


def parquet_file_stats(metadata: pq.FileMetaData) -> dict[str, Any]:
    """Delta ``stats`` (numRecords, minValues, maxValues, nullCount) from a parquet footer."""
    arrow_schema = metadata.schema.to_arrow_schema()
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for col_index, fld in enumerate(arrow_schema):
        if pa.types.is_nested(fld.type):
            continue
        lo = hi = None
        null_count = 0
        complete = True
        for rg in range(metadata.num_row_groups):
            column = metadata.row_group(rg).column(col_index)
            stats = column.statistics
            if stats is None or not stats.has_min_max:
                if column.num_values and (stats is None or stats.null_count != column.num_values):
                    complete = False
                if stats is not None and stats.has_null_count:
                    null_count += stats.null_count
                continue
            null_count += stats.null_count if stats.has_null_count else 0
            lo = stats.min if lo is None or stats.min < lo else lo
            hi = stats.max if hi is None or stats.max > hi else hi
        nulls[fld.name] = null_count
        if complete and lo is not None:
            aware = pa.types.is_timestamp(fld.type) and fld.type.tz
            if aware and isinstance(lo, datetime) and isinstance(hi, datetime) and lo.tzinfo is None:
                lo, hi = lo.replace(tzinfo=UTC), hi.replace(tzinfo=UTC)
            mins[fld.name], maxs[fld.name] = _stat_json(lo), _stat_json(hi)
    return {"numRecords": metadata.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}


# --- the store ---------------------------------------------------------------------------------------------


def normalize_root(root: str) -> str:
    """A lake root as an absolute URI-ish string: relative paths become absolute local paths."""
    if "://" in root:
        return root.rstrip("/")
    return str(Path(root).expanduser().resolve())


def _partition_dir(spec: PartitionSpec, partition_by: Sequence[str]) -> str:
    return "/".join(f"{col}={quote(str(spec[col]), safe='-_.')}" for col in partition_by)


def _partition_filters(specs: Sequence[PartitionSpec], partition_by: Sequence[str]) -> list[tuple[str, str, Any]]:
    """A conjunction selecting exactly the given partitions (single column IN, or one exact partition)."""
    if len(specs) == 1:
        return [(col, "=", str(specs[0][col])) for col in partition_by]
    if len(partition_by) == 1:
        col = partition_by[0]
        return [(col, "in", sorted({str(s[col]) for s in specs}))]
    raise DeltaLayerError(
        "overwriting several partitions at once needs a table partitioned by one column; "
        f"this one is partitioned by {list(partition_by)}"
    )


def _conjunction(specs: Sequence[PartitionSpec]) -> list[tuple[str, str, Any]] | None:
    """The partitions as one delta-rs filter (``=`` on the columns they share a value of, ``in`` on one that
    varies), or None when they do not fit one conjunction (the caller then filters rows itself)."""
    if not specs or any(set(s) != set(specs[0]) for s in specs):
        return None
    filters: list[tuple[str, str, Any]] = []
    for column in specs[0]:
        values = sorted({str(s[column]) for s in specs})
        filters.append((column, "=", values[0]) if len(values) == 1 else (column, "in", values))
    return filters if sum(op == "in" for _, op, _ in filters) <= 1 else None


def _sql_partition_predicate(alias: str, specs: Sequence[PartitionSpec], partition_by: Sequence[str]) -> str:
    """A SQL predicate on the target's partition columns matching exactly these partitions."""
    if len(partition_by) == 1:
        col = partition_by[0]
        values = sorted({str(s[col]) for s in specs})
        return f"{alias}.{col} IN ({', '.join(_sql_literal(v) for v in values)})"
    first, rest = partition_by[0], partition_by[1:]
    groups: dict[str, list[PartitionSpec]] = {}
    for s in specs:
        groups.setdefault(str(s[first]), []).append(s)
    terms = []
    for value, members in sorted(groups.items()):
        inner = _sql_partition_predicate(alias, members, rest)
        terms.append(f"({alias}.{first} = {_sql_literal(value)} AND {inner})")
    return "(" + " OR ".join(terms) + ")"


@dataclass
class DeltaStore:
    """Reads and writes the lake's Delta tables. Plain Python; :class:`DeltaLakeResource` configures it."""

    root: str
    storage_options: dict[str, str] = field(default_factory=dict)
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

    # paths -----------------------------------------------------------------------------------------------
    def table_uri(self, key: Sequence[str] | str) -> str:
        parts = [key] if isinstance(key, str) else list(key)
        for part in parts:
            if not part or "/" in part or part.startswith((".", "_")):
                raise DeltaLayerError(f"invalid table key part {part!r} in {parts}")
        return self.root + "/" + "/".join(parts)

    def _fs(self, uri: str) -> tuple[pafs.FileSystem, str]:
        if "://" not in uri:
            return pafs.LocalFileSystem(), uri
        return pafs.FileSystem.from_uri(uri)  # type: ignore[no-any-return]

    def table(self, key: Sequence[str] | str, version: int | None = None) -> DeltaTable | None:
        try:
            return DeltaTable(self.table_uri(key), version=version, storage_options=self.storage_options or None)
        except TableNotFoundError:
            return None

    def exists(self, key: Sequence[str] | str) -> bool:
        return DeltaTable.is_deltatable(self.table_uri(key), storage_options=self.storage_options or None)

    def version(self, key: Sequence[str] | str, at: int | None = None) -> int | None:
        """The table's current version (or ``at`` if that version is still readable), None without a table."""
        dt = self.table(key, at)
        return None if dt is None else int(dt.version())

    def arrow_schema(self, key: Sequence[str] | str) -> pa.Schema | None:
        dt = self.table(key)
        return None if dt is None else pa.schema(dt.schema().to_arrow())  # type: ignore[call-overload]

    # rows without Spark: the small tables the warehouse keeps about itself, a producer's table ---------------
    def read_rows(
        self,
        key: Sequence[str] | str,
        partitions: Sequence[PartitionSpec] | None = None,
        columns: Sequence[str] | None = None,
        version: int | None = None,
    ) -> tuple[pa.Table, ReadStats]:
        """The rows of ``partitions`` (all without), read by Arrow from the files the Delta log selects.

        The stats say how many files were read: partition pruning keeps a read of a few partitions the
        same size however many partitions the table has. An empty table (no rows) when it does not exist.
        """
        dt = self.table(key, version)
        if dt is None:
            return pa.table({}), ReadStats()
        # delta-rs selects the files by partition before Arrow sees them: a few partitions cost the same in a
        # table of any size. The Arrow filter then keeps exactly the wanted partitions.
        dataset = dt.to_pyarrow_dataset(file_pruning_predicate=_conjunction(partitions or []))
        where = None
        for spec in partitions or []:
            term = None
            for column, value in spec.items():
                equal = pc.field(column) == str(value)
                term = equal if term is None else term & equal
            where = term if where is None else where | term
        if partitions is not None and where is None:  # no partition wanted: nothing to read
            where = pc.scalar(False)
        fragments = list(dataset.get_fragments(filter=where))
        rows = dataset.to_table(columns=list(columns) if columns else None, filter=where)
        # files_in_table stays 0: counting them would cost what the pruning saves
        stats = ReadStats(0, len(fragments), len(fragments), version=int(dt.version()))
        return rows, stats

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
        reached theirs, so a re-run after a crash appends nothing twice. Creates the table on first use.
        """
        write_deltalake(
            self.table_uri(key),
            rows,
            mode="append",
            partition_by=list(partition_by),
            configuration=self.table_configuration(retention_hours),
            storage_options=self.storage_options or None,
            commit_properties=CommitProperties(
                custom_metadata={"warehouse.operation": operation},
                app_transactions=[Transaction(app_id, v) for app_id, v in (app_transactions or {}).items()],
            ),
        )
        return self._version(key)

    def app_versions(self, key: Sequence[str] | str, app_ids: Iterable[str]) -> dict[str, int]:
        """The last version committed for each app id (0 for none, or when the table does not exist)."""
        dt = self.table(key)
        return {app_id: (dt.transaction_version(app_id) if dt is not None else None) or 0 for app_id in app_ids}

    # file selection --------------------------------------------------------------------------------------
    def live_files(
        self,
        key: Sequence[str] | str,
        partitions: Sequence[PartitionSpec] | None = None,
        predicates: Sequence[Predicate] = (),
        version: int | None = None,
    ) -> tuple[list[dict[str, Any]], ReadStats]:
        """The table's live files in ``partitions`` whose statistics may match every predicate."""
        dt = self.table(key, version)
        if dt is None:
            raise DeltaLayerError(f"table {self.table_uri(key)} does not exist")
        actions, stats = self._select(dt, partitions)
        if predicates:
            actions = [
                a
                for a in actions
                if all(p.may_match(a.get(f"min.{p.column}"), a.get(f"max.{p.column}")) for p in predicates)
            ]
        stats.files_read = len(actions)
        stats.bytes_read = sum(int(a["size_bytes"]) for a in actions)
        return actions, stats

    @staticmethod
    def _select(dt: DeltaTable, partitions: Sequence[PartitionSpec] | None) -> tuple[list[dict[str, Any]], ReadStats]:
        """The live files of ``partitions`` (every live file without), by the partition values in the log."""
        actions = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
        stats = ReadStats(files_in_table=len(actions), version=dt.version())
        if partitions is not None:
            wanted = {tuple(sorted((k, str(v)) for k, v in p.items())) for p in partitions}
            cols = sorted({k for p in partitions for k in p})
            actions = [a for a in actions if tuple(sorted((c, a.get(f"partition.{c}")) for c in cols)) in wanted]
        stats.files_after_partition_pruning = stats.files_read = len(actions)
        stats.bytes_read = sum(int(a["size_bytes"]) for a in actions)
        return actions, stats

    # read ------------------------------------------------------------------------------------------------
    def read(
        self,
        spark: SparkSession,
        key: Sequence[str] | str,
        partitions: Sequence[PartitionSpec] | None = None,
        predicates: Sequence[Predicate] = (),
        version: int | None = None,
    ) -> tuple[DataFrame, ReadStats]:
        """A Spark DataFrame over the pruned live files; predicates are also applied to the rows."""
        uri = self.table_uri(key)
        dt = self.table(key, version)
        if dt is None:
            raise DeltaLayerError(f"table {uri} does not exist")
        schema = pa.schema(dt.schema().to_arrow())  # type: ignore[call-overload]
        actions, stats = self.live_files(key, partitions, predicates, version)
        ddl = spark_ddl(schema)
        if not actions:
            df = spark.createDataFrame([], ddl)
        else:
            paths = [uri + "/" + unquote(a["path"]) for a in actions]
            df = spark.read.schema(ddl).option("basePath", uri).parquet(*paths)
            df = df.select(*[f"`{f.name}`" for f in schema])
        for p in predicates:
            df = df.where(p.spark_sql())
        return df, stats

    # overwrite -------------------------------------------------------------------------------------------
    def overwrite(
        self,
        key: Sequence[str] | str,
        df: DataFrame,
        partition_by: Sequence[str],
        partitions: Sequence[PartitionSpec],
        *,
        description: str | None = None,
        configuration: Mapping[str, str | None] | None = None,
        read_version: int | None = None,
        operation: str = "overwrite",
    ) -> WriteResult:
        """Replace exactly ``partitions`` with the rows of ``df`` that belong to them, atomically.

        Spark writes each partition's parquet files into ``<table>/<partition dir>/w-<uuid>/``; one delta-rs
        transaction adds them and removes every file previously live in those partitions.

        ``read_version`` makes this a rewrite of what ``df`` read at that version (Z-order, compaction): the
        files are added with ``dataChange=false``, the commit is checked against that version, and a
        concurrent change to the partitions fails the rewrite instead of being replaced by stale rows.
        """
        started = time.monotonic()
        if not partitions:
            raise DeltaLayerError("overwrite needs at least one target partition")
        missing = [c for c in partition_by if c not in df.columns]
        if missing:
            raise DeltaLayerError(f"the DataFrame lacks partition column(s) {missing} for {self.table_uri(key)}")
        for spec in partitions:
            if set(spec) != set(partition_by):
                raise DeltaLayerError(f"partition {dict(spec)} does not match partition columns {list(partition_by)}")
        uri = self.table_uri(key)
        data_columns = [c for c in df.columns if c not in partition_by]
        write_id = f"w-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:12]}"
        adds: list[AddAction] = []
        arrow_schema: pa.Schema | None = None
        source = df.persist() if len(partitions) > 1 else df
        try:
            for spec in partitions:
                rel_dir = f"{_partition_dir(spec, partition_by)}/{write_id}"
                cond = " AND ".join(f"`{c}` = {_sql_literal(str(spec[c]))}" for c in partition_by)
                part_df = source.where(cond).select(*[f"`{c}`" for c in data_columns])
                part_df.write.mode("error").parquet(f"{uri}/{rel_dir}")
                file_adds, file_schema = self._collect_written(uri, rel_dir, spec)
                adds.extend(file_adds)
                arrow_schema = arrow_schema or file_schema
        finally:
            if source is not df:
                source.unpersist()
        if arrow_schema is None:
            arrow_schema = _arrow_schema_of(df, data_columns)
        table_schema = normalize_arrow_schema(
            pa.schema(list(arrow_schema) + [pa.field(c, pa.string()) for c in partition_by])
        )
        commit = CommitProperties(custom_metadata={"warehouse.operation": operation, "warehouse.write_id": write_id})
        if read_version is not None:
            for add in adds:
                add.data_change = False
        dt = self.table(key, read_version)
        if dt is None:
            removed = 0
            create_table_with_add_actions(
                uri,
                Schema.from_arrow(table_schema),
                adds,
                mode="error",
                partition_by=list(partition_by),
                description=description,
                configuration={**self.table_configuration(), **(configuration or {})},
                storage_options=self.storage_options or None,
                commit_properties=commit,
            )
        else:
            actions: list[AddAction | RemoveAction] = [*adds]
            for attempt in range(1, COMMIT_ATTEMPTS + 1):
                removed = self.live_files(key, partitions)[1].files_read
                try:
                    dt.create_write_transaction(
                        actions,
                        mode="overwrite",
                        schema=Schema.from_arrow(table_schema),
                        partition_by=list(partition_by),
                        partition_filters=_partition_filters(partitions, partition_by),
                        commit_properties=commit,
                    )
                    break
                except CommitFailedError as exc:
                    if read_version is not None:
                        raise DeltaLayerError(
                            f"{uri}: {[dict(p) for p in partitions]} changed after version {read_version}, which "
                            f"this {operation} read; nothing was replaced (run it again on the new version): {exc}"
                        ) from exc
                    # Another writer replaced the same partition first. Our files are complete, so the
                    # replacement is re-applied on top of the new version (last writer wins, nothing mixed).
                    if attempt == COMMIT_ATTEMPTS:
                        raise DeltaLayerError(
                            f"{uri}: concurrent writers kept conflicting on {[dict(p) for p in partitions]} "
                            f"after {attempt} attempts: {exc}"
                        ) from exc
                    log.warning("%s: commit conflict (%s), retrying on the new version (%d)", uri, exc, attempt)
                    dt = self.table(key) or dt
        version = self._version(key)
        return WriteResult(
            table=uri,
            version=version,
            rows=sum(json.loads(a.stats)["numRecords"] for a in adds),
            files_added=len(adds),
            files_removed=removed,
            bytes_added=sum(a.size for a in adds),
            partitions=[dict(p) for p in partitions],
            duration_s=time.monotonic() - started,
        )

    def _collect_written(self, uri: str, rel_dir: str, spec: PartitionSpec) -> tuple[list[AddAction], pa.Schema | None]:
        fs, base = self._fs(f"{uri}/{rel_dir}")
        infos = fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
        adds: list[AddAction] = []
        schema: pa.Schema | None = None
        for info in sorted(infos, key=lambda i: i.path):
            name = info.path.rsplit("/", 1)[-1]
            if info.type != pafs.FileType.File or not name.endswith(".parquet") or name.startswith(("_", ".")):
                continue
            with fs.open_input_file(info.path) as handle:
                meta = pq.read_metadata(handle)
            schema = schema or meta.schema.to_arrow_schema()
            if meta.num_rows == 0:
                continue  # Spark writes a schema-only file for an empty partition; nothing to add
            adds.append(
                AddAction(
                    path=f"{rel_dir}/{quote(name, safe='-_.')}",
                    size=int(info.size or 0),
                    partition_values={k: str(v) for k, v in spec.items()},
                    modification_time=int((info.mtime_ns or time.time_ns()) // 1_000_000),
                    data_change=True,
                    stats=json.dumps(parquet_file_stats(meta)),
                )
            )
        return adds, schema

    def _version(self, key: Sequence[str] | str) -> int:
        dt = self.table(key)
        if dt is None:
            raise DeltaLayerError(f"table {self.table_uri(key)} vanished after a commit")
        return int(dt.version())

    # merge -----------------------------------------------------------------------------------------------
    def merge(
        self,
        key: Sequence[str] | str,
        batch: pa.Table,
        *,
        primary_key: Sequence[str],
        partition_by: Sequence[str],
        order_by: Sequence[str] = ("_es", "_pos"),
        op_column: str = "_op",
        app_transactions: Mapping[str, int] | None = None,
        prune: bool = True,
        tombstone_column: str | None = None,
        merge_schema: bool = False,
        moved_out: pa.Table | None = None,
    ) -> MergeResult:
        """Merge a change batch by primary key; the newest change (by ``order_by``) wins.

        ``batch`` holds at most one row per key (the caller deduplicates) with ``op_column`` = INSERT /
        UPDATE / DELETE. Rows of ``op_column`` are not stored. With ``prune`` the merge predicate names the
        batch's partition values, so delta-rs scans only those partitions (seed 001's DPP).
        ``app_transactions`` (app id → version) are committed in the same transaction: the ingestion
        position is stored atomically with the data it describes — also when the batch changes no row.

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
        dt = self.table(key)
        if dt is None:
            schema = normalize_arrow_schema(batch.select(target_columns).schema)
            dt = self.create_table(key, schema, partition_by)
        moved = 0
        if moved_out is not None and moved_out.num_rows:
            moved = moved_out.num_rows
            leave = _with_column(moved_out, op_column, pa.array(["DELETE"] * moved, pa.string()))
            if tombstone_column is not None:
                leave = _with_column(leave, tombstone_column, pa.array([True] * moved, pa.bool_()))
            # the left partitions join the batch's: the predicate below then prunes to both, no more
            batch = pa.concat_tables([batch, leave.select(batch.schema.names).cast(batch.schema)])
        specs = batch_partitions(batch, partition_by)
        conditions = [f"t.`{c}` = s.`{c}`" for c in [*partition_by, *primary_key]]
        if prune and specs:
            conditions.insert(0, _sql_partition_predicate("t", specs, partition_by))
        newer = _newer_predicate(order_by)
        commit = CommitProperties(
            custom_metadata={"warehouse.operation": "merge"},
            app_transactions=[Transaction(app_id, version) for app_id, version in (app_transactions or {}).items()],
        )
        version_before = dt.version()
        merger = dt.merge(
            batch,
            predicate=" AND ".join(conditions),
            source_alias="s",
            target_alias="t",
            merge_schema=merge_schema,
            commit_properties=commit,
        )
        assignments = {f"`{c}`": f"s.`{c}`" for c in target_columns}
        if tombstone_column is not None:
            merger = merger.when_matched_update(updates=assignments, predicate=newer).when_not_matched_insert(
                updates=assignments
            )
        else:
            merger = (
                merger.when_matched_delete(predicate=f"s.{op_column} = 'DELETE' AND {newer}")
                .when_matched_update(updates=assignments, predicate=f"s.{op_column} <> 'DELETE' AND {newer}")
                .when_not_matched_insert(updates=assignments, predicate=f"s.{op_column} <> 'DELETE'")
            )
        metrics = merger.execute()
        dt.update_incremental()
        if dt.version() == version_before and app_transactions:
            # delta-rs writes no commit for a merge that changed nothing: record the position anyway
            self.commit_app_transactions(key, app_transactions)
        return MergeResult(
            table=uri,
            version=int(dt.version()) if dt.version() != version_before else self._version(key),
            metrics=dict(metrics),
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

    def app_version(self, key: Sequence[str] | str, app_id: str) -> int | None:
        """The last version committed for ``app_id`` (e.g. an ingestion position), or None."""
        dt = self.table(key)
        return None if dt is None else dt.transaction_version(app_id)

    # maintenance -----------------------------------------------------------------------------------------
    def optimize(
        self,
        key: Sequence[str] | str,
        partitions: Sequence[PartitionSpec] | None = None,
        zorder_by: Sequence[str] = (),
        target_size: int | None = None,
        spark: SparkSession | None = None,
    ) -> dict[str, Any]:
        """Compact (or Z-order) the given partitions; returns the metrics plus the duration.

        With ``spark`` and Z-order columns of numeric, date or timestamp type, the rewrite is
        :meth:`zorder` (Spark sorts along a true Morton curve). Otherwise delta-rs's optimize does it; its
        Z-order key (1.6) takes the bits of each byte least-significant first, which scatters neighbouring
        values and skips fewer files.
        """
        dt = self.table(key)
        if dt is None:
            raise DeltaLayerError(f"table {self.table_uri(key)} does not exist")
        filters = None
        if partitions:
            if len(partitions) != 1:
                raise DeltaLayerError("optimize one partition at a time")
            if zorder_by and spark is not None and _morton_columns(dt, zorder_by):
                return self.zorder(spark, key, partitions[0], zorder_by, target_size)
            filters = [(c, "=", str(v)) for c, v in partitions[0].items()]
        started = time.monotonic()
        if zorder_by:
            metrics = dt.optimize.z_order(list(zorder_by), partition_filters=filters, target_size=target_size)
        else:
            metrics = dt.optimize.compact(partition_filters=filters, target_size=target_size)
        result = dict(metrics)
        result["duration_s"] = time.monotonic() - started
        result["delta_version"] = self._version(key)
        return result

    def zorder(
        self,
        spark: SparkSession,
        key: Sequence[str] | str,
        partition: PartitionSpec,
        columns: Sequence[str],
        target_size: int | None = None,
    ) -> dict[str, Any]:
        """Rewrite one partition's files in Z-order of ``columns``, so each file covers a small box of them.

        Each column is scaled linearly onto ``bits`` bits between its min and max in the partition, the
        bits are interleaved most-significant first (a Morton key), Spark range-partitions the rows on the
        key into files of about ``target_size`` bytes and sorts within each. The files replace the
        partition in one commit checked against the version read (``dataChange=false``).
        """
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        if not columns:
            raise DeltaLayerError("Z-order needs at least one column")
        dt = self.table(key)
        if dt is None:
            raise DeltaLayerError(f"table {self.table_uri(key)} does not exist")
        started = time.monotonic()
        version = int(dt.version())
        partition_by = list(dt.metadata().partition_columns)
        actions, stats = self.live_files(key, [partition], version=version)
        result: dict[str, Any] = {"numFilesAdded": 0, "numFilesRemoved": 0, "delta_version": version}
        if not actions:
            return {**result, "duration_s": time.monotonic() - started}
        df, _ = self.read(spark, key, [partition], version=version)
        types = {f.name: f.dataType for f in df.schema.fields}
        values = []
        for column in columns:
            ctype = types.get(column)
            if isinstance(ctype, T.NumericType):
                values.append(F.col(f"`{column}`").cast("double"))
            elif isinstance(ctype, T.DateType):
                values.append(F.unix_date(F.col(f"`{column}`")).cast("double"))
            elif isinstance(ctype, T.TimestampType | T.TimestampNTZType):
                values.append(F.unix_micros(F.col(f"`{column}`")).cast("double"))
            else:
                raise DeltaLayerError(
                    f"{self.table_uri(key)}: Z-order column {column!r} is {ctype or 'missing'}; "
                    "Z-order needs numeric, date or timestamp columns"
                )
        bounds = _numeric_bounds(actions, columns)  # from the files' statistics: no pass over the data
        if bounds is None:
            bounds = list(df.agg(*[agg(v) for v in values for agg in (F.min, F.max)]).first() or [])
        bits = min(16, 62 // len(columns))
        top = float((1 << bits) - 1)
        scaled = []
        for i, value in enumerate(values):
            lo, hi = bounds[2 * i], bounds[2 * i + 1]
            span = (hi - lo) if lo is not None and hi is not None and hi > lo else None
            scaled.append(F.lit(0) if span is None else F.coalesce(((value - lo) / span * top).cast("long"), F.lit(0)))
        k = len(scaled)
        terms = [
            F.shiftleft(F.shiftright(s, bit).bitwiseAND(F.lit(1)), bit * k + (k - 1 - j))
            for bit in range(bits)
            for j, s in enumerate(scaled)
        ]
        zkey = terms[0]
        for term in terms[1:]:
            zkey = zkey.bitwiseOR(term)
        target = target_size or 256 * 1024 * 1024
        files = max(1, math.ceil(stats.bytes_read / target))
        ordered = (
            df.withColumn("__zorder_key", zkey)
            .repartitionByRange(files, "__zorder_key")
            .sortWithinPartitions("__zorder_key")
            .drop("__zorder_key")
        )
        written = self.overwrite(key, ordered, partition_by, [partition], read_version=version, operation="zorder")
        return {
            **result,
            "numFilesAdded": written.files_added,
            "numFilesRemoved": written.files_removed,
            "delta_version": written.version,
            "rows": written.rows,
            "zorder_bits": bits,
            "duration_s": time.monotonic() - started,
        }

    def maintain(
        self, key: Sequence[str] | str, retention_hours: int | None = None, compact: bool = False
    ) -> dict[str, Any]:
        """Keep storage bounded while the time-travel window stays readable.

        With ``compact``, first bin-packs each partition's small files into few (a table appended to in
        small commits, like the ops tables). Then vacuums data files removed longer than ``retention_hours``
        ago (default: the store's window), writes a checkpoint of the log and drops log entries older than
        the table's log retention.
        """
        dt = self.table(key)
        if dt is None:
            raise DeltaLayerError(f"table {self.table_uri(key)} does not exist")
        hours = self.time_travel_hours if retention_hours is None else retention_hours
        started = time.monotonic()
        compacted = dict(dt.optimize.compact()) if compact else {}
        vacuumed = dt.vacuum(retention_hours=hours, dry_run=False, enforce_retention_duration=False)
        dt.create_checkpoint()
        logs_before = self._log_entries(key)
        dt.cleanup_metadata()
        return {
            "files_compacted": int(compacted.get("numFilesRemoved", 0)),
            "files_vacuumed": len(vacuumed),
            "log_files_removed": logs_before - self._log_entries(key),
            "delta_version": dt.version(),
            "retention_hours": hours,
            "duration_s": round(time.monotonic() - started, 3),
        }

    def _log_entries(self, key: Sequence[str] | str) -> int:
        fs, base = self._fs(self.table_uri(key) + "/_delta_log")
        infos = fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
        return sum(1 for i in infos if i.path.endswith(".json"))

    def history(self, key: Sequence[str] | str, limit: int | None = None) -> list[dict[str, Any]]:
        dt = self.table(key)
        return [] if dt is None else list(dt.history(limit))

    def partitions_present(self, key: Sequence[str] | str) -> list[dict[str, str]]:
        dt = self.table(key)
        if dt is None:
            return []
        return [{k: str(v) for k, v in p.items()} for p in dt.partitions()]


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


def _numeric_bounds(actions: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> list[Any] | None:
    """[min, max] of each column over the files' statistics, when every file has numeric statistics."""
    bounds: list[Any] = []
    for column in columns:
        lows: list[Any] = [a.get(f"min.{column}") for a in actions]
        highs: list[Any] = [a.get(f"max.{column}") for a in actions]
        values = [*lows, *highs]
        if not all(isinstance(v, int | float | Decimal) and not isinstance(v, bool) for v in values):
            return None
        bounds += [float(min(lows)), float(max(highs))]
    return bounds


def _morton_columns(dt: DeltaTable, columns: Sequence[str]) -> bool:
    """Whether every Z-order column has a type :meth:`DeltaStore.zorder` scales onto its key."""
    schema = pa.schema(dt.schema().to_arrow())  # type: ignore[call-overload]
    types = {f.name: f.type for f in schema}
    checks = (pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal, pa.types.is_date, pa.types.is_timestamp)
    return all(c in types and any(check(types[c]) for check in checks) for c in columns)


def _newer_predicate(order_by: Sequence[str]) -> str:
    """``(s.a, s.b) >= (t.a, t.b)`` in SQL that delta-rs understands (ties apply: replays are idempotent)."""
    terms = []
    for i, col in enumerate(order_by):
        equal = [f"s.`{c}` = t.`{c}`" for c in order_by[:i]]
        op = ">=" if i == len(order_by) - 1 else ">"
        terms.append("(" + " AND ".join([*equal, f"s.`{col}` {op} t.`{col}`"]) + ")")
    return "(" + " OR ".join(terms) + ")"


def _arrow_schema_of(df: DataFrame, columns: Iterable[str]) -> pa.Schema:
    """Arrow schema for the given DataFrame columns (used when a write produced no file at all)."""
    wanted = list(columns)
    table = df.select(*[f"`{c}`" for c in wanted]).limit(0).toArrow()
    return table.schema


# Where each object store's credentials come from: the variables its own SDKs read (dagster-deltalake's fields).
_STORAGE_ENV: dict[str, dict[str, str]] = {
    "s3": {
        "access_key_id": "AWS_ACCESS_KEY_ID",
        "secret_access_key": "AWS_SECRET_ACCESS_KEY",
        "token": "AWS_SESSION_TOKEN",
        "region": "AWS_REGION",
        "endpoint": "AWS_ENDPOINT_URL",
    },
    "gcs": {
        "service_account": "GOOGLE_SERVICE_ACCOUNT",
        "service_account_key": "GOOGLE_SERVICE_ACCOUNT_KEY",
        "application_credentials": "GOOGLE_APPLICATION_CREDENTIALS",
    },
    "azure": {
        "account_name": "AZURE_STORAGE_ACCOUNT_NAME",
        "account_key": "AZURE_STORAGE_ACCOUNT_KEY",
        "sas_key": "AZURE_STORAGE_SAS_KEY",
        "client_id": "AZURE_CLIENT_ID",
        "client_secret": "AZURE_CLIENT_SECRET",
        "tenant_id": "AZURE_TENANT_ID",
    },
}
_SCHEMES = {"s3": "s3", "s3a": "s3", "gs": "gcs", "az": "azure", "abfs": "azure", "abfss": "azure"}


def storage_config(root: str, env: Mapping[str, str] | None = None) -> LocalConfig | S3Config | GcsConfig | AzureConfig:
    """dagster-deltalake's storage configuration for a lake root: local for a path, else the object store of
    the URI's scheme with its credentials from the environment (unset ones left to the store's own chain)."""
    env = os.environ if env is None else env
    scheme = urlparse(root).scheme if "://" in root else "file"
    provider = _SCHEMES.get(scheme)
    if provider is None:
        if scheme != "file":
            raise DeltaLayerError(
                f"lake root {root!r}: unsupported scheme {scheme!r} (a path, s3://, gs:// or abfss://)"
            )
        return LocalConfig()
    values = {field_: env[var] for field_, var in _STORAGE_ENV[provider].items() if env.get(var)}
    config_class = {"s3": S3Config, "gcs": GcsConfig, "azure": AzureConfig}[provider]
    return config_class(**values)  # type: ignore[no-any-return]


def storage_options(root: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The delta-rs storage options of a lake root (see :func:`storage_config`)."""
    config = storage_config(root, env).model_dump(exclude={"provider"})  # the discriminator is no store option
    options = {name: str(value) for name, value in config.items() if value is not None}
    return options if "://" in root else {}


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


def local_uri_path(uri: str) -> Path:
    """The local path of a ``file://`` or plain-path URI."""
    parsed = urlparse(uri)
    return Path(parsed.path if parsed.scheme == "file" else uri)
