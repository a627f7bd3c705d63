"""``warehouse rebuild --stale``: the stale partitions the dependency center reports, listed, and their rebuilds
launched now as the engine launches runs (rebuild lane, late changes, upstream tables first); nothing for none."""

from __future__ import annotations

import argparse
import json
from datetime import timedelta

import pytest
from dagster import AssetKey, DagsterInstance

from tests.center.test_center import Center
from tests.center.test_late_data import BUILT, DAY, DERIVED, built_chain, late_hour
from tests.center.test_state_store import create_run, end, materialize_in, start
from tests.support.small_catalog import VALUED_ODS, sql_catalog
from warehouse_assets.catalog import Catalog
from warehouse_assets.center.catch_up import CATCH_UP, plan_catch_up
from warehouse_assets.center.ledger import Stale, open_readonly
from warehouse_assets.center.plans import REQUEST_TAG, TRIGGER_TAG, RunPlan
from warehouse_assets.cli.rebuild import rebuild_stale_command
from warehouse_assets.instance.lanes import LANE_TAG, REBUILD_LANE
from warehouse_assets.materialize.gate import LATE_CHANGES_TAG


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    tables = {f"{fqn.replace('.', '/')}.sql": declaration for fqn, declaration in DERIVED.items()}
    return sql_catalog(tmp_path_factory.mktemp("catalog"), tables, ods=VALUED_ODS)


class Submitter:
    """The webserver's stand-in: records each plan it is asked to launch."""

    def __init__(self) -> None:
        self.plans: list[tuple[RunPlan, AssetKey]] = []

    def submit(self, plan: RunPlan, asset_key: AssetKey) -> str:
        self.plans.append((plan, asset_key))
        return f"run-{len(self.plans)}"


def args(dry_run: bool = False, tables: tuple[str, ...] = ()) -> argparse.Namespace:
    return argparse.Namespace(stale=True, table=list(tables), dry_run=dry_run, url=None, dagster_home=None)


def stale_day(consolidated: DagsterInstance, catalog: Catalog) -> Center:
    """dwd.day built, then late data to one of its hours: stale, its rebuild due an hour later (every 60 min)."""
    center = Center(consolidated, catalog)
    built_chain(center)
    late_hour(center, 10, seen=BUILT + timedelta(minutes=1))
    late_hour(center, 11, seen=BUILT + timedelta(minutes=2))
    return center


def test_a_dry_run_lists_each_stale_partition_with_its_due_time_and_launches_nothing(
    consolidated: DagsterInstance, catalog: Catalog, capsys: pytest.CaptureFixture[str]
) -> None:
    stale_day(consolidated, catalog)
    submitter = Submitter()
    assert rebuild_stale_command(args(dry_run=True), consolidated, catalog, submitter) == 0
    out = capsys.readouterr().out
    assert f"dwd.day {DAY}: stale: late data since 2026-03-06 01:01+08:00 (2 late changes), rebuild due" in out
    # and every built partition read from it, stale the moment it is rebuilt: dws.sum and the four ADS tables
    assert "1 stale partition(s) and 5 built from them; 6 rebuild run(s), upstream first" in out
    assert out.index(f"  dwd.day {DAY}\n") < out.index(f"  dws.sum {DAY}\n") < out.index(f"  ads.fresh {DAY}\n")
    assert "nothing launched" in out
    assert submitter.plans == []


def test_the_rebuilds_are_launched_now_in_the_rebuild_lane_with_their_late_changes(
    consolidated: DagsterInstance, catalog: Catalog, capsys: pytest.CaptureFixture[str]
) -> None:
    stale_day(consolidated, catalog)
    submitter = Submitter()
    assert rebuild_stale_command(args(), consolidated, catalog, submitter) == 0
    (plan, key), *followers = submitter.plans
    assert key == AssetKey(["dwd", "day"]) and plan.partitions == (DAY,)
    tags = plan.tags
    assert tags[LANE_TAG] == REBUILD_LANE and tags["dagster/partition"] == DAY
    assert json.loads(tags[LATE_CHANGES_TAG]) == {DAY: 2}
    assert CATCH_UP in tags[TRIGGER_TAG] and tags[REQUEST_TAG].startswith("catch-up-")
    # then what is built from it, after it in Dagster's queue (a lower priority), each as a late-data rebuild
    assert [p.table for p, _ in followers][0] == "dws.sum"
    assert {p.table for p, _ in followers} == {"dws.sum", "ads.nightly", "ads.manual", "ads.fresh", "ads.through"}
    assert all(p.queue_priority < plan.queue_priority and p.tags[LANE_TAG] == REBUILD_LANE for p, _ in followers)
    assert all(json.loads(p.tags[LATE_CHANGES_TAG]) == {DAY: 1} for p, _ in followers)
    assert followers[0][0].queue_priority > followers[1][0].queue_priority  # dws before ads
    assert "launched 6 rebuild run(s) for 1 stale partition(s) and 5 built from them" in capsys.readouterr().out


def test_once_the_catch_up_runs_land_in_queue_order_nothing_is_stale_and_no_rebuild_is_left_due(
    consolidated: DagsterInstance, catalog: Catalog
) -> None:
    center = stale_day(consolidated, catalog)
    submitter = Submitter()
    assert rebuild_stale_command(args(), consolidated, catalog, submitter) == 0
    at = BUILT + timedelta(minutes=3)  # long before the policy's time (01:01 + 60 min)
    runs = [(create_run(consolidated, list(p.partitions), key), p, key) for p, key in submitter.plans]
    assert center.step(at) == []  # all queued: the engine launches none of them again
    for run, plan, key in runs:  # the rebuild lane runs them one at a time, in the queue's order
        start(consolidated, run)
        for partition in plan.partitions:
            materialize_in(consolidated, run, partition, key)
        end(consolidated, run, "success")
        assert center.step(at) == []  # nothing built twice, nothing downstream built on the old data
    ledger = open_readonly(center.store.path)
    assert ledger is not None
    assert ledger.all_stale() == []
    ledger.close()
    assert center.step(BUILT + timedelta(hours=3)) == []  # and no rebuild due later either


def test_only_the_tables_asked_for_and_an_unknown_table_is_an_error(
    consolidated: DagsterInstance, catalog: Catalog, capsys: pytest.CaptureFixture[str]
) -> None:
    stale_day(consolidated, catalog)
    submitter = Submitter()
    assert rebuild_stale_command(args(tables=("dws.sum",)), consolidated, catalog, submitter) == 0
    assert capsys.readouterr().out == "nothing stale in dws.sum\n" and submitter.plans == []
    assert rebuild_stale_command(args(tables=("dws.summ",)), consolidated, catalog, submitter) == 2
    assert "dws.summ" in capsys.readouterr().err and submitter.plans == []


def test_nothing_stale_launches_nothing(
    consolidated: DagsterInstance, catalog: Catalog, capsys: pytest.CaptureFixture[str]
) -> None:
    built_chain(Center(consolidated, catalog))
    submitter = Submitter()
    assert rebuild_stale_command(args(), consolidated, catalog, submitter) == 0
    assert capsys.readouterr().out == "nothing stale\n" and submitter.plans == []


def test_an_instance_the_center_never_ran_on_says_so(
    consolidated: DagsterInstance, catalog: Catalog, capsys: pytest.CaptureFixture[str]
) -> None:
    assert rebuild_stale_command(args(), consolidated, catalog, Submitter()) == 2
    assert "the dependency center has not run" in capsys.readouterr().err


def stale(table: str, partition: str, changes: int = 1, note: str = "", due: float | None = 0.0) -> Stale:
    return Stale(table, partition, 0.0, due, changes, "[]", "every 1 h", note)


def test_the_runs_go_upstream_first_in_contiguous_spans_of_at_most_the_run_size(catalog: Catalog) -> None:
    entries = [
        stale("ads.manual", "2026-03-05", note="the policy says never", due=None),
        stale("dws.sum", "2026-03-03", 3),
        stale("dwd.day", "2026-03-02"),
        stale("dwd.day", "2026-03-01"),
        stale("dwd.day", "2026-03-03"),
        stale("dwd.day", "2026-03-05"),  # not contiguous with the 3rd
        stale("ads.fresh", "2026-03-05", note="waiting for its inputs", due=None),
    ]
    plan = plan_catch_up(catalog, entries, lambda table: 2)
    assert [(p.table, p.partitions) for p in plan.plans] == [
        ("dwd.day", ("2026-03-01", "2026-03-02")),
        ("dwd.day", ("2026-03-03",)),
        ("dwd.day", ("2026-03-05",)),
        ("dws.sum", ("2026-03-03",)),
        ("ads.manual", ("2026-03-05",)),
    ]
    priorities = [p.queue_priority for p in plan.plans]
    assert priorities == sorted(priorities, reverse=True) and priorities[0] > priorities[-1]
    assert all(p.rebuild for p in plan.plans) and plan.plans[3].late_changes == (("2026-03-03", 3),)
    assert [(s.table, s.partition) for s in plan.waiting] == [("ads.fresh", "2026-03-05")]
