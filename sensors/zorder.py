"""Z-order complete partitions of tables that name Z-order columns, off the critical path.

A partition is complete when it is materialized: derived partitions are written whole by one run, ODS
hours are materialized by the readiness sensor once every shard is applied past the hour. This sensor
sees those materializations and launches ``zorder_partitions`` (:mod:`warehouse_assets.materialize.zorder`) for them;
downstream runs never wait for it (automation ignores it), and a reader in flight keeps its snapshot's files
(vacuum honours the time-travel window).
"""

import json

from dagster import (
    AssetKey,
    AssetRecordsFilter,
    DefaultSensorStatus,
    JobDefinition,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    sensor,
)

from warehouse_assets.catalog import Catalog
from warehouse_assets.materialize.zorder import zordered_tables

BATCH = 48  # partitions per optimize run


def build_zorder_sensor(catalog: Catalog, zorder_partitions: JobDefinition) -> SensorDefinition:
    """The sensor launching ``zorder_partitions`` (:mod:`warehouse_assets.materialize.zorder`) for complete
    partitions."""
    tables = zordered_tables(catalog)

    @sensor(
        name="zorder_complete_partitions",
        job=zorder_partitions,
        minimum_interval_seconds=60,
        default_status=DefaultSensorStatus.RUNNING,
        description="Launches Z-order for partitions of tables with Z-order columns once they are complete.",
    )
    def zorder_complete_partitions(context: SensorEvaluationContext) -> SensorResult:
        cursor: dict[str, int] = json.loads(context.cursor) if context.cursor else {}
        requests = []
        for fqn, table in sorted(tables.items()):
            records = context.instance.fetch_materializations(
                AssetRecordsFilter(asset_key=AssetKey(table.key), after_storage_id=cursor.get(fqn)),
                limit=1000,
                ascending=True,
            ).records
            if not records:
                continue
            keys = sorted({r.partition_key for r in records if r.partition_key})
            cursor[fqn] = records[-1].storage_id
            for i in range(0, len(keys), BATCH):
                chunk = keys[i : i + BATCH]
                requests.append(
                    RunRequest(
                        run_key=f"zorder-{fqn}-{records[-1].storage_id}-{i}",
                        run_config={"ops": {"zorder_partition_files": {"config": {"table": fqn, "partitions": chunk}}}},
                        tags={"warehouse/table": fqn},
                    )
                )
        return SensorResult(run_requests=requests, cursor=json.dumps(cursor, sort_keys=True))

    return zorder_complete_partitions
