"""Taint and repair as an on-call engineer meets them in the UI: the ``taint_repair`` job launched from the Launchpad,
its run showing the plan as Markdown, the repair backfill listed, and each tainted partition shown failed on its
asset's ``valid`` check, with the reason and the root.

The instance holds one day of the example warehouse as built (the 24 hours of ``ods.order`` and the day of the tables
reading it, reported as the product reports them); Dagster's webserver serves the real code location of
``workspace.yaml`` over it, and a headless Chromium drives it. No daemon runs, so the repair backfill stays requested
and the taint stays visible however long the page takes: what the daemon then does is tests/center/test_repair.py's
and tests/test_taint_end_to_end.py's business. No Spark either: the taint job reads the instance only.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance, DagsterRunStatus, MarkdownMetadataValue
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from tests.center.test_state_store import report
from tests.support.ui import (
    PAGE_S,
    REPOSITORY,
    button,
    chromium,
    clickable,
    needs_browser,
    shoot,
    sqlite_home,
    wait_for_text,
    webserver,
)
from warehouse_assets.catalog import load_catalog
from warehouse_assets.materialize.validity import tainted_in_instance

pytestmark = [pytest.mark.stack, needs_browser, pytest.mark.timeout(600)]  # a webserver, Chromium, a run

DAY = "2026-01-05"
START, END = f"{DAY}-08:00", f"{DAY}-17:00"
REASON = "order amounts 100x too high"
BUILT = ["dwd.order_detail", "dws.user_order_daily", "ads.daily_gmv"]  # the day, as built from the 24 hours


@dataclass
class Server:
    url: str
    home: Path

    def instance(self) -> DagsterInstance:
        return DagsterInstance.from_config(str(self.home))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("taint_ui")
    home = sqlite_home(root)
    instance = DagsterInstance.from_config(str(home))
    for hour in range(24):
        report(instance, AssetKey(["ods", "order"]), f"{DAY}-{hour:02d}:00")
    for fqn in BUILT:
        report(instance, AssetKey(fqn.split(".")), DAY)
    instance.dispose()
    with webserver(root, home) as url:
        yield Server(url, home)


@pytest.fixture(scope="module")
def browser(server: Server) -> Iterator[WebDriver]:
    with chromium(server.url) as driver:
        yield driver


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("screenshots")


@pytest.fixture(scope="module")
def taint_run(server: Server, browser: WebDriver, screenshots: Path) -> str:
    """The taint of ods.order 08:00 .. 17:00, applied from the Launchpad; its run's id, once it succeeded."""
    browser.get(f"{server.url}/locations/{REPOSITORY}/jobs/taint_repair/playground")
    WebDriverWait(browser, PAGE_S).until(lambda d: d.execute_script("return !!document.querySelector('.CodeMirror')"))
    config = (
        "ops:\n  taint_and_repair:\n    config:\n"
        f"      table: ods.order\n      start: '{START}'\n      end: '{END}'\n"
        f"      reason: {REASON}\n      by: oncall\n      apply: true\n"
    )
    browser.execute_script("document.querySelector('.CodeMirror').CodeMirror.setValue(arguments[0]);", config)
    clickable(browser, button("Launch Run")).click()
    WebDriverWait(browser, PAGE_S).until(lambda d: "/runs/" in d.current_url)
    run_id = browser.current_url.rstrip("/").split("/runs/")[1].split("?")[0]
    wait_for_text(browser, r"marked 13 partition\(s\) tainted; repair backfill \w+")
    shoot(browser, screenshots, "ui-taint-run")
    instance = server.instance()
    run = instance.get_run_by_id(run_id)
    assert run is not None and run.job_name == "taint_repair", run
    WebDriverWait(None, PAGE_S, poll_frequency=1).until(lambda _: instance.get_run_by_id(run_id).is_finished)  # type: ignore[union-attr]
    assert instance.get_run_by_id(run_id).status == DagsterRunStatus.SUCCESS  # type: ignore[union-attr]
    return run_id


def test_the_launchpad_run_shows_the_plan_and_launches_one_backfill(
    server: Server, browser: WebDriver, screenshots: Path, taint_run: str
) -> None:
    # the run's output carries the plan as Markdown metadata, listed in the run's log
    wait_for_text(browser, r"plan \[Show Markdown\]\s+marked 13\s+rebuilt 3\s+runs 3\s+applied true\s+backfill \w+")
    instance = server.instance()
    [output] = [e for e in instance.all_logs(taint_run) if e.dagster_event and e.dagster_event.is_successful_output]
    plan = output.dagster_event.step_output_data.metadata["plan"]  # type: ignore[union-attr]
    assert isinstance(plan, MarkdownMetadataValue)
    assert f"**Taint** ods.order {START} .. {END}: {REASON} (by oncall)" in plan.value
    assert f"| `dwd.order_detail` | {DAY} | 1 | rebuilt in 1 run(s) |" in plan.value

    # the repair: one asset backfill, in the UI's list of backfills
    [backfill] = instance.get_backfills()
    assert backfill.tags["warehouse/taint"] == taint_run
    browser.get(f"{server.url}/runs/b/{backfill.backfill_id}")
    wait_for_text(browser, r"dwd / order_detail")
    shoot(browser, screenshots, "ui-taint-backfill")


def test_a_tainted_partition_shows_failed_on_its_valid_check_with_reason_and_root(
    server: Server, browser: WebDriver, screenshots: Path, taint_run: str
) -> None:
    catalog = load_catalog()
    instance = server.instance()
    assert set(tainted_in_instance(instance, catalog["dwd.order_detail"], [DAY])) == {DAY}

    browser.get(f"{server.url}/assets/dwd/order_detail?view=checks&checkDetail=valid")
    # the check's own Partitions tab (a tab button of the check's panel, below the asset's tabs)
    clickable(browser, "(//button[@role='tab' and @title='Partitions'])[last()]").click()
    wait_for_text(browser, r"Failed \(1\)")  # of every partition of the table, one failed: the tainted day
    search = clickable(browser, "//input[@placeholder='Filter by partition…']")
    search.send_keys(DAY)
    clickable(browser, f"//*[@data-tooltip='{DAY}']").click()
    wait_for_text(browser, rf"Description\s+tainted: {REASON}, from ods\.order {START} \.\. {END}")
    metadata = wait_for_text(browser, r"Metadata[\s\S]*").group(0)
    for value in (REASON, f"ods.order {START} .. {END}", "oncall", "tainted"):  # reason, root, who: the metadata
        assert value in metadata, metadata
    shoot(browser, screenshots, "ui-tainted-partition")
