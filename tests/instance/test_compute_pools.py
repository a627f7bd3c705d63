"""Compute pools on two real Spark Connect servers: pool ``a`` (capacity 1, the small machine) and pool ``b`` (capacity
2). Runs go through the product's run coordinator and warm launcher, a queued run through Dagster's own dequeuer;
each run queries the Spark its tags name and reports that server's port."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from dagster import AssetKey, DagsterInstance, DagsterRun, DagsterRunStatus, SubmitRunContext
from dagster._core.definitions.reconstruct import ReconstructableRepository
from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
from dagster._core.test_utils import in_process_test_workspace
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon

from resources.spark import CONNECT_TOKEN_VARIABLE, new_connect_token, start_connect_server
from tests.instance.test_run_coordinator import status, submit, wait_step_started
from tests.instance.test_warm_launcher import wait_finished
from tests.support.dev_stack import free_port, kill_stragglers
from tests.support.jvm import QUICK_JIT
from tests.support.pool_location import HOLD_TAG
from warehouse_assets.instance.pools import (
    POOL_TAG,
    POOL_URL_TAG,
    POOLS_VARIABLE,
    PoolRegistry,
    load_lines,
    parse_pools,
    requirement_tags,
    waiting_message,
)

pytestmark = [pytest.mark.spark, pytest.mark.stack, pytest.mark.timeout(600)]

LOCATION = Path(__file__).resolve().parents[1] / "support" / "pool_location.py"
CONFIG = """
telemetry: {enabled: false}
run_launcher:
  module: warehouse_assets.instance.warm_launcher
  class: WarmRunLauncher
  config: {preload_modules: [pyspark.sql.connect.session]}
run_coordinator:
  module: warehouse_assets.instance.run_coordinator
  class: ImmediateRunCoordinator
  config: {max_concurrent_runs: 10}
"""
SMALL = requirement_tags({"size": "small"})  # only pool a has it


@dataclass
class Pools:
    instance: DagsterInstance
    repo: ReconstructableRepository
    ports: dict[str, int]
    servers: dict[str, int]  # pool -> the process group of its server
    holds: Path

    def submit(self, hold: str = "", tags: dict[str, str] | None = None) -> DagsterRun:
        held = {HOLD_TAG: str(self.holds / hold)} if hold else {}
        return submit(self.instance, self.repo, "spark_job", {**held, **(tags or {})})

    def submit_from_ui(self, job_name: str, asset: str, hold: str) -> DagsterRun:
        """A run of ``asset`` submitted with the workspace of its code location, as the webserver's launchRun does."""
        job = self.repo.get_definition().get_job(job_name)
        origin = LoadableTargetOrigin(
            module_name="pool_location", attribute="defs", working_directory=self.repo.pointer.working_directory
        )
        location = InProcessCodeLocationOrigin(origin, location_name="warm_test")
        run = self.instance.create_run_for_job(
            job,
            tags={HOLD_TAG: str(self.holds / hold)},
            job_code_origin=self.repo.get_reconstructable_job(job_name).get_python_origin(),
            remote_job_origin=RemoteJobOrigin(RemoteRepositoryOrigin(location, "__repository__"), job_name),
            asset_selection=frozenset({AssetKey(asset)}),  # what the UI's Materialize of that asset selects
        )
        with in_process_test_workspace(self.instance, origin) as workspace:
            return self.instance.run_coordinator.submit_run(SubmitRunContext(run, workspace=workspace))

    def release(self, hold: str) -> None:
        (self.holds / hold).touch()

    def pool(self, run: DagsterRun) -> str:
        found = self.instance.get_run_by_id(run.run_id)
        assert found is not None
        return found.tags.get(POOL_TAG, "")

    def port_used(self, run: DagsterRun) -> int:
        """The port of the Spark server the run's query ran on, as that server reported it."""
        for key in ("on_spark", "on_small_spark"):
            for record in self.instance.fetch_materializations(AssetKey(key), limit=50).records:
                if record.run_id == run.run_id:
                    return int(record.asset_materialization.metadata["port"].value)  # type: ignore[union-attr]
        raise AssertionError(f"run {run.run_id} materialized nothing")

    def dequeue(self, *runs: DagsterRun, until: DagsterRunStatus | None = None, passes: int = 3) -> None:
        """Dagster's daemon passes over the queue: until no run of ``runs`` is queued, or ``passes`` of them."""
        daemon = QueuedRunCoordinatorDaemon(interval_seconds=1)
        context = SimpleNamespace(instance=self.instance, create_request_context=lambda: None)
        deadline = time.monotonic() + 60
        for done in range(10**6):
            if until is None and done >= passes:
                return
            if until is not None and all(status(self.instance, r) != DagsterRunStatus.QUEUED for r in runs):
                return
            assert time.monotonic() < deadline, "the daemon did not launch the queued runs"
            list(daemon.run_iteration(context))  # type: ignore[arg-type]
            time.sleep(0.3)


def tags_of(instance: DagsterInstance, run: DagsterRun) -> dict[str, str]:
    found = instance.get_run_by_id(run.run_id)
    assert found is not None
    return dict(found.tags)


def enqueued_times(instance: DagsterInstance, run: DagsterRun) -> int:
    return sum(
        1
        for e in instance.all_logs(run.run_id)
        if e.dagster_event and e.dagster_event.event_type_value == "PIPELINE_ENQUEUED"
    )


def _stop(group: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)


@pytest.fixture(scope="module")
def pools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pools]:
    root = tmp_path_factory.mktemp("pools")
    servers: dict[str, int] = {}
    ports = {"a": free_port(), "b": free_port()}
    tokens = {name: new_connect_token() for name in ports}
    with pytest.MonkeyPatch.context() as env:
        marker = f"WARM_LAUNCHER_TEST={root}"  # inherited by the warm worker and its runs: found and killed after
        env.setenv(*marker.split("=", 1))
        env.delenv(CONNECT_TOKEN_VARIABLE, raising=False)  # each pool's URL carries its own server's token
        env.setenv("WAREHOUSE_LOG_DIR", str(root / "logs"))
        pools_spec = {
            name: {"url": f"sc://localhost:{ports[name]}/;token={tokens[name]}", "capacity": capacity, "labels": labels}
            for name, capacity, labels in (("a", 1, {"size": "small"}), ("b", 2, {"size": "large"}))
        }
        env.setenv(POOLS_VARIABLE, json.dumps(pools_spec))
        code, home = root / "code", root / "home"
        code.mkdir()
        home.mkdir()
        (root / "holds").mkdir()
        shutil.copy(LOCATION, code / "pool_location.py")
        (home / "dagster.yaml").write_text(CONFIG)
        instance = None
        try:

            def start(name: str) -> int:  # a small server, one core: the test runs a query per run
                proc = start_connect_server(
                    port=ports[name],
                    master="local[1]",
                    driver_memory="512m",
                    log_path=root / "logs" / f"spark-{name}.log",
                    token=tokens[name],
                    timeout_s=180,
                )
                assert proc is not None
                servers[name] = proc.pid  # started in a session of its own: its group is its pid
                return proc.pid

            # both JVMs boot at once, compiled by C1 alone: they live the module's half minute, too short for C2's
            # compiles to pay back (the warm worker and its runs start no JVM: the option is the servers' only)
            with pytest.MonkeyPatch.context() as servers_env, ThreadPoolExecutor(2) as starting:
                inherited = os.environ.get("JAVA_TOOL_OPTIONS", "")
                servers_env.setenv("JAVA_TOOL_OPTIONS", f"{inherited} {QUICK_JIT}".strip())
                list(starting.map(start, ports))
            instance = DagsterInstance.from_config(str(home))
            repo = ReconstructableRepository.for_module("pool_location", "defs", working_directory=str(code))
            yield Pools(instance, repo, ports, servers, root / "holds")
        finally:
            if instance is not None:
                instance.run_launcher.dispose()
                instance.dispose()
            kill_stragglers(marker)
            for group in servers.values():
                _stop(group)
            sys.modules.pop("pool_location", None)


def test_runs_go_where_there_is_room_and_wait_in_the_queue_when_every_pool_is_full(pools: Pools) -> None:
    instance = pools.instance
    # a run of an asset that needs the small machine, launched as the UI does (no tag of its own), keeps pool a busy
    small = pools.submit_from_ui("small_job", "on_small_spark", "small")
    wait_step_started(instance, small)
    assert pools.pool(small) == "a"
    assert tags_of(instance, small)["warehouse/compute"] == "size=small"  # learnt from its asset's tags
    # the tags name the endpoint, not its token (the UI shows them): the run found it in its settings
    assert tags_of(instance, small)[POOL_URL_TAG] == f"sc://localhost:{pools.ports['a']}"
    # the next runs go to b, which has room, each at once (no daemon runs yet)
    first, second = pools.submit("first"), pools.submit("second")
    assert [pools.pool(first), pools.pool(second)] == ["b", "b"]
    for run in (first, second):
        wait_step_started(instance, run)
    # both pools full: the next run waits in Dagster's queue, and the daemon's passes leave it there
    late = pools.submit()
    assert status(instance, late) == DagsterRunStatus.QUEUED
    pools.dequeue(late, passes=3)
    assert status(instance, late) == DagsterRunStatus.QUEUED
    # held by the queue's limits, not launched and sent back by the launcher pass after pass
    assert enqueued_times(instance, late) == 1
    assert waiting_message(instance, late, parse_pools(os.environ[POOLS_VARIABLE])) == (
        "waiting for compute: pool a full (1/1), pool b full (2/2)"
    )
    ports = pools.ports
    assert load_lines(instance, parse_pools(os.environ[POOLS_VARIABLE])) == [
        f"pool a: 1/1 runs [size=small] sc://localhost:{ports['a']}",
        f"pool b: 2/2 runs [size=large] sc://localhost:{ports['b']}",
    ]
    # a run of b ends: the queued run is placed there by the daemon's next pass, and runs on b's Spark
    pools.release("first")
    assert wait_finished(instance, first.run_id).status == DagsterRunStatus.SUCCESS
    assert pools.port_used(first) == pools.ports["b"]
    pools.dequeue(late, until=DagsterRunStatus.STARTING)
    assert pools.pool(late) == "b"
    assert wait_finished(instance, late.run_id).status == DagsterRunStatus.SUCCESS
    assert pools.port_used(late) == pools.ports["b"]
    for hold, run in (("small", small), ("second", second)):
        pools.release(hold)
        assert wait_finished(instance, run.run_id).status == DagsterRunStatus.SUCCESS
    assert pools.port_used(small) == pools.ports["a"]


def test_a_pool_whose_server_dies_is_marked_offline_skipped_and_its_runs_wait(pools: Pools) -> None:
    instance = pools.instance
    # one run on b: a and b have a free slot each, and a, declared first, would be chosen
    busy = pools.submit("busy-b")
    wait_step_started(instance, busy)
    assert pools.pool(busy) == "b"
    _stop(pools.servers["a"])
    killed_at = time.time()
    # a does not answer: skipped and marked offline; the run goes to b and succeeds there
    elsewhere = pools.submit()
    assert pools.pool(elsewhere) == "b"
    assert wait_finished(instance, elsewhere.run_id).status == DagsterRunStatus.SUCCESS
    assert pools.port_used(elsewhere) == pools.ports["b"]
    since = PoolRegistry(instance.root_directory).offline()["a"]["since"]
    assert killed_at <= since <= time.time()
    # a run that only a can take waits, saying why
    small = pools.submit(tags=SMALL)
    pools.dequeue(small, passes=2)
    assert status(instance, small) == DagsterRunStatus.QUEUED
    clock = time.strftime("%H:%M", time.localtime(since))
    assert waiting_message(instance, small, parse_pools(os.environ[POOLS_VARIABLE])) == (
        f"waiting for compute: pool a offline since {clock}"
    )
    assert load_lines(instance, parse_pools(os.environ[POOLS_VARIABLE]))[0] == (
        f"pool a: 0/1 runs, offline since {clock} [size=small] sc://localhost:{pools.ports['a']}"
    )
    pools.release("busy-b")
    assert wait_finished(instance, busy.run_id).status == DagsterRunStatus.SUCCESS
    instance.run_coordinator.cancel_run(small.run_id)
