"""Lake maintenance: vacuum, log checkpoints and log cleanup for every table, on a daily schedule; and the in-place
upgrade of an existing lake's ODS tables to deletion vectors.

The tables Spark writes are vacuumed by Spark's ``VACUUM``, after their partitions with many rows marked deleted by
deletion vectors are purged (``REORG TABLE ... APPLY (PURGE)``); the ops tables
(:mod:`warehouse_assets.ingest.ops_tables`), which delta-rs writes, by delta-rs, and they are also compacted: they grow
by a small commit per batch.
"""

from typing import TYPE_CHECKING

from dagster import (
    DefaultScheduleStatus,
    JobDefinition,
    OpExecutionContext,
    Output,
    ScheduleDefinition,
    in_process_executor,
    job,
    op,
)

from resources.delta_lake import DeltaLakeResource, DeltaStore
from resources.spark import SparkResource
from warehouse_assets.catalog import Catalog, periods
from warehouse_assets.catalog.additive import state_key
from warehouse_assets.ingest.ops_tables import OPS_TABLES
from warehouse_assets.instance.lanes import MAINTENANCE_LANE, lane_tags

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def upgrade_to_deletion_vectors(store: DeltaStore, catalog: Catalog, spark: "SparkSession") -> dict[str, bool]:
    """Turn deletion vectors on for every existing ODS table that has none (a table property and the protocol
    feature, one commit each, no data file rewritten): their merges then mark the rows they replace or delete
    instead of rewriting the files holding them. Table → whether it was upgraded now (False: it had them)."""
    return {t.fqn: store.enable_deletion_vectors(spark, t.key) for t in catalog if t.is_ods and store.exists(t.key)}


def build_maintenance(catalog: Catalog) -> tuple[JobDefinition, ScheduleDefinition]:
    # (key, retention hours or None for the lake's window, compact, written by Spark): never a producer's table
    tables: list[tuple[tuple[str, ...], int | None, bool, bool]] = [
        (tuple(t.key), None, False, True) for t in catalog if not t.is_external and not t.is_windows and not t.site
    ]
    # the partial states beside the additive tables, rewritten by each of their builds
    tables += [(tuple(state_key(t)), None, False, True) for t in catalog.derived() if not t.site]
    tables += [(ops.key, ops.retention_hours, True, False) for ops in OPS_TABLES]

    @op(
        name="maintain_lake",
        description="Compact the ops tables; purge deletion vectors past their threshold; vacuum outside the "
        "time-travel window, checkpoint, clean the log.",
    )
    def maintain_lake(
        context: OpExecutionContext, lake: DeltaLakeResource, spark: SparkResource
    ) -> Output[dict[str, dict[str, int]]]:
        store = lake.store()
        done: dict[str, dict[str, int]] = {}
        for key, retention_hours, compact, on_spark in tables:
            if not store.exists(key):
                continue
            session = spark.session() if on_spark else None
            result = store.maintain(key, retention_hours, compact=compact, spark=session)
            done[".".join(key)] = {k: int(v) for k, v in result.items() if k != "duration_s"}
            context.log.info(
                f"{'.'.join(key)}: {result['files_compacted']} files compacted, "
                f"{result['partitions_purged']} partitions purged of {result['rows_purged']} deleted rows, "
                f"{result['files_vacuumed']} files vacuumed, "
                f"{result['log_files_removed']} log entries removed, version {result['delta_version']}"
            )
        return Output(
            done,
            metadata={
                "tables": len(done),
                "files_compacted": sum(d["files_compacted"] for d in done.values()),
                "partitions_purged": sum(d["partitions_purged"] for d in done.values()),
                "files_vacuumed": sum(d["files_vacuumed"] for d in done.values()),
                "log_files_removed": sum(d["log_files_removed"] for d in done.values()),
            },
        )

    @job(
        name="lake_maintenance",
        executor_def=in_process_executor,
        description=maintain_lake.description,
        tags=lane_tags(MAINTENANCE_LANE),
    )
    def lake_maintenance() -> None:
        maintain_lake()

    schedule = ScheduleDefinition(
        name="lake_maintenance_daily",
        job=lake_maintenance,
        cron_schedule="30 4 * * *",
        execution_timezone=periods().timezone,
        default_status=DefaultScheduleStatus.RUNNING,
    )
    return lake_maintenance, schedule
