"""The ``freshness_slas`` sensor: exactly one freshness check evaluation per partition, when its deadline passes; and
the ``sla_forecast`` sensor: a warning before the deadline for each partition predicted to miss it.

The rule each tick applies (which deadlines are judged, the backlog of a first start, the cursor) is
:func:`warehouse_assets.materialize.freshness.deadline_tick`; the sensor reports its verdicts as partitioned
``AssetCheckEvaluation`` events (``SensorResult(asset_events=...)``), which the daemon stores run-less, per partition.
The warnings' rule is :func:`warehouse_assets.explain.forecast.forecast_tick`, reported the same way.
"""

import json
from datetime import timedelta

from dagster import (
    AssetCheckEvaluation,
    DefaultSensorStatus,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from resources.landing import LandingResource
from resources.settings import Settings, current
from warehouse_assets.catalog import Catalog, business_zone
from warehouse_assets.center.reverse_index import ReverseIndex
from warehouse_assets.center.state_store import PartitionStateStore
from warehouse_assets.explain.eta_instance import instance_predictor
from warehouse_assets.explain.forecast import day_predictions, forecast_tick, warning_evaluation
from warehouse_assets.explain.forecast import timeline_markdown as timeline
from warehouse_assets.explain.prediction_log import FORECAST, record_predictions
from warehouse_assets.materialize.freshness import (
    FORECAST_CHECK_NAME,
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
from warehouse_assets.materialize.freshness import deadline as sla_deadline
from warehouse_assets.materialize.quality import evaluation

# the partitions whose deadline falls within this span ahead are predicted at each tick
FORECAST_HORIZON = timedelta(hours=24)


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


def build_forecast_sensor(
    catalog: Catalog, clock: Clock = now_in_business_tz, settings: Settings | None = None
) -> SensorDefinition:
    settings = settings or current()
    watched = [t.fqn for t in catalog if t.sla is not None]
    indexes: list[ReverseIndex] = []  # built at the first tick, kept: its calendars extend as time passes

    @sensor(
        name="sla_forecast",
        minimum_interval_seconds=settings.freshness_sensor_interval,
        default_status=DefaultSensorStatus.RUNNING,
        description=(
            "Predicts when each partition due within the next "
            f"{FORECAST_HORIZON.total_seconds() / 3600:.0f} h will be ready and warns (the sla_forecast check, "
            f"severity WARN) before the deadline of each predicted to miss it ({', '.join(watched)})."
        ),
    )
    def _forecast(context: SensorEvaluationContext, landing: LandingResource) -> SensorResult:
        now = clock()
        if not indexes:
            indexes.append(ReverseIndex.build(catalog, current_time=now))
        store = PartitionStateStore(context.instance)
        try:
            # the landed hours: what waits for the ingestion is not late at its source
            predictor = instance_predictor(
                context.instance, catalog, store.view(), now, indexes[0], landing=landing.landing()
            )
            tick = forecast_tick(
                catalog,
                predictor,
                json.loads(context.cursor) if context.cursor else {},
                FORECAST_HORIZON,
                lambda table, key: judged(context.instance, table, key, FORECAST_CHECK_NAME),
            )
            # each prediction beside its deadline, to be scored against its finish (``warehouse eta --accuracy``)
            due = {
                (p.table, p.partition): sla_deadline(catalog[p.table], p.partition).timestamp()
                for p in tick.predictions
            }
            record_predictions(context.instance, tick.predictions, predictor.now, FORECAST, due, context.log)
            events: list[AssetCheckEvaluation] = []
            for warning in tick.warnings:
                context.log.warning(f"{warning.table.fqn} {warning.partition}: {warning.describe()}")
                day = warning.partition[:10]  # the day the partition starts in: the day's ADS figures are drawn
                shown = day_predictions(catalog, predictor, day)
                if all(p.table != warning.table.fqn for p in shown):
                    shown.insert(0, warning.prediction)
                title = f"predicted finish of {day}"
                events.append(warning_evaluation(warning, timeline(shown, business_zone(), title)))
        finally:
            store.close()
        cursor = json.dumps(tick.warned, sort_keys=True)
        context.log.info(f"{len(tick.predictions)} partition(s) due within the horizon predicted, {len(events)} warned")
        if not events:
            return SensorResult(skip_reason=SkipReason("no partition predicted to miss its SLA"), cursor=cursor)
        return SensorResult(asset_events=events, cursor=cursor)

    return _forecast
