"""Smoke test of the embedded warehouse as `make dev` runs it: Spark Connect, webserver and daemon.

Nobody clicks anything: the landing sensor launches the ingestion, the readiness sensor reports ODS hours,
and the dependency center's engine (``warehouse engine``, started by ``warehouse dev``) materializes DWD, DWS and
ADS partitions through the webserver. The UI answers GraphQL with all layers.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from dagster import (
    AssetCheckKey,
    AssetKey,
    AssetRecordsFilter,
    DagsterInstance,
    DagsterRunStatus,
    RunRecord,
    RunsFilter,
)

from resources.spark import port_open
from simulator.cdc import SimulationConfig, simulate
from tests.test_spark_delta import assert_round

ROOT = Path(__file__).resolve().parent.parent
# Not a latency target (bench/handoff_latency.py measures that): the chain — ingest, ODS hour checks, DWD, DWS,
# ADS, a run launch each on 2 run slots — takes about 4 min on a quiet 2-core machine and twice that on a busy one.
# The test fails when the stack stops making progress (no run or step event for STALL_S), or at
# DEADLINE_S whatever happens.
STALL_S = 300
DEADLINE_S = 1500
DAY = datetime.combine(datetime.now(ZoneInfo("Asia/Shanghai")).date() - timedelta(days=3), datetime.min.time())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _graphql(port: int, query: str) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def spark_port() -> int:
    return _free_port()


@pytest.fixture(scope="module")
def dev_stack(
    tmp_path_factory: pytest.TempPathFactory, spark_port: int
) -> Iterator[tuple[int, Path, subprocess.Popen[bytes]]]:
    root = tmp_path_factory.mktemp("dev")
    home = root / "dagster_home"
    home.mkdir()
    shutil.copy(ROOT / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    # a recent day: the engine looks back a few weeks, older history is for backfills
    simulate(root / "landing", DAY, DAY + timedelta(days=1, hours=1), SimulationConfig(seed=5, scale=0.03))
    port = _free_port()
    env = dict(
        os.environ,
        DAGSTER_HOME=str(home),
        WAREHOUSE_LAKE_ROOT=str(root / "lake"),
        WAREHOUSE_LANDING_ROOT=str(root / "landing"),
        WAREHOUSE_LOG_DIR=str(root),
        WAREHOUSE_SPARK_MODE="connect",
        WAREHOUSE_SPARK_CONNECT_URL=f"sc://127.0.0.1:{spark_port}",
        WAREHOUSE_SPARK_DRIVER_MEMORY="2g",
    )
    log = (root / "dev.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "warehouse_assets.cli", "dev", "--no-simulate", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        yield port, home, proc
    finally:
        try:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=60)
        except ProcessLookupError:
            pass  # the stack had exited already: its log below says why
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        _kill_stragglers(f"DAGSTER_HOME={home}")
        print((root / "dev.log").read_text()[-3000:])


def _kill_stragglers(marker: str) -> None:
    """Kill what the stack left behind (a code server may outlive dagster dev), found by its environment."""
    needle = marker.encode() + b"\0"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes():
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue


def _run_line(record: RunRecord) -> str:
    """One run, for a failure message: job, status, partition, assets, queued / run seconds."""
    run = record.dagster_run
    created = record.create_timestamp.timestamp()
    started, ended = record.start_time, record.end_time
    partition = run.tags.get("dagster/partition") or run.tags.get("dagster/asset_partition_range_start", "")
    assets = ",".join(k.to_user_string() for k in sorted(run.asset_selection or [], key=str))
    return (
        f"{run.job_name} {run.status.value} {partition} {assets} "
        f"queued={(started or time.time()) - created:.0f}s ran={(ended or time.time()) - (started or created):.0f}s"
    )


def _runs_summary(instance: DagsterInstance) -> str:
    """What ran, oldest first."""
    return "\n".join(_run_line(record) for record in reversed(instance.get_run_records(limit=200)))


def test_dev_materializes_downstream_partitions_without_a_click(
    dev_stack: tuple[int, Path, subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    port, home, proc = dev_stack
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    started = last_progress = time.monotonic()
    instance = None
    target = AssetKey(["ads", "daily_gmv"])
    seen: int | None = None  # the newest event of any run: a step or a run starting or ending is progress
    while (now := time.monotonic()) - last_progress < STALL_S and now - started < DEADLINE_S:
        assert proc.poll() is None, "the dev stack exited"
        # the webserver listens only after `warehouse dev` created the instance's storage: opening it earlier
        # races that creation (two processes stamping a fresh SQLite database leave alembic two heads)
        if instance is None and port_open("127.0.0.1", port):
            instance = DagsterInstance.from_config(str(home))
        if instance is not None:
            if f"{DAY:%Y-%m-%d}" in instance.get_materialized_partitions(target):
                break
            latest = instance.event_log_storage.get_maximum_record_id()
            if latest != seen:
                seen, last_progress = latest, now
        time.sleep(5)
    else:
        why = f"no run or step event for {STALL_S}s" if now - last_progress >= STALL_S else "deadline"
        pytest.fail(
            f"ads/daily_gmv {DAY:%Y-%m-%d} was not materialized by the engine: {why} "
            f"after {now - started:.0f}s; runs:\n"
            + (_runs_summary(instance) if instance is not None else "(no instance)")
        )
    assert instance is not None
    # the materialization is stored before the run's last steps (its checks) end: wait until every run started
    # so far has finished; every run the stack started must have succeeded, not only written its data
    started_runs = RunsFilter(run_ids=[r.dagster_run.run_id for r in instance.get_run_records()])
    while (now := time.monotonic()) - last_progress < STALL_S and now - started < DEADLINE_S:
        if all(run.is_finished for run in instance.get_runs(started_runs)):
            break
        latest = instance.event_log_storage.get_maximum_record_id()
        if latest != seen:
            seen, last_progress = latest, now
        time.sleep(5)
    print(_runs_summary(instance))  # shown with -s or -rP: what the stack ran to get there
    unfinished = [_run_line(r) for r in instance.get_run_records(started_runs) if not r.dagster_run.is_finished]
    assert not unfinished, "runs that did not finish:\n" + "\n".join(unfinished)
    failed = [
        _run_line(r)
        for r in instance.get_run_records()
        if r.dagster_run.is_finished and r.dagster_run.status != DagsterRunStatus.SUCCESS
    ]
    assert not failed, "runs that did not succeed:\n" + "\n".join(failed)
    for key in (["ods", "order"], ["dwd", "order_detail"], ["dws", "user_order_daily"]):
        assert instance.get_materialized_partitions(AssetKey(key)), key
    # the day was built by the engine, not by hand: submitted for one request, naming the change that triggered it
    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=target), limit=1).records
    run = instance.get_run_by_id(records[0].run_id)
    assert run is not None and run.tags.get("warehouse/engine") == "center", run and run.tags
    assert run.tags["warehouse/request"] and run.tags["warehouse/trigger_table"].startswith(("dws.", "dwd.")), run.tags
    assert instance.get_runs_count(RunsFilter(tags={"warehouse/request": run.tags["warehouse/request"]})) == 1
    # with the table's blocking checks, evaluated in the same step as the write
    checks = instance.event_log_storage.get_asset_check_execution_history(
        AssetCheckKey(target, "unique"), limit=10
    )
    assert any(c.run_id == run.run_id and c.status.value == "SUCCEEDED" for c in checks), checks

    data = _graphql(port, "{ assetNodes { assetKey { path } groupName } }")
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
