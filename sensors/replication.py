"""Replicate each partition of a table that declares ``replicate_to`` once it is materialized and valid.

The sensor reads the source tables' materializations since its cursor (one query per replicated table) and requests
one replica run per site and partition (:func:`warehouse_assets.materialize.replication.replication_due`). A repair
materializes a partition again, so the repaired partition is replicated again; the run key holds the source's event,
so a partition is requested once per build.
"""

from dagster import DefaultSensorStatus, RunRequest, SensorDefinition, SensorEvaluationContext, SensorResult, sensor

from warehouse_assets.catalog import Catalog
from warehouse_assets.materialize.replication import replica_key, replicated, replication_due


def build_replication_sensor(catalog: Catalog) -> list[SensorDefinition]:
    """The ``replication`` sensor, if some table replicates."""
    tables = replicated(catalog)
    if not tables:
        return []

    @sensor(
        name="replication",
        asset_selection=[replica_key(site, t) for t in tables for site in t.replicate_to],
        minimum_interval_seconds=5,
        default_status=DefaultSensorStatus.RUNNING,
        description="Publishes each valid partition of the replicated tables on their sites, as it is built.",
    )
    def replication(context: SensorEvaluationContext) -> SensorResult:
        after = int(context.cursor) if context.cursor else None
        due = replication_due(context.instance, catalog, after)
        requests = [
            RunRequest(run_key=f"{key.to_user_string()}|{partition}|{due.cursor}", asset_selection=[key],
                       partition_key=partition)
            for key, partitions in due.partitions.items()
            for partition in partitions
        ]  # fmt: skip
        return SensorResult(run_requests=requests, cursor=str(due.cursor))

    return [replication]
