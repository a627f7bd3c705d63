"""The ``ods_quality_checks`` job: the declared checks of many ODS hours evaluated in one run.

Launched by the ``ods_quality_checks`` sensor (sensors/ods_checks.py) for every hour reported since the last
run, or by hand with ``hours`` in its config. It records one ``AssetCheckEvaluation`` per check and hour, with
the numbers behind it, targeting the materialization it checked, so the verdict shows on the partition in the
UI and gates the dependency center.
"""

import time

from dagster import (
    Config,
    Failure,
    JobDefinition,
    OpExecutionContext,
    Output,
    in_process_executor,
    job,
    op,
)

from resources.delta_lake import DeltaLakeResource
from resources.spark import SparkResource
from warehouse_assets.catalog import Catalog, Table
from warehouse_assets.partitions import BY_PERIOD
from warehouse_assets.quality import evaluation, latest_materialization

JOB = "ods_quality_checks"


class OdsChecksConfig(Config):  # type: ignore[misc]
    hours: dict[str, list[str]]  # ODS table (e.g. "ods.order") -> hour partition keys


def checked_tables(catalog: Catalog) -> dict[str, Table]:
    return {t.fqn: t for t in catalog.ods() if t.checks}


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
        from warehouse_assets.runtime import check_ods_hours  # the run imports PySpark; compiling does not

        session, store = spark.session(), lake.store()
        started = time.monotonic()
        counts = {"table_hours": 0, "evaluations": 0, "failed": 0}
        for fqn, keys in sorted(config.hours.items()):
            table, keys = tables[fqn], sorted(set(keys))
            # the materializations being checked, looked up before the rows are read
            checked = {k: latest_materialization(context.instance, table, k) for k in keys}
            for outcome in check_ods_hours(table, keys, session, store):
                # log_event accepts check evaluations at run time (its annotation lags behind)
                event = evaluation(context.instance, table, outcome, checked[outcome.partition])
                context.log_event(event)  # type: ignore[arg-type]
                counts["evaluations"] += 1
                if not outcome.passed:
                    counts["failed"] += 1
                    context.log.warning(
                        f"{fqn} {outcome.partition} check {outcome.check.name} FAILED: {outcome.description}"
                    )
            counts["table_hours"] += len(keys)
            context.log.info(f"{fqn}: checked {len(keys)} hour(s), {keys[0]} .. {keys[-1]}")
        seconds = round(time.monotonic() - started, 3)
        return Output(counts, metadata={**counts, "duration_s": seconds})

    @job(name=JOB, executor_def=in_process_executor, tags={"warehouse/quality": "ods"})
    def ods_quality_checks() -> None:
        evaluate_ods_hours()

    return ods_quality_checks
