"""The embedded default's clock: keeps the simulated sources producing as wall-clock time passes.

The CDC source gets its new segments; the simulated external producers (the ad partner's files, the
finance system's Delta table, :mod:`simulator.external`) deliver whatever is due by now.

Only active when the resource ``landing`` says ``simulate_live`` (``warehouse dev`` turns it on) and the
landing area was made by the simulator. Real sources never go through this sensor.
"""

from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

from dagster import DefaultSensorStatus, SensorEvaluationContext, SkipReason, sensor

from resources.external import ExternalResource
from resources.landing import LandingResource
from simulator.cdc import append, read_simulation
from simulator.external import simulate_external


@sensor(
    name="simulated_source",
    minimum_interval_seconds=60,
    default_status=DefaultSensorStatus.RUNNING,
    description="Extends the simulated CDC source up to now (embedded default only).",
)
def simulated_source(
    context: SensorEvaluationContext, landing: LandingResource, external: ExternalResource
) -> SkipReason:
    if not landing.simulate_live:
        return SkipReason("live simulation is off (WAREHOUSE_SIMULATE_LIVE); sources are real")
    root = landing.landing().root
    recorded = read_simulation(root)
    if recorded is None:
        return SkipReason(f"{root} was not made by the simulator")
    config, start, _ = recorded
    now = datetime.now(ZoneInfo(config.tz))
    summary = append(root, now.replace(tzinfo=None))
    delivered = simulate_external(Path(external.root), start.date(), now, config.seed, config.tz)
    for ident in delivered:
        context.log.info(f"simulated external delivery: {ident}")
    return SkipReason(
        f"simulated source now reaches {summary.end} ({summary.messages} new messages); "
        f"{len(delivered)} external deliveries"
    )
