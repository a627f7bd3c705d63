"""The product's stack as `warehouse dev` starts it (Spark Connect, webserver, daemon), for tests of a running stack.

:func:`start_stack` starts it on simulated sources against a Dagster home of the caller's (SQLite or PostgreSQL) and
stops it cleanly, process group and stragglers included. :func:`await_partition` waits, with no click, until a
partition is materialized and every run the stack started has finished, and asserts that they all succeeded.
:func:`assert_sigint_stops_everything` stops a stack as a supervisor does and asserts that nothing outlives it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from dagster import AssetKey, DagsterInstance, DagsterRun, DagsterRunStatus, RunRecord, RunsFilter

from resources.spark import LOG_FILE_BYTES, port_open
from simulator.cdc import SimulationConfig, simulate

ROOT = Path(__file__).resolve().parents[2]
# Not a latency target (bench/handoff_latency.py measures that): the chain — ingest, ODS hour checks, DWD, DWS,
# ADS, a run launch each on 2 run slots — takes about 4 min on a quiet 2-core machine and twice that on a busy one.
# A wait fails when the stack stops making progress (no run or step event for STALL_S), or at DEADLINE_S
# whatever happens.
STALL_S = 300
DEADLINE_S = 1500
# the per-test limit (pytest-timeout) of a module that waits on a stack: past the waits' own deadline, whose failure
# says more (the runs so far), so that it catches only a hang elsewhere (a stop, a browser, a query)
STACK_TIMEOUT_S = DEADLINE_S + STALL_S
# how often a wait looks at the instance (a few cheap reads): a wait ends this long at most after what it waits for
POLL_S = 1.0
# a recent day: automation looks back a few weeks, older history is for backfills
DAY = datetime.combine(datetime.now(ZoneInfo("Asia/Shanghai")).date() - timedelta(days=3), datetime.min.time())
# seconds between the ODS sensors' ticks in a test's stack (the product's default is 15): the ingestion starts, and a
# stopped sensor looks again, within this long of what it waits for
ODS_SENSOR_INTERVAL_S = 2


def days_ended() -> int:
    """The days from ``DAY`` that have ended now, the stack's partitions of a daily table: three when the module
    starts, one more from each midnight of the business zone a long run crosses."""
    return (datetime.now(ZoneInfo("Asia/Shanghai")).date() - DAY.date()).days


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def graphql(port: int, query: str) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


@contextmanager
def start_stack(
    root: Path,
    home: Path,
    port: int,
    spark_port: int,
    env: Mapping[str, str] | None = None,
    days: int = 1,
    sigint_ignored: bool = False,
) -> Iterator[subprocess.Popen[bytes]]:
    """`warehouse dev` on ``days`` simulated days from DAY and the next day's first hour (landing and lake under
    ``root``) with the instance of ``home``; ``env`` adds to the environment (the instance's settings). With
    ``sigint_ignored`` it starts as a script or a supervisor starts it in the background: SIGINT ignored, which a
    non-interactive shell gives a background job."""
    disposition = signal.SIG_IGN if sigint_ignored else signal.SIG_DFL
    simulate(root / "landing", DAY, DAY + timedelta(days=days, hours=1), SimulationConfig(seed=5, scale=0.03))
    full_env = dict(
        os.environ,
        DAGSTER_HOME=str(home),
        WAREHOUSE_LAKE_ROOT=str(root / "lake"),
        WAREHOUSE_LANDING_ROOT=str(root / "landing"),
        WAREHOUSE_LOG_DIR=str(root),
        WAREHOUSE_SPARK_MODE="connect",
        WAREHOUSE_SPARK_CONNECT_URL=f"sc://127.0.0.1:{spark_port}",
        WAREHOUSE_SPARK_DRIVER_MEMORY="2g",
        # the simulated sources' first day, as `warehouse dev` would adopt it, whatever this process's environment says
        WAREHOUSE_START=f"{DAY:%Y-%m-%d}",
        WAREHOUSE_ODS_SENSOR_INTERVAL=str(ODS_SENSOR_INTERVAL_S),
        **(env or {}),
    )
    log = (root / "terminal.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "warehouse_assets.cli", "dev", "--no-simulate", "--port", str(port)],
        cwd=ROOT,
        env=full_env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, disposition),
    )
    try:
        yield proc
    finally:
        stop_group(proc)  # a stack that had exited already: its log below says why
        kill_stragglers(f"DAGSTER_HOME={home}")
        log.close()
        print((root / "terminal.log").read_text()[-3000:])


def stop_group(proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    """Stop the process group ``proc`` leads as Ctrl-C would (so each process cleans up), killing it past
    ``timeout_s``; a group gone already is left as it is."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=timeout_s)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def kill_stragglers(marker: str) -> None:
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


def run_line(record: RunRecord) -> str:
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


def runs_summary(instance: DagsterInstance) -> str:
    """What ran, oldest first."""
    return "\n".join(run_line(record) for record in reversed(instance.get_run_records(limit=200)))


def launched_by_the_stack(run: DagsterRun) -> bool:
    """Whether a sensor or the dependency center launched ``run`` (a run launched by hand carries neither tag)."""
    return "dagster/sensor_name" in run.tags  # the engine's runs name its sensor, dependency_center


def await_partition(
    proc: subprocess.Popen[bytes], port: int, home: Path, target: AssetKey, partition: str
) -> DagsterInstance:
    """Wait until ``target``'s ``partition`` is materialized and every run started so far has finished; assert that
    they all succeeded. The instance of ``home`` is returned."""
    started = last_progress = time.monotonic()
    instance = None
    seen: int | None = None  # the newest event of any run: a step or a run starting or ending is progress
    while (now := time.monotonic()) - last_progress < STALL_S and now - started < DEADLINE_S:
        assert proc.poll() is None, "the dev stack exited"
        # the webserver listens only after `warehouse dev` created the instance's storage: opening it earlier
        # races that creation (two processes stamping a fresh SQLite database leave alembic two heads)
        if instance is None and port_open("127.0.0.1", port):
            instance = DagsterInstance.from_config(str(home))
        if instance is not None:
            if partition in instance.get_materialized_partitions(target):
                break
            latest = instance.event_log_storage.get_maximum_record_id()
            if latest != seen:
                seen, last_progress = latest, now
        time.sleep(POLL_S)
    else:
        why = f"no run or step event for {STALL_S}s" if now - last_progress >= STALL_S else "deadline"
        pytest.fail(
            f"{target.to_user_string()} {partition} was not materialized by automation: {why} "
            f"after {now - started:.0f}s; runs:\n"
            + (runs_summary(instance) if instance is not None else "(no instance)")
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
        time.sleep(POLL_S)
    print(runs_summary(instance))  # shown with -s or -rP: what the stack ran to get there
    unfinished = [run_line(r) for r in instance.get_run_records(started_runs) if not r.dagster_run.is_finished]
    assert not unfinished, "runs that did not finish:\n" + "\n".join(unfinished)
    failed = [
        run_line(r)
        for r in instance.get_run_records()
        if r.dagster_run.is_finished and r.dagster_run.status != DagsterRunStatus.SUCCESS
    ]
    assert not failed, "runs that did not succeed:\n" + "\n".join(failed)
    return instance


LAUNCH = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
  }
}
"""


def marked_processes(marker: str) -> list[int]:
    """The live processes (zombies left out) whose environment carries ``marker``."""
    needle = marker.encode() + b"\0"
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if needle in (entry / "environ").read_bytes() and "Z" not in (entry / "stat").read_text().split()[2]:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def launch_job(port: int, job: str, run_config: dict) -> str:
    """Launch ``job`` through the webserver, as the UI's Launchpad does; the run's id."""
    params = {
        "selector": {"repositoryLocationName": "warehouse", "repositoryName": "__repository__", "jobName": job},
        "runConfigData": run_config,
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": LAUNCH, "variables": {"params": params}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=180) as response:  # the launch may start the warm worker: it waits
        answer = json.loads(response.read())["data"]["launchRun"]
    assert answer["__typename"] == "LaunchRunSuccess", answer
    return str(answer["run"]["runId"])


def assert_sigint_stops_everything(
    proc: subprocess.Popen[bytes], root: Path, port: int, home: Path, why: Mapping[str, str]
) -> None:
    """A `why_waiting` run (config ``why``) launched and finished, so that the warm launcher's worker and a run's own
    process have existed; then SIGINT to the stack's process group, as a supervisor stops a background `warehouse dev`
    (started with ``sigint_ignored``): it exits 0 and nothing it started outlives it. On the way, its logs under
    ``root``: the terminal's and dev.log (in one zone), and Spark Connect's, warnings only in a size-capped file."""
    # the stack's own processes: the test's (a browser it drives) share its DAGSTER_HOME, not its log dir
    marker = f"WAREHOUSE_LOG_DIR={root}"
    instance = DagsterInstance.from_config(str(home))
    run_id = launch_job(port, "why_waiting", {"ops": {"explain_partition": {"config": dict(why)}}})
    deadline = time.monotonic() + DEADLINE_S
    while not ((run := instance.get_run_by_id(run_id)) is not None and run.is_finished):
        assert proc.poll() is None, "warehouse dev exited before the run finished"
        assert time.monotonic() < deadline, f"run {run_id} did not finish"
        time.sleep(POLL_S)
    assert run is not None and run.status == DagsterRunStatus.SUCCESS, run
    assert len(marked_processes(marker)) >= 6  # dev, Spark, dagster dev, webserver, daemon, code server, engine, ...
    instance.dispose()

    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=120) == 0
    deadline = time.monotonic() + 10  # reparented children a moment behind their parents
    while (left := marked_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == [], [Path(f"/proc/{pid}/cmdline").read_bytes()[:200] for pid in left]
    # the daemon stopped before the code server: none of its sensor ticks failed against a server gone
    terminal = (root / "terminal.log").read_text()
    assert "DagsterUserCodeUnreachableError" not in terminal
    # the stack's own log (WAREHOUSE_LOG_DIR/dev.log): what the terminal showed, Dagster's colour codes left out
    written = (root / "dev.log").read_text()
    assert "\x1b[" in terminal and "\x1b" not in written  # the daemon's warnings at a first start are coloured
    assert "[dev] the UI is up" in written and "why_waiting" in written
    # one zone: Dagster's lines (its daemon's, the runs') carry the business timezone's offset, as the partition keys do
    stamped = re.findall(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d( [+-]\d{4})? - dagster[.\w]* - ", written, re.MULTILINE)
    assert stamped and set(stamped) == {" +0800"}, stamped

    connect_log = root / "spark-connect.log"
    lines = connect_log.read_text().splitlines() if connect_log.exists() else []
    assert not [line for line in lines if " INFO " in line], lines[:20]  # warnings and errors only
    config = (root / "spark-connect.log4j2.properties").read_text()
    assert "appender.file.type = RollingFile" in config
    assert f"appender.file.policies.size.size = {LOG_FILE_BYTES}" in config
