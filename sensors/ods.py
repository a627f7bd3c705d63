"""The ODS handoff's sensors: start ingestion when segments land, and the fallbacks of what an ingestion run reports.

* ``ods_landing`` starts the ``ods_ingest`` job (:mod:`warehouse_assets.ingest.job`) when CDC segments are waiting,
  one run at a time. That run merges them, reports the hours its commits completed and judges their checks.
* ``ods_readiness`` reports each ODS hour once it is complete (:mod:`warehouse_assets.ingest.readiness`) and no
  ingestion run did: hours whose source counts arrived after their segments were ingested, or whose run died before
  reporting them.
* ``ods_quality_checks`` judges the reported hours still without verdicts in one ``ods_quality_checks`` run
  (:mod:`warehouse_assets.materialize.hour_checks`), oldest first. Left to Dagster's automation, each table and hour
  would get a run of its own (120 runs per simulated day, each starting a process), which flooded the run queue.

Both fallbacks wait while an ingestion run (or a ``taint_repair`` run re-ingesting hours) is in flight: it reports and
judges the hours it completes, and doing it here too would race it. Hours older than the dependency center's lookback
are checked by hand (execute the table's checks on the partition in the UI).
"""

import hashlib
import json
import time
from datetime import datetime

from dagster import (
    AssetKey,
    DagsterInstance,
    DagsterRunStatus,
    DefaultSensorStatus,
    JobDefinition,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from resources.delta_lake import DeltaLakeResource
from resources.landing import LandingResource
from resources.settings import current
from warehouse_assets.catalog import Catalog, business_zone
from warehouse_assets.center.late_data import LOOKBACK
from warehouse_assets.center.taint import reingest_in_flight
from warehouse_assets.ingest.job import IN_FLIGHT, ingestion_in_flight
from warehouse_assets.ingest.merge import pending_segments
from warehouse_assets.ingest.readiness import readiness_events, reported_ingested_rows, unreported_changes
from warehouse_assets.materialize.hour_checks import JOB, RETRY_AFTER, checked_tables, next_batch, unchecked_hours
from warehouse_assets.materialize.validity import taint_times

INGEST_PRIORITY = ("dagster/priority", "1")
ACTIVE = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]


def reporting_run(instance: DagsterInstance) -> str | None:
    """The id of a run in flight that merges ODS hours and reports and judges them itself: an ingestion run or a
    re-ingest."""
    return ingestion_in_flight(instance) or reingest_in_flight(instance)


def build_landing_sensor(catalog: Catalog, ingest_job: JobDefinition):  # type: ignore[no-untyped-def]
    @sensor(
        name="ods_landing",
        job=ingest_job,
        minimum_interval_seconds=current().ods_sensor_interval,
        default_status=DefaultSensorStatus.RUNNING,
        description="Launches ods_ingest when CDC segments are waiting to be applied.",
    )
    def ods_landing(
        context: SensorEvaluationContext, lake: DeltaLakeResource, landing: LandingResource
    ) -> RunRequest | SkipReason:
        active = context.instance.get_runs_count(RunsFilter(job_name=ingest_job.name, statuses=ACTIVE))
        if active:
            return SkipReason("an ods_ingest run is already queued or running")
        store, land = lake.store(), landing.landing()
        pending = {t.fqn: pending_segments(store, land, t) for t in catalog.ods()}
        waiting = {fqn: segs for fqn, segs in pending.items() if segs}
        if not waiting:
            return SkipReason("no pending segments")
        heads: dict[str, int] = {}
        for segs in waiting.values():
            for seg in segs:
                heads[seg.stream] = max(heads.get(seg.stream, 0), seg.seq)
        digest = hashlib.sha1("|".join(f"{k}:{v}" for k, v in sorted(heads.items())).encode()).hexdigest()[:16]
        counts = ", ".join(f"{fqn} {len(segs)}" for fqn, segs in waiting.items())
        context.log.info(f"pending segments: {counts}")
        # first in the queue: every other run waits for the hours it reports (the engine's runs queue below zero)
        return RunRequest(
            run_key=f"ingest-{digest}", tags={"warehouse/pending": counts[:200], INGEST_PRIORITY[0]: INGEST_PRIORITY[1]}
        )

    return ods_landing


def build_readiness_sensor(catalog: Catalog):  # type: ignore[no-untyped-def]
    @sensor(
        name="ods_readiness",
        minimum_interval_seconds=current().ods_sensor_interval,
        default_status=DefaultSensorStatus.RUNNING,
        asset_selection=[AssetKey(t.key) for t in [*catalog.ods(), *catalog.windows()]],
        description=(
            "Reports an ODS hour as materialized once every shard stream is applied past its end and the rows "
            "ingested for it reach the completeness threshold of the source's count, when no ingestion run did; "
            "re-reports late changes."
        ),
    )
    def ods_readiness(
        context: SensorEvaluationContext, lake: DeltaLakeResource, landing: LandingResource
    ) -> SensorResult | SkipReason:
        running = reporting_run(context.instance)
        if running:  # it reports the hours it completes: reporting them here too would race it
            return SkipReason(f"ingestion run {running} is in flight; it reports the hours it completes")
        cursor = json.loads(context.cursor) if context.cursor else {}
        store, land = lake.store(), landing.landing()
        events, new_cursor = readiness_events(
            store,
            land,
            catalog,
            cursor,
            lambda t: set(context.instance.get_materialized_partitions(AssetKey(t.key))),
            reported_rows=reported_ingested_rows(context.instance),
            changed={
                t.fqn: unreported_changes(context.instance, store, t, land.timezone, tainted_at=taint_times)
                for t in catalog.ods()
            },
        )
        # a run launched while this tick read the lake may have merged an hour it has not reported yet
        running = reporting_run(context.instance)
        if running:
            return SkipReason(f"ingestion run {running} started during the tick; it reports the hours it completes")
        if not events:
            if new_cursor != cursor:
                return SensorResult(cursor=json.dumps(new_cursor, sort_keys=True))
            return SkipReason("no ODS hour became ready")
        context.log.info(
            f"{len(events)} ODS hour(s) ready: "
            + ", ".join(f"{'/'.join(e.asset_key.path)} {e.partition}" for e in events[:10])
            + (" …" if len(events) > 10 else "")
        )
        return SensorResult(asset_events=events, cursor=json.dumps(new_cursor, sort_keys=True))

    return ods_readiness


def build_ods_checks_sensor(catalog: Catalog, ods_quality_checks: JobDefinition) -> SensorDefinition:
    """The sensor launching ``ods_quality_checks`` (:mod:`warehouse_assets.materialize.hour_checks`) for unchecked
    hours."""
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
        ingesting = reporting_run(instance)
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
