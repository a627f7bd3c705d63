"""The ``ods_quality_checks`` job: the declared checks of many ODS hours evaluated in one run.

The ingestion run that makes hours ready judges them itself (:func:`judge_hours`, from
:mod:`warehouse_assets.ingest.job`), so a handoff pays no second launch. This job is the fallback: launched by the
``ods_quality_checks`` sensor (:mod:`sensors.ods`) for every reported hour still without verdicts (reported by
the readiness sensor, or an ingestion run that failed before judging), or by hand with ``hours`` in its config.
Either records one ``AssetCheckEvaluation`` per check and hour, with the numbers behind it, targeting the
materialization it checked, so the verdict shows on the partition in the UI and gates the dependency center.
"""

import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from dagster import (
    AssetCheckKey,
    AssetKey,
    Config,
    DagsterInstance,
    Failure,
    JobDefinition,
    OpExecutionContext,
    Output,
    in_process_executor,
    job,
    op,
)
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

from resources.delta_lake import DeltaLakeResource, DeltaStore
from resources.spark import SparkResource
from warehouse_assets.catalog import BY_PERIOD, Catalog, Table
from warehouse_assets.instance.lanes import INGEST_LANE, lane_tags
from warehouse_assets.materialize.quality import evaluation, latest_materializations
from warehouse_assets.materialize.validity import valid_evaluation

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JOB = "ods_quality_checks"


class OdsChecksConfig(Config):  # type: ignore[misc]
    hours: dict[str, list[str]]  # ODS table (e.g. "ods.order") -> hour partition keys


def checked_tables(catalog: Catalog) -> dict[str, Table]:
    return {t.fqn: t for t in catalog.ods() if t.checks}


def judge_hours(
    context: OpExecutionContext, table: Table, keys: Sequence[str], session: "SparkSession", store: DeltaStore
) -> tuple[int, int]:
    """Evaluates ``table``'s checks on the reported hours ``keys`` in one grouped Spark pass per check and logs
    one verdict per check and hour in the run (``ods_quality_checks``, or the ingestion run that made the hours
    ready); returns (evaluations, failed)."""
    from warehouse_assets.materialize.runner import check_ods_hours  # the run imports PySpark; compiling does not

    keys = sorted(set(keys))
    if not keys:
        return 0, 0
    # the materializations being checked, looked up before the rows are read
    checked = latest_materializations(context.instance, table, keys)
    evaluations = failed = 0
    refused: set[str] = set()
    for outcome in check_ods_hours(table, keys, session, store):
        # log_event accepts check evaluations at run time (its annotation lags behind)
        context.log_event(evaluation(context.instance, table, outcome, checked[outcome.partition]))  # type: ignore[arg-type]
        evaluations += 1
        if not outcome.passed:
            failed += 1
            refused.update([outcome.partition] if outcome.check.blocking else [])
            context.log.warning(
                f"{table.fqn} {outcome.partition} check {outcome.check.name} FAILED: {outcome.description}"
            )
    for key in keys:  # the hours whose blocking checks passed are valid (again, after a taint)
        if key not in refused and checked[key] is not None:
            detail = "reported; its blocking checks passed"
            context.log_event(valid_evaluation(table, key, checked[key], detail))  # type: ignore[arg-type]
    context.log.info(f"{table.fqn}: checked {len(keys)} hour(s), {keys[0]} .. {keys[-1]}")
    return evaluations, failed


def build_ods_checks_job(catalog: Catalog) -> JobDefinition:
    tables = checked_tables(catalog)
    hourly = BY_PERIOD["hourly"]

    @op(name="check_ods_hours", description="Evaluate the declared checks of ODS hours, one verdict per check.")
    def evaluate_ods_hours(
        context: OpExecutionContext, config: OdsChecksConfig, spark: SparkResource, lake: DeltaLakeResource
    ) -> Output[dict[str, int]]:
        unknown = sorted(set(config.hours) - set(tables))
        if unknown:
            raise Failure(f"not an ODS table with checks: {', '.join(unknown)}; those are: {', '.join(tables)}")
        for fqn, keys in config.hours.items():
            bad = [k for k in keys if not hourly.has_partition_key(k)]
            if bad:
                raise Failure(f"{fqn}: not hour partition keys (YYYY-MM-DD-HH:00): {', '.join(bad[:5])}")
        session, store = spark.session(), lake.store()
        started = time.monotonic()
        counts = {"table_hours": 0, "evaluations": 0, "failed": 0}
        for fqn, keys in sorted(config.hours.items()):
            evaluations, failed = judge_hours(context, tables[fqn], keys, session, store)
            counts["table_hours"] += len(set(keys))
            counts["evaluations"] += evaluations
            counts["failed"] += failed
        seconds = round(time.monotonic() - started, 3)
        return Output(counts, metadata={**counts, "duration_s": seconds})

    @job(name=JOB, executor_def=in_process_executor, tags={"warehouse/quality": "ods", **lane_tags(INGEST_LANE)})
    def ods_quality_checks() -> None:
        evaluate_ods_hours()

    return ods_quality_checks


# --- which hours the ods_quality_checks sensor sends to the job -----------------------------------------------
#
# Nothing is lost: the pending set is recomputed from the instance on every tick, so a failed or killed run leaves
# its hours pending and a later run checks them (after RETRY_AFTER when the last run failed).

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
