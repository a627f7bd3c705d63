"""``WAREHOUSE_START``: where every table's partitions begin, validated, and set by ``warehouse dev``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

from simulator.cdc import SimulationConfig, append, simulate
from warehouse_assets.cli.common import warehouse_start

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json
from warehouse_assets.catalog import BY_PERIOD
print(json.dumps({p: d.get_first_partition_key() for p, d in BY_PERIOD.items()}))
"""


def _probe(start: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "WAREHOUSE_START"}
    if start is not None:
        env["WAREHOUSE_START"] = start
    return subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_first_partitions_follow_the_start_weeks_and_months_only_whole() -> None:
    default = _probe(None)
    assert default.returncode == 0, default.stderr
    assert json.loads(default.stdout) == {  # 2026-01-01 is a Thursday
        **{minutes: "2026-01-01-00:00" for minutes in ("5min", "10min", "15min")},  # mini-batch windows
        "hourly": "2026-01-01-00:00",
        "daily": "2026-01-01",
        "weekly": "2026-01-05",
        "monthly": "2026-01-01",
    }
    wednesday = _probe("2026-03-04")
    assert wednesday.returncode == 0, wednesday.stderr
    assert json.loads(wednesday.stdout) == {
        **{minutes: "2026-03-04-00:00" for minutes in ("5min", "10min", "15min")},
        "hourly": "2026-03-04-00:00",
        "daily": "2026-03-04",
        "weekly": "2026-03-09",  # the first Monday on or after: a week reaching before the start never completes
        "monthly": "2026-04-01",
    }
    monday = json.loads(_probe("2026-03-02").stdout)
    assert monday["weekly"] == "2026-03-02" and monday["monthly"] == "2026-04-01"


def test_a_malformed_start_is_a_clear_error() -> None:
    for bad in ("2026-3-4", "2026-02-30"):
        result = _probe(bad)
        assert result.returncode != 0
        assert "WAREHOUSE_START must be the first day of the warehouse's data as YYYY-MM-DD" in result.stderr
        assert repr(bad) in result.stderr


def test_dev_starts_the_warehouse_on_the_first_simulated_day_across_restarts(tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    env = {"WAREHOUSE_LANDING_ROOT": str(landing)}
    assert warehouse_start(env) is None  # no simulation: the default of partitions.py
    simulate(landing, datetime(2026, 3, 4), datetime(2026, 3, 4, 0, 30), SimulationConfig(scale=0.01))
    assert warehouse_start(env) == "2026-03-04"
    append(landing, datetime(2026, 3, 5, 1, 0))  # a restart a day later extends the same simulation
    assert warehouse_start(env) == "2026-03-04"
    assert warehouse_start({**env, "WAREHOUSE_START": "2026-03-01"}) == "2026-03-01"  # the user's value wins


def test_every_command_works_from_the_simulated_start(tmp_path: Path) -> None:
    """`warehouse status` (like `why` and the others) run by hand in another shell, with nothing exported, uses the
    start `warehouse dev` derives from the simulated landing area, not the settings' default."""
    landing = tmp_path / "landing"
    simulate(landing, datetime(2026, 3, 4), datetime(2026, 3, 4, 0, 30), SimulationConfig(scale=0.01))
    env = {k: v for k, v in os.environ.items() if k != "WAREHOUSE_START"}
    env.update(WAREHOUSE_LANDING_ROOT=str(landing), DAGSTER_HOME=str(tmp_path / "home"))
    done = subprocess.run(
        [sys.executable, "-m", "warehouse_assets.cli", "status"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "warehouse start: 2026-03-04" in done.stdout, done.stdout + done.stderr
