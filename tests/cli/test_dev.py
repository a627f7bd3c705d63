"""``warehouse dev`` started the way a script or a supervisor starts it: in the background, in a session of its own,
with SIGINT ignored (what a non-interactive shell gives a background job). SIGINT to its process group stops
everything it started, the warm launcher's worker and a run's process included, and nothing outlives it. On the way,
the Spark Connect server it starts logs warnings only, into a size-capped rolling file."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRunStatus

from resources.spark import LOG_FILE_BYTES, port_open
from tests.support.dev_stack import ROOT, free_port, kill_stragglers
from warehouse_assets.center import heartbeat

START_S = 600  # Spark Connect, the webserver, the daemon and the engine on a loaded 2-core machine
pytestmark = [pytest.mark.stack, pytest.mark.timeout(2 * START_S)]  # the waits below, one after the other
LAUNCH = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
  }
}
"""


def _marked(marker: str) -> list[int]:
    """The processes whose environment carries ``marker``."""
    needle = marker.encode() + b"\0"
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if needle in (entry / "environ").read_bytes() and "Z" not in (entry / "stat").read_text().split()[2]:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _wait(condition, what: str, proc: subprocess.Popen[bytes], timeout: float = START_S) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"warehouse dev exited before {what}"
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        time.sleep(1)


def _launch(port: int, job: str, run_config: dict) -> dict:
    """Launch ``job`` through the webserver, as the UI's Launchpad does."""
    params = {
        "selector": {"repositoryLocationName": "warehouse", "repositoryName": "__repository__", "jobName": job},
        "runConfigData": run_config,
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": LAUNCH, "variables": {"params": params}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=180) as response:  # the launch forks the warm worker: it may wait
        return json.loads(response.read())["data"]["launchRun"]


def test_sigint_stops_a_background_dev_stack_with_nothing_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home, landing = tmp_path / "home", tmp_path / "landing"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))  # the instance's file locates its storage by it
    landing.mkdir()
    shutil.copy(ROOT / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    port, spark_port = free_port(), free_port()
    marker = f"DAGSTER_HOME={home}"
    env = dict(
        os.environ,
        DAGSTER_HOME=str(home),
        WAREHOUSE_LAKE_ROOT=str(tmp_path / "lake"),
        WAREHOUSE_LANDING_ROOT=str(landing),
        WAREHOUSE_LOG_DIR=str(tmp_path),
        WAREHOUSE_SPARK_CONNECT_URL=f"sc://127.0.0.1:{spark_port}",
        WAREHOUSE_SPARK_DRIVER_MEMORY="1g",
    )
    log = (tmp_path / "terminal.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "warehouse_assets.cli", "dev", "--no-simulate", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # setsid: a group of its own, as `setsid make dev &`
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # as a background job of a script
    )
    try:
        _wait(lambda: port_open("127.0.0.1", port), "webserver", proc)
        instance = DagsterInstance.from_config(str(home))
        _wait(lambda: heartbeat.read(instance) is not None, "engine heartbeat", proc)
        # a run: the warm launcher's worker and the run's own process exist too
        why = {"table": "ads.daily_gmv", "partition": "2026-01-02"}
        answer = _launch(port, "why_waiting", {"ops": {"explain_partition": {"config": why}}})
        assert answer["__typename"] == "LaunchRunSuccess", answer
        run_id = answer["run"]["runId"]
        _wait(lambda: (run := instance.get_run_by_id(run_id)) is not None and run.is_finished, "finished run", proc)
        assert instance.get_run_by_id(run_id).status == DagsterRunStatus.SUCCESS  # type: ignore[union-attr]
        assert len(_marked(marker)) >= 6  # dev, Spark, dagster dev, webserver, daemon, code server, engine, worker

        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=120) == 0
        deadline = time.monotonic() + 10  # reparented children a moment behind their parents
        while (left := _marked(marker)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert left == [], [Path(f"/proc/{pid}/cmdline").read_bytes()[:200] for pid in left]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        kill_stragglers(marker)
        log.close()
        print((tmp_path / "terminal.log").read_text()[-3000:])
    # the daemon stopped before the code server: none of its sensor ticks failed against a server gone
    terminal = (tmp_path / "terminal.log").read_text()
    assert "DagsterUserCodeUnreachableError" not in terminal
    # the stack's own log (WAREHOUSE_LOG_DIR/dev.log): what the terminal showed, Dagster's colour codes left out
    written = (tmp_path / "dev.log").read_text()
    assert "\x1b[" in terminal and "\x1b" not in written  # the daemon's warnings at a first start are coloured
    assert "[dev] the UI is up" in written and "why_waiting" in written
    # one zone: Dagster's lines (its daemon's, the runs') carry the business timezone's offset, as the partition keys do
    stamped = re.findall(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d( [+-]\d{4})? - dagster[.\w]* - ", written, re.MULTILINE)
    assert stamped and set(stamped) == {" +0800"}, stamped

    connect_log = tmp_path / "spark-connect.log"
    lines = connect_log.read_text().splitlines() if connect_log.exists() else []
    assert not [line for line in lines if " INFO " in line], lines[:20]  # warnings and errors only
    config = (tmp_path / "spark-connect.log4j2.properties").read_text()
    assert "appender.file.type = RollingFile" in config
    assert f"appender.file.policies.size.size = {LOG_FILE_BYTES}" in config
