"""``bench/automation_scale.py``'s simulated day, small: the dependency center builds every partition of the day once.

The bench's closed loop on its synthetic catalog of 40 tables (hourly, daily, weekly and monthly tables, T-1 and T-7,
sliding windows, a month on its hours and days): the root hours of the last day of a year reported one after the
other into a real event log, the state store reading them by cursor, the resolver requesting runs, every run's
partitions reported in turn. At the end, every partition whose window ended within the day was requested exactly
once and nothing else, so the figures the bench prints are those of the whole day's work. No Spark, no definitions.
"""

from __future__ import annotations

import sys
from datetime import date, datetime, time, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from dagster import DagsterInstance

from resources.settings import Settings, using
from warehouse_assets.catalog import load_catalog
from warehouse_assets.center.resolver import Resolver
from warehouse_assets.center.reverse_index import ReverseIndex
from warehouse_assets.center.state_store import PartitionStateStore
from warehouse_assets.materialize.compiler import max_partitions_per_run

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import automation_scale as bench  # noqa: E402


@pytest.fixture
def instance(consolidated: DagsterInstance) -> DagsterInstance:
    return consolidated  # one SQLite event log (tests/conftest.py): quick to write to


def simulate(instance: DagsterInstance, root: Path, tables: int, budget: float | None) -> dict[str, Any]:
    settings = Settings.from_env({"WAREHOUSE_START": bench.BENCH_START})
    with using(settings):
        bench.generate_catalog(root, tables, seed=7)
        catalog = load_catalog(root)
        day = datetime.combine(
            date.fromisoformat(bench.BENCH_START) + timedelta(days=364), time(), ZoneInfo(settings.timezone)
        )
        store = PartitionStateStore(instance)
        calendars = bench.Calendars(day.timestamp() + 2 * 86400)
        assert bench.seed_history(store, catalog, calendars, day.timestamp(), days=62) > 0
        resolver = Resolver(
            catalog, ReverseIndex.build(catalog, current_time=day + timedelta(days=2)), store, max_partitions_per_run
        )
        try:
            feed = bench.LogFeed(instance, store)
            return bench.simulate_day(catalog, resolver, feed, calendars, day.timestamp(), budget)
        finally:
            resolver.close()
            store.close()


@pytest.mark.parametrize("budget", [None, 0.0], ids=["whole-calls", "one-candidate-per-call"])
def test_a_simulated_day_requests_every_partition_of_the_day_exactly_once(
    instance: DagsterInstance, tmp_path: Path, budget: float | None
) -> None:
    # budget 0: every call evaluates one candidate and leaves the rest to a backlog, the engine's slicing at its
    # most extreme; the day must come out the same
    day = simulate(instance, tmp_path / "tables", tables=40, budget=budget)
    assert day["expected"] > 24 * 5  # the hours of the roots, and more
    assert (day["built"], day["missed"], day["built_twice"], day["unexpected"]) == (day["expected"], 0, 0, 0)
    assert 0 < day["runs"] <= day["built"]
    assert day["changes"] == day["built"]  # every completion was fed, and nothing else
    if budget is None:
        assert (day["events"], day["sliced_calls"]) == (day["built"], 0)  # one call per change
    else:
        assert day["sliced_calls"] > 0  # calls left a backlog, and the day is the same
