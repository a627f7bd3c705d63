"""Partition-exact replication of a Delta table to a second lake (a site), with delta-rs, without a JVM.

One call publishes one partition of one source version: the partition's live files at that version are read from
the source's Delta log, the ones the replica does not hold yet are copied byte for byte (in practice the add actions
of the commit that built the partition), the replica's files of the partition that the source no longer lists are
removed, and all of it is one Delta commit on the replica (delta-rs's ``create_write_transaction``). A file whose
rows a deletion vector marks deleted is written again without those rows: delta-rs's add actions carry no
deletion-vector descriptor, so the replica holds the rows a reader of the source sees, in a plain file. The commit
records the source version in an application transaction per partition, so a replication of an older version than
the one published is skipped, and a re-run of the same one commits nothing.

Then it verifies: each published file's size in storage against the add action, the partition's rows by the
replica's log and by a DataFusion count against the source commit's statistics (rows marked deleted subtracted).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from dagster import ConfigurableResource
from deltalake import CommitProperties, DeltaTable, QueryBuilder
from deltalake.exceptions import DeltaError
from deltalake.transaction import AddAction, RemoveAction, Transaction, create_table_with_add_actions
from pydantic import Field

from resources.delta_lake import DeltaStore
from resources.delta_read import DeltaReader, PartitionSpec, arrow_table
from resources.storage import DeltaLayerError, filesystem, normalize_root, storage_options

# the application id prefix of the per-partition source versions a replica records
APP_PREFIX = "warehouse.replica"
COMMIT_RETRIES = 5


class ReplicationError(DeltaLayerError):
    """A replication could not publish or verify a partition; the message names the table, partition and why."""


@dataclass(frozen=True)
class Replicated:
    """What one replication published: the replica's commit (None when it already held that source version)."""

    source: str  # the source table's URI
    replica: str  # the replica table's URI
    partition: dict[str, str]
    source_version: int
    source_committed_at: float | None  # the source commit's time (epoch seconds), from its log entry
    replica_version: int | None  # the commit this call made; None: nothing to publish
    published_at: float
    files_copied: int = 0
    files_rewritten: int = 0  # written again without the rows their deletion vector marks deleted
    files_removed: int = 0
    files: int = 0  # the partition's files on the replica afterwards
    rows: int = 0  # its rows, verified
    bytes_copied: int = 0
    copied_paths: tuple[str, ...] = field(default=())

    @property
    def lag_s(self) -> float | None:
        """Source commit -> replica published, in seconds."""
        return None if self.source_committed_at is None else self.published_at - self.source_committed_at


def app_id(partition: PartitionSpec) -> str:
    """The replica's application id of one partition: it records the source version last published there."""
    return APP_PREFIX + ":" + ",".join(f"{c}={partition[c]}" for c in sorted(partition))


def replicate_partition(
    source: DeltaReader,
    replica: DeltaReader,
    key: Sequence[str],
    partition: PartitionSpec,
    version: int | None = None,
) -> Replicated:
    """Publish ``partition`` of the source table ``key`` as it is at ``version`` (default: the current one) to the
    same key under the replica's root, in one commit, and verify it. ReplicationError when it cannot."""
    source_uri, replica_uri = source.table_uri(key), replica.table_uri(key)
    partition = {str(c): str(v) for c, v in partition.items()}
    where = f"{source_uri} {_spelled(partition)}"
    src = source.table(key, version)
    if src is None:
        raise ReplicationError(f"{where}: the source table (version {version}) does not exist")
    columns = list(src.metadata().partition_columns)
    if sorted(columns) != sorted(partition):
        raise ReplicationError(f"{where}: the table is partitioned by {columns}, not by {sorted(partition)}")
    at = int(src.version())
    wanted = _live_files(src, partition)
    dst = replica.table(key)
    published_version = None if dst is None else dst.transaction_version(app_id(partition))
    if published_version is not None and published_version >= at:
        return Replicated(source_uri, replica_uri, partition, at, commit_time(source_uri, at), None, time.time())
    if dst is not None and dst.schema().to_arrow() != src.schema().to_arrow():
        raise ReplicationError(f"{where}: the replica's schema differs from the source's at version {at}")
    held = {} if dst is None else {f["path"]: f for f in _live_files(dst, partition)}
    adds, copied, rewritten = [], [], 0
    for file in wanted:
        target = file["path"] if not file["deleted"] else _rewritten_path(file)
        if target in held and held[target]["size_bytes"] == file["size_bytes"] or (file["deleted"] and target in held):
            continue
        if file["deleted"]:
            adds.append(_rewrite(src, source_uri, replica_uri, file, target))
            rewritten += 1
        else:
            adds.append(_copy(source_uri, replica_uri, file))
            copied.append(target)
    targets = {f["path"] if not f["deleted"] else _rewritten_path(f) for f in wanted}
    now_ms = int(time.time() * 1000)
    removes = [
        RemoveAction(path, True, now_ms, int(f["size_bytes"]), dict(partition))
        for path, f in held.items()
        if path not in targets
    ]
    properties = CommitProperties(
        custom_metadata={
            "warehouse.operation": "replicate",
            "warehouse.source": source_uri,
            "warehouse.source_version": at,
        },
        max_commit_retries=COMMIT_RETRIES,
        app_transactions=[Transaction(app_id(partition), at, now_ms)],
    )
    if dst is None:
        try:
            create_table_with_add_actions(
                replica_uri,
                src.schema(),
                adds,
                mode="error",
                partition_by=columns,
                storage_options=replica.storage_options or None,
                commit_properties=properties,
            )
        except DeltaError:
            if not replica.exists(key):
                raise
            # another partition's replication created the table first: publish on it
            return replicate_partition(source, replica, key, partition, at)
    else:
        dst.create_write_transaction(
            [*adds, *removes], "append", dst.schema(), partition_by=columns, commit_properties=properties
        )
    published = replica.table(key)
    assert published is not None
    files, rows = _verify(published, replica_uri, partition, wanted, adds, where)
    return Replicated(
        source_uri,
        replica_uri,
        partition,
        at,
        commit_time(source_uri, at),
        int(published.version()),
        time.time(),
        files_copied=len(copied),
        files_rewritten=rewritten,
        files_removed=len(removes),
        files=files,
        rows=rows,
        bytes_copied=sum(a.size for a in adds),
        copied_paths=tuple(copied),
    )


def _spelled(partition: PartitionSpec) -> str:
    return "[" + ", ".join(f"{c}={v}" for c, v in partition.items()) + "]"


def _live_files(dt: DeltaTable, partition: PartitionSpec) -> list[dict[str, Any]]:
    """The table's live files in ``partition``: path (unquoted, relative), size, row count, statistics, and
    ``deleted``: the keep mask of its deletion vector (None without one)."""
    actions = arrow_table(dt.get_add_actions(flatten=False)).to_pylist()
    mine = [a for a in actions if all(str((a.get("partition") or {}).get(c)) == v for c, v in partition.items())]
    masks = _deletion_masks(dt) if mine else {}
    out = []
    for action in mine:
        path = unquote(str(action["path"]))
        if "://" in path or path.startswith("/"):
            raise ReplicationError(f"{dt.table_uri}: file {path} lies outside the table (a clone): not replicated")
        mask = masks.get(path)
        out.append({**action, "path": path, "deleted": mask if mask is not None and False in mask else None})
    return out


def _deletion_masks(dt: DeltaTable) -> dict[str, list[bool]]:
    if "deletionVectors" not in (dt.protocol().reader_features or []):
        return {}
    base = unquote(dt.table_uri.rstrip("/") + "/")
    out = {}
    for batch in dt.deletion_vectors():
        vectors = pa.record_batch(batch)
        for uri, keep in zip(vectors["filepath"].to_pylist(), vectors["selection_vector"].to_pylist(), strict=True):
            path = unquote(str(uri))
            out[path[len(base) :] if path.startswith(base) else path] = list(keep)
    return out


def _rewritten_path(file: Mapping[str, Any]) -> str:
    """Where the live rows of a file with a deletion vector go: named by the file and the rows kept, so that the same
    vector gives the same file and another vector another one."""
    digest = hashlib.sha1(bytes(file["deleted"])).hexdigest()[:16]
    folder, _, name = str(file["path"]).rpartition("/")
    stem = name.removesuffix(".parquet")
    return f"{folder}/{stem}.live-{digest}.parquet" if folder else f"{stem}.live-{digest}.parquet"


def _copy(source_uri: str, replica_uri: str, file: Mapping[str, Any]) -> AddAction:
    source_fs, source_base = filesystem(source_uri)
    replica_fs, replica_base = filesystem(replica_uri)
    path = str(file["path"])
    folder = path.rpartition("/")[0]
    if folder:
        replica_fs.create_dir(f"{replica_base}/{folder}", recursive=True)
    try:
        reader = source_fs.open_input_stream(f"{source_base}/{path}")
    except FileNotFoundError:
        raise ReplicationError(
            f"{source_uri}: {path} is gone from storage (vacuumed?): that version can no longer be replicated"
        ) from None
    with reader, replica_fs.open_output_stream(f"{replica_base}/{path}") as writer:
        while chunk := reader.read(8 << 20):
            writer.write(chunk)
    return AddAction(
        path,
        int(file["size_bytes"]),
        dict(file["partition"]),
        int(file["modification_time"]),
        True,
        _stats(file),
    )


def _rewrite(src: DeltaTable, source_uri: str, replica_uri: str, file: Mapping[str, Any], target: str) -> AddAction:
    """The file's rows that its deletion vector keeps, written as a plain Parquet file of the table's types."""
    source_fs, source_base = filesystem(source_uri)
    schema = pa.schema(src.schema().to_arrow())  # type: ignore[call-overload]
    data_fields = [f for f in schema if f.name not in set(file["partition"])]
    with source_fs.open_input_file(f"{source_base}/{file['path']}") as handle:
        rows = pq.read_table(handle, columns=[f.name for f in data_fields])
    mask = pa.array(file["deleted"], pa.bool_())
    if len(mask) != rows.num_rows:
        raise ReplicationError(f"{source_uri}: {file['path']} has {rows.num_rows} rows, its vector {len(mask)}")
    live = rows.filter(mask).cast(pa.schema(data_fields))
    replica_fs, replica_base = filesystem(replica_uri)
    folder = target.rpartition("/")[0]
    if folder:
        replica_fs.create_dir(f"{replica_base}/{folder}", recursive=True)
    with replica_fs.open_output_stream(f"{replica_base}/{target}") as out:
        pq.write_table(live, out, compression="snappy")
    size = replica_fs.get_file_info(f"{replica_base}/{target}").size
    stats = {"numRecords": live.num_rows, "nullCount": {c: live[c].null_count for c in live.column_names}}
    return AddAction(target, int(size), dict(file["partition"]), int(time.time() * 1000), True, json.dumps(stats))


def _stats(file: Mapping[str, Any]) -> str:
    """The add action's statistics as the Delta log spells them, from delta-rs's parsed ones: the row count, null
    counts, and the bounds of the columns whose JSON form is exact (timestamps are left out: the log keeps them to the
    millisecond, and a bound rounded the wrong way would let a reader skip rows)."""
    stats: dict[str, Any] = {"numRecords": file.get("num_records")}
    for name, wanted in (("nullCount", "null_count"), ("minValues", "min"), ("maxValues", "max")):
        values = {c: v for c, v in (file.get(wanted) or {}).items() if _exact(v)}
        if values:
            stats[name] = {c: v.isoformat() if isinstance(v, date) else v for c, v in values.items()}
    return json.dumps(stats)


def _exact(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, bool | int | str) or (isinstance(value, date) and type(value) is date)


def _verify(
    published: DeltaTable,
    replica_uri: str,
    partition: PartitionSpec,
    wanted: list[dict[str, Any]],
    adds: list[AddAction],
    where: str,
) -> tuple[int, int]:
    """The published partition against the source: the same number of files, each added file's size in storage as
    its add action says, the rows by the replica's log and by a count of its data equal to the source's live rows."""
    held = _live_files(published, partition)
    if len(held) != len(wanted):
        raise ReplicationError(
            f"{where}: the replica holds {len(held)} files of the partition, the source {len(wanted)}"
        )
    replica_fs, replica_base = filesystem(replica_uri)
    for add in adds:
        stored = replica_fs.get_file_info(f"{replica_base}/{add.path}").size
        if stored != add.size:
            raise ReplicationError(
                f"{where}: {add.path} is {stored} bytes on the replica, its add action says {add.size}"
            )
    expected = sum(int(f["num_records"] or 0) - (f["deleted"].count(False) if f["deleted"] else 0) for f in wanted)
    by_log = sum(int(f["num_records"] or 0) for f in held)
    condition = " AND ".join(f"\"{c}\" = '{v}'" for c, v in partition.items())
    counted = arrow_table(
        QueryBuilder().register("replica", published).execute(f'SELECT count(*) AS n FROM "replica" WHERE {condition}')
    )
    by_data = int(counted["n"][0].as_py()) if counted.num_rows else 0
    if not expected == by_log == by_data:
        raise ReplicationError(
            f"{where}: the source commit holds {expected} live rows, the replica {by_log} by its log and {by_data} read"
        )
    return len(held), by_data


def commit_time(uri: str, version: int) -> float | None:
    """When ``version`` of the table at ``uri`` was committed (epoch seconds, its commitInfo's), None when its log
    entry is gone or does not say."""
    fs, base = filesystem(uri + "/_delta_log")
    try:
        with fs.open_input_stream(f"{base}/{version:020d}.json") as entry:
            lines = entry.read().decode().splitlines()
    except FileNotFoundError:
        return None
    for line in lines:
        info = json.loads(line).get("commitInfo") if line.strip() else None
        if isinstance(info, dict) and isinstance(info.get("timestamp"), int | float):
            return float(info["timestamp"]) / 1000
    return None


class ReplicaSitesResource(ConfigurableResource):  # type: ignore[misc]
    """The lake root of each site tables replicate to (``WAREHOUSE_SITES``), and where the replicas are read from."""

    roots: dict[str, str] = Field(default_factory=dict, description="site name -> its lake root, a path or URI")

    def reader(self, site: str) -> DeltaReader:
        """The replica lake of ``site``; ReplicationError naming the configured sites when it is not one."""
        if site not in self.roots:
            known = ", ".join(sorted(self.roots)) or "none"
            raise ReplicationError(f"no site {site!r} in WAREHOUSE_SITES (configured: {known})")
        root = normalize_root(self.roots[site])
        return DeltaReader(root, storage_options(root))

    def store(self, site: str) -> SiteStore:
        """The lake of ``site`` as the tables declared there read and write it (:class:`SiteStore`)."""
        root = self.reader(site).root
        return SiteStore(root, storage_options(root), site=site)


@dataclass
class SiteStore(DeltaStore):
    """A site's lake, as the tables declared at the site build on it: laid out as the first site's, a replica's asset
    key (``dc2/dwd/order_detail``) names the site, the replica's path (``dwd/order_detail``) does not."""

    site: str = ""

    def table_uri(self, key: Sequence[str] | str) -> str:
        parts = [key] if isinstance(key, str) else list(key)
        if len(parts) > 1 and parts[0] == self.site:
            parts = parts[1:]
        return super().table_uri(parts)
