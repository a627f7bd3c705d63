"""The ``freshness_slas`` sensor: exactly one freshness check evaluation per partition, when its deadline passes.

The rule each tick applies (which deadlines are judged, the backlog of a first start, the cursor) is
:func:`warehouse_assets.build.freshness.deadline_tick`; the sensor reports its verdicts as partitioned
``AssetCheckEvaluation`` events (``SensorResult(asset_events=...)``), which the daemon stores run-less, per partition.
"""

from datetime import timedelta

from dagster import (
    DefaultSensorStatus,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from resources.landing import LandingResource
from resources.settings import Settings, current
from warehouse_assets.build.freshness import (
    Clock,
    DeadlineCursor,
    Landed,
    data_available,
    deadline_tick,
    first_materialized,
    judged,
    log_tick,
    now_in_business_tz,
)
from warehouse_assets.build.quality import evaluation
from warehouse_assets.catalog import Catalog


def build_freshness_sensor(
    catalog: Catalog, clock: Clock = now_in_business_tz, settings: Settings | None = None
) -> SensorDefinition:
    settings = settings or current()
    horizon = timedelta(hours=settings.freshness_horizon_hours)
    watched = [t.fqn for t in catalog if t.sla is not None]

    @sensor(
        name="freshness_slas",
        minimum_interval_seconds=settings.freshness_sensor_interval,
        default_status=DefaultSensorStatus.RUNNING,
        description=f"Judges each partition's freshness SLA once its deadline passes ({', '.join(watched)}).",
    )
    def _freshness(context: SensorEvaluationContext, landing: LandingResource) -> SensorResult:
        source = landing.landing()
        cache: Landed = {}  # per tick: the landed segments of each stream
        tick = deadline_tick(
            catalog,
            lambda table, key: first_materialized(context.instance, table, key),
            DeadlineCursor.load(context.cursor),
            clock(),
            lambda table, key: judged(context.instance, table, key),
            lambda table, key: data_available(context.instance, catalog, source, table, key, cache),
            horizon,
        )
        log_tick(context.log, tick)
        if not tick.verdicts:
            return SensorResult(skip_reason=SkipReason("no partition reached its deadline"), cursor=tick.cursor.dump())
        events = [evaluation(context.instance, table, outcome) for table, outcome in tick.verdicts]
        return SensorResult(asset_events=events, cursor=tick.cursor.dump())

    return _freshness
