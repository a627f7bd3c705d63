"""The ODS hours' data-quality checks, batched: one run checks every reported hour still without verdicts.

The ingestion run that makes hours ready judges them itself (:mod:`warehouse_assets.ingest.job`); this sensor is the
fallback for the hours the readiness sensor reports (sensors/ods_readiness.py) and for a run that died before
judging, and waits while an ingestion run is in flight. The declared checks of ODS hours
(key uniqueness, not-null, ...) are blocking like those of every other layer: a DWD day runs only when all
24 of its hours passed. Left to Dagster's automation, each table and hour would get a run of its own —
120 runs per simulated day, each starting a process, which flooded the run queue and held back every
downstream run. Instead this sensor finds the ODS hours whose latest materialization has no verdict yet
(new hours, and hours re-reported after late changes) and launches one ``ods_quality_checks`` run
(:mod:`warehouse_assets.build.hour_checks`) for them all, oldest first, at most ``MAX_HOURS_PER_RUN`` table-hours at
a time.

Nothing is lost: the pending set is recomputed from the instance on every tick, so a failed or killed run
leaves its hours pending and a later run checks them (after ``RETRY_AFTER`` when the last run failed). While
a run is in flight no other starts. Hours older than the dependency center's lookback are checked by hand
(execute the table's checks on the partition in the UI).
"""

import time
from collections.abc import Mapping, Sequence
from datetime import datetime

from dagster import (
    AssetCheckKey,
    AssetKey,
    DagsterInstance,
    DagsterRunStatus,
    DefaultSensorStatus,
    JobDefinition,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
    sensor,
)
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

from resources.settings import current
from warehouse_assets.build.hour_checks import JOB, checked_tables
from warehouse_assets.catalog import BY_PERIOD, Catalog, Table, business_zone
from warehouse_assets.center.resolver import LOOKBACK
from warehouse_assets.ingest.job import IN_FLIGHT, ingestion_in_flight

MAX_HOURS_PER_RUN = 24 * 5 * 2  # two days of the five ODS tables
RETRY_AFTER = 120.0  # seconds after a failed run before its hours are tried again
VERDICTS = (AssetCheckExecutionRecordStatus.SUCCEEDED, AssetCheckExecutionRecordStatus.FAILED)


def unchecked_hours(
    instance: DagsterInstance, tables: Mapping[str, Table], since: datetime | None = None
) -> dict[str, list[str]]:
    """Per ODS table, the materialized hours (from ``since``) whose latest materialization lacks a verdict
    of one of the table's checks."""
    hourly = BY_PERIOD["hourly"]
    horizon = hourly.get_partition_key_for_timestamp(since.timestamp()) if since else ""
    pending: dict[str, list[str]] = {}
    for fqn, table in sorted(tables.items()):
        key = AssetKey(table.key)
        materialized = {k for k in instance.get_materialized_partitions(key) if k >= horizon}
        if not materialized:
            continue
        checks = [AssetCheckKey(key, c.name) for c in table.checks]
        judged: dict[AssetCheckKey, set[str]] = {c: set() for c in checks}
        for info in instance.event_log_storage.get_asset_check_partition_info(checks):
            if info.partition_key is not None and info.is_current and info.latest_execution_status in VERDICTS:
                judged[info.check_key].add(info.partition_key)
        hours = sorted(k for k in materialized if any(k not in done for done in judged.values()))
        if hours:
            pending[fqn] = hours
    return pending


def next_batch(pending: Mapping[str, Sequence[str]], limit: int = MAX_HOURS_PER_RUN) -> dict[str, list[str]]:
    """The oldest ``limit`` table-hours of ``pending`` (so that whole days complete first)."""
    pairs = sorted((hour, fqn) for fqn, hours in pending.items() for hour in hours)[:limit]
    batch: dict[str, list[str]] = {}
    for hour, fqn in pairs:
        batch.setdefault(fqn, []).append(hour)
    return batch


def build_ods_checks_sensor(catalog: Catalog, ods_quality_checks: JobDefinition) -> SensorDefinition:
    """The sensor launching ``ods_quality_checks`` (:mod:`warehouse_assets.build.hour_checks`) for unchecked hours."""
    tables = checked_tables(catalog)

    @sensor(
        name="ods_quality_checks",
        job=ods_quality_checks,
        minimum_interval_seconds=current().ods_checks_interval,
        default_status=DefaultSensorStatus.RUNNING,
        description="Checks every newly reported ODS hour (its declared data-quality checks) in one run.",
    )
    def ods_quality_checks_sensor(context: SensorEvaluationContext) -> RunRequest | SkipReason:
        instance = context.instance
        running = instance.get_runs(RunsFilter(job_name=JOB, statuses=IN_FLIGHT), limit=1)
        if running:
            return SkipReason(f"run {running[0].run_id} is still checking ODS hours")
        ingesting = ingestion_in_flight(instance)
        if ingesting:  # it judges the hours it reports: a check run now would judge them a second time
            return SkipReason(f"ingestion run {ingesting} is in flight; it judges the hours it reports")
        last = instance.get_run_records(RunsFilter(job_name=JOB), limit=1)
        if last and last[0].dagster_run.status == DagsterRunStatus.FAILURE and last[0].end_time:
            wait = RETRY_AFTER - (time.time() - last[0].end_time)
            if wait > 0:
                return SkipReason(f"run {last[0].dagster_run.run_id} failed; retrying its hours in {wait:.0f}s")
        since = datetime.now(business_zone()) - LOOKBACK
        batch = next_batch(unchecked_hours(instance, tables, since))
        if not batch:
            return SkipReason("every reported ODS hour has its checks' verdicts")
        n = sum(len(v) for v in batch.values())
        summary = ", ".join(f"{fqn} {keys[0]} .. {keys[-1]} ({len(keys)})" for fqn, keys in sorted(batch.items()))
        context.log.info(f"checking {n} ODS table-hour(s): {summary}")
        return RunRequest(
            run_config={"ops": {"check_ods_hours": {"config": {"hours": batch}}}},
            tags={"warehouse/table_hours": str(n)},
        )

    return ods_quality_checks_sensor
