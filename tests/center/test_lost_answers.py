"""A submission whose answer was lost (the webserver killed in the middle of it) may have created its run all the same:
the engine takes that run as the plan's instead of submitting a second one, and replaces a run the dying webserver
created but never queued. Found by the fault soak: a request built twice after a webserver kill."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance, DagsterRunStatus, RunsFilter, instance_for_test

from tests.center.test_lost_retries import DAY, NOW, Recorder
from tests.center.test_state_store import report, start
from tests.support.small_catalog import sql_catalog
from warehouse_assets.center.engine import ORPHAN_TAG, Engine
from warehouse_assets.center.plans import REQUEST_TAG, RunPlan
from warehouse_assets.center.resolver import Resolver
from warehouse_assets.center.reverse_index import ReverseIndex
from warehouse_assets.center.state_store import PartitionStateStore
from warehouse_assets.materialize.compiler import max_partitions_per_run


class LosingRecorder(Recorder):
    """Creates the run, then loses the answer once; ``queue`` says whether the webserver got to queue the run."""

    def __init__(self, instance: DagsterInstance, queue: bool):
        super().__init__(instance)
        self.queue, self.lost = queue, False

    def submit(self, plan: RunPlan, asset_key: AssetKey) -> str:
        run_id = super().submit(plan, asset_key)
        if not self.lost:
            self.lost = True
            if self.queue:
                run = self.instance.get_run_by_id(run_id)
                assert run is not None
                start(self.instance, run)  # queued and picked up: no longer NOT_STARTED
            raise ConnectionResetError("Remote end closed connection without response")
        return run_id


def _engine(instance: DagsterInstance, tmp_path: Path, queue: bool) -> tuple[Engine, LosingRecorder]:
    catalog = sql_catalog(tmp_path / "catalog", {"dwd/day.sql": ("period: daily\n", "SELECT id FROM ods.src")})
    resolver = Resolver(
        catalog, ReverseIndex.build(catalog, current_time=NOW), PartitionStateStore(instance), max_partitions_per_run
    )
    recorder = LosingRecorder(instance, queue)
    engine = Engine(instance, resolver, recorder, clock=lambda: NOW)
    for hour in range(24):
        report(instance, AssetKey(["ods", "src"]), f"{DAY}-{hour:02d}:00")
    return engine, recorder


@pytest.fixture
def instance(tmp_path: Path) -> Iterator[DagsterInstance]:
    (tmp_path / "home").mkdir()
    with instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
        yield instance


@pytest.fixture
def lost_after_queueing(instance: DagsterInstance, tmp_path: Path) -> Iterator[tuple[Engine, LosingRecorder]]:
    engine, recorder = _engine(instance, tmp_path, queue=True)
    yield engine, recorder
    engine.close()


@pytest.fixture
def lost_before_queueing(instance: DagsterInstance, tmp_path: Path) -> Iterator[tuple[Engine, LosingRecorder]]:
    engine, recorder = _engine(instance, tmp_path, queue=False)
    yield engine, recorder
    engine.close()


def _runs(instance: DagsterInstance, plan: RunPlan) -> list[tuple[str, DagsterRunStatus, bool]]:
    records = instance.get_run_records(RunsFilter(tags={REQUEST_TAG: plan.request_id}))
    return [(r.dagster_run.run_id, r.dagster_run.status, ORPHAN_TAG in r.dagster_run.tags) for r in records]


def test_a_run_created_before_its_answer_was_lost_is_the_plans_run(
    lost_after_queueing: tuple[Engine, LosingRecorder],
) -> None:
    engine, recorder = lost_after_queueing
    assert engine.tick() == []  # the answer lost: the plan stays pending
    [pending] = engine.resolver.pending()
    [(run_id, status, _)] = _runs(engine.instance, pending)
    assert status == DagsterRunStatus.STARTED
    [(plan, adopted)] = engine.tick()
    assert (plan.request_id, adopted) == (pending.request_id, run_id)
    assert len(recorder.plans) == 1  # never submitted a second time
    assert engine.resolver.pending() == [] and engine.tick() == []
    assert len(_runs(engine.instance, pending)) == 1


def test_a_run_the_dying_webserver_never_queued_is_canceled_and_submitted_again(
    lost_before_queueing: tuple[Engine, LosingRecorder],
) -> None:
    engine, recorder = lost_before_queueing
    assert engine.tick() == []
    [pending] = engine.resolver.pending()
    [(orphan, status, _)] = _runs(engine.instance, pending)
    assert status == DagsterRunStatus.NOT_STARTED
    assert engine.tick() == []  # too recent to tell from a webserver about to queue it: nothing submitted yet
    assert len(recorder.plans) == 1 and engine.resolver.pending() == [pending]
    engine.orphan_after = 0.0  # ... until it has been NOT_STARTED for longer than any webserver takes
    [(plan, run_id)] = engine.tick()
    assert plan.request_id == pending.request_id and run_id != orphan
    runs = {r: (s, tagged) for r, s, tagged in _runs(engine.instance, pending)}
    assert runs == {orphan: (DagsterRunStatus.CANCELED, True), run_id: (DagsterRunStatus.NOT_STARTED, False)}
    assert engine.tick() == [] and len(recorder.plans) == 2


def test_after_a_restart_a_run_created_for_a_pending_plan_is_its_run_and_an_orphan_is_replaced(
    lost_before_queueing: tuple[Engine, LosingRecorder],
) -> None:
    engine, recorder = lost_before_queueing
    assert engine.tick() == []
    [pending] = engine.resolver.pending()
    assert engine.recover() == 1  # too recent: still to submit, not taken as submitted
    engine.orphan_after = 0.0
    assert engine.recover() == 1  # an orphan: canceled, the plan still to submit
    [(_, status, tagged)] = _runs(engine.instance, pending)
    assert (status, tagged) == (DagsterRunStatus.CANCELED, True)
    [(plan, _)] = engine.tick()
    assert plan.request_id == pending.request_id and len(recorder.plans) == 2
