"""Z-order complete partitions of tables that name Z-order columns, off the critical path.

A partition is complete when it is materialized: derived partitions are written whole by one run, ODS
hours are materialized by the readiness sensor once every shard is applied past the hour. This sensor
sees those materializations and launches ``zorder_partitions`` for them; downstream runs never wait for
it (automation ignores it), and a reader in flight keeps its snapshot's files (vacuum honours the
time-travel window). The results (files before/after, duration) are recorded as asset observations on
the partition, so they show on the asset's page in the UI.
"""

import json
from typing import Any

from dagster import (
    AssetKey,
    AssetObservation,
    Config,
    DagsterEventType,
    DefaultSensorStatus,
    EventRecordsFilter,
    JobDefinition,
    OpExecutionContext,
    Output,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    in_process_executor,
    job,
    op,
    sensor,
)

from resources.delta_lake import DeltaLakeResource
from resources.spark import SparkResource
from warehouse_assets.catalog import Catalog
from warehouse_assets.compiler import partition_spec

BATCH = 48  # partitions per optimize run


class ZOrderConfig(Config):  # type: ignore[misc]
    table: str
    partitions: list[str]


def build_zorder(catalog: Catalog) -> tuple[JobDefinition, SensorDefinition]:
    tables = {t.fqn: t for t in catalog if t.zorder}

    @op(name="zorder_partition_files", description="Z-order the files of complete partitions.")
    def zorder_partition_files(
        context: OpExecutionContext, config: ZOrderConfig, lake: DeltaLakeResource, spark: SparkResource
    ) -> Output[list[dict[str, Any]]]:
        if config.table not in tables:
            raise ValueError(f"{config.table} declares no Z-order columns; tables that do: {sorted(tables)}")
        table, store = tables[config.table], lake.store()
        results = []
        for key in config.partitions:
            spec = partition_spec(table.period, key)
            before = store.live_files(table.key, [spec])[1].files_read
            metrics = store.optimize(table.key, partitions=[spec], zorder_by=table.zorder, spark=spark.session())
            after = store.live_files(table.key, [spec])[1].files_read
            numbers = {
                "files_before": before,
                "files_after": after,
                "files_added": int(metrics.get("numFilesAdded", 0)),
                "files_removed": int(metrics.get("numFilesRemoved", 0)),
                "duration_s": round(float(metrics["duration_s"]), 3),
                "delta_version": int(metrics["delta_version"]),
            }
            context.log_event(
                AssetObservation(
                    asset_key=AssetKey(table.key),
                    partition=key,
                    metadata={**numbers, "zorder_by": ", ".join(table.zorder)},
                )
            )
            context.log.info(f"{table.fqn} {key}: Z-ordered by {table.zorder}, files {before} -> {after}")
            results.append(numbers)
        return Output(results, metadata={"partitions": len(results)})

    @job(name="zorder_partitions", executor_def=in_process_executor, tags={"warehouse/maintenance": "zorder"})
    def zorder_partitions() -> None:
        zorder_partition_files()

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
            records = context.instance.get_event_records(
                EventRecordsFilter(
                    DagsterEventType.ASSET_MATERIALIZATION,
                    asset_key=AssetKey(table.key),
                    after_cursor=cursor.get(fqn),
                ),
                ascending=True,
                limit=1000,
            )
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

    return zorder_partitions, zorder_complete_partitions
