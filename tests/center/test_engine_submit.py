"""The engine's submitter against an HTTP server that answers GraphQL like the webserver: several rounds of
submissions at once must each create their run (one shared GraphQL client refuses a second call while one is open);
and the engine submits a round's runs in the order of Dagster's queue."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from dagster import AssetKey, DagsterInstance

from tests.center.test_center import hours
from tests.center.test_state_store import report
from tests.support.small_catalog import VALUED_ODS, write
from warehouse_assets.catalog import load_catalog
from warehouse_assets.center.engine import SUBMITTERS, GraphQLSubmitter, SubmitError, assemble_engine
from warehouse_assets.center.plans import RunPlan, Trigger
from warehouse_assets.materialize.compiler import max_partitions_per_run


class _Webserver(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _LaunchRun)
        self.lock = threading.Lock()
        self.open = self.most_open = self.launched = 0
        self.params: list[dict[str, Any]] = []  # each launch's execution parameters


class _GraphQL(BaseHTTPRequestHandler):
    """Answers a POST with a GraphQL answer, as the webserver does."""

    def reply(self, answer: dict[str, Any]) -> None:
        payload = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


class _LaunchRun(_GraphQL):
    server: _Webserver

    def do_POST(self) -> None:  # noqa: N802 - the name http.server dispatches to
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            self.server.open += 1
            self.server.most_open = max(self.server.most_open, self.server.open)
            self.server.launched += 1
            run_id = f"run-{self.server.launched}"
            self.server.params.append(body["variables"]["executionParams"])
        time.sleep(0.2)  # the webserver builds the run from the code location: calls overlap
        with self.server.lock:
            self.server.open -= 1
        assert "launchRun(" in body["query"]
        answer = {"data": {"launchRun": {"__typename": "LaunchRunSuccess", "run": {"runId": run_id}}}}
        self.reply(answer)


@contextlib.contextmanager
def _serving(server: ThreadingHTTPServer) -> Iterator[None]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def webserver() -> Iterator[_Webserver]:
    server = _Webserver()
    with _serving(server):
        yield server


def _plan(n: int) -> RunPlan:
    trigger = Trigger("ods.order", "2026-11-01-00", storage_id=n, run_id="upstream", fields=frozenset({"materialized"}))
    return RunPlan(table="dwd.order", partitions=(f"2026-11-{n:02d}",), trigger=trigger, request_id=f"r{n}")


def test_concurrent_submissions_each_create_their_run(webserver: _Webserver) -> None:
    submitter = GraphQLSubmitter(f"http://127.0.0.1:{webserver.server_port}", "warehouse")
    plans = [_plan(n) for n in range(1, 3 * SUBMITTERS + 1)]
    with ThreadPoolExecutor(SUBMITTERS) as pool:
        run_ids = list(pool.map(lambda plan: submitter.submit(plan, AssetKey(["dwd", "order"])), plans))

    assert sorted(run_ids) == sorted(f"run-{n}" for n in range(1, len(plans) + 1))
    assert webserver.most_open > 1, "the submissions ran one at a time"


def test_a_run_is_launched_by_the_dependency_center_with_the_tables_own_checks(webserver: _Webserver) -> None:
    """The Runs page's "Launched by" reads Dagster's sensor tag; the freshness check, judged by its sensor at the
    deadline, stays out of the run (it would add an op that yields nothing and logs so)."""
    key = AssetKey(["dwd", "order"])
    submitter = GraphQLSubmitter(f"http://127.0.0.1:{webserver.server_port}", "warehouse", {key: ["unique"]})
    assert submitter.submit(_plan(1), key) == "run-1"
    [params] = webserver.params
    selector = params["selector"]
    assert (selector["jobName"], selector["repositoryLocationName"]) == ("__ASSET_JOB", "warehouse")
    assert selector["assetSelection"] == [{"path": ["dwd", "order"]}]
    assert selector["assetCheckSelection"] == [{"assetKey": {"path": ["dwd", "order"]}, "name": "unique"}]
    tags = {t["key"]: t["value"] for t in params["executionMetadata"]["tags"]}
    assert tags["dagster/sensor_name"] == "dependency_center"
    assert tags["warehouse/trigger"] == "ods.order 2026-11-01-00 (materialized)"
    assert tags["dagster/partition"] == "2026-11-01"


def test_a_run_of_a_table_that_requires_compute_labels_carries_them(webserver: _Webserver) -> None:
    """The tag the warm launcher places a run by (warehouse_assets/instance/pools.py): a table's ``compute:``."""
    big, other = AssetKey(["dwd", "order"]), AssetKey(["dwd", "user"])
    submitter = GraphQLSubmitter(
        f"http://127.0.0.1:{webserver.server_port}", "warehouse", compute={big: {"size": "large", "region": "eu"}}
    )
    submitter.submit(_plan(1), big)
    submitter.submit(_plan(2), other)
    tags = [{t["key"]: t["value"] for t in p["executionMetadata"]["tags"]} for p in webserver.params]
    assert tags[0]["warehouse/compute"] == "region=eu,size=large"
    assert "warehouse/compute" not in tags[1]


def test_a_taint_plan_launches_the_taint_job_with_its_config_and_no_partition(webserver: _Webserver) -> None:
    submitter = GraphQLSubmitter(f"http://127.0.0.1:{webserver.server_port}", "warehouse")
    config = {"ops": {"taint_and_repair": {"config": {"table": "ods.order", "start": "2026-11-01-03:00"}}}}
    plan = RunPlan(
        "ods.order", ("2026-11-01-03:00",), _plan(1).trigger, "r1", job="taint_repair", run_config=json.dumps(config)
    )
    assert submitter.submit_job(plan) == "run-1"
    [params] = webserver.params
    selector = params["selector"]
    assert (selector["jobName"], selector["repositoryLocationName"]) == ("taint_repair", "warehouse")
    assert "assetSelection" not in selector
    assert params["runConfigData"] == config
    tags = {t["key"]: t["value"] for t in params["executionMetadata"]["tags"]}
    assert not {"dagster/partition", "dagster/asset_partition_range_start"} & set(tags)
    assert tags["dagster/sensor_name"] == "dependency_center" and tags["warehouse/request"] == "r1"


class _LostCodeServer(ThreadingHTTPServer):
    """A webserver whose code server is gone: every launch fails until the code location is reloaded."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Unreachable)
        self.reloads: list[str] = []
        self.healed = False  # a reload started the code server again


class _Unreachable(_GraphQL):
    server: _LostCodeServer

    def do_POST(self) -> None:  # noqa: N802 - the name http.server dispatches to
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if "reloadRepositoryLocation(" in body["query"]:
            self.server.reloads.append(body["variables"]["location"])
            answer: dict[str, Any] = {"data": {"reloadRepositoryLocation": {"__typename": "WorkspaceLocationEntry"}}}
        else:
            if self.server.healed:
                answer = {"data": {"launchRun": {"__typename": "LaunchRunSuccess", "run": {"runId": "run-1"}}}}
            else:
                error = (
                    "dagster._core.errors.DagsterUserCodeUnreachableError: Could not reach user code server. "
                    "gRPC Error code: UNAVAILABLE"
                )
                answer = {"data": {"launchRun": {"__typename": "PythonError", "message": error}}}
        self.reply(answer)


def test_a_lost_code_server_is_reloaded_once_and_a_later_round_submits() -> None:
    server = _LostCodeServer()
    with _serving(server):
        submitter = GraphQLSubmitter(f"http://127.0.0.1:{server.server_port}", "warehouse")
        for _ in range(3):  # rounds in quick succession: one reload asked for, not one per failed launch
            with pytest.raises(SubmitError, match="Could not reach user code server"):
                submitter.submit(_plan(1), AssetKey(["dwd", "order"]))
        assert server.reloads == ["warehouse"]
        server.healed = True
        assert submitter.submit(_plan(1), AssetKey(["dwd", "order"])) == "run-1"


class _SlowRecorder:
    """Records when each submission starts and ends; each takes a while, as the webserver's does."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: dict[str, tuple[float, float]] = {}  # table → (started, ended)

    def submit(self, plan: RunPlan, asset_key: AssetKey) -> str:
        started = time.monotonic()
        time.sleep(0.1)
        with self.lock:
            self.calls[plan.table] = (started, time.monotonic())
        return f"run-{plan.table}"

    def submit_job(self, plan: RunPlan) -> str:
        raise AssertionError(f"no job run expected: {plan}")


def test_a_days_last_hour_is_submitted_before_the_days_first_daily_runs(
    consolidated: DagsterInstance, tmp_path: Path
) -> None:
    """The coordinator launches a submitted run at once while a slot is free, and the run keeps its slot: submitted
    together, the day's first daily runs could take every slot and leave the day's last hour queued behind them."""
    root = tmp_path / "tables"
    write(root, "ods/src.yaml", VALUED_ODS)
    write(root, "dwd/day.sql", "/* ---\ntable: dwd.day\nperiod: daily\n--- */\nSELECT id, v FROM ods.src\n")
    write(root, "dws/hour.sql", "/* ---\ntable: dws.hour\nperiod: hourly\n--- */\nSELECT id, v FROM ods.src\n")
    recorder = _SlowRecorder()
    now = datetime(2026, 3, 6, 9, tzinfo=ZoneInfo("Asia/Shanghai"))
    engine = assemble_engine(consolidated, load_catalog(root), recorder, max_partitions_per_run, clock=lambda: now)
    try:
        engine.recover()
        for hour in hours("2026-03-05")[:-1]:
            report(consolidated, AssetKey(["ods", "src"]), hour)
        engine.tick()
        recorder.calls.clear()

        report(consolidated, AssetKey(["ods", "src"]), hours("2026-03-05")[-1])  # the day's last hour
        engine.tick()
    finally:
        engine.close()
    assert set(recorder.calls) == {"dws.hour", "dwd.day"}
    assert recorder.calls["dws.hour"][1] <= recorder.calls["dwd.day"][0], recorder.calls
