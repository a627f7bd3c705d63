"""Replicas: each table that declares ``replicate_to: <site>`` gets, per site, an asset of its own,
``<site>/<layer>/<table>`` in the group named after the site, with the table's partitions definition and the
table as its one upstream, partition for partition. Materializing a replica partition publishes the source
partition's Delta commit on the site's lake (:func:`resources.delta_replica.replicate_partition`: exactly its files,
one commit, verified), once the source partition is materialized and valid; tables built at the site read the replica
assets as any upstream (each replica is a catalog table, :class:`warehouse_assets.catalog.ReplicaTable`, whose
partitions the dependency center tracks from these runs' materializations). :func:`replication_due` finds the source
partitions built (or rebuilt by a repair) since a cursor, which the ``replication`` sensor turns into replica runs.
"""

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dagster import (
    AssetDep,
    AssetExecutionContext,
    AssetKey,
    AssetRecordsFilter,
    AssetsDefinition,
    BackfillPolicy,
    DagsterInstance,
    Failure,
    IdentityPartitionMapping,
    MaterializeResult,
    asset,
)

from warehouse_assets.catalog import Catalog, CatalogError, Table, partitions_def_of
from warehouse_assets.catalog.calendars import partition_values
from warehouse_assets.materialize.quality import failed_blocking_checks, latest_materialization
from warehouse_assets.materialize.validity import tainted_in_instance

REPLICA_RESOURCE = "replica_sites"


def replicated(catalog: Catalog) -> list[Table]:
    """The tables that replicate to some site."""
    return [t for t in catalog if t.replicate_to]


def replica_key(site: str, table: Table) -> AssetKey:
    return AssetKey([site, *table.key])


def check_sites(catalog: Catalog, sites: Mapping[str, str]) -> None:
    """CatalogError naming the table's file when it replicates to a site ``WAREHOUSE_SITES`` does not configure, or
    when it is not a partitioned table."""
    for table in replicated(catalog):
        for site in table.replicate_to:
            if site not in sites:
                known = ", ".join(sorted(sites)) or "none configured"
                raise CatalogError(
                    f"{table.path}: {table.fqn} replicates to site {site!r}, which WAREHOUSE_SITES does not name "
                    f"({known})"
                )
        if table.is_static or not table.partition_by:
            raise CatalogError(f"{table.path}: replicate_to is for partitioned tables; {table.fqn} has no partitions")


def build_replica_assets(catalog: Catalog, sites: Mapping[str, str]) -> list[AssetsDefinition]:
    """One replica asset per replicated table and site (none when no table replicates)."""
    check_sites(catalog, sites)
    return [_replica_asset(catalog[replica.source], replica.site) for replica in catalog.replicas()]


def _replica_asset(table: Table, site: str) -> AssetsDefinition:
    @asset(
        key=replica_key(site, table),
        group_name=site,
        description=f"{table.fqn} replicated to site {site}: each valid partition's Delta commit, verified.",
        partitions_def=partitions_def_of(table),
        deps=[AssetDep(AssetKey(table.key), partition_mapping=IdentityPartitionMapping())],
        backfill_policy=BackfillPolicy.single_run(),
        kinds={"delta"},
        required_resource_keys={"lake", REPLICA_RESOURCE},
        metadata={"source": table.fqn, "site": site},
    )
    def _replicate(context: AssetExecutionContext) -> MaterializeResult:
        from resources.delta_replica import replicate_partition  # the run reads the Delta logs; compiling does not

        source = context.resources.lake.store()
        replica = getattr(context.resources, REPLICA_RESOURCE).reader(site)
        keys = list(context.partition_keys)
        versions = source_versions(context.instance, table, keys)
        published: dict[str, dict[str, Any]] = {}
        for key in keys:
            done = replicate_partition(source, replica, table.key, partition_values(table.period, key), versions[key])
            context.log.info(
                f"{site}/{table.fqn} {key}: source v{done.source_version} -> replica "
                f"{'v' + str(done.replica_version) if done.replica_version is not None else 'already published'}, "
                f"{done.files_copied} files copied, {done.files_rewritten} rewritten, {done.files_removed} removed, "
                f"{done.rows} rows verified"
            )
            published[key] = {
                "source_version": done.source_version,
                "replica_version": done.replica_version,
                "source_committed_at": done.source_committed_at,
                "published_at": done.published_at,
                "rows": done.rows,
                "files_copied": done.files_copied,
                "files_rewritten": done.files_rewritten,
                "files_removed": done.files_removed,
            }
        lags = [p["published_at"] - p["source_committed_at"] for p in published.values() if p["source_committed_at"]]
        return MaterializeResult(
            metadata={
                "replicated": json.dumps(published, sort_keys=True),
                "rows": sum(int(p["rows"]) for p in published.values()),
                "lag_s": round(max(lags), 3) if lags else None,
                "replica_uri": replica.table_uri(table.key),
            }
        )

    return _replicate


def source_versions(instance: DagsterInstance, table: Table, keys: Sequence[str]) -> dict[str, int | None]:
    """The Delta version each source partition's latest build wrote, once it is valid; Failure naming the partition
    when it was never built, is tainted or failed a blocking check: a replica only publishes valid data."""
    tainted = tainted_in_instance(instance, table, keys)
    failed = failed_blocking_checks(instance, table, keys)
    versions: dict[str, int | None] = {}
    for key in keys:
        if key in tainted:
            raise Failure(f"{table.fqn} {key} is tainted: it is replicated once it is repaired")
        if key in failed:
            raise Failure(f"{table.fqn} {key} failed its blocking check(s) {', '.join(failed[key])}: not replicated")
        record = latest_materialization(instance, table, key)
        if record is None:
            raise Failure(f"{table.fqn} {key} has not been materialized: nothing to replicate")
        versions[key] = built_version(
            record.asset_materialization.metadata if record.asset_materialization else {}, key
        )
    return versions


def built_version(metadata: Mapping[str, Any], key: str) -> int | None:
    """The Delta version a build's materialization of partition ``key`` records: its own, or in a ranged run's
    list of partitions; None when it records none (the source's current version is replicated then)."""
    ranged = metadata.get("partitions")
    for entry in ranged.value if ranged is not None and isinstance(ranged.value, list) else []:
        if isinstance(entry, Mapping) and entry.get("partition") == key and entry.get("delta_version") is not None:
            return int(entry["delta_version"])
    value = metadata.get("delta_version")
    return int(value.value) if value is not None and value.value is not None else None


@dataclass(frozen=True)
class Due:
    """Replica partitions to publish: the source partitions materialized since the cursor, and the new cursor."""

    partitions: dict[AssetKey, list[str]]
    cursor: int


def replication_due(instance: DagsterInstance, catalog: Catalog, after: int | None) -> Due:
    """The replica partitions whose source partition was materialized (built, or rebuilt by a repair) after the event
    storage id ``after`` and is valid now, per replica asset. A partition tainted or failing a blocking check is left
    out: its repair materializes it again, which makes it due then."""
    due: dict[AssetKey, list[str]] = {}
    cursor = after or 0
    for table in replicated(catalog):
        records = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=AssetKey(table.key), after_storage_id=after), limit=10_000, ascending=True
        ).records
        keys = sorted({r.partition_key for r in records if r.partition_key})
        invalid = {*tainted_in_instance(instance, table, keys), *failed_blocking_checks(instance, table, keys)}
        keys = [k for k in keys if k not in invalid]
        cursor = max([cursor, *(r.storage_id for r in records)])
        for site in table.replicate_to:
            if keys:
                due[replica_key(site, table)] = keys
    return Due(due, cursor)


def replication_lags(instance: DagsterInstance, catalog: Catalog, since: float | None = None) -> dict[str, list[float]]:
    """Per site, the lag (source commit -> replica published, seconds) of each partition its replica runs published
    since ``since`` (epoch seconds; default the last day), from their materializations' metadata."""
    since = time.time() - 86_400 if since is None else since
    lags: dict[str, list[float]] = {}
    for table in replicated(catalog):
        for site in table.replicate_to:
            records = instance.fetch_materializations(replica_key(site, table), limit=10_000).records
            seen: set[str] = set()
            for record in records:
                if record.timestamp < since or record.asset_materialization is None:
                    continue
                entry = record.asset_materialization.metadata.get("replicated")
                for key, done in json.loads(str(entry.value) if entry is not None else "{}").items():
                    if key in seen or done.get("replica_version") is None or not done.get("source_committed_at"):
                        continue
                    seen.add(key)
                    lags.setdefault(site, []).append(float(done["published_at"]) - float(done["source_committed_at"]))
    return lags
