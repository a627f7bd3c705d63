"""The embedded default's clock: keeps the simulated CDC source producing as wall-clock time passes.

Only active when the resource ``landing`` says ``simulate_live`` (``warehouse dev`` turns it on) and the
landing area was made by the simulator. Real sources never go through this sensor.
"""

from datetime import datetime
from zoneinfo import ZoneInfo

from dagster import DefaultSensorStatus, SensorEvaluationContext, SkipReason, sensor

from resources.landing import LandingResource
from resources.simulator import append, read_simulation


@sensor(
    name="simulated_source",
    minimum_interval_seconds=60,
    default_status=DefaultSensorStatus.RUNNING,
    description="Extends the simulated CDC source up to now (embedded default only).",
)
def simulated_source(context: SensorEvaluationContext, landing: LandingResource) -> SkipReason:
    if not landing.simulate_live:
        return SkipReason("live simulation is off (WAREHOUSE_SIMULATE_LIVE); sources are real")
    root = landing.landing().root
    recorded = read_simulation(root)
    if recorded is None:
        return SkipReason(f"{root} was not made by the simulator")
    now = datetime.now(ZoneInfo(recorded[0].tz)).replace(tzinfo=None)
    summary = append(root, now)
    return SkipReason(f"simulated source now reaches {summary.end} ({summary.messages} new messages)")
