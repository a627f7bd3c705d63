"""The ``zorder_partitions`` job: Z-order the files of complete partitions of a table that names Z-order columns.

Launched off the critical path by the ``zorder_complete_partitions`` sensor (sensors/zorder.py). The run's partitions
are Z-ordered by one ``OPTIMIZE`` (one Spark job, one commit), each by the table's declared columns into files of its
declared ``zorder.file_size`` (Delta's default, 1 GiB, when it declares none). Each partition's results (its files
before/after, added and removed, from the Delta log; the duration of the whole OPTIMIZE) are recorded as asset
observations on the partition, so they show on the asset's page in the UI.
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

from resources.delta_lake import DeltaLakeResource, DeltaStore
from resources.spark import SparkResource
from warehouse_assets.catalog import Catalog, Table, partition_values_of
from warehouse_assets.instance.lanes import MAINTENANCE_LANE, lane_tags


class ZOrderConfig(Config):  # type: ignore[misc]
    table: str
    partitions: list[str]


def _files(store: DeltaStore, table: Table, spec: dict[str, str], version: int | None = None) -> set[str]:
    """The live files of one partition, from the Delta log (no data read)."""
    actions, _ = store.live_files(table.key, [spec], version, deletions=False)
    return {str(a["path"]) for a in actions}


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
        specs = {key: partition_values_of(table, key) for key in config.partitions}
        if not specs:  # an OPTIMIZE without partitions would rewrite the whole table
            return Output([], metadata={"partitions": 0})
        before = {key: _files(store, table, spec) for key, spec in specs.items()}
        # one OPTIMIZE for every partition of the run: Delta bins and Z-orders each partition on its own, in one
        # Spark job and one commit, instead of a job and a commit per partition
        metrics = store.optimize(
            table.key,
            partitions=list(specs.values()),
            zorder_by=table.zorder,
            target_size=table.zorder_file_size,
            spark=spark.session(),
        )
        version = int(metrics["delta_version"])
        results = []
        for key, spec in specs.items():
            after = _files(store, table, spec, version)
            numbers = {
                "files_before": len(before[key]),
                "files_after": len(after),
                # the partition's own share of the commit: the files it lost and gained, from the Delta log
                "files_added": len(after - before[key]),
                "files_removed": len(before[key] - after),
                "duration_s": round(float(metrics["duration_s"]), 3),  # of the OPTIMIZE of all of them
                "partitions_optimized_together": len(specs),
                "delta_version": version,
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
            context.log.info(
                f"{table.fqn} {key}: Z-ordered by {table.zorder}, files {len(before[key])} -> {len(after)}"
            )
            results.append(numbers)
        return Output(results, metadata={"partitions": len(results)})

    @job(
        name="zorder_partitions",
        executor_def=in_process_executor,
        tags={"warehouse/maintenance": "zorder", **lane_tags(MAINTENANCE_LANE)},
    )
    def zorder_partitions() -> None:
        zorder_partition_files()

    return zorder_partitions
