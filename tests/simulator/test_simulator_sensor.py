"""The embedded default's clock sensor extends a simulated landing area up to now, and only that."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

from dagster import build_sensor_context

from resources.external import ExternalResource
from resources.landing import LandingResource
from simulator.cdc import SimulationConfig, read_simulation, simulate
from simulator.sensor import simulated_source

TZ = ZoneInfo("Asia/Shanghai")


def test_live_simulation_catches_up_with_the_clock(tmp_path: Path) -> None:
    now = datetime.now(TZ).replace(tzinfo=None, second=0, microsecond=0)
    start = (now - timedelta(hours=2)).replace(minute=0)
    simulate(tmp_path, start, start + timedelta(hours=1), SimulationConfig(scale=0.02))
    before = read_simulation(tmp_path)
    assert before is not None
    external = ExternalResource(root=str(tmp_path / "external"))
    result = simulated_source(
        build_sensor_context(
            resources={"landing": LandingResource(root=str(tmp_path), simulate_live=True), "external": external}
        )
    )
    after = read_simulation(tmp_path)
    assert after is not None and after[2] > before[2]
    assert after[2] > datetime.now(TZ) - timedelta(minutes=6)
    assert "now reaches" in str(result.skip_message)
    # the external producers follow the same clock (what is due by now; they record their progress)
    assert "external deliveries" in str(result.skip_message)
    assert (tmp_path / "external" / "simulation.json").is_file()


def test_real_sources_are_left_alone(tmp_path: Path) -> None:
    external = ExternalResource(root=str(tmp_path / "external"))
    result = simulated_source(
        build_sensor_context(resources={"landing": LandingResource(root=str(tmp_path)), "external": external})
    )
    assert "live simulation is off" in str(result.skip_message)
    result = simulated_source(
        build_sensor_context(
            resources={"landing": LandingResource(root=str(tmp_path), simulate_live=True), "external": external}
        )
    )
    assert "not made by the simulator" in str(result.skip_message)
    assert not any(tmp_path.iterdir())
