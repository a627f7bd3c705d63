"""The embedded warehouse as `make dev` runs it (Spark Connect, webserver, daemon and engine on two simulated days),
one stack for every test of this module, seen as its user sees it.

Nobody clicks anything: the landing sensor launches the ingestion, the readiness sensor reports ODS hours, and the
dependency center's engine (``warehouse engine``, started by ``warehouse dev``) materializes DWD, DWS and ADS
partitions through the webserver; the Spark Connect server it starts runs Delta's SQL.

Then the UI in a real browser: headless Chromium driven by Selenium (Debian's `chromium` and `chromium-driver`, which
`make system-packages` installs). Asserted on the page's text: the asset graph with the four layers, a derived
table's partitions built by the engine, a 2-day backfill launched from the Materialize dialog that succeeds, and the
`why_waiting` job's answer for a partition that waits. Every browser test saves a screenshot (the path is printed);
every run the stack or a test started must have succeeded. The engine's own test comes first: the backfill rebuilds
its day.

Last, bad data, with the `warehouse` command as the README's "Bad data" section has its user type it: an hour of orders
gone wrong in the lake is tainted (``--apply``), shown tainted by ``warehouse status``, stays tainted when the stack
next looks at the lake, is re-ingested from the landing area; the repair the daemon runs rebuilds exactly what was
built from it, every run succeeds and the ADS figures equal a replay of the landing area. Then SIGINT stops the stack,
started in the background as a script starts it, with nothing left running.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from dagster import (
    AssetCheckKey,
    AssetKey,
    AssetRecordsFilter,
    DagsterEventType,
    DagsterInstance,
    DagsterRunStatus,
    RunsFilter,
)
from dagster._core.execution.backfill import BulkActionStatus
from deltalake import DeltaTable, write_deltalake
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from resources.spark import (
    CONNECT_TOKEN_VARIABLE,
    connect_client_url,
    connect_token_file,
    port_open,
    read_connect_token,
)
from tests.resources.test_spark_delta import assert_round
from tests.support import oracle
from tests.support.dev_stack import (
    DAY,
    DEADLINE_S,
    POLL_S,
    ROOT,
    STACK_TIMEOUT_S,
    STALL_S,
    assert_sigint_stops_everything,
    await_partition,
    days_ended,
    free_port,
    graphql,
    runs_summary,
    start_stack,
)
from tests.support.instances import memory_backed_dir
from tests.support.jvm import SESSION_JIT
from tests.support.lake import row_dicts
from tests.support.small_catalog import product_tables
from tests.support.ui import (
    PAGE_S,
    REPOSITORY,
    button,
    chromium,
    clickable,
    needs_browser,
    page_text,
    shoot,
    wait_for_text,
)
from warehouse_assets.catalog import Catalog, load_catalog
from warehouse_assets.materialize.validity import VALID, Taint, tainted_in_instance

pytestmark = [pytest.mark.stack, pytest.mark.timeout(STACK_TIMEOUT_S)]

LAYERS = {
    "ods": ("order", "user"),
    "dwd": ("order_detail", "user_snapshot"),
    "dws": ("user_order_daily",),
    "ads": ("daily_gmv", "retention_d1"),
}
GOING = (BulkActionStatus.REQUESTED, BulkActionStatus.CANCELING, BulkActionStatus.FAILING)  # a backfill not done
DAYS = [f"{DAY + timedelta(days=n):%Y-%m-%d}" for n in range(3)]  # two full simulated days, the third's first hour
# the stack's catalog: these and what they read (LAYERS' tables, the taint's closure through DWD, DWS and ADS)
STACK_TABLES = ("ads.daily_gmv", "ads.retention_d1", "ads.gmv_hourly")


@dataclass
class Stack:
    port: int
    home: Path
    proc: subprocess.Popen[bytes]
    spark_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def lake(self) -> Path:
        return self.home.parent / "lake"

    @property
    def landing(self) -> Path:
        return self.home.parent / "landing"

    @property
    def tables(self) -> Path:
        """The stack's catalog (WAREHOUSE_CATALOG_DIR): a copy of the product's tables."""
        return self.home.parent / "tables"

    def await_spark_server(self) -> None:
        """Wait until the stack's Spark Connect server listens and `warehouse dev` wrote its token file (just after)."""
        deadline = time.monotonic() + STALL_S
        token_file = connect_token_file(self.home.parent)
        while not (port_open("127.0.0.1", self.spark_port) and token_file.exists()):
            assert self.proc.poll() is None, "the dev stack exited"
            assert time.monotonic() < deadline, f"the Spark Connect server did not listen on port {self.spark_port}"
            time.sleep(POLL_S)

    def spark_url(self) -> str:
        """The stack's Spark Connect URL with the token `warehouse dev` generated for the product's own clients."""
        token = read_connect_token(connect_token_file(self.home.parent))
        assert token, "warehouse dev left no Spark Connect token in its log dir"
        return connect_client_url(f"sc://127.0.0.1:{self.spark_port}", token)

    def instance(self) -> DagsterInstance:
        """The stack's instance, once the webserver listens (`warehouse dev` has then created its storage)."""
        deadline = time.monotonic() + DEADLINE_S
        while not port_open("127.0.0.1", self.port):
            assert self.proc.poll() is None, "the dev stack exited"
            assert time.monotonic() < deadline, f"the webserver did not listen on port {self.port}"
            time.sleep(POLL_S)
        return DagsterInstance.from_config(str(self.home))


@pytest.fixture(scope="module")
def stack(monkeypatch_module: pytest.MonkeyPatch) -> Iterator[Stack]:
    # the stack's files (its SQLite instance, lake and landing area) on memory-backed storage: its processes commit
    # thousands of events, each a disk sync elsewhere (tests/support/instances.py)
    with memory_backed_dir("ui-") as root:
        home = root / "dagster_home"
        home.mkdir()
        shutil.copy(ROOT / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
        monkeypatch_module.setenv("DAGSTER_HOME", str(home))
        # the product's tables, in a folder of the stack's own: a test adds a table there, never to the repository.
        # Those the tests look at and their inputs (ODS order, user, lesson, attendance; 10 of the derived tables):
        # every assertion names one of them, and the engine's runs for the others only made the stack slower
        product_tables(root / "tables", STACK_TABLES)
        port, spark_port = free_port(), free_port()
        # the stack's Spark Connect server compiled as each worker's own session is (tests/support/jvm.py)
        jit = f"{os.environ.get('JAVA_TOOL_OPTIONS', '')} {SESSION_JIT}".strip()
        env = {"WAREHOUSE_CATALOG_DIR": str(root / "tables"), "JAVA_TOOL_OPTIONS": jit}
        # started as a script or a supervisor starts it in the background (SIGINT ignored): the module's last test
        # stops it with SIGINT to its process group
        with start_stack(root, home, port, spark_port, env=env, days=2, sigint_ignored=True) as proc:
            yield Stack(port, home, proc, spark_port)


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture(scope="module")
def browser(stack: Stack) -> Iterator[WebDriver]:
    stack.instance()  # the webserver listens
    with chromium(stack.url) as driver:
        yield driver


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("screenshots")


def all_runs_succeeded(instance: DagsterInstance, runs: RunsFilter | None = None) -> None:
    """Wait until the runs have finished; assert they all succeeded."""
    deadline = time.monotonic() + DEADLINE_S
    while not all(run.is_finished for run in instance.get_runs(runs)):
        assert time.monotonic() < deadline, "runs still going after the deadline"
        time.sleep(POLL_S)
    failed = [
        f"{run.job_name} {run.run_id} {run.status.value} {run.tags}"
        for run in instance.get_runs(runs)
        if run.status != DagsterRunStatus.SUCCESS
    ]
    assert not failed, "runs that did not succeed:\n" + "\n".join(failed)


def test_dev_materializes_downstream_partitions_without_a_click(stack: Stack) -> None:
    target = AssetKey(["ads", "daily_gmv"])
    instance = await_partition(stack.proc, stack.port, stack.home, target, f"{DAY:%Y-%m-%d}")
    for key in (["ods", "order"], ["dwd", "order_detail"], ["dws", "user_order_daily"]):
        assert instance.get_materialized_partitions(AssetKey(key)), key
    # the day was built by the engine, not by hand: submitted for one request, naming the change that triggered it
    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=target), limit=1).records
    run = instance.get_run_by_id(records[0].run_id)
    assert run is not None and run.tags.get("dagster/sensor_name") == "dependency_center", run and run.tags
    assert run.tags["warehouse/request"] and run.tags["warehouse/trigger"].startswith(("dws.", "dwd.")), run.tags
    # the table's own checks and its validity, not the freshness check its sensor judges at the deadline
    declared = {AssetCheckKey(target, c.name) for c in load_catalog()["ads.daily_gmv"].checks}
    assert run.asset_check_selection == {*declared, AssetCheckKey(target, VALID)}
    assert instance.get_runs_count(RunsFilter(tags={"warehouse/request": run.tags["warehouse/request"]})) == 1
    # with the table's blocking checks, evaluated in the same step as the write
    checks = instance.event_log_storage.get_asset_check_execution_history(AssetCheckKey(target, "unique"), limit=10)
    assert any(c.run_id == run.run_id and c.status.value == "SUCCEEDED" for c in checks), checks

    data = graphql(stack.port, "{ assetNodes { assetKey { path } groupName } }")
    groups = {node["groupName"] for node in data["data"]["assetNodes"]}
    assert {"ods", "dwd", "dws", "ads"} <= groups


def test_the_connect_server_of_dev_runs_delta_sql(stack: Stack, tmp_path: Path) -> None:
    """The Spark Connect server `warehouse dev` starts carries Delta's jars, SQL extension and catalog."""
    stack.await_spark_server()
    path = str(tmp_path / "orders")
    # the client in a process of its own: a Connect session would switch this one, which holds the tests'
    # classic Spark, to Connect mode
    client = (
        "import json, sys\n"
        "from pyspark.sql import SparkSession\n"
        "from tests.resources.test_spark_delta import spark_delta_round\n"
        "session = SparkSession.builder.remote(sys.argv[1]).getOrCreate()\n"
        "print(json.dumps(spark_delta_round(session, sys.argv[2])))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", client, stack.spark_url(), path],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert_round(path, json.loads(done.stdout.splitlines()[-1]))


# an analyst's client: plain SQL over the warehouse's tables by name, one created after the server started
NAMES_CLIENT = """
    import json, sys
    from pyspark.sql import SparkSession

    session = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
    probe = session.sql("SELECT id, note FROM dws.analyst_probe ORDER BY id").collect()
    built = session.sql(f"SELECT count(*) AS n FROM dwd.order_detail VERSION AS OF {sys.argv[2]}").collect()[0].n
    print(json.dumps({"probe": [list(row) for row in probe], "built": built}))
"""


def test_names_resolve_over_connect_for_a_table_created_after_the_server_started(stack: Stack) -> None:
    """`layer.table` resolves on the stack's Spark Connect server to the lake's Delta table: one the engine built,
    and one created after the server started (the catalog looks a name up when a query names it)."""
    target = AssetKey(["dwd", "order_detail"])
    await_partition(stack.proc, stack.port, stack.home, target, DAYS[0])
    assert port_open("127.0.0.1", stack.spark_port)  # the server started before the probe table exists
    write_deltalake(str(stack.lake / "dws" / "analyst_probe"), pa.table({"id": [2, 1], "note": ["b", "a"]}))
    built = DeltaTable(str(stack.lake / "dwd" / "order_detail"))
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(NAMES_CLIENT), stack.spark_url(), str(built.version())],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["probe"] == [[1, "a"], [2, "b"]]
    assert seen["built"] == len(row_dicts(str(stack.lake / "dwd" / "order_detail"))) > 0


def test_a_connect_client_without_the_token_is_refused(stack: Stack) -> None:
    """The product's Connect server requires the token `warehouse dev` generated: a local user without it runs
    nothing, not even a read."""
    stack.await_spark_server()
    client = (
        "import sys\n"
        "from pyspark.sql import SparkSession\n"
        "SparkSession.builder.remote(sys.argv[1]).getOrCreate().sql('SELECT 1').collect()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != CONNECT_TOKEN_VARIABLE}
    for url in (
        f"sc://127.0.0.1:{stack.spark_port}",
        connect_client_url(f"sc://127.0.0.1:{stack.spark_port}", "guess"),
    ):
        done = subprocess.run(
            [sys.executable, "-c", client, url], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode != 0
        assert "UNAUTHENTICATED" in done.stderr, done.stderr[-2000:]


# two threads of one Connect client create three new tables at once, each writing its own hour
CREATING_CLIENT = """
    import sys, threading
    from pyspark.sql import SparkSession
    from resources.delta_lake import DeltaStore

    session = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
    errors = []

    def write(table, hour, barrier):
        rows = session.createDataFrame([(hour, "2026-01-01", f"{hour:02d}")], "id int, dt string, hh string")
        barrier.wait()
        try:
            spec = {"dt": "2026-01-01", "hh": f"{hour:02d}"}
            DeltaStore(sys.argv[2]).overwrite(("dws", table), rows, ["dt", "hh"], [spec])
        except Exception as exc:
            errors.append(repr(exc))

    for n in range(3):
        barrier = threading.Barrier(2)
        threads = [threading.Thread(target=write, args=(f"t{n}", hour, barrier)) for hour in (0, 1)]
        [thread.start() for thread in threads]
        [thread.join() for thread in threads]
    sys.exit("\\n".join(errors) or None)  # a message exits with 1
"""


def test_runs_creating_one_table_at_once_over_connect_all_land(stack: Stack, tmp_path: Path) -> None:
    """Two runs of a new table write their partitions at once through the stack's Spark Connect server: Delta
    refuses the second creation of the table, and the overwrite writes it again (the error comes through gRPC)."""
    client = textwrap.dedent(CREATING_CLIENT)
    lake = tmp_path / "lake"
    done = subprocess.run(
        [sys.executable, "-c", client, stack.spark_url(), str(lake)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for n in range(3):
        rows = row_dicts(str(lake / "dws" / f"t{n}"))
        assert sorted(r["hh"] for r in rows) == ["00", "01"], rows


@needs_browser
def test_the_asset_graph_shows_the_four_layers(stack: Stack, browser: WebDriver, screenshots: Path) -> None:
    browser.get(f"{stack.url}/asset-groups")
    wait_for_text(browser, "Global asset lineage")
    for group in LAYERS:  # unfold each layer's group in the sidebar: its tables are listed under it
        clickable(
            browser,
            f"//*[@title='{group}']/ancestor::div[button[.//*[@aria-label='arrow_drop_down']]][1]"
            "/button[.//*[@aria-label='arrow_drop_down']]",
        ).click()
    for group, tables in LAYERS.items():
        wait_for_text(browser, rf"(?m)^{group}$[\s\S]*" + r"[\s\S]*".join(rf"^{t}$" for t in tables))
    # the graph's nodes are the four layers (and the external sources')
    nodes = {el.get_attribute("title") for el in browser.find_elements(By.XPATH, "//*[@title]")}
    assert set(LAYERS) <= nodes, nodes
    shoot(browser, screenshots, "ui-asset-graph")


@needs_browser
def test_a_derived_tables_partitions_show_what_the_engine_built(
    stack: Stack, browser: WebDriver, screenshots: Path
) -> None:
    target = AssetKey(["dwd", "order_detail"])
    instance = await_partition(stack.proc, stack.port, stack.home, target, DAYS[0])
    run_id = (
        instance.fetch_materializations(AssetRecordsFilter(asset_key=target, asset_partitions=[DAYS[0]]), limit=1)
        .records[0]
        .run_id
    )

    before = days_ended()  # the partitions that exist: the render may cross the business zone's midnight
    browser.get(f"{stack.url}/assets/dwd/order_detail?view=partitions")
    # the counts of one rendering (the engine may build the next day meanwhile): none failed, every day counted
    counts = wait_for_text(
        browser, r"Failed \((\d+)\)\s+Materialized \(([1-9]\d*)\)\s+Materializing \((\d+)\)\s+Missing \((\d+)\)"
    )
    failed, materialized, materializing, missing = map(int, counts.groups())
    assert failed == 0 and materialized + materializing + missing in {before, days_ended()}, counts.group(0)
    assert materialized <= len(instance.get_materialized_partitions(target)), counts.group(0)
    # the day's latest materialization names the engine's run
    clickable(browser, f"//*[@title='{DAYS[0]}']").click()  # its row in the list
    wait_for_text(browser, rf"Latest materialization[\s\S]*{run_id[:8]}")
    shoot(browser, screenshots, "ui-partitions")


@needs_browser
def test_an_ads_tables_page_shows_its_column_lineage(stack: Stack, browser: WebDriver, screenshots: Path) -> None:
    """The open-source UI hides ``dagster/column_lineage``; the Markdown table beside it is shown on the asset's page
    without a click, with the sources of gmv and paying_users checked by hand (tests/catalog/test_lineage.py)."""
    target = AssetKey(["ads", "daily_gmv"])
    instance = await_partition(stack.proc, stack.port, stack.home, target, DAYS[0])
    browser.get(f"{stack.url}/assets/ads/daily_gmv")
    wait_for_text(browser, r"column_lineage[\s\S]*column\s+computed from")
    wait_for_text(browser, r"gmv\s+dws\.user_order_daily\.paid_amount\s")
    wait_for_text(browser, r"paying_users\s+dws\.user_order_daily\.paid_orders\s")
    shoot(browser, screenshots, "ui-column-lineage")
    # and the latest materialization carries the same table, for what its build read
    [record] = instance.fetch_materializations(target, limit=1).records
    markdown = record.asset_materialization.metadata["column_lineage"].value  # type: ignore[union-attr]
    assert "| `gmv` | dws.user_order_daily.paid_amount |" in str(markdown)
    assert "| `paying_users` | dws.user_order_daily.paid_orders |" in str(markdown)


@needs_browser
def test_a_backfill_launched_from_the_materialize_dialog_succeeds(
    stack: Stack, browser: WebDriver, screenshots: Path
) -> None:
    target = AssetKey(["ads", "daily_gmv"])
    # both days built by the engine first: the backfill rebuilds them, racing no run of the engine's
    instance = await_partition(stack.proc, stack.port, stack.home, target, DAYS[1])
    before = {backfill.backfill_id for backfill in instance.get_backfills()}

    browser.get(f"{stack.url}/assets/ads/daily_gmv")
    clickable(browser, button("Materialize…")).click()
    selection = clickable(browser, "//div[@role='dialog']//input[@type='text']")
    selection.send_keys(Keys.CONTROL, "a")
    selection.send_keys(f"[{DAYS[0]}...{DAYS[1]}]", Keys.TAB)
    wait_for_text(browser, r"Partition selection\s+2 partitions")
    assert "Upstream data missing" not in page_text(browser), page_text(browser)
    clickable(browser, button("Launch backfill")).click()

    deadline = time.monotonic() + DEADLINE_S
    while not (launched := [b for b in instance.get_backfills() if b.backfill_id not in before]):
        assert time.monotonic() < deadline, "no backfill was launched"
        time.sleep(POLL_S)
    (backfill,) = launched
    while (backfill := instance.get_backfill(backfill.backfill_id)).status in GOING:
        assert time.monotonic() < deadline, f"backfill {backfill.backfill_id} still going after {DEADLINE_S}s"
        time.sleep(POLL_S)
    assert backfill.status == BulkActionStatus.COMPLETED_SUCCESS, backfill.status
    runs = RunsFilter(tags={"dagster/backfill": backfill.backfill_id})
    all_runs_succeeded(instance, runs)
    assert instance.get_runs_count(runs) >= 1
    run_ids = {run.run_id for run in instance.get_runs(runs)}
    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=target), limit=100).records
    rebuilt = {record.partition_key for record in records if record.run_id in run_ids}
    assert rebuilt == set(DAYS[:2]), rebuilt

    browser.get(f"{stack.url}/runs/b/{backfill.backfill_id}")
    wait_for_text(browser, r"Status\s+Succeeded")
    wait_for_text(browser, rf"{DAYS[0]}\.\.\.{DAYS[1]}[\s\S]*ads / daily_gmv\s+100% completed")
    shoot(browser, screenshots, "ui-backfill")
    # what the stack did after (the engine may rebuild downstream of the rebuilt days) succeeded too
    all_runs_succeeded(instance)


@needs_browser
def test_the_why_waiting_job_explains_a_waiting_partition(stack: Stack, browser: WebDriver, screenshots: Path) -> None:
    waiting = DAYS[2]  # only its first hour has landed
    instance = stack.instance()
    assert waiting not in instance.get_materialized_partitions(AssetKey(["dwd", "order_detail"]))
    browser.get(f"{stack.url}/locations/{REPOSITORY}/jobs/why_waiting/playground")
    WebDriverWait(browser, PAGE_S).until(lambda d: d.execute_script("return !!document.querySelector('.CodeMirror')"))
    # the launchpad's config editor (CodeMirror) keeps the resources it scaffolded; the op's config is added
    browser.execute_script(
        "const editor = document.querySelector('.CodeMirror').CodeMirror;"
        "editor.setValue(editor.getValue() + arguments[0]);",
        f"ops:\n  explain_partition:\n    config:\n      table: dwd.order_detail\n      partition: '{waiting}'\n",
    )
    clickable(browser, button("Launch Run")).click()
    WebDriverWait(browser, PAGE_S).until(lambda d: "/runs/" in d.current_url)
    run_id = browser.current_url.rstrip("/").split("/runs/")[1]
    # the run's log: the upstream hours that are not ready, with their reason, and the verdict (the run may wait in
    # the queue behind the engine's)
    wait_for_text(browser, r"verdict: waiting for \d+ of 24 upstream partition\(s\); first: ods\.order ", STALL_S)
    text = page_text(browser)
    assert f"dwd.order_detail {waiting}: missing" in text, text
    assert re.search(rf"ods\.order +{waiting}-\d\d:00 +not ready — \d+ of \d+ shard stream\(s\) not applied", text)
    assert "root causes:" in text, text
    shoot(browser, screenshots, "ui-why-waiting")
    all_runs_succeeded(instance, RunsFilter(run_ids=[run_id]))


# the README's example of adding a table, word for word
NEW_TABLE = """/* ---
table: dws.course_gmv_daily
period: daily                      # hourly | daily | weekly | monthly
description: Paid GMV per course per day.
owner: trade-data
primary_key: [course_id]
depends_on:                        # optional: offsets only; the inputs come from the SQL
  dwd.order_detail: {set: [0]}     # set: [-1] = T-1, range: [-6, 0] = a 7-day window
checks:
  unique: true                     # the primary key
  not_null: [course_id]
--- */
SELECT course_id, sum(amount) AS gmv
FROM dwd.order_detail
WHERE status = 'paid'
GROUP BY course_id
"""


def test_a_table_added_while_the_stack_runs_is_built_by_itself(stack: Stack) -> None:
    """One file added to the running stack's catalog, and nothing else: the engine loads it, has the code location
    reloaded, and builds the new table's partitions whose inputs were all there already; every run succeeds. And the
    `dependency_center` sensor's ticks say, in the tick list, what the engine launched and that it is alive."""
    instance = await_partition(stack.proc, stack.port, stack.home, AssetKey(["dwd", "order_detail"]), DAYS[1])
    (stack.tables / "dws" / "course_gmv_daily.sql").write_text(NEW_TABLE)
    target = AssetKey(["dws", "course_gmv_daily"])
    await_partition(stack.proc, stack.port, stack.home, target, DAYS[1])
    assert set(DAYS[:2]) <= instance.get_materialized_partitions(target)
    runs = instance.get_runs(RunsFilter(tags={"dagster/sensor_name": "dependency_center"}))
    built = [run for run in runs if run.asset_selection and target in run.asset_selection]
    assert built and all(run.status == DagsterRunStatus.SUCCESS for run in built), [r.status for r in built]
    assert any("table declared" in run.tags.get("warehouse/trigger", "") for run in built), [r.tags for r in built]
    rows = row_dicts(str(stack.lake / "dws" / "course_gmv_daily"))
    assert rows and {r["dt"] for r in rows} >= set(DAYS[:2])
    all_runs_succeeded(instance)

    # the sensor's ticks as the tick list reads them: each one's cursor, and the heartbeat when hovered
    ticks = graphql(
        stack.port,
        '{ sensorOrError(sensorSelector: {repositoryLocationName: "warehouse", repositoryName: "__repository__", '
        'sensorName: "dependency_center"}) { ... on Sensor { sensorState { ticks(limit: 100) { status cursor '
        "skipReason error { message } } } } } }",
    )["data"]["sensorOrError"]["sensorState"]["ticks"]
    skipped = [t for t in ticks if t["status"] == "SKIPPED"]
    # a tick before the engine's first heartbeat fails, saying so; none after
    early = [t for t in ticks if t["status"] != "SKIPPED"]
    assert all("has never run against this instance" in (t["error"] or {}).get("message", "") for t in early), early
    line = (
        r"(\d+) runs? launched \d\d:\d\d:\d\d–\d\d:\d\d:\d\d[+-]\d\d:\d\d; "
        r"engine (alive|FAILING \(hover\)), beat \d+ s ago, \d+ to submit"
    )
    said = [re.fullmatch(line, t["cursor"] or "") for t in skipped]
    assert skipped and all(said), [t["cursor"] for t in skipped]
    # the runs as they are after the ticks were read (the engine goes on launching meanwhile): none counted twice
    launched = instance.get_runs(RunsFilter(tags={"dagster/sensor_name": "dependency_center"}))
    assert 0 < sum(int(m[1]) for m in said if m) <= len(launched), [t["cursor"] for t in skipped]
    assert all(t["skipReason"].startswith(t["cursor"].split(";")[0] + "; engine alive (pid ") for t in skipped)


# --- bad data on the running stack: the README's "Bad data: taint and repair", typed as its user types it ----------


def readme_taint_example(day: str, hour: str) -> list[list[str]]:
    """The `warehouse` commands of the README's taint example, word for word, its day and hour (``$D``, ``$H``) the
    ones given."""
    section = (ROOT / "README.md").read_text().split("## Bad data", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [shlex.split(line, comments=True) for line in block.splitlines() if line.startswith("warehouse ")]
    return [[{"$D": day, "$H": hour}.get(word, word) for word in command[1:]] for command in commands]


# the lake's copy of an hour goes bad while the landing area's stays right: what `warehouse reingest` is for
CORRUPTING_CLIENT = """
    import sys
    from pyspark.sql import SparkSession

    session = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
    table, day, hh = sys.argv[2:5]
    session.sql(f"UPDATE delta.`{table}` SET amount = amount * 100 WHERE dt = '{day}' AND hh = '{hh}'").collect()
"""

SENSOR = '{repositoryLocationName: "warehouse", repositoryName: "__repository__", sensorName: "ods_readiness"}'


def readiness_sensor(stack: Stack, running: bool) -> None:
    """Stop or start the stack's ODS readiness sensor, as its page in the UI does; a stop returns once no tick of it
    is in flight."""
    if running:
        done = graphql(stack.port, f"mutation {{ startSensor(sensorSelector: {SENSOR}) {{ __typename }} }}")
        assert done["data"]["startSensor"]["__typename"] == "Sensor", done
        return
    found = graphql(stack.port, f"{{ sensorOrError(sensorSelector: {SENSOR}) {{ ... on Sensor {{ id }} }} }}")
    sensor_id = found["data"]["sensorOrError"]["id"]
    done = graphql(stack.port, f'mutation {{ stopSensor(id: "{sensor_id}") {{ __typename }} }}')
    assert done["data"]["stopSensor"]["__typename"] == "StopSensorMutationResult", done
    deadline = time.monotonic() + STALL_S
    while any(t["status"] == "STARTED" for t in readiness_ticks(stack, limit=1)):
        assert time.monotonic() < deadline, "the ODS readiness sensor's last tick did not end"
        time.sleep(0.5)


def readiness_ticks(stack: Stack, limit: int) -> list[dict[str, Any]]:
    """The ODS readiness sensor's latest ticks, newest first."""
    ticks: list[dict[str, Any]] = graphql(
        stack.port,
        f"{{ sensorOrError(sensorSelector: {SENSOR}) {{ ... on Sensor {{ sensorState {{ ticks(limit: {limit}) "
        "{ timestamp status skipReason error { message } } } } } }",
    )["data"]["sensorOrError"]["sensorState"]["ticks"]
    return ticks


def readiness_looks_since(stack: Stack, since: float) -> list[dict[str, Any]]:
    """The ODS readiness sensor's finished ticks since ``since`` (epoch seconds) that looked at the lake (not skipped
    for an ingestion run in flight, which reports what it changed itself)."""
    return [
        t
        for t in readiness_ticks(stack, limit=10)
        if t["timestamp"] > since and t["status"] != "STARTED" and not (t["skipReason"] or "").startswith("ingestion")
    ]


def warehouse(stack: Stack, *argv: str) -> list[str]:
    """``warehouse ARGV``, the installed command, run as a user of `make dev` runs it from a shell of their own: the
    stack's Dagster home and data folders (`make dev`'s dagster_home/ and data/) and its Spark Connect URL (`make
    dev`'s is the default one, this stack's a free port), no other setting of the warehouse (its start is the simulated
    landing area's; Spark, when the command needs it, the stack's Connect server, found as a user's shell finds it:
    listening at that URL, its token file in the log dir). What it printed, once it succeeded."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WAREHOUSE_") and k != CONNECT_TOKEN_VARIABLE}
    env |= {
        "DAGSTER_HOME": str(stack.home),
        "WAREHOUSE_LAKE_ROOT": str(stack.lake),
        "WAREHOUSE_LANDING_ROOT": str(stack.landing),
        "WAREHOUSE_LOG_DIR": str(stack.home.parent),
        "WAREHOUSE_CATALOG_DIR": str(stack.tables),
        # without it a re-ingest starts a JVM of its own (a minute and more), or merges on whatever server listens
        # at the default port: another stack's
        "WAREHOUSE_SPARK_CONNECT_URL": f"sc://127.0.0.1:{stack.spark_port}",
    }
    command = Path(sys.executable).with_name("warehouse")
    done = subprocess.run([str(command), *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=STALL_S)
    assert done.returncode == 0, f"warehouse {' '.join(argv)}: exit {done.returncode}\n{done.stderr[-3000:]}"
    return done.stdout.splitlines()


def marked_by(plan: list[str]) -> dict[str, str]:
    """Table → the partitions a printed plan marks: its table lines, between the title and the summary."""
    end = next(n for n, line in enumerate(plan) if re.match(r"\d+ partition\(s\) of \d+ table\(s\) to mark", line))
    return {line.split()[0]: line.split()[1] for line in plan[1:end]}


def marked_in_run(instance: DagsterInstance, run_id: str) -> dict[str, dict[str, Taint]]:
    """Table → partition → its taint: the failed ``valid`` verdicts the run logged (what ``--apply`` marked)."""
    marked: dict[str, dict[str, Taint]] = {}
    for entry in instance.all_logs(run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION):
        evaluation = entry.dagster_event.asset_check_evaluation_data if entry.dagster_event else None
        if evaluation is not None and evaluation.check_name == VALID and not evaluation.passed:
            table = ".".join(evaluation.asset_key.path)
            marked.setdefault(table, {})[str(evaluation.partition)] = Taint.of(evaluation, entry.timestamp)
    return marked


def latest_run(instance: DagsterInstance, fqn: str, key: str) -> tuple[int, Any]:
    """The storage id of the partition's latest materialization, and the run that wrote it."""
    [record] = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey(fqn.split(".")), asset_partitions=[key]), limit=1
    ).records
    return record.storage_id, instance.get_run_by_id(record.run_id)


def ods_hour(lake: Path, hour: str) -> dict[int, Decimal]:
    """The live orders of ods.order's ``hour`` in the lake: id → amount."""
    rows = row_dicts(lake / "ods" / "order")
    return {
        r["id"]: Decimal(str(r["amount"]))
        for r in rows
        if str(r["dt"]) == hour[:10] and r["hh"] == hour[11:13] and not r.get("_deleted")
    }


@dataclass
class Repair:
    instance: DagsterInstance
    lake: Path
    catalog: Catalog  # the stack's
    truth: oracle.Tables  # the replay of the stack's landing area
    day: str
    hour: str  # the ods.order hour gone bad in the lake, tainted and re-ingested
    reason: str  # the README's
    bad: dict[int, Decimal]  # the hour's orders in the lake once gone bad
    before: int  # storage id of the hour's materialization when it was tainted
    applied: list[str]  # `warehouse taint … --apply`
    closure: dict[str, dict[str, Taint]]  # table → its partitions --apply marked tainted
    status: list[str]  # `warehouse status dwd.order_detail` then
    looked: list[dict[str, Any]]  # the readiness sensor's looks at the lake once started again, before the re-ingest
    still_tainted: dict[str, Taint]  # the hour's taint after those ticks
    latest_then: int  # storage id of the hour's latest materialization after those ticks
    reingested: list[str]  # `warehouse reingest`
    backfill: Any  # the repair, finished
    runs: list[Any]  # every run since the first command, finished


@pytest.fixture(scope="module")
def repaired(stack: Stack) -> Repair:
    """The README's taint and repair on the stack at rest, as on-call types it: an hour of orders is wrong in the lake
    (its amounts 100x, the landing area's right); `warehouse taint --apply` marks the closure and launches the repair,
    `warehouse status` shows the taint, `warehouse reingest` re-ingests the hour from the landing area, and the
    repair's runs, waiting for it, rebuild.

    The hour goes bad while the ODS readiness sensor is stopped and is tainted before it runs again: the order in
    which on-call meets a change the stack has not looked at yet (its next tick is up to an interval away). The sensor
    then finds the hour changed in the lake since its last report; reporting it again would lift the taint with nothing
    corrected, and the repair would rebuild from the 100x rows."""
    day = DAYS[1]  # the last whole day: its closure holds no later day
    built = [("ads.daily_gmv", day), ("ads.retention_d1", day), ("ads.gmv_hourly", f"{day}-23:00")]
    for fqn, key in built:  # the stack at rest, the day's tables built
        instance = await_partition(stack.proc, stack.port, stack.home, AssetKey(fqn.split(".")), key)
    catalog = load_catalog(stack.tables)
    truth = oracle.replay(stack.landing)
    # the hour of the day with the most paid orders: where amounts gone wrong show most in the figures
    paid = Counter(
        o["create_time"][11:13]
        for o in truth["order"].values()
        if o["status"] == "paid" and o["create_time"][:10] == day
    )
    hh = paid.most_common(1)[0][0]
    hour = f"{day}-{hh}:00"
    since = datetime.now(UTC)
    readiness_sensor(stack, running=False)
    try:
        corrupted = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(CORRUPTING_CLIENT), stack.spark_url()]
            + [str(stack.lake / "ods" / "order"), day, hh],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=STALL_S,
        )
        assert corrupted.returncode == 0, corrupted.stderr[-3000:]
        bad = ods_hour(stack.lake, hour)
        before, _ = latest_run(instance, "ods.order", hour)

        taint, apply, show = readme_taint_example(day, hour)
        assert apply == [*taint, "--apply"] and show[0] == "status", (taint, apply, show)
        applied = warehouse(stack, *apply)
        [backfill_id] = re.findall(r"repair backfill (\w+)", applied[-1])
        # what --apply marked, from its run's verdicts: the repair starts at once, and a partition its run is
        # rebuilding has a check planned there, which Dagster reports as its latest execution instead of the taint
        [apply_run] = re.findall(r"\(run ([\w-]+)\)", applied[-1])
        closure = marked_in_run(instance, apply_run)
        status = warehouse(stack, *show)
    finally:
        started = time.time()
        readiness_sensor(stack, running=True)
    deadline = time.monotonic() + STALL_S
    while not (looked := readiness_looks_since(stack, started)):
        assert time.monotonic() < deadline, "the ODS readiness sensor did not look at the lake again"
        time.sleep(1)
    still_tainted = tainted_in_instance(instance, catalog["ods.order"], [hour])
    latest_then, _ = latest_run(instance, "ods.order", hour)
    reingested = warehouse(stack, "reingest", "ods.order", hour)

    # the repair, as the backfill daemon runs it, to its end
    deadline = time.monotonic() + DEADLINE_S
    while (backfill := instance.get_backfill(backfill_id)) is None or backfill.status in GOING:
        assert time.monotonic() < deadline, f"repair {backfill_id} still going:\n{runs_summary(instance)}"
        time.sleep(POLL_S)
    # every run since the first command: the commands' own, the repair's, the engine's
    runs = RunsFilter(created_after=since)
    all_runs_succeeded(instance, runs)
    return Repair(
        instance=instance,
        lake=stack.lake,
        catalog=catalog,
        truth=truth,
        day=day,
        hour=hour,
        reason=taint[taint.index("--reason") + 1],
        bad=bad,
        before=before,
        applied=applied,
        closure=closure,
        status=status,
        looked=looked,
        still_tainted=still_tainted,
        latest_then=latest_then,
        reingested=reingested,
        backfill=backfill,
        runs=list(instance.get_runs(runs)),
    )


def test_the_readme_taint_marks_what_was_built_from_the_hour_and_status_shows_it(repaired: Repair) -> None:
    day, hour, reason, user = repaired.day, repaired.hour, repaired.reason, getpass.getuser()
    assert repaired.applied[0] == f"taint ods.order {hour}: {reason} (by {user})"
    # the hour, its day and the hour's own partitions downstream, through DWD, DWS and ADS: nothing else
    marked = marked_by(repaired.applied)
    assert {t: marked[t] for t in ("ods.order", "dws.order_hourly", "ads.gmv_hourly")} == dict.fromkeys(
        ("ods.order", "dws.order_hourly", "ads.gmv_hourly"), hour
    )
    core = ("dwd.order_detail", "dws.user_order_daily", "dws.user_active_daily", "ads.daily_gmv", "ads.retention_d1")
    assert {t: marked[t] for t in core} == dict.fromkeys(core, day)
    assert all(key == (hour if repaired.catalog[t].period == "hourly" else day) for t, key in marked.items()), marked
    # --apply marked exactly those, with the reason and the root
    assert {t: set(found) for t, found in repaired.closure.items()} == {t: {k} for t, k in marked.items()}
    taints = [taint for found in repaired.closure.values() for taint in found.values()]
    assert {(t.reason, t.root, t.by) for t in taints} == {(reason, f"ods.order {hour}", user)}
    assert re.fullmatch(
        rf"marked {len(marked)} partition\(s\) tainted; repair backfill \w+ \(run [\w-]+\)", repaired.applied[-1]
    )
    assert tainted_in_instance(repaired.instance, repaired.catalog["ads.daily_gmv"], [DAYS[0]]) == {}
    # `warehouse status` shows the day tainted, why and from where
    assert repaired.status[0].startswith("dwd.order_detail (daily): 1 partition(s), 1 materialized, 1 tainted")
    assert repaired.status[1].split()[0] == day
    assert f"tainted: {reason}, from ods.order {hour}" in repaired.status[1], repaired.status


def test_the_stack_finding_the_hour_changed_before_its_taint_leaves_it_tainted(repaired: Repair) -> None:
    # the sensor looked at the lake with the hour's change in it, and did not fail
    assert repaired.looked and all(t["status"] != "FAILURE" for t in repaired.looked), repaired.looked
    # it did not report the hour again: its materialization is the one tainted, and the taint holds
    assert repaired.latest_then == repaired.before
    assert set(repaired.still_tainted) == {repaired.hour}
    assert repaired.still_tainted[repaired.hour].reason == repaired.reason


def test_the_hour_is_reingested_from_its_retained_landing_segments(repaired: Repair) -> None:
    day, hh = repaired.day, repaired.hour[11:13]
    want = {
        k: Decimal(o["amount"]) for k, o in repaired.truth["order"].items() if o["create_time"][:13] == f"{day} {hh}"
    }
    assert want and repaired.bad == {k: amount * 100 for k, amount in want.items()}  # the lake's copy had gone bad
    # every row of the hour's partition written again, its deletions' tombstones too
    written = [r for r in row_dicts(repaired.lake / "ods" / "order") if f"{r['dt']}-{r['hh']}:00" == repaired.hour]
    assert repaired.reingested[0].startswith(f"ods.order: re-ingested {repaired.hour} ({len(written)} rows) from ")
    assert repaired.reingested[1] == "ods.order: 1 hour(s) reported again, checks judged"
    [run_id] = re.findall(r"\(run (\S+)\)", repaired.reingested[-1])
    assert ods_hour(repaired.lake, repaired.hour) == want
    # the hour's latest materialization is the re-ingest's, and the taint on it is gone
    _, run = latest_run(repaired.instance, "ods.order", repaired.hour)
    assert run.run_id == run_id and run.job_name == "taint_repair", run
    assert tainted_in_instance(repaired.instance, repaired.catalog["ods.order"], [repaired.hour]) == {}


def test_every_run_of_the_repair_succeeded_and_every_partition_of_the_closure_is_valid_again(
    repaired: Repair,
) -> None:
    instance = repaired.instance
    assert repaired.backfill.status == BulkActionStatus.COMPLETED_SUCCESS, repaired.backfill.status
    # every run since the taint (the commands', the repair's, any of the engine's) succeeded, not only wrote its data
    failed = [
        f"{r.job_name} {r.run_id} {r.status.value} {r.tags}"
        for r in repaired.runs
        if r.status != DagsterRunStatus.SUCCESS
    ]
    assert not failed, "runs that did not succeed:\n" + "\n".join(failed)
    repair_runs = {r.run_id for r in repaired.runs if r.tags.get("dagster/backfill") == repaired.backfill.backfill_id}
    assert repair_runs
    for table, found in repaired.closure.items():
        [key] = found
        assert tainted_in_instance(instance, repaired.catalog[table], [key]) == {}, (table, key)
        if table != "ods.order":  # each derived partition built again by the repair, after the hour was re-ingested
            _, run = latest_run(instance, table, key)
            assert run.run_id in repair_runs, (table, key, run.run_id, run.tags)


def test_the_ads_figures_equal_the_replay_of_the_landing_area(repaired: Repair) -> None:
    truth, day, lake = repaired.truth, repaired.day, repaired.lake
    stamp = f"{day} {repaired.hour[11:13]}"
    hourly = oracle.gmv_hourly(truth, stamp)
    assert hourly["gmv"] > 0  # the hour's amounts count in the figures: read 100x, they would show
    gmv = {str(r["dt"]): r["gmv"] for r in row_dicts(lake / "ads" / "daily_gmv")}
    assert gmv[day] == oracle.daily_gmv(truth["order"], "Asia/Shanghai")[date.fromisoformat(day)]
    built = {f"{r['dt']} {r['hh']}": r for r in row_dicts(lake / "ads" / "gmv_hourly")}
    assert {k: built[stamp][k] for k in hourly} == hourly


def test_after_the_repair_the_hour_is_not_reported_again_its_readers_not_stale_and_reconcile_exits_0(
    repaired: Repair, stack: Stack
) -> None:
    """The README's repair ends where it promises: the re-ingested hour is not reported again by the readiness sensor
    (a runless report beside the repair's own would make its readers late data, rebuilt only by another repair), the
    hour's readers are not left stale by the re-ingestion their repair runs waited for, nothing the repair rebuilt is
    left to another repair, and `warehouse reconcile` on the running stack says it is healthy."""
    from warehouse_assets.center.ledger import open_readonly
    from warehouse_assets.center.state_store import default_path

    instance, hour = repaired.instance, repaired.hour
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey(["ods", "order"]), asset_partitions=[hour]), limit=20
    ).records
    [run_id] = re.findall(r"\(run (\S+)\)", repaired.reingested[-1])
    since_reingest = [r for r in records if r.storage_id > repaired.latest_then]
    assert since_reingest and {r.run_id for r in since_reingest} == {run_id}, [
        (r.storage_id, r.run_id) for r in since_reingest
    ]
    # the tables that read the re-ingested hour itself: their repair runs waited for it, then read it
    readers = {t for t in repaired.closure if any(d.table == "ods.order" for d in repaired.catalog[t].deps)}
    assert {"dwd.order_detail", "dws.order_hourly"} <= readers
    closure = {(table, key) for table, found in repaired.closure.items() for key in found}
    hour_readers = {(table, key) for table, key in closure if table in readers}
    deadline = time.monotonic() + 180  # the engine's next passes: a rebuild due at once is requested and runs
    while True:
        ledger = open_readonly(default_path(instance))
        assert ledger is not None
        entries = [s for s in ledger.all_stale() if (s.table, s.partition) in closure]
        stale = [
            (s.table, s.partition, s.note, None if s.due is None else round(s.due - time.time()), s.upstream[:300])
            for s in entries
            if (s.table, s.partition) in hour_readers
        ]
        if not stale or time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    assert not stale, (stale, runs_summary(instance))
    # further down, the live stream's own late changes (orders paid or refunded after the repair read them) may leave
    # a repaired partition stale for its policy's interval: rebuilt automatically, never one left to another repair
    left = [(s.table, s.partition, s.note) for s in entries if s.due is None]
    assert not left, (left, runs_summary(instance))
    warehouse(stack, "reconcile")  # exits 0: nothing missing, nothing orphaned, the ingesting hour left out


# --- last: the stack stopped as a supervisor stops it ---------------------------------------------------------------


def test_sigint_stops_a_background_dev_stack_with_nothing_left(stack: Stack) -> None:
    """`warehouse dev` started in the background, in a session of its own, with SIGINT ignored (what a non-interactive
    shell gives a background job): SIGINT to its process group stops everything it started, the warm launcher's worker
    and a run's process included, and nothing outlives it. Its logs on the way: the terminal's, dev.log, and the Spark
    Connect server's warnings only, in a size-capped rolling file."""
    why = {"table": "ads.daily_gmv", "partition": DAYS[2]}
    assert_sigint_stops_everything(stack.proc, stack.home.parent, stack.port, stack.home, why)
