"""A partition's state as a user sees it in the UI: a day of ``dws.revenue_usd_daily`` built estimated (on the
previous day's CNY→USD rate), then built again completed once the day's own rate arrived. The asset's page for that
partition shows, at the top of its metadata, the state its latest materialization reached.

The builds run in this process (``materialize`` on the table's asset, as a run of the engine would), on an instance
Dagster's webserver serves at the same time; a headless Chromium reads the page after each build.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance
from pyspark.sql import SparkSession

from resources.delta_lake import DeltaLakeResource
from resources.external import ExternalResource
from resources.spark import SparkResource
from simulator.external import arrival, simulate_external
from tests.ingest.test_external import (
    FIRST,
    FX,
    REVENUE,
    SEED,
    TZ,
    Clock,
    Daemon,
    _materialize,
    day,
    report,
    seed_paid_day,
)
from tests.support.ui import chromium, needs_browser, shoot, sqlite_home, wait_for_text, webserver
from warehouse_assets.materialize.gate import STATE

pytestmark = [pytest.mark.stack, needs_browser, pytest.mark.timeout(600)]  # a webserver, Chromium, builds


def test_the_partition_page_shows_the_state_its_latest_build_reached(tmp_path: Path, spark: SparkSession) -> None:
    home, external = sqlite_home(tmp_path), tmp_path / "external"
    before = arrival(SEED, "fx_rate", FIRST + timedelta(days=1), TZ) - timedelta(minutes=1)
    simulate_external(external, FIRST, before, SEED)  # day 0's rate is in, day 1's is not
    seed_paid_day(spark, tmp_path / "lake", day(1))
    resources = {
        "spark": SparkResource(),
        "lake": DeltaLakeResource(root=str(tmp_path / "lake")),
        "external": ExternalResource(root=str(external)),
    }
    page = f"/assets/dws/revenue_usd_daily?view=partitions&partition={day(1)}"
    instance = DagsterInstance.from_config(str(home))
    try:
        report(instance, AssetKey(["dws", "user_order_daily"]), day(1))
        rates = Daemon(instance, external, FX, Clock(before))
        rates.tick()
        assert _materialize(instance, REVENUE, day(1), resources)[STATE] == {day(1): "estimated"}
        with webserver(tmp_path, home) as url, chromium(url) as browser:
            browser.get(url + page)
            # the first row of the partition's metadata
            wait_for_text(browser, rf'Metadata\s+state\s+\{{\s*"{day(1)}": "estimated"')
            shoot(browser, tmp_path, "ui-partition-estimated")

            simulate_external(external, FIRST, before + timedelta(minutes=2), SEED)  # day 1's rate arrives
            rates.clock.now = before + timedelta(minutes=2)
            rates.tick()
            assert _materialize(instance, REVENUE, day(1), resources)[STATE] == {day(1): "completed"}
            browser.get(url + page)
            wait_for_text(browser, rf'Metadata\s+state\s+\{{\s*"{day(1)}": "completed"')
            shoot(browser, tmp_path, "ui-partition-completed")
    finally:
        instance.dispose()
