"""The run coordinator's fast path (warehouse_assets/instance/run_coordinator.py) on the tiny code location of the warm
launcher's tests: a run that fits starts in the call that submits it, with no daemon; the others queue, and
Dagster's daemon launches them as it would behind its own QueuedRunCoordinator."""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, SubmitRunContext
from dagster._core.definitions.reconstruct import ReconstructableRepository
from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon

from tests.instance.test_warm_launcher import LOCATION, wait_finished
from tests.support.dev_stack import kill_stragglers
from warehouse_assets.instance.lanes import (
    FIRST_BUILD_LANE,
    INGEST_LANE,
    MAINTENANCE_LANE,
    REBUILD_LANE,
    USER_LANE,
    lane_tags,
)
from warehouse_assets.instance.run_coordinator import ImmediateRunCoordinator

pytestmark = pytest.mark.stack

CONFIG = """
telemetry: {enabled: false}
run_launcher:
  module: warehouse_assets.instance.warm_launcher
  class: WarmRunLauncher
run_coordinator:
  module: warehouse_assets.instance.run_coordinator
  class: ImmediateRunCoordinator
  config:
    max_concurrent_runs: 2
    tag_concurrency_limits: [{key: warehouse/ingest, limit: 1}]
"""
INGEST = {"warehouse/ingest": "ods"}


@pytest.fixture
def location(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[DagsterInstance, ReconstructableRepository]]:
    marker = f"WARM_LAUNCHER_TEST={tmp_path}"  # inherited by the warm worker and its runs: found and killed after
    monkeypatch.setenv(*marker.split("=", 1))
    code, home = tmp_path / "code", tmp_path / "home"
    code.mkdir()
    home.mkdir()
    shutil.copy(LOCATION, code / "warm_location.py")
    (home / "dagster.yaml").write_text(CONFIG)
    instance = DagsterInstance.from_config(str(home))
    try:
        yield instance, ReconstructableRepository.for_module("warm_location", "defs", working_directory=str(code))
    finally:
        instance.run_launcher.dispose()
        instance.dispose()
        kill_stragglers(marker)
        sys.modules.pop("warm_location", None)


def submit(
    instance: DagsterInstance, recon_repo: ReconstructableRepository, job_name: str, tags: dict[str, str] | None = None
) -> DagsterRun:
    """What DagsterInstance.submit_run does once the run exists (the warm launcher needs no workspace)."""
    job = recon_repo.get_definition().get_job(job_name)
    location = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(module_name="warm_location", working_directory=recon_repo.pointer.working_directory),
        location_name="warm_test",
    )
    run = instance.create_run_for_job(
        job,
        tags=tags,
        job_code_origin=recon_repo.get_reconstructable_job(job_name).get_python_origin(),
        # a queued run names its code location (the webserver sets it from its workspace)
        remote_job_origin=RemoteJobOrigin(RemoteRepositoryOrigin(location, "__repository__"), job_name),
    )
    return instance.run_coordinator.submit_run(SubmitRunContext(run, workspace=None))  # type: ignore[arg-type]


def status(instance: DagsterInstance, run: DagsterRun) -> DagsterRunStatus:
    found = instance.get_run_by_id(run.run_id)
    assert found is not None
    return found.status


def wait_step_started(instance: DagsterInstance, run: DagsterRun, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not any(
        e.dagster_event and e.dagster_event.event_type_value == "STEP_START" for e in instance.all_logs(run.run_id)
    ):
        assert time.monotonic() < deadline, f"run {run.run_id} never started its step"
        time.sleep(0.1)


def enqueued(instance: DagsterInstance, run: DagsterRun) -> bool:
    return any(
        e.dagster_event and e.dagster_event.event_type_value == "PIPELINE_ENQUEUED"
        for e in instance.all_logs(run.run_id)
    )


def test_a_run_that_fits_is_launched_by_the_call_that_submits_it(location) -> None:
    instance, recon_repo = location
    assert isinstance(instance.run_coordinator, ImmediateRunCoordinator)
    run = submit(instance, recon_repo, "quick_job")
    assert run.status in (DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.SUCCESS)
    # no daemon runs here: only the submitting call can have launched it
    assert wait_finished(instance, run.run_id).status == DagsterRunStatus.SUCCESS
    assert not enqueued(instance, run)


def test_runs_over_a_limit_queue_and_the_daemon_launches_them(location) -> None:
    instance, recon_repo = location
    ingest = submit(instance, recon_repo, "waiting_job", INGEST)
    wait_step_started(instance, ingest)
    # the tag limit (one ingestion at a time) holds the second ingestion back …
    second_ingest = submit(instance, recon_repo, "quick_job", INGEST)
    assert status(instance, second_ingest) == DagsterRunStatus.QUEUED
    # … but not an untagged run, which the daemon would launch past it too: it takes the second slot at once
    other = submit(instance, recon_repo, "waiting_job")
    assert status(instance, other) in (DagsterRunStatus.STARTING, DagsterRunStatus.STARTED)
    wait_step_started(instance, other)
    # both slots taken (max_concurrent_runs: 2): the next run queues, and stays queued with no daemon
    late = submit(instance, recon_repo, "quick_job")
    assert status(instance, late) == DagsterRunStatus.QUEUED
    time.sleep(1)
    assert status(instance, late) == DagsterRunStatus.QUEUED

    # the slots free; a new run now would overtake the two queued ones, which the daemon would launch first
    for run in (ingest, other):
        assert instance.run_launcher.terminate(run.run_id)
        assert wait_finished(instance, run.run_id, timeout=30).status == DagsterRunStatus.CANCELED
    newest = submit(instance, recon_repo, "quick_job")
    assert status(instance, newest) == DagsterRunStatus.QUEUED

    # Dagster's own dequeuer works with this coordinator: its passes launch the queued runs, oldest first
    daemon = QueuedRunCoordinatorDaemon(interval_seconds=1)
    context = SimpleNamespace(instance=instance, create_request_context=lambda: None)
    deadline = time.monotonic() + 120
    while any(status(instance, r) == DagsterRunStatus.QUEUED for r in (second_ingest, late, newest)):
        assert time.monotonic() < deadline, "the daemon did not launch the queued runs"
        list(daemon.run_iteration(context))  # type: ignore[arg-type]
        time.sleep(0.2)
    for run in (second_ingest, late, newest):
        assert wait_finished(instance, run.run_id).status == DagsterRunStatus.SUCCESS
    started = {r.run_id: instance.get_run_record_by_id(r.run_id).start_time for r in (second_ingest, newest)}  # type: ignore[union-attr]
    assert started[second_ingest.run_id] <= started[newest.run_id]


@pytest.fixture
def product(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[DagsterInstance, ReconstructableRepository]]:
    """The tiny code location on an instance with dagster_home/dagster.yaml's own run coordinator settings."""
    import yaml

    settings = yaml.safe_load((Path(__file__).parents[2] / "dagster_home" / "dagster.yaml").read_text())
    marker = f"WARM_LAUNCHER_TEST={tmp_path}"
    monkeypatch.setenv(*marker.split("=", 1))
    code, home = tmp_path / "code", tmp_path / "home"
    code.mkdir()
    home.mkdir()
    shutil.copy(LOCATION, code / "warm_location.py")
    config = yaml.safe_load(CONFIG)
    config["run_coordinator"] = settings["run_coordinator"]
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    instance = DagsterInstance.from_config(str(home))
    try:
        yield instance, ReconstructableRepository.for_module("warm_location", "defs", working_directory=str(code))
    finally:
        instance.run_launcher.dispose()
        instance.dispose()
        kill_stragglers(marker)
        sys.modules.pop("warm_location", None)


def cancel_all(instance: DagsterInstance, running: list[DagsterRun], queued: list[DagsterRun]) -> None:
    for run in running:
        assert instance.run_launcher.terminate(run.run_id)
        assert wait_finished(instance, run.run_id, timeout=30).status == DagsterRunStatus.CANCELED
    for run in queued:
        instance.run_coordinator.cancel_run(run.run_id)


def test_a_first_build_starts_while_the_rebuild_lane_is_full_with_the_products_settings(product) -> None:
    """Rebuilds (late data, repairs) hold one slot at most, the ingestion one, so a partition's first build finds a
    slot although rebuilds wait in the queue before it."""
    instance, recon_repo = product
    rebuild = {**lane_tags(REBUILD_LANE), "dagster/priority": "-189"}
    first_rebuild = submit(instance, recon_repo, "waiting_job", rebuild)
    wait_step_started(instance, first_rebuild)
    second_rebuild = submit(instance, recon_repo, "waiting_job", rebuild)
    assert status(instance, second_rebuild) == DagsterRunStatus.QUEUED  # the lane is full
    ingest = submit(instance, recon_repo, "waiting_job", lane_tags(INGEST_LANE))
    wait_step_started(instance, ingest)
    first_build = submit(
        instance, recon_repo, "waiting_job", {**lane_tags(FIRST_BUILD_LANE), "dagster/priority": "-89"}
    )
    assert status(instance, first_build) in (DagsterRunStatus.STARTING, DagsterRunStatus.STARTED)
    wait_step_started(instance, first_build)
    assert status(instance, second_rebuild) == DagsterRunStatus.QUEUED
    cancel_all(instance, [first_rebuild, ingest, first_build], [second_rebuild])


def test_three_busy_background_lanes_leave_a_slot_to_a_first_build_with_the_products_settings(product) -> None:
    """An ingestion, a rebuild and a Z-order run submitted at once with a first build: two of the three background
    runs start, the third waits for one of them, and the first build starts at once."""
    instance, recon_repo = product
    background = [
        submit(instance, recon_repo, "waiting_job", lane_tags(lane))
        for lane in (INGEST_LANE, REBUILD_LANE, MAINTENANCE_LANE)
    ]
    first_build = submit(instance, recon_repo, "waiting_job", lane_tags(FIRST_BUILD_LANE))
    assert status(instance, first_build) in (DagsterRunStatus.STARTING, DagsterRunStatus.STARTED)
    wait_step_started(instance, first_build)
    started = [r for r in background if status(instance, r) != DagsterRunStatus.QUEUED]
    assert [r.tags["warehouse/lane"] for r in started] == [INGEST_LANE, REBUILD_LANE]
    for run in started:
        wait_step_started(instance, run)
    assert status(instance, background[2]) == DagsterRunStatus.QUEUED  # the background lanes' share is full
    # a user's run waits like any other once every slot is taken: the guarantee is one slot, not one per lane
    user = submit(instance, recon_repo, "quick_job", lane_tags(USER_LANE))
    assert status(instance, user) == DagsterRunStatus.QUEUED
    cancel_all(instance, [*started, first_build], [background[2], user])
