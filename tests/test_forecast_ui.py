"""The predicted finish as an on-call engineer meets it in the UI: a partition warned by the SLA forecast shows, on
its ``sla_forecast`` check, the day's timeline (each daily ADS partition's predicted time and critical path).

The instance holds ``ods.order`` as a slow source (each hour delivered 9 hours after it ends); the ``sla_forecast``
sensor, ticked at a pinned 07:00, predicts the day's GMV past its 09:00 deadline and warns, and its evaluations are
stored as the daemon stores them. Dagster's webserver serves the real code location of ``workspace.yaml`` over that
instance, and a headless Chromium opens the warned partition. No Spark, no run: the forecast reads the instance only.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from dagster import DagsterInstance, SensorResult, build_sensor_context
from dagster._core.test_utils import freeze_time
from selenium.webdriver.common.by import By

from resources.landing import LandingResource
from sensors.freshness import build_forecast_sensor
from tests.center.test_eta import DAY, SLOW_NOW, deliver_slowly
from tests.support.ui import chromium, clickable, needs_browser, shoot, sqlite_home, wait_for_text, webserver
from warehouse_assets.catalog import load_catalog

pytestmark = [pytest.mark.stack, needs_browser, pytest.mark.timeout(600)]  # a webserver, Chromium

WARNED = r"Description\s+predicted ready ~03-03 09:15, 15 min after its deadline 2026-03-03 09:00"

# the GMV's row of the day's timeline: its predicted time, its critical path and what sets it
GMV_ROW = (
    f"ads.daily_gmv {DAY} 03-03 09:15 ods.order {DAY}-23:00 → dwd.order_detail {DAY} → dws.user_order_daily {DAY} "
    f"→ ads.daily_gmv {DAY} ods.order {DAY}-23:00 arrives ~03-03 09:00"
)


def test_a_warned_partition_shows_the_days_timeline_of_predictions(tmp_path: Path) -> None:
    catalog = load_catalog()
    home = sqlite_home(tmp_path)
    instance = DagsterInstance.from_config(str(home))
    try:
        deliver_slowly(instance, catalog)
        landing = {"landing": LandingResource(root=str(tmp_path / "landing"))}  # nothing landed: the hours are late
        result = build_forecast_sensor(catalog, clock=lambda: SLOW_NOW)(
            build_sensor_context(instance=instance, resources=landing)
        )
        assert isinstance(result, SensorResult)
        warned = {(e.asset_key.to_user_string(), e.partition) for e in result.asset_events}
        assert ("ads/daily_gmv", DAY) in warned
        with freeze_time(SLOW_NOW):  # as the daemon stores a sensor's events
            for event in result.asset_events:
                instance.report_runless_asset_event(event)
    finally:
        instance.dispose()

    with webserver(tmp_path, home) as url, chromium(url) as browser:
        browser.get(f"{url}/assets/ads/daily_gmv?view=checks&checkDetail=sla_forecast")
        # the check's own Partitions tab (a tab button of the check's panel, below the asset's tabs)
        clickable(browser, "(//button[@role='tab' and @title='Partitions'])[last()]").click()
        search = clickable(browser, "//input[@placeholder='Filter by partition…']")
        search.send_keys(DAY)
        clickable(browser, f"//*[@data-tooltip='{DAY}']").click()
        wait_for_text(browser, WARNED)
        shoot(browser, tmp_path, "ui-forecast-partition")
        # the timeline is longer than the UI shows inline: it opens from the metadata's link
        clickable(browser, "//*[contains(text(), 'Show Markdown')]").click()
        wait_for_text(browser, rf"title predicted finish of {DAY}")  # the Gantt chart's source
        # the Markdown table rendered as a table: a row per daily ADS table of the day
        rows = [r.text for r in browser.find_elements(By.XPATH, "//*[@role='dialog']//table//tr")]
        assert rows[0] == "partition predicted critical path set by", rows
        assert GMV_ROW in rows, rows
        daily_ads = sorted(t.fqn for t in catalog if t.layer == "ads" and t.period == "daily")
        regions = ("shanghai", "karachi", "utc", "los_angeles")  # a table with regions: a row per region's day
        expected = [
            (t, k) for t in daily_ads for k in ([f"{DAY}|{r}" for r in regions] if t == "ads.dau_by_region" else [DAY])
        ]
        assert [tuple(r.split()[:2]) for r in rows[1:]] == expected, rows
        shoot(browser, tmp_path, "ui-forecast-timeline")
