"""The ``dependency_center`` sensor: the dependency center's face in the UI.

The engine (:mod:`warehouse_assets.center.engine`) starts the derived tables' runs from a process of its own; this
sensor targets those tables, so that each one's Automation tab names it, and its ticks show the engine's heartbeat
(:mod:`warehouse_assets.center.heartbeat`): a skipped tick whose message says the engine is alive, how far its cursor
is behind the event log, its backlog and its latest submissions; a failed tick when the engine stopped, died or
hangs. It never requests a run itself: the engine's runs name it as their "Launched by".
"""

from dagster import (
    AssetKey,
    AssetSelection,
    DefaultSensorStatus,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
    sensor,
)

from warehouse_assets.catalog import Catalog
from warehouse_assets.center.heartbeat import SENSOR_NAME, engine_status

TICK_SECONDS = 30


def build_dependency_center_sensor(catalog: Catalog) -> SensorDefinition:
    @sensor(
        name=SENSOR_NAME,
        asset_selection=AssetSelection.assets(*[AssetKey(t.key) for t in catalog.derived()]),
        minimum_interval_seconds=TICK_SECONDS,
        default_status=DefaultSensorStatus.RUNNING,
        description=(
            "The dependency center: its engine starts each partition of these tables once every upstream partition "
            "it needs is materialized and passed its blocking checks. Each tick shows the engine's heartbeat; a "
            "failed tick means the engine is not running."
        ),
    )
    def dependency_center(context: SensorEvaluationContext) -> SkipReason:
        # an engine that is down raises EngineDown: the tick fails with its message
        return SkipReason(engine_status(context.instance))

    return dependency_center
