"""Smoke test of the embedded warehouse as `make dev` runs it: Spark Connect, webserver and daemon.

Nobody clicks anything: the landing sensor launches the ingestion, the readiness sensor reports ODS hours,
and the dependency center's engine (``warehouse engine``, started by ``warehouse dev``) materializes DWD, DWS and
ADS partitions through the webserver. The UI answers GraphQL with all layers.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import AssetCheckKey, AssetKey, AssetRecordsFilter, RunsFilter

from resources.spark import port_open
from tests.dev_stack import DAY, DEADLINE_S, ROOT, STALL_S, await_partition, free_port, graphql, start_stack
from tests.test_spark_delta import assert_round


@pytest.fixture(scope="module")
def spark_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def dev_stack(
    tmp_path_factory: pytest.TempPathFactory, spark_port: int
) -> Iterator[tuple[int, Path, subprocess.Popen[bytes]]]:
    root = tmp_path_factory.mktemp("dev")
    home = root / "dagster_home"
    home.mkdir()
    shutil.copy(ROOT / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    port = free_port()
    with start_stack(root, home, port, spark_port) as proc:
        yield port, home, proc


def test_dev_materializes_downstream_partitions_without_a_click(
    dev_stack: tuple[int, Path, subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    port, home, proc = dev_stack
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    target = AssetKey(["ads", "daily_gmv"])
    instance = await_partition(proc, port, home, target, f"{DAY:%Y-%m-%d}")
    for key in (["ods", "order"], ["dwd", "order_detail"], ["dws", "user_order_daily"]):
        assert instance.get_materialized_partitions(AssetKey(key)), key
    # the day was built by the engine, not by hand: submitted for one request, naming the change that triggered it
    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=target), limit=1).records
    run = instance.get_run_by_id(records[0].run_id)
    assert run is not None and run.tags.get("warehouse/engine") == "center", run and run.tags
    assert run.tags["warehouse/request"] and run.tags["warehouse/trigger_table"].startswith(("dws.", "dwd.")), run.tags
    assert instance.get_runs_count(RunsFilter(tags={"warehouse/request": run.tags["warehouse/request"]})) == 1
    # with the table's blocking checks, evaluated in the same step as the write
    checks = instance.event_log_storage.get_asset_check_execution_history(AssetCheckKey(target, "unique"), limit=10)
    assert any(c.run_id == run.run_id and c.status.value == "SUCCEEDED" for c in checks), checks

    data = graphql(port, "{ assetNodes { assetKey { path } groupName } }")
    groups = {node["groupName"] for node in data["data"]["assetNodes"]}
    assert {"ods", "dwd", "dws", "ads"} <= groups


def test_the_connect_server_of_dev_runs_delta_sql(
    dev_stack: tuple[int, Path, subprocess.Popen[bytes]], spark_port: int, tmp_path: Path
) -> None:
    """The Spark Connect server `warehouse dev` starts carries Delta's jars, SQL extension and catalog."""
    proc = dev_stack[2]
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
        "from tests.test_spark_delta import spark_delta_round\n"
        "session = SparkSession.builder.remote(sys.argv[1]).getOrCreate()\n"
        "print(json.dumps(spark_delta_round(session, sys.argv[2])))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", client, f"sc://127.0.0.1:{spark_port}", path],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert_round(path, json.loads(done.stdout.splitlines()[-1]))
