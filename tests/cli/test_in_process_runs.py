"""A run the CLI executes in its own process (``warehouse reingest``, ``taint --apply``, ``release``, ``materialize``)
is one the daemon's run monitoring finds alive: the monitor asks the warm launcher about every started run, whoever
started it, and the launcher knows a run's worker by its ``warehouse/run_worker`` tag."""

import logging
import os
from collections.abc import Iterator
from typing import Any

import pytest
from dagster import DagsterInstance, DagsterRunStatus, OpExecutionContext, instance_for_test, job, op
from dagster._daemon.monitoring.run_monitoring import monitor_started_run

from warehouse_assets.cli.common import in_process_run_tags
from warehouse_assets.cli.repair import _run_taint_job
from warehouse_assets.instance.lanes import LANE_TAG, USER_LANE
from warehouse_assets.instance.warm_launcher import WORKER_TAG, WarmRunLauncher

MONITORED = {
    "run_launcher": {"module": "warehouse_assets.instance.warm_launcher", "class": "WarmRunLauncher"},
    "run_monitoring": {"enabled": True, "max_resume_run_attempts": 0},
}


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with instance_for_test(overrides=MONITORED) as instance:
        yield instance


@op
def monitored_while_running(context: OpExecutionContext) -> str:
    """One pass of the daemon's run monitoring over this run, while it runs; what the run's status is after it."""
    record = context.instance.get_run_record_by_id(context.run_id)
    assert record is not None and record.dagster_run.status == DagsterRunStatus.STARTED
    monitor_started_run(context.instance, None, record, logging.getLogger("test"))  # type: ignore[arg-type]
    after = context.instance.get_run_by_id(context.run_id)
    assert after is not None
    return after.status.value


@job
def in_process() -> None:
    monitored_while_running()


def run_monitored(instance: DagsterInstance, tags: dict[str, str]) -> str:
    result = in_process.execute_in_process(instance=instance, tags=tags, raise_on_error=False)
    status: Any = result.output_for_node("monitored_while_running")
    return str(status)


def test_a_run_executed_in_this_process_with_its_tags_is_alive_to_the_run_monitor(instance: DagsterInstance) -> None:
    assert isinstance(instance.run_launcher, WarmRunLauncher)
    assert run_monitored(instance, in_process_run_tags(USER_LANE)) == DagsterRunStatus.STARTED.value
    # without them, what `warehouse reingest` did: the monitor fails the run under way, its worker UNKNOWN
    assert run_monitored(instance, {}) == DagsterRunStatus.FAILURE.value


def test_the_cli_repair_commands_run_their_job_with_this_process_as_its_worker(instance: DagsterInstance) -> None:
    """``reingest``, ``release`` and ``taint --apply`` execute the taint job here (an unknown table: it fails early,
    but its run exists as the monitor would see it)."""
    config = {"table": "ods.nope", "start": "2026-03-02-10:00", "end": "2026-03-02-10:00", "action": "reingest"}
    assert _run_taint_job(config, instance, {}, lake=False) == 1
    [run] = instance.get_runs()
    assert run.tags[LANE_TAG] == USER_LANE
    assert run.tags[WORKER_TAG].split(":")[1] == str(os.getpid())
    assert instance.run_launcher.check_run_worker_health(run).status.value == "RUNNING"


def test_the_headless_builds_run_with_this_process_as_their_worker(
    instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``warehouse materialize`` builds in this process through Dagster's ``materialize``: with the same tags."""
    import dagster

    from warehouse_assets.catalog import load_catalog
    from warehouse_assets.cli.headless import build_static

    asked: list[dict[str, str]] = []

    class Done:
        success = True

    def materialize(*args: Any, tags: dict[str, str] | None = None, **kwargs: Any) -> Done:
        asked.append(dict(tags or {}))
        return Done()

    monkeypatch.setattr(dagster, "materialize", materialize)
    assert build_static(instance, {}, [], load_catalog()["dwd.city_tier"])
    assert asked == [in_process_run_tags(USER_LANE)]
    assert asked[0][WORKER_TAG].split(":")[1] == str(os.getpid())
