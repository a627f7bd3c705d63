"""A failed run whose retry Dagster could not launch (its code server restarting at that moment) is given up for good
by Dagster (``dagster/will_retry=false``): the engine submits it again, once, and leaves alone the runs that failed on
their data or used up their retries. Found by the fault soak: a partition never built after a code server kill.
A run a stop of the stack canceled (Ctrl-C: its worker tags it) is submitted again the same way at the next start; a
run a user terminated is not."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from dagster import AssetKey, DagsterInstance, DagsterRun, instance_for_test

from tests.center.test_state_store import job_of, report, start
from tests.support.small_catalog import sql_catalog
from warehouse_assets.catalog import Catalog
from warehouse_assets.center.engine import (
    AUTO_RETRY_RUN_ID_TAG,
    RETRY_NUMBER_TAG,
    WILL_RETRY_TAG,
    Engine,
)
from warehouse_assets.center.plans import LOST_RETRY, REQUEST_TAG, STOPPED, RunPlan
from warehouse_assets.center.resolver import Resolver
from warehouse_assets.center.reverse_index import ReverseIndex
from warehouse_assets.center.state_store import PartitionStateStore
from warehouse_assets.instance.warm_launcher import STOPPED_TAG
from warehouse_assets.materialize.compiler import max_partitions_per_run
from warehouse_assets.materialize.gate import RETRY_ON_STEP_FAILURE_TAG

TZ = ZoneInfo("Asia/Shanghai")
NOW = datetime(2026, 3, 6, 9, tzinfo=TZ)
DAY = "2026-03-05"
DAILY = AssetKey(["dwd", "day"])


@pytest.fixture
def retrying(tmp_path: Path) -> Iterator[DagsterInstance]:
    """An instance that retries failed runs twice, as the product's does."""
    (tmp_path / "home").mkdir()
    overrides = {"run_retries": {"enabled": True, "max_retries": 2, "retry_on_asset_or_op_failure": True}}
    with instance_for_test(temp_dir=str(tmp_path / "home"), overrides=overrides) as instance:
        yield instance


class Recorder:
    """Submits as the webserver would: the run is created with the plan's tags."""

    def __init__(self, instance: DagsterInstance):
        self.instance, self.plans = instance, list[RunPlan]()

    def submit(self, plan: RunPlan, asset_key: AssetKey) -> str:
        self.plans.append(plan)
        run = self.instance.create_run_for_job(
            job_of(asset_key), tags=plan.tags, asset_selection=frozenset({asset_key})
        )
        return run.run_id

    def submit_job(self, plan: RunPlan) -> str:
        raise AssertionError(f"no job run expected: {plan}")


@pytest.fixture
def engine(retrying: DagsterInstance, tmp_path: Path) -> Iterator[tuple[Engine, Recorder]]:
    catalog: Catalog = sql_catalog(tmp_path / "catalog", {"dwd/day.sql": ("period: daily\n", "SELECT id FROM ods.src")})
    resolver = Resolver(
        catalog, ReverseIndex.build(catalog, current_time=NOW), PartitionStateStore(retrying), max_partitions_per_run
    )
    recorder = Recorder(retrying)
    engine = Engine(retrying, resolver, recorder, clock=lambda: NOW)
    engine.sweep_every = 0.0
    yield engine, recorder
    engine.close()


def _failed_first_run(engine: Engine, recorder: Recorder, **tags: str) -> DagsterRun:
    """The day's run, submitted by the engine once its 24 hours are in, started, then failed as Dagster leaves a run it
    could not retry (or with ``tags`` instead)."""
    instance = engine.instance
    for hour in range(24):
        report(instance, AssetKey(["ods", "src"]), f"{DAY}-{hour:02d}:00")
    [(plan, run_id)] = engine.tick()
    assert plan.partitions == (DAY,)
    run = instance.get_run_by_id(run_id)
    assert run is not None
    start(instance, run)
    instance.report_run_failed(run)
    instance.add_run_tags(run_id, {WILL_RETRY_TAG: "false", "dagster/failure_reason": "STEP_FAILURE", **tags})
    recorder.plans.clear()
    return run


def test_a_run_whose_retry_could_not_be_launched_is_submitted_again_once(engine: tuple[Engine, Recorder]) -> None:
    center, recorder = engine
    failed = _failed_first_run(center, recorder)
    [(plan, run_id)] = center.tick()
    assert (plan.table, plan.partitions, plan.request_id) == ("dwd.day", (DAY,), f"retry-{failed.run_id}")
    assert plan.trigger.fields == frozenset({LOST_RETRY}) and plan.trigger.run_id == failed.run_id
    assert plan.trigger.describe() == f"dwd.day {DAY} (its retry could not be launched)"
    run = center.instance.get_run_by_id(run_id)
    assert run is not None and run.tags[REQUEST_TAG] == plan.request_id
    assert run.asset_selection == {DAILY}
    assert center.tick() == []  # once: its run exists
    start(center.instance, run)
    center.instance.report_run_failed(run)  # and should the second chance fail the same way, no third
    center.instance.add_run_tags(run_id, {WILL_RETRY_TAG: "false"})
    assert center.tick() == []


@pytest.mark.parametrize(
    "tags",
    [
        {RETRY_ON_STEP_FAILURE_TAG: "false"},  # failed on its data: its inputs changing requests it again
        {RETRY_NUMBER_TAG: "2"},  # the second retry of a run: its retries are used up
        {AUTO_RETRY_RUN_ID_TAG: "a-retry"},  # Dagster retried it
    ],
    ids=["data", "exhausted", "retried"],
)
def test_a_run_dagster_did_not_lose_is_left_alone(engine: tuple[Engine, Recorder], tags: dict[str, str]) -> None:
    center, recorder = engine
    _failed_first_run(center, recorder, **tags)
    assert center.tick() == []
    assert recorder.plans == []


def test_a_partition_a_later_run_took_over_is_not_submitted_again(engine: tuple[Engine, Recorder]) -> None:
    center, recorder = engine
    _failed_first_run(center, recorder)
    later = center.instance.create_run_for_job(job_of(DAILY), tags={"dagster/partition": DAY})
    start(center.instance, later)  # e.g. the user's Materialize
    center.resolver.step(NOW)  # the store sees it
    assert center.plan_lost_retries() == []


@pytest.mark.parametrize("stopped", [True, False], ids=["stopped", "terminated"])
def test_a_run_a_stop_canceled_is_submitted_again_at_the_next_start(
    engine: tuple[Engine, Recorder], stopped: bool
) -> None:
    center, recorder = engine
    instance = center.instance
    for hour in range(24):
        report(instance, AssetKey(["ods", "src"]), f"{DAY}-{hour:02d}:00")
    [(_, run_id)] = center.tick()
    run = instance.get_run_by_id(run_id)
    assert run is not None
    start(instance, run)
    if stopped:  # what the warm launcher's worker does on SIGINT or SIGTERM
        instance.add_run_tags(run_id, {STOPPED_TAG: "SIGINT"})
    instance.report_run_canceling(run)
    instance.report_run_canceled(run)
    recorder.plans.clear()
    plans = center.tick()
    if not stopped:
        assert plans == []  # a user's Terminate is not undone
        return
    [(plan, again)] = plans
    assert (plan.table, plan.partitions, plan.request_id) == ("dwd.day", (DAY,), f"again-{run_id}")
    assert plan.trigger.fields == frozenset({STOPPED})
    assert plan.trigger.describe() == f"dwd.day {DAY} (its run was canceled by a stop)"
    assert center.tick() == []  # once: its run exists
    assert again != run_id
