"""Lake maintenance: vacuum, log checkpoints and log cleanup for every table, on a daily schedule."""

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

from resources.delta_lake import DeltaLakeResource
from warehouse_assets.catalog import Catalog
from warehouse_assets.ingestion import QUARANTINE_KEY
from warehouse_assets.partitions import periods


def build_maintenance(catalog: Catalog) -> tuple[JobDefinition, ScheduleDefinition]:
    keys = [tuple(t.key) for t in catalog if not t.is_external] + [QUARANTINE_KEY]  # never a producer's table

    @op(name="maintain_lake", description="Vacuum outside the time-travel window, checkpoint, clean the log.")
    def maintain_lake(context: OpExecutionContext, lake: DeltaLakeResource) -> Output[dict[str, dict[str, int]]]:
        store = lake.store()
        done: dict[str, dict[str, int]] = {}
        for key in keys:
            if not store.exists(key):
                continue
            result = store.maintain(key)
            done[".".join(key)] = {k: int(v) for k, v in result.items() if k != "duration_s"}
            context.log.info(
                f"{'.'.join(key)}: {result['files_vacuumed']} files vacuumed, "
                f"{result['log_files_removed']} log entries removed, version {result['delta_version']}"
            )
        return Output(
            done,
            metadata={
                "tables": len(done),
                "files_vacuumed": sum(d["files_vacuumed"] for d in done.values()),
                "log_files_removed": sum(d["log_files_removed"] for d in done.values()),
            },
        )

    @job(name="lake_maintenance", executor_def=in_process_executor, description=maintain_lake.description)
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
