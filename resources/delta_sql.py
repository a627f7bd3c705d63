"""What the Delta lake layer's Spark writes share: their results (:class:`WriteResult`, :class:`MergeResult`), the
row conditions they read with (:class:`Predicate`), the SQL that names partitions, and how a failed Spark Delta
command is told (:func:`spark_errors`) and retried after another writer's commit (:func:`is_conflict`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import TYPE_CHECKING, Any

from resources.delta_read import PartitionSpec
from resources.storage import DeltaLayerError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

COMMIT_ATTEMPTS = 4  # a commit that lost a race to another writer is written again, on the new version


# --- results -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionWritten:
    """One partition of an overwrite: the rows and files it holds at the overwrite's commit (all of them new, the
    overwrite replaced the partition whole)."""

    rows: int
    files: int
    bytes: int
    # its live files at the commit (the log's add actions, with ``live_records``), where the write read them to count
    # its rows (a key-scoped write's): its checks take them from here rather than reading the log again
    live_files: tuple[dict[str, Any], ...] | None = field(default=None, compare=False, repr=False)


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
    # per partition of ``partitions`` (same order): its rows and files as the commit left them
    by_partition: list[PartitionWritten] = field(default_factory=list)
    # a key-scoped write (``replace_keys``): the keys whose rows it replaced, and the rows it deleted
    keys_replaced: int | None = None
    rows_deleted: int = 0

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
        meta: dict[str, Any] = {
            "source_rows": m.get("num_source_rows", 0),  # the batch's changes + moved_out
            "rows_moved_out": self.moved_out,
            "rows_inserted": m.get("num_target_rows_inserted", 0),
            "rows_updated": m.get("num_target_rows_updated", 0),
            "rows_deleted": m.get("num_target_rows_deleted", 0),
            "files_added": m.get("num_target_files_added", 0),
            "files_removed": m.get("num_target_files_removed", 0),
            "partitions_touched": len(self.partitions),
            "rows_copied": m.get("num_target_rows_copied", 0),
            # rows marked replaced or deleted in place (tables with deletion vectors) instead of rewritten
            "deletion_vectors_added": m.get("num_target_deletion_vectors_added", 0),
            "delta_version": self.version,
            "merge_seconds": round(self.duration_s, 3),
            # reported by Delta's MERGE, absent when the engine does not expose them (never inferred)
            **{
                name: m[f"num_target_{name}"]
                for name in ("files_in_table", "files_scanned", "partitions_scanned")
                if f"num_target_{name}" in m
            },
        }
        if "files_in_table" in meta and "files_scanned" in meta:
            meta["files_skipped"] = meta["files_in_table"] - meta["files_scanned"]
        return meta


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
            return f"`{self.column}` IN ({', '.join(sql_literal(v) for v in self.value)})"
        return f"`{self.column}` {self.op} {sql_literal(self.value)}"


def sql_literal(value: Any) -> str:
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, datetime):
        return f"TIMESTAMP '{value.isoformat(sep=' ')}'"
    if isinstance(value, date):
        return f"DATE '{value.isoformat()}'"
    if value is None:
        return "NULL"
    return str(value)


# --- Spark SQL -------------------------------------------------------------------------------------------------


def partition_columns(specs: Sequence[PartitionSpec]) -> list[str]:
    return list(specs[0]) if specs else []


def sql_partition_predicate(alias: str | None, specs: Sequence[PartitionSpec], partition_by: Sequence[str]) -> str:
    """A SQL predicate on the partition columns matching exactly these partitions ("" for none)."""
    if not specs:
        return ""
    prefix = f"{alias}." if alias else ""
    if len(partition_by) == 1:
        col = partition_by[0]
        values = sorted({str(s[col]) for s in specs})
        return f"{prefix}`{col}` IN ({', '.join(sql_literal(v) for v in values)})"
    first, rest = partition_by[0], partition_by[1:]
    groups: dict[str, list[PartitionSpec]] = {}
    for s in specs:
        groups.setdefault(str(s[first]), []).append(s)
    terms = []
    for value, members in sorted(groups.items()):
        inner = sql_partition_predicate(alias, members, rest)
        terms.append(f"({prefix}`{first}` = {sql_literal(value)} AND {inner})")
    return "(" + " OR ".join(terms) + ")"


def spark_string(value: str) -> str:
    """A string literal of Spark SQL, which reads backslash escapes (and joins adjacent literals: ``''`` is no
    quote)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def create_table_sql(
    path: str,
    schema: str,
    partition_by: Sequence[str],
    properties: Mapping[str, str | None],
    description: str | None = None,
) -> str:
    """``CREATE TABLE IF NOT EXISTS`` of a Delta table at ``path`` (``schema``: Spark DDL columns) with its table
    properties, in one commit: Spark derives the protocol from the properties as it does for any table it creates."""
    partitions = f" PARTITIONED BY ({', '.join(f'`{c}`' for c in partition_by)})" if partition_by else ""
    comment = f" COMMENT {spark_string(description)}" if description else ""
    listed = ", ".join(f"{spark_string(k)} = {spark_string(v)}" for k, v in properties.items() if v is not None)
    return (
        f"CREATE TABLE IF NOT EXISTS delta.`{path}` ({schema}) USING DELTA{partitions}{comment} "
        f"TBLPROPERTIES ({listed})"
    )


def merge_clauses(
    target_columns: Sequence[str], order_by: Sequence[str], op_column: str, tombstone_column: str | None
) -> str:
    """The MERGE's WHEN clauses: a newer change updates (or deletes) its key's row, a new key's row is inserted; with
    ``tombstone_column`` a DELETE is an update that flags the row."""
    newer = newer_predicate(order_by)
    # unqualified targets: with schema evolution a column new to the table is assigned by its name
    updates = ", ".join(f"`{c}` = s.`{c}`" for c in target_columns)
    names = ", ".join(f"`{c}`" for c in target_columns)
    inserts = f"({names}) VALUES ({', '.join(f's.`{c}`' for c in target_columns)})"
    if tombstone_column is not None:
        return f"WHEN MATCHED AND {newer} THEN UPDATE SET {updates} WHEN NOT MATCHED THEN INSERT {inserts}"
    return (
        f"WHEN MATCHED AND s.`{op_column}` = 'DELETE' AND {newer} THEN DELETE "
        f"WHEN MATCHED AND s.`{op_column}` <> 'DELETE' AND {newer} THEN UPDATE SET {updates} "
        f"WHEN NOT MATCHED AND s.`{op_column}` <> 'DELETE' THEN INSERT {inserts}"
    )


def newer_predicate(order_by: Sequence[str]) -> str:
    """``(s.a, s.b) >= (t.a, t.b)`` in SQL that delta-rs understands (ties apply: replays are idempotent)."""
    terms = []
    for i, col in enumerate(order_by):
        equal = [f"s.`{c}` = t.`{c}`" for c in order_by[:i]]
        op = ">=" if i == len(order_by) - 1 else ">"
        terms.append("(" + " AND ".join([*equal, f"s.`{col}` {op} t.`{col}`"]) + ")")
    return "(" + " OR ".join(terms) + ")"


def snake(name: str) -> str:
    """``numTargetRowsInserted`` → ``num_target_rows_inserted``: Delta's metric names as the results spell them."""
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")


CONFLICTS = ("CONCURRENT", "METADATA_CHANGED", "PROTOCOL_CHANGED", "METADATACHANGED", "PROTOCOLCHANGED")


def is_conflict(exc: BaseException) -> bool:
    """Whether Delta refused a commit because another writer committed first (it can be written again).

    The whole chain is read: over Spark Connect the first error is gRPC's, whose text may not carry Delta's error
    class, which the PySpark error that follows it does."""
    texts: list[str] = []
    chain: list[BaseException | None] = [exc]
    seen: set[int] = set()
    while chain:
        error = chain.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        texts.append(str(error).upper())
        chain += [error.__cause__, error.__context__]
    return any(marker in text for text in texts for marker in CONFLICTS)


def root_message(exc: BaseException) -> str:
    """The first error of the chain: PySpark fails to render Delta's own error classes and raises a second
    error about that, whose message hides the real one."""
    first: BaseException = exc
    while first.__context__ is not None and first.__context__ is not first:
        first = first.__context__
    java = getattr(first, "java_exception", None)
    if java is not None:
        try:
            return str(java.toString())
        except Exception:  # noqa: BLE001 - the gateway itself may be gone
            pass
    return str(first).strip().splitlines()[0] if str(first).strip() else repr(first)


@contextmanager
def spark_errors(uri: str, operation: str) -> Iterator[None]:
    """A failed Spark Delta operation as a :class:`DeltaLayerError` naming the table and Delta's reason."""
    try:
        yield
    except DeltaLayerError:
        raise
    except Exception as exc:
        raise DeltaLayerError(f"{uri}: {operation} failed: {root_message(exc)}") from exc


# SQL commands take their app transaction and user metadata from session settings, which the threads of a
# process share with its one session: one such command at a time per process (each process, each run, has a
# session of its own, also on a shared Spark Connect server)
SESSION_CONF_COMMAND = threading.Lock()


@contextmanager
def session_confs(spark: SparkSession, confs: Mapping[str, str]) -> Iterator[None]:
    """Session settings for one Delta command (its app transaction, its commit's user metadata)."""
    with SESSION_CONF_COMMAND:
        for name, value in confs.items():
            spark.conf.set(name, value)
        try:
            yield
        finally:
            for name in confs:
                spark.conf.unset(name)
