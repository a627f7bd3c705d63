"""Where the sources are simulated faster than real time, the dependency center's time rules run on their clock
(``WAREHOUSE_CLOCK``): a late-data policy's grace and interval are simulated minutes, not real ones.

The engine is assembled as ``warehouse engine`` assembles it, without a clock of its own: it takes the settings'.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from dagster import AssetKey, DagsterInstance

from resources.clock import Clock
from resources.settings import Settings, using
from tests.center.test_center import hours
from tests.center.test_engine_catalog import Recorder
from tests.center.test_state_store import report
from tests.support.small_catalog import VALUED_ODS, sql_catalog
from warehouse_assets.center.engine import assemble_engine
from warehouse_assets.center.ledger import open_readonly
from warehouse_assets.center.state_store import default_path
from warehouse_assets.materialize.compiler import max_partitions_per_run

TZ = ZoneInfo("Asia/Shanghai")
DAY = "2026-03-05"
JUST_CLOSED = datetime(2026, 3, 6, 0, 15, tzinfo=TZ)  # a quarter of an hour after the day ended


def test_the_clock_runs_from_its_start_at_its_speed_and_stands_before_its_anchor() -> None:
    anchor = time.time() - 60
    clock = Settings.from_env({"WAREHOUSE_CLOCK": f"{JUST_CLOSED.isoformat()}@{anchor}*240"}).center_clock
    assert clock.simulated
    # a minute of real time is four simulated hours (give or take the seconds this test takes)
    assert timedelta(hours=4) <= clock.now() - JUST_CLOSED < timedelta(hours=4, minutes=20)
    assert Clock.parse(f"{JUST_CLOSED.isoformat()}@{time.time() + 3600}*240").now() == JUST_CLOSED
    real = Settings.from_env({}).center_clock
    assert not real.simulated and abs((real.now() - datetime.now(UTC)).total_seconds()) < 5


@pytest.mark.parametrize(
    "value", ["2026-03-06T00:15:00@0*240", "2026-03-06T00:15:00+08:00@0*0.5", "yesterday", "2026-03-06T00:15+08:00@x*2"]
)
def test_a_bad_clock_is_an_error_naming_the_variable(value: str) -> None:
    with pytest.raises(ValueError) as error:
        Settings.from_env({"WAREHOUSE_CLOCK": value})
    assert "WAREHOUSE_CLOCK: expected START@ANCHOR*SPEED" in str(error.value)


def test_the_engine_keeps_the_late_data_policy_on_the_simulated_clock(
    consolidated: DagsterInstance, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The day's build, then a late change a simulated quarter of an hour after the day ended: within the grace hour,
    rebuilt at once. A second late change waits for the declared 60-minute interval, due 60 simulated minutes after it
    was seen. On real time (months after that day) the engine would not even build the day: beyond its lookback."""
    catalog = sql_catalog(
        tmp_path_factory.mktemp("catalog"),
        {"dwd/day.sql": ("period: daily\nlate_data: {rebuild: every 60m}\n", "SELECT id, v FROM ods.src")},
        ods=VALUED_ODS,
    )
    instance, recorder = consolidated, Recorder()
    ods, day = AssetKey(["ods", "src"]), AssetKey(["dwd", "day"])
    standing = f"{JUST_CLOSED.isoformat()}@{time.time() + 3600}*240"  # stands at JUST_CLOSED during the test
    with using(Settings(clock=standing)):
        engine = assemble_engine(instance, catalog, recorder, max_partitions_per_run)
    try:
        assert engine.clock() == JUST_CLOSED
        for hour in hours(DAY):
            report(instance, ods, hour)
        engine.tick()
        assert [plan.partitions for plan in recorder.plans] == [(DAY,)]  # the first build
        report(instance, day, DAY)
        engine.tick()
        report(instance, ods, f"{DAY}-23:00")  # late: the day settling, within the grace
        engine.tick()
        assert [plan.partitions for plan in recorder.plans] == [(DAY,), (DAY,)]
        report(instance, day, DAY)
        engine.tick()
        report(instance, ods, f"{DAY}-22:00")  # late again: the first rebuild was done, the interval counts
        engine.tick()
        assert len(recorder.plans) == 2
        ledger = open_readonly(default_path(instance))
        assert ledger is not None
        try:
            [stale] = ledger.all_stale()
        finally:
            ledger.close()
        assert (stale.table, stale.partition) == ("dwd.day", DAY)
        assert stale.due == (JUST_CLOSED + timedelta(minutes=60)).timestamp()
    finally:
        engine.close()
