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
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from dagster import AssetCheckKey, AssetKey, AssetRecordsFilter, DagsterInstance, DagsterRunStatus, RunsFilter
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
from tests.support.dev_stack import (
    DAY,
    DEADLINE_S,
    ROOT,
    STACK_TIMEOUT_S,
    STALL_S,
    await_partition,
    free_port,
    graphql,
    start_stack,
)
from tests.support.lake import row_dicts
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
from warehouse_assets.catalog import TABLES_DIR, load_catalog
from warehouse_assets.materialize.validity import VALID

pytestmark = [pytest.mark.stack, pytest.mark.timeout(STACK_TIMEOUT_S)]

LAYERS = {
    "ods": ("order", "user"),
    "dwd": ("order_detail", "user_snapshot"),
    "dws": ("user_order_daily",),
    "ads": ("daily_gmv", "retention_d1"),
}
GOING = (BulkActionStatus.REQUESTED, BulkActionStatus.CANCELING, BulkActionStatus.FAILING)  # a backfill not done
DAYS = [f"{DAY + timedelta(days=n):%Y-%m-%d}" for n in range(3)]  # two full simulated days, the third's first hour


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
    def tables(self) -> Path:
        """The stack's catalog (WAREHOUSE_CATALOG_DIR): a copy of the product's tables."""
        return self.home.parent / "tables"

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
            time.sleep(2)
        return DagsterInstance.from_config(str(self.home))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, monkeypatch_module: pytest.MonkeyPatch) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("ui")
    home = root / "dagster_home"
    home.mkdir()
    shutil.copy(ROOT / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    monkeypatch_module.setenv("DAGSTER_HOME", str(home))
    # the product's tables, in a folder of the stack's own: a test adds a table there, never to the repository
    shutil.copytree(TABLES_DIR, root / "tables")
    port, spark_port = free_port(), free_port()
    env = {"WAREHOUSE_CATALOG_DIR": str(root / "tables")}
    with start_stack(root, home, port, spark_port, env=env, days=2) as proc:
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
        time.sleep(3)
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
    proc, spark_port = stack.proc, stack.spark_port
    deadline = time.monotonic() + STALL_S
    while not port_open("127.0.0.1", spark_port):
        assert proc.poll() is None, "the dev stack exited"
        assert time.monotonic() < deadline, f"the Spark Connect server did not listen on port {spark_port}"
        time.sleep(2)
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
    assert seen["built"] == built.to_pyarrow_table().num_rows > 0


def test_a_connect_client_without_the_token_is_refused(stack: Stack) -> None:
    """The product's Connect server requires the token `warehouse dev` generated: a local user without it runs
    nothing, not even a read."""
    deadline = time.monotonic() + STALL_S
    while not port_open("127.0.0.1", stack.spark_port):
        assert stack.proc.poll() is None and time.monotonic() < deadline, "the Spark Connect server did not start"
        time.sleep(2)
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

    browser.get(f"{stack.url}/assets/dwd/order_detail?view=partitions")
    # the counts of one rendering (the engine may build the next day meanwhile): none failed, every day counted
    counts = wait_for_text(
        browser, r"Failed \((\d+)\)\s+Materialized \(([1-9]\d*)\)\s+Materializing \((\d+)\)\s+Missing \((\d+)\)"
    )
    failed, materialized, materializing, missing = map(int, counts.groups())
    assert failed == 0 and materialized + materializing + missing == len(DAYS), counts.group(0)
    assert materialized <= len(instance.get_materialized_partitions(target)), counts.group(0)
    # the day's latest materialization names the engine's run
    clickable(browser, f"//*[@title='{DAYS[0]}']").click()  # its row in the list
    wait_for_text(browser, rf"Latest materialization[\s\S]*{run_id[:8]}")
    shoot(browser, screenshots, "ui-partitions")


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
        time.sleep(2)
    (backfill,) = launched
    while (backfill := instance.get_backfill(backfill.backfill_id)).status in GOING:
        assert time.monotonic() < deadline, f"backfill {backfill.backfill_id} still going after {DEADLINE_S}s"
        time.sleep(3)
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
        r"(\d+) runs? launched since the (previous tick|engine started); "
        r"engine (alive|FAILING \(hover\)), beat \d+ s ago, \d+ to submit"
    )
    said = [re.fullmatch(line, t["cursor"] or "") for t in skipped]
    assert skipped and all(said), [t["cursor"] for t in skipped]
    # the runs as they are after the ticks were read: the engine goes on launching meanwhile
    launched = instance.get_runs(RunsFilter(tags={"dagster/sensor_name": "dependency_center"}))
    assert 0 < sum(int(m[1]) for m in said if m) <= len(launched), [t["cursor"] for t in skipped]
    assert all(t["skipReason"].startswith(t["cursor"].split(";")[0] + "; engine alive (pid ") for t in skipped)
