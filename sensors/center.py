"""The ``dependency_center`` sensor: the dependency center's face in the UI.

The engine (:mod:`warehouse_assets.center.engine`) starts the derived tables' runs from a process of its own; this
sensor targets those tables, so that each one's Automation tab names it, and its ticks show what the engine did and
its heartbeat (:mod:`warehouse_assets.center.heartbeat`): a skipped tick whose cursor, which the tick list shows in a
column of its own, says how many runs the engine launched since the previous tick (in the seconds it names, so that
no run is counted by two ticks) and that it is alive, and whose skip reason and log carry the whole heartbeat (how
far its cursor is behind the event log, its backlog, its latest submissions); a failed tick when the engine stopped,
died or hangs. It never requests a run itself: the engine's runs name it as their "Launched by", and the tick list's
"0 runs requested" counts the sensor's own requests only.
"""

from dagster import (
    AssetKey,
    AssetSelection,
    DefaultSensorStatus,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from warehouse_assets.catalog import Catalog
from warehouse_assets.center.heartbeat import SENSOR_NAME, tick_text

TICK_SECONDS = 30


def build_dependency_center_sensor(catalog: Catalog) -> SensorDefinition:
    @sensor(
        name=SENSOR_NAME,
        asset_selection=AssetSelection.assets(*[AssetKey(t.key) for t in catalog.derived()]),
        minimum_interval_seconds=TICK_SECONDS,
        default_status=DefaultSensorStatus.RUNNING,
        description=(
            "The dependency center: its engine starts each partition of these tables once every upstream partition "
            "it needs is materialized and passed its blocking checks. Each tick's cursor says how many runs the "
            "engine launched since the previous tick, in the seconds it names, and that it is alive; hovering the "
            "tick's \"0 runs requested\" (the sensor's own requests: it makes none) shows its whole heartbeat. A "
            "failed tick means the engine is not running."
        ),
    )
    def dependency_center(context: SensorEvaluationContext) -> SensorResult:
        # an engine that is down raises EngineDown: the tick fails with its message
        said = tick_text(context.instance, context.cursor)
        context.log.info(said.message)
        return SensorResult(skip_reason=SkipReason(said.message), cursor=said.line)

    return dependency_center
