"""The warm run launcher (warehouse_assets/instance/warm_launcher.py) on a tiny code location (tests/support).

The first tests call the instance's launcher directly, as the daemon does when it dequeues a run; one starts the
webserver and the daemon `dagster dev` runs, on the product's instance settings (dagster_home/dagster.yaml: the warm
launcher behind the QueuedRunCoordinator), and launches runs as the UI does, through GraphQL.
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, RunsFilter
from dagster._core.definitions.reconstruct import ReconstructableRepository
from dagster._core.errors import DagsterLaunchFailedError
from dagster._core.launcher import WorkerStatus
from dagster_graphql import DagsterGraphQLClient

from resources.spark import port_open
from tests.support.dev_stack import free_port, graphql, kill_stragglers, marked_processes, stop_group
from warehouse_assets.instance.warm_launcher import (
    STOPPED_TAG,
    WORKER_TAG,
    WarmRunLauncher,
    source_roots,
    source_signature,
)

pytestmark = [pytest.mark.stack, pytest.mark.timeout(900)]  # Dagster's processes started, runs waited on: 300 s each

ROOT = Path(__file__).resolve().parents[2]
LOCATION = ROOT / "tests" / "support" / "warm_location.py"
RUN_TIMEOUT_S = 120  # a run of the tiny location takes a second or two; the first pays the warm worker's imports
WARM_CONFIG = """
telemetry: {enabled: false}
run_launcher:
  module: warehouse_assets.instance.warm_launcher
  class: WarmRunLauncher
"""
# the product's retry policy (its runs are retried by the daemon, which these tests do not start)
PRODUCT_RETRIES = yaml.safe_load((ROOT / "dagster_home" / "dagster.yaml").read_text()).get("run_retries")


@pytest.fixture
def location(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[DagsterInstance, ReconstructableRepository, Path]]:
    """An instance with the warm launcher, and the tiny code location copied into a working directory of its own
    (so that a test can edit its code)."""
    marker = f"WARM_LAUNCHER_TEST={tmp_path}"  # inherited by the warm worker and its runs: found and killed after
    monkeypatch.setenv(*marker.split("=", 1))
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(LOCATION, code / "warm_location.py")
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(WARM_CONFIG + yaml.safe_dump({"run_retries": PRODUCT_RETRIES or {}}))
    instance = DagsterInstance.from_config(str(home))
    recon_repo = ReconstructableRepository.for_module("warm_location", "defs", working_directory=str(code))
    try:
        yield instance, recon_repo, code
    finally:
        instance.run_launcher.dispose()
        instance.dispose()
        kill_stragglers(marker)  # a test that failed midway may have left a run waiting
        sys.modules.pop("warm_location", None)


def launch(instance: DagsterInstance, recon_repo: ReconstructableRepository, job_name: str) -> DagsterRun:
    job = recon_repo.get_definition().get_job(job_name)
    run = instance.create_run_for_job(
        job, job_code_origin=recon_repo.get_reconstructable_job(job_name).get_python_origin()
    )
    instance.launch_run(run.run_id, workspace=None)  # type: ignore[arg-type]  # the warm launcher needs none
    return run


def launch_waiting(instance: DagsterInstance, recon_repo: ReconstructableRepository) -> DagsterRun:
    """The ``waiting_job`` launched, once its step has started (its worker is at work)."""
    waiting = launch(instance, recon_repo, "waiting_job")
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not any(
        e.dagster_event and e.dagster_event.event_type_value == "STEP_START" for e in instance.all_logs(waiting.run_id)
    ):
        assert time.monotonic() < deadline, "the waiting run never started its step"
        time.sleep(0.1)
    return waiting


def wait_finished(instance: DagsterInstance, run_id: str, timeout: float = RUN_TIMEOUT_S) -> DagsterRun:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = instance.get_run_by_id(run_id)
        assert run is not None
        if run.is_finished:
            return run
        time.sleep(0.1)
    pytest.fail(f"run {run_id} did not finish within {timeout} s")


def failure_message(instance: DagsterInstance, run_id: str) -> str:
    return "\n".join(e.message for e in instance.all_logs(run_id) if e.dagster_event and e.dagster_event.is_run_failure)


def _tags(instance: DagsterInstance, run_id: str) -> dict[str, str]:
    run = instance.get_run_by_id(run_id)
    assert run is not None
    return dict(run.tags)


def worker_pid(run: DagsterRun) -> int:
    return int(run.tags[WORKER_TAG].split(":")[1])


def zygote_pid(instance: DagsterInstance) -> int:
    launcher = instance.run_launcher
    assert isinstance(launcher, WarmRunLauncher)
    (zygote,) = launcher._zygotes.values()
    return zygote.proc.pid


def test_runs_are_forked_from_one_warm_worker_that_survives_crashed_and_killed_runs(location) -> None:
    instance, recon_repo, _ = location
    first = wait_finished(instance, launch(instance, recon_repo, "quick_job").run_id)
    assert first.status == DagsterRunStatus.SUCCESS
    zygote = zygote_pid(instance)

    # a worker that dies mid-step (as a segfault or an OOM kill would end it) fails its run, naming why
    crashed = wait_finished(instance, launch(instance, recon_repo, "crashing_job").run_id)
    assert crashed.status == DagsterRunStatus.FAILURE
    assert "exited with code 3 before the run finished" in failure_message(instance, crashed.run_id)

    # a worker killed from outside fails its run within seconds (not at a monitoring timeout)
    waiting = launch_waiting(instance, recon_repo)
    waiting = instance.get_run_by_id(waiting.run_id)
    assert waiting is not None
    assert instance.run_launcher.check_run_worker_health(waiting).status == WorkerStatus.RUNNING
    os.kill(worker_pid(waiting), signal.SIGKILL)
    killed = wait_finished(instance, waiting.run_id, timeout=10)
    assert killed.status == DagsterRunStatus.FAILURE
    assert "killed by signal 9 (SIGKILL)" in failure_message(instance, killed.run_id)
    assert instance.run_launcher.check_run_worker_health(killed).status == WorkerStatus.FAILED

    # the launcher and its warm worker are unharmed: the next run succeeds from the same worker
    after = wait_finished(instance, launch(instance, recon_repo, "quick_job").run_id)
    assert after.status == DagsterRunStatus.SUCCESS
    assert zygote_pid(instance) == zygote


def test_a_run_whose_worker_is_killed_is_marked_to_run_again(location) -> None:
    # the daemon re-executes the failed runs so marked: the partition of a run whose process died is built after all
    instance, recon_repo, _ = location
    waiting = launch_waiting(instance, recon_repo)
    started = instance.get_run_by_id(waiting.run_id)
    assert started is not None
    os.kill(worker_pid(started), signal.SIGKILL)
    killed = wait_finished(instance, waiting.run_id, timeout=10)
    assert killed.status == DagsterRunStatus.FAILURE
    assert instance.run_retries_enabled
    deadline = time.monotonic() + 10  # the verdict is tagged just after the failure is stored
    while (tags := _tags(instance, killed.run_id)).get("dagster/will_retry") is None:
        assert time.monotonic() < deadline, tags
        time.sleep(0.1)
    assert tags["dagster/will_retry"] == "true"


def test_a_dead_warm_worker_is_restarted_and_its_running_runs_are_still_watched(location) -> None:
    instance, recon_repo, _ = location
    assert wait_finished(instance, launch(instance, recon_repo, "quick_job").run_id).status == DagsterRunStatus.SUCCESS
    waiting = launch(instance, recon_repo, "waiting_job")
    os.kill(zygote_pid(instance), signal.SIGKILL)
    time.sleep(1)
    # the orphaned run worker goes on; when it dies, its run still fails (watched by PID)
    run = instance.get_run_by_id(waiting.run_id)
    assert run is not None and not run.is_finished
    os.kill(worker_pid(run), signal.SIGKILL)
    assert wait_finished(instance, waiting.run_id, timeout=10).status == DagsterRunStatus.FAILURE
    # the next launch starts a new warm worker
    assert wait_finished(instance, launch(instance, recon_repo, "quick_job").run_id).status == DagsterRunStatus.SUCCESS


def test_an_edited_code_location_is_reloaded_before_the_next_run(location, tmp_path: Path) -> None:
    instance, recon_repo, code = location
    assert wait_finished(instance, launch(instance, recon_repo, "quick_job").run_id).status == DagsterRunStatus.SUCCESS
    stale = zygote_pid(instance)
    source = code / "warm_location.py"
    source.write_text(source.read_text().replace("    return 1\n", "    return 2\n", 1))  # quick() returns 2
    assert wait_finished(instance, launch(instance, recon_repo, "quick_job").run_id).status == DagsterRunStatus.SUCCESS
    assert zygote_pid(instance) != stale
    stored = tmp_path / "home" / "storage" / "quick"
    assert pickle.loads(stored.read_bytes()) == 2, "the run executed the code as it was before the edit"


def test_a_folder_named_by_watch_env_is_code_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A table declared in a catalog kept outside the working directory (WAREHOUSE_CATALOG_DIR) restarts the warm
    worker as a code edit does: its runs then know the new table."""
    code, tables = tmp_path / "code", tmp_path / "tables"
    code.mkdir()
    (code / "defs.py").write_text("")
    (tables / "dws").mkdir(parents=True)
    monkeypatch.setenv("WAREHOUSE_CATALOG_DIR", str(tables))
    monkeypatch.delenv("WARM_LAUNCHER_TEST_UNSET", raising=False)
    roots = source_roots(str(code), ["WAREHOUSE_CATALOG_DIR", "WARM_LAUNCHER_TEST_UNSET"])
    assert roots == [code / "defs.py", tables.resolve()]
    before = source_signature(roots)
    (tables / "dws" / "new.sql").write_text("SELECT 1")
    assert source_signature(roots) != before
    for home in ("dagster_home", "dagster_home/postgres"):  # the product's instances watch the catalog's folder
        config = yaml.safe_load((ROOT / home / "dagster.yaml").read_text())["run_launcher"]["config"]
        assert config["watch_env"] == ["WAREHOUSE_CATALOG_DIR"], home


def test_a_code_location_that_cannot_load_fails_the_run_with_the_reason(location) -> None:
    instance, recon_repo, code = location
    recon_repo.get_definition()  # the run is created from the code as it was
    source = code / "warm_location.py"
    source.write_text(source.read_text() + "\nraise RuntimeError('broken on purpose')\n")
    with pytest.raises(DagsterLaunchFailedError, match="broken on purpose"):
        launch(instance, recon_repo, "quick_job")
    (run,) = instance.get_runs()
    assert run.status == DagsterRunStatus.FAILURE


def test_runs_launched_from_the_ui_go_through_the_warm_launcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The webserver and the daemon `dagster dev` runs, on the product's instance settings; a 2-day backfill and a run
    launched through GraphQL. The daemon starts once the backfill is launched: its backfill loop looks at it at once
    rather than at its next pass, half a minute on (Dagster's fixed interval)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))  # the storage settings of dagster_home/dagster.yaml read it
    shutil.copy(ROOT / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(
        "load_from:\n  - python_module:\n      module_name: tests.support.warm_location\n"
        f"      working_directory: {ROOT}\n      location_name: warm_test\n"
    )
    port = free_port()
    log = (tmp_path / "dev.log").open("wb")
    instance = DagsterInstance.from_config(str(home))
    instance.get_runs_count()  # the storage created once, before two processes open it
    started: list[subprocess.Popen[bytes]] = []

    def start(program: str, *argv: str) -> None:
        started.append(
            subprocess.Popen(
                [str(Path(sys.executable).with_name(program)), *argv, "-w", str(workspace)],
                cwd=ROOT,
                env=dict(os.environ, DAGSTER_HOME=str(home)),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # stopped with SIGINT to its group, as `dagster dev` stops them
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
            )
        )

    try:
        start("dagster-webserver", "-h", "127.0.0.1", "-p", str(port))
        deadline = time.monotonic() + 300
        while not port_open("127.0.0.1", port):
            assert started[0].poll() is None and time.monotonic() < deadline, "the webserver did not start"
            time.sleep(0.5)
        answer = graphql(
            port,
            """mutation { launchPartitionBackfill(backfillParams: {partitionsByAssets: [
                {assetKey: {path: ["daily"]}, partitions: {range: {start: "2026-01-01", end: "2026-01-02"}}}]}) {
              __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }""",
        )["data"]["launchPartitionBackfill"]
        assert answer["__typename"] == "LaunchBackfillSuccess", answer
        start("dagster-daemon", "run")  # starting while the webserver launches the direct run
        client = DagsterGraphQLClient("127.0.0.1", port_number=port)
        direct = client.submit_job_execution("quick_job", "warm_test", "__repository__", run_config={})

        expected = 3  # one run per day of the backfill, and the direct run
        while time.monotonic() < deadline + 300:
            runs = instance.get_runs()
            if len(runs) >= expected and all(run.is_finished for run in runs):
                break
            assert all(proc.poll() is None for proc in started), "the webserver or the daemon exited"
            time.sleep(0.5)
        runs = instance.get_runs()
        summary = "\n".join(f"{r.run_id} {r.job_name} {r.status.value} {dict(r.tags)}" for r in runs)
        assert len(runs) == expected, summary
        assert all(run.status == DagsterRunStatus.SUCCESS for run in runs), summary
        assert all(WORKER_TAG in run.tags for run in runs), "a run did not go through the warm launcher:\n" + summary
        backfill_runs = instance.get_runs(RunsFilter(tags={"dagster/backfill": answer["backfillId"]}))
        assert sorted(r.tags["dagster/partition"] for r in backfill_runs) == ["2026-01-01", "2026-01-02"], summary
        assert direct in {r.run_id for r in runs}
        instance.dispose()
    finally:
        for proc in reversed(started):
            stop_group(proc)
        kill_stragglers(f"DAGSTER_HOME={home}")
        log.close()
        print((tmp_path / "dev.log").read_text()[-3000:])


def test_terminate_interrupts_the_run_worker_and_the_run_is_canceled(location) -> None:
    instance, recon_repo, _ = location
    waiting = launch_waiting(instance, recon_repo)
    assert instance.run_launcher.terminate(waiting.run_id)
    assert wait_finished(instance, waiting.run_id, timeout=30).status == DagsterRunStatus.CANCELED


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_to_a_run_worker_cancels_its_run_in_one_line(
    location,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    stop: signal.Signals,
    tmp_path: Path,
) -> None:
    # what Ctrl-C of the stack (its whole process group) or a supervisor's SIGTERM does to a run in progress
    instance, recon_repo, _ = location
    # Dagster's compute log capture echoes a step's output to the terminal by a process of its own, stopped when the
    # step ends; given a second to echo all of it (Dagster's setting for it), it would echo the interrupted step's
    # traceback every time
    monkeypatch.setenv("DAGSTER_COMPUTE_LOG_TAIL_WAIT_AFTER_FINISH", "1")
    waiting = launch_waiting(instance, recon_repo)
    started = instance.get_run_by_id(waiting.run_id)
    assert started is not None
    capfd.readouterr()  # what the run printed until now
    os.kill(worker_pid(started), stop)
    run = wait_finished(instance, waiting.run_id, timeout=30)
    assert run.status == DagsterRunStatus.CANCELED
    assert run.tags[STOPPED_TAG] == stop.name  # the engine submits such a run again at its next start
    # the worker's last words, and what an echo of its step would still print: all said once the worker and every
    # process it started have ended (the warm worker alone left: what it forks inherits the location's marker)
    deadline = time.monotonic() + 30
    while left := set(marked_processes(f"WARM_LAUNCHER_TEST={tmp_path}")) - {zygote_pid(instance)}:
        assert time.monotonic() < deadline, [Path(f"/proc/{pid}/cmdline").read_bytes()[:200] for pid in left]
        time.sleep(0.1)
    err = capfd.readouterr().err
    said = f"run {waiting.run_id[:8]} (waiting_job) canceled: its worker received {stop.name}"
    assert said in err.splitlines()
    assert "RUN_CANCELED" not in err and "RUN_FAILURE" not in err  # the run's end is in its log, not printed
    # nor the interrupted step's traceback, which stays in the step's compute log and the run's event log
    assert "Traceback" not in err and "DagsterExecutionInterruptedError" not in err, err
    logs = instance.all_logs(waiting.run_id)
    [failed] = [e.dagster_event for e in logs if e.dagster_event and e.dagster_event.is_step_failure]
    assert failed.step_failure_data.error.cls_name == "DagsterExecutionInterruptedError"  # type: ignore[union-attr]
    [captured] = [
        e.dagster_event for e in logs if e.dagster_event and e.dagster_event.event_type_value == "LOGS_CAPTURED"
    ]
    key = [waiting.run_id, "compute_logs", captured.logs_captured_data.file_key]
    stderr = (instance.compute_log_manager.get_log_data(key).stderr or b"").decode()
    assert "DagsterExecutionInterruptedError" in stderr  # what the terminal was spared, the step's log has
    assert not [e for e in instance.all_logs(waiting.run_id) if e.dagster_event and e.dagster_event.is_run_failure]
