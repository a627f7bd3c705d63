"""The example warehouse over a simulated January, built once per test session for the modules that read it.

Built as the product builds history, on a small source (scale 0.03, one landing segment per shard and day): the
ingestion, the external producers' deliveries of the backfill's range, the static tables, then one backfill of the
whole graph over the first 11 days (2026-01-01 .. 01-11), launched as the UI launches one and run by the backfill
daemon's iterations (``WholeGraphBackfill``: what tests/test_backfill.py checks of it), then the rest of the month
by the headless path (``materialize_range``):

* every derived table over the first 11 days whose every upstream partition can exist (T-1 and T-7 retention, the
  self-dependent snapshots and cumulative learning from their first partition, one whole ISO week 01-05 .. 01-11),
  each table's range in one run; the hourly tables only over the 24 hours of 2026-01-05;
* the daily chain under DAU/WAU/MAU and the monthly report over the whole month, so that the 30-day window exists
  (01-30, 01-31) and ``ads.monthly_report`` 2026-01 can run on all of its days;
* January's last day of the tables reading the latest month.

The external producers deliver the days of the backfill's range and stop (their clock: ``EXTERNAL_CLOCK``), so the
tables waiting for them later in the month wait.

The source sends one hour of orders wrong: of 2026-01-05, the hour with the most paid orders confined to it, with
amounts 100 times too high (:func:`simulator.corrections.corrupt_hour`), as a source with a unit error would. The
figures equal an independent replay of what was sent (tests/test_end_to_end.py, tests/test_backfill.py), and the taint
module repairs the hour on a copy (tests/test_taint_end_to_end.py).

``BACKFILL_DAYS=31 BACKFILL_HOURLY_DAYS=31`` (`make test-backfill-month`, for tests/test_backfill.py alone) widens the
backfill to the whole graph for all of January, every hour.

The modules that read it are ``MODULES``: `make test` runs them on one worker (tests/conftest.py), which builds it
once. A module that changes the warehouse works on :meth:`ExampleWarehouse.copy`, a copy of its lake,
landing area and instance as they were built, whatever another module did to the original since.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from dagster import AssetKey, DagsterInstance, instance_for_test
from pyspark.sql import SparkSession

from resources import LandingResource, resources_from_env
from simulator.cdc import SimulationConfig, simulate
from simulator.corrections import confined_rows_of_day, corrupt_hour
from simulator.external import simulate_external_for_landing
from tests.support import oracle
from tests.support.instances import memory_backed_dir, pooled_event_log
from tests.support.repair import SYNC_RUNS, code_location, launch_backfill
from warehouse_assets.cli.headless import (
    build_static,
    materialize_range,
    report_external_deliveries,
    report_ready_hours,
    run_ingest,
)
from warehouse_assets.materialize.compiler import build_assets
from warehouse_assets.materialize.gate import backfill_partitions

GROUP = "example_warehouse"  # the unit of work of the modules reading it, on one worker
MODULES = ("tests/test_end_to_end.py", "tests/test_taint_end_to_end.py", "tests/test_backfill.py")
TZ = ZoneInfo("Asia/Shanghai")
FIRST = date(2026, 1, 1)  # the warehouse's first partition (warehouse_assets/catalog/calendars.py START)
DAYS = [FIRST + timedelta(days=n) for n in range(11)]  # the whole graph: 2026-01-01 .. 2026-01-11
MONTH = [FIRST + timedelta(days=n) for n in range(31)]  # the chain under the 30-day window and the month
HOUR_DAY = date(2026, 1, 5)  # hourly tables: its 24 hours; the day of the hour sent wrong
BACKFILL_ID = "january"
BACKFILL_DAYS = int(os.environ.get("BACKFILL_DAYS", str(len(DAYS))))  # the whole graph over the first days
BACKFILL_END = FIRST + timedelta(days=BACKFILL_DAYS)  # the backfill's range: FIRST .. the day before
# the hourly tables over HOURLY_DAYS days from HOUR_DAY, or the range's last ones where they would reach past it
HOURLY_DAYS = min(BACKFILL_DAYS, int(os.environ.get("BACKFILL_HOURLY_DAYS", "1")))
HOURLY_FROM = min(HOUR_DAY, BACKFILL_END - timedelta(days=HOURLY_DAYS))
# the ad partner's files come the next morning or later (the finance system's rates by D+2 03:30): the producers'
# clock runs a few days past the range, then stops; from its day on nothing is delivered
EXTERNAL_CLOCK = BACKFILL_END + timedelta(days=4)
BATCH_MINUTES = 1440  # one landing segment per shard and day: a month ingests in seconds
EVERY_DAY = [  # the tables the end-to-end module checks on each of DAYS (built with the rest of the graph)
    "dwd.user_snapshot",
    "dwd.course_daily",  # a snapshot: the courses as of each day, from ods.course's change stream
    "dwd.lesson_snapshot",
    "dwd.order_detail",
    "dwd.attendance_detail",
    "dws.user_order_daily",
    "dws.user_learning_daily",
    "dws.user_learning_cumulative",
    "dws.user_active_daily",
    "dws.course_attendance_weekly",
    "ads.daily_gmv",
    "ads.attendance_rate_daily",
    "ads.retention_d1",
    "ads.retention_d7",
    "ads.lesson_catalog",  # any one of its last three snapshots: from the first day on
    "ads.gmv_week_to_date",  # cumulative within the week: Thursday 1st .. Sunday 4th, then from Monday 5th afresh
    "ads.new_users_by_tier",  # reads the static dwd.city_tier, built once before its first day
]
HOURLY = ["dws.order_hourly", "ads.gmv_hourly"]
MONTH_CHAIN = [  # the rest of January, under the 30-day window and the month
    "dwd.lesson_snapshot",
    "dwd.order_detail",
    "dwd.attendance_detail",
    "dws.user_order_daily",
    "dws.user_active_daily",
]
WINDOWED = ["ads.active_users", "ads.monthly_report"]
# January's last day against the latest month: January, which has ended by then (no earlier day has a month)
MONTH_END = ["ads.daily_gmv", "ads.gmv_vs_month"]
# what the headless path builds after the backfill, unless the backfill covered the month
AFTER_BACKFILL = (
    [
        (MONTH_CHAIN, BACKFILL_END, MONTH[-1] + timedelta(days=1)),
        (WINDOWED, MONTH[0], MONTH[-1] + timedelta(days=1)),  # only the partitions that can exist run
        (MONTH_END, MONTH[-1], MONTH[-1] + timedelta(days=1)),
    ]
    if len(MONTH) > BACKFILL_DAYS
    else []
)


def at(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=TZ)


def bad_hour(landing: Path) -> tuple[datetime, set[int]]:
    """The hour of HOUR_DAY whose confined orders hold the most paid ones (where a corruption shows most), and those
    orders."""
    truth = oracle.replay(landing)["order"]
    best: tuple[int, datetime, set[int]] = (-1, datetime(2026, 1, 5), set())
    for hour, keys in confined_rows_of_day(landing, "order", HOUR_DAY).items():  # one read of a month's orders
        paid = sum(1 for k in keys if truth[k]["status"] == "paid")
        if paid > best[0]:
            best = (paid, hour, keys)
    assert best[0] > 0, "the simulation should pay orders within one hour of the 5th"
    return best[1], best[2]


@dataclass(frozen=True)
class WholeGraphBackfill:
    """The backfill that built the first days: its plan (table -> its partition keys, launched as one range of each
    table), how it ended, and each planned table's materialized partitions as it left them (before the headless path
    built the rest of the month on some of them)."""

    plan: dict[str, list[str]]
    finished: Any  # Dagster's PartitionBackfill, as stored when done
    iterations: int  # of the backfill daemon
    seconds: float
    materialized: dict[str, set[str]]


@dataclass(frozen=True)
class Copy:
    landing: Path
    lake: Path


@dataclass(frozen=True)
class ExampleWarehouse:
    landing: Path
    lake: Path
    instance: DagsterInstance
    resources: dict[str, Any]
    hour: datetime  # the hour of orders the source sent wrong
    keys: set[int]  # the orders it corrupted
    built: Path  # the lake, landing area and instance home as built
    backfill: WholeGraphBackfill

    def copy(self, root: Path, home: Path) -> Copy:
        """The warehouse as built, copied: its lake and landing area under ``root``, its instance's files into
        ``home`` (open it with ``instance_for_test(temp_dir=home, overrides=pooled_event_log(home))``)."""
        shutil.copytree(self.built / "landing", root / "landing")
        shutil.copytree(self.built / "lake", root / "lake")
        copy_instance_files(self.built / "home", home)
        return Copy(root / "landing", root / "lake")


def copy_instance_files(source: Path, dest: Path) -> None:
    """An instance's files copied, its SQLite databases through SQLite's backup (a consistent copy whatever their
    write-ahead log holds), the instance's own configuration left out (the copy's instance writes its own)."""
    for path in sorted(source.rglob("*")):
        target = dest / path.relative_to(source)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif path.name == "dagster.yaml" and path.parent == source or path.name.endswith(("-wal", "-shm")):
            continue
        elif path.suffix == ".db":
            with closing(sqlite3.connect(path)) as db, closing(sqlite3.connect(target)) as copied:
                db.backup(copied)
        else:
            shutil.copy2(path, target)


def backfill_plan() -> dict[str, list[str]]:
    """The whole graph over the backfill's range (``backfill_partitions``: the partitions whose every upstream
    partition can exist), the hourly tables over their hours only."""
    from warehouse_assets.definitions import catalog

    plan = backfill_partitions(catalog, at(FIRST), at(BACKFILL_END))
    hours = (HOURLY_FROM.isoformat(), (HOURLY_FROM + timedelta(days=HOURLY_DAYS)).isoformat())
    for fqn in [t.fqn for t in catalog.derived() if t.period == "hourly"]:
        plan[fqn] = [k for k in plan[fqn] if hours[0] <= k < hours[1]]
    return plan


def ingest_and_backfill(instance: DagsterInstance, resources: dict[str, Any]) -> WholeGraphBackfill:
    """The ingestion, the external deliveries and the static tables, as their job and sensors make them, then the
    backfill of the whole graph over the range, run by the backfill daemon's iterations over the code location (its
    lake and landing area from the environment: set by the caller)."""
    from warehouse_assets.definitions import catalog

    summary = run_ingest(instance, resources)
    end = at(BACKFILL_END)
    # the ingestion run reports every hour its commits completed (the range's, and after it what the simulated
    # sources completed), so the readiness fallback finds none left
    assert all(summary[t.fqn]["hours_reported"] >= 24 * BACKFILL_DAYS for t in catalog.ods()), summary
    assert report_ready_hours(instance, resources, until=end) == 0
    for table in catalog.ods():
        in_range = {
            k for k in instance.get_materialized_partitions(AssetKey(table.key)) if k < BACKFILL_END.isoformat()
        }
        assert len(in_range) == 24 * BACKFILL_DAYS, table.fqn  # every ODS hour of the range is ready
    assert report_external_deliveries(instance, resources) >= 2 * BACKFILL_DAYS  # both producers, every day
    # the static tables, built as their sensor builds them once the code location loads
    for static in catalog.statics():
        assert build_static(instance, resources, build_assets(catalog), static), static.fqn
    plan = backfill_plan()
    title = f"whole graph, {FIRST} .. {BACKFILL_END - timedelta(days=1)}"
    with code_location(instance) as workspace:
        finished, iterations, seconds = launch_backfill(instance, workspace, catalog, BACKFILL_ID, plan, title)
    materialized = {fqn: instance.get_materialized_partitions(AssetKey(catalog[fqn].key)) for fqn in plan}
    return WholeGraphBackfill(plan, finished, iterations, seconds, materialized)


@pytest.fixture(scope="session")
def example_warehouse(tmp_path_factory: pytest.TempPathFactory, spark: SparkSession) -> Iterator[ExampleWarehouse]:
    root = tmp_path_factory.mktemp("example_warehouse")
    landing, lake = root / "landing", root / "lake"
    simulate(
        landing,
        datetime(2026, 1, 1),
        datetime(2026, 2, 1),
        SimulationConfig(seed=11, scale=0.03, batch_minutes=BATCH_MINUTES),
    )
    hour, keys = bad_hour(landing)
    assert corrupt_hour(landing, "order", hour) == keys  # the source sends the hour wrong
    simulate_external_for_landing(landing, landing / "external", at(EXTERNAL_CLOCK))
    env = {"WAREHOUSE_LAKE_ROOT": str(lake), "WAREHOUSE_LANDING_ROOT": str(landing)}
    resources = resources_from_env(env)
    resources["landing"] = LandingResource(root=str(landing), timezone="Asia/Shanghai", segment_minutes=BATCH_MINUTES)
    # one pooled SQLite event log on memory-backed storage (tests/support/instances.py): the ingestion's ~9,000 hour
    # reports and check verdicts are stored 2.4 times faster than in Dagster's in-memory storage. Runs go straight to
    # a launcher that executes them synchronously in this process (the real daemon would queue them and launch each
    # in its own process)
    with (
        memory_backed_dir("e2e-home-") as home,
        instance_for_test(temp_dir=str(home), overrides={**SYNC_RUNS, **pooled_event_log(home)}) as instance,
    ):
        with pytest.MonkeyPatch.context() as patch:  # the code location's lake and landing area, for the build only
            for name, value in env.items():
                patch.setenv(name, value)
            backfill = ingest_and_backfill(instance, resources)
        for tables, start, end in AFTER_BACKFILL:
            ok = materialize_range(instance, resources, at(start), at(end), tables=tables, ingest=False)
            assert ok, f"the headless materialization of {tables} failed"
        # as built, for the modules that change it: before any module of the session has read or changed it
        built = tmp_path_factory.mktemp("example_warehouse_built")
        shutil.copytree(landing, built / "landing")
        shutil.copytree(lake, built / "lake")
        copy_instance_files(home, built / "home")
        yield ExampleWarehouse(landing, lake, instance, resources, hour, keys, built, backfill)
