"""The ``ods_readiness`` sensor: reports each ODS hour once it is complete (:mod:`warehouse_assets.ingest.readiness`)
and no ingestion run did (the run reports the hours its commits complete, :mod:`warehouse_assets.ingest.job`): hours
whose source counts arrived after their segments were ingested, or whose run died before reporting them."""

import json

from dagster import AssetKey, DefaultSensorStatus, SensorEvaluationContext, SensorResult, SkipReason, sensor

from resources.delta_lake import DeltaLakeResource
from resources.landing import LandingResource
from warehouse_assets.catalog import Catalog
from warehouse_assets.ingest.job import ingestion_in_flight
from warehouse_assets.ingest.readiness import readiness_events, reported_ingested_rows


def build_readiness_sensor(catalog: Catalog):  # type: ignore[no-untyped-def]
    @sensor(
        name="ods_readiness",
        minimum_interval_seconds=15,
        default_status=DefaultSensorStatus.RUNNING,
        asset_selection=[AssetKey(t.key) for t in catalog.ods()],
        description=(
            "Reports an ODS hour as materialized once every shard stream is applied past its end and the rows "
            "ingested for it reach the completeness threshold of the source's count, when no ingestion run did; "
            "re-reports late changes."
        ),
    )
    def ods_readiness(
        context: SensorEvaluationContext, lake: DeltaLakeResource, landing: LandingResource
    ) -> SensorResult | SkipReason:
        running = ingestion_in_flight(context.instance)
        if running:  # it reports the hours it completes: reporting them here too would race it
            return SkipReason(f"ingestion run {running} is in flight; it reports the hours it completes")
        cursor = json.loads(context.cursor) if context.cursor else {}
        events, new_cursor = readiness_events(
            lake.store(),
            landing.landing(),
            catalog,
            cursor,
            lambda t: set(context.instance.get_materialized_partitions(AssetKey(t.key))),
            reported_rows=reported_ingested_rows(context.instance),
        )
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
