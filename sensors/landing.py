"""Starts the ODS ingestion job when new CDC segments land (one run at a time)."""

import hashlib

from dagster import (
    DagsterRunStatus,
    DefaultSensorStatus,
    JobDefinition,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SkipReason,
    sensor,
)

from resources.delta_lake import DeltaLakeResource
from resources.landing import LandingResource
from warehouse_assets.catalog import Catalog
from warehouse_assets.ingest.merge import pending_segments

ACTIVE = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]


def build_landing_sensor(catalog: Catalog, ingest_job: JobDefinition):  # type: ignore[no-untyped-def]
    @sensor(
        name="ods_landing",
        job=ingest_job,
        minimum_interval_seconds=15,
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
        return RunRequest(run_key=f"ingest-{digest}", tags={"warehouse/pending": counts[:200]})

    return ods_landing
