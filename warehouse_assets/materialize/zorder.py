"""The ``zorder_partitions`` job: Z-order the files of complete partitions of a table that names Z-order columns.

Launched off the critical path by the ``zorder_complete_partitions`` sensor (sensors/zorder.py). Each partition is
Z-ordered by the table's declared columns into files of its declared ``zorder.file_size`` (Delta's default, 1 GiB,
when it declares none). The results
(files before/after, duration) are recorded as asset observations on the partition, so they show on the asset's
page in the UI.
"""

from typing import Any

from dagster import (
    AssetKey,
    AssetObservation,
    Config,
    JobDefinition,
    OpExecutionContext,
    Output,
    in_process_executor,
    job,
    op,
)

from resources.delta_lake import DeltaLakeResource
from resources.spark import SparkResource
from warehouse_assets.catalog import Catalog, Table, partition_values_of


class ZOrderConfig(Config):  # type: ignore[misc]
    table: str
    partitions: list[str]


def zordered_tables(catalog: Catalog) -> dict[str, Table]:
    return {t.fqn: t for t in catalog if t.zorder}


def build_zorder_job(catalog: Catalog) -> JobDefinition:
    tables = zordered_tables(catalog)

    @op(name="zorder_partition_files", description="Z-order the files of complete partitions.")
    def zorder_partition_files(
        context: OpExecutionContext, config: ZOrderConfig, lake: DeltaLakeResource, spark: SparkResource
    ) -> Output[list[dict[str, Any]]]:
        if config.table not in tables:
            raise ValueError(f"{config.table} declares no Z-order columns; tables that do: {sorted(tables)}")
        table, store = tables[config.table], lake.store()
        results = []
        for key in config.partitions:
            spec = partition_values_of(table, key)
            before = store.live_files(table.key, [spec], deletions=False)[1].files_read
            metrics = store.optimize(
                table.key,
                partitions=[spec],
                zorder_by=table.zorder,
                target_size=table.zorder_file_size,
                spark=spark.session(),
            )
            after = store.live_files(table.key, [spec], deletions=False)[1].files_read
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
                    metadata={
                        **numbers,
                        "zorder_by": ", ".join(table.zorder),
                        "file_size_mib": round(table.zorder_file_size / 2**20, 1) if table.zorder_file_size else "",
                    },
                )
            )
            context.log.info(f"{table.fqn} {key}: Z-ordered by {table.zorder}, files {before} -> {after}")
            results.append(numbers)
        return Output(results, metadata={"partitions": len(results)})

    @job(name="zorder_partitions", executor_def=in_process_executor, tags={"warehouse/maintenance": "zorder"})
    def zorder_partitions() -> None:
        zorder_partition_files()

    return zorder_partitions
