"""A one-month backfill of the whole graph through Dagster's own backfill machinery.

The backfill is created as the UI's GraphQL ``launchPartitionBackfill`` creates it with
``partitionsByAssets`` (``PartitionBackfill.from_partitions_by_assets`` on the workspace's asset graph,
``instance.add_backfill``), and the backfill daemon's iteration (``execute_backfill_iteration``) runs it
until it is done, submitting runs through the instance's run coordinator to a synchronous in-process run
launcher (so runs share this process's Spark session). Nothing calls an asset function directly.

The range starts on 2026-01-01, the warehouse's first day (default ``WAREHOUSE_START``): the self-dependent
tables start their chains in the backfill, and the partitions reaching before the start are left out by
``backfill_partitions`` (D1 retention from the 2nd, D7 from the 8th, 30-day windows from the 30th).

Size: ``BACKFILL_DAYS`` days (default 11: the chains, D7 retention on days 8–11 waiting for days 1–4, one
whole ISO week), hourly tables over the range's last ``BACKFILL_HOURLY_DAYS`` days (default 1: they build
one Delta partition per hour). ``BACKFILL_DAYS=31 BACKFILL_HOURLY_DAYS=31`` is the whole graph for all of
January, the monthly report and the 30-day windows included; on a shared 2-core machine it takes far longer
than a test should (ingestion alone ~3.5 min), so the default is the short range.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from dagster import (
    AssetCheckKey,
    AssetKey,
    DagsterInstance,
    DagsterRunStatus,
    PartitionKeyRange,
    RunsFilter,
    instance_for_test,
)
from dagster._core.definitions.selector import PartitionRangeSelector, PartitionsByAssetSelector, PartitionsSelector
from dagster._core.event_api import PartitionKeyFilter
from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._daemon.backfill import execute_backfill_iteration
from pyspark.sql import SparkSession

from resources import LandingResource, resources_from_env
from simulator.cdc import SimulationConfig, simulate
from simulator.external import simulate_external_for_landing
from tests.support import oracle
from tests.support.instances import memory_backed_dir, pooled_event_log
from tests.support.lake import row_dicts
from tests.support.repair import SYNC_RUNS, code_location
from warehouse_assets.catalog import DerivedTable, partitions_def_of, upstream_partitions
from warehouse_assets.cli.headless import build_static, report_external_deliveries, report_ready_hours, run_ingest
from warehouse_assets.definitions import catalog
from warehouse_assets.materialize.compiler import build_assets
from warehouse_assets.materialize.gate import backfill_partitions

TZ = ZoneInfo("Asia/Shanghai")
DAYS = int(os.environ.get("BACKFILL_DAYS", "11"))
HOURLY_DAYS = min(DAYS, int(os.environ.get("BACKFILL_HOURLY_DAYS", "1")))
# the per-test limit: the module's first test runs the whole backfill (its fixture), about 6 min on CI at the default
# size; `make test-backfill-month` (~25 min on 2 cores) gets an hour
pytestmark = pytest.mark.timeout(1200 if (DAYS, HOURLY_DAYS) <= (11, 1) else 3600)
FIRST = date(2026, 1, 1)
END = FIRST + timedelta(days=DAYS)
SCALE = 0.01
SEGMENT_MINUTES = 1440  # one landing segment per shard and day
log = logging.getLogger(__name__)


@dataclass
class Backfilled:
    instance: DagsterInstance
    lake: Path
    landing: Path
    backfill: PartitionBackfill
    plan: dict[str, list[str]]
    iterations: int
    seconds: float
    workspace: WorkspaceProcessContext


def key_ranges(fqn: str, keys: list[str]) -> list[PartitionKeyRange]:
    """``keys`` as Dagster's ranges of them, as the UI selects them: one range of a table's period, and of a table with
    regions one range of dates per region (Dagster holds one dimension of a date × region grid fixed)."""
    pdef = partitions_def_of(catalog[fqn])
    return list(pdef.subset_with_partition_keys(keys).get_partition_key_ranges(pdef))


def launch_backfill(
    instance: DagsterInstance,
    workspace: WorkspaceProcessContext,
    backfill_id: str,
    plan: dict[str, list[str]],
    title: str,
) -> tuple[PartitionBackfill, int, float]:
    """Launch ``plan`` (table -> its partition keys, a range each) as the UI's GraphQL
    ``launchPartitionBackfill(partitionsByAssets: [...])`` does, and run the backfill daemon's iterations
    until it is done. Returns the finished backfill, the iterations and the seconds it took."""
    selectors = [
        PartitionsByAssetSelector(
            asset_key=AssetKey(catalog[fqn].key),
            partitions=PartitionsSelector(
                ranges=[PartitionRangeSelector(start=r.start, end=r.end) for r in key_ranges(fqn, keys)]
            ),
        )
        for fqn, keys in plan.items()
    ]
    backfill = PartitionBackfill.from_partitions_by_assets(
        backfill_id=backfill_id,
        asset_graph=workspace.create_request_context().asset_graph,
        backfill_timestamp=time.time(),
        tags={},
        dynamic_partitions_store=instance,
        partitions_by_assets=selectors,
        title=title,
        description=None,
        run_config=None,
    )
    instance.add_backfill(backfill)
    began, iterations = time.monotonic(), 0
    while instance.get_backfill(backfill_id).status == BulkActionStatus.REQUESTED:  # type: ignore[union-attr]
        iterations += 1
        assert iterations <= 60, "the backfill does not finish"
        errors = [e for e in execute_backfill_iteration(workspace, log) if e is not None]
        assert not errors, errors[0].to_string()
    finished = instance.get_backfill(backfill_id)
    assert finished is not None
    return finished, iterations, time.monotonic() - began


def failed_runs(instance: DagsterInstance) -> list[str]:
    """Every run in the instance that did not succeed (ingestion, backfill runs, ...), one line each."""
    lines = []
    for record in instance.get_run_records():
        run = record.dagster_run
        if run.status != DagsterRunStatus.SUCCESS:
            start = run.tags.get("dagster/asset_partition_range_start") or run.tags.get("dagster/partition", "")
            end = run.tags.get("dagster/asset_partition_range_end", "")
            assets = ",".join(k.to_user_string() for k in sorted(run.asset_selection or [], key=str))
            lines.append(f"{run.run_id} {run.job_name} {run.status.value} {assets} {start}..{end}")
    return lines


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory: pytest.TempPathFactory, spark: SparkSession) -> Iterator[Backfilled]:
    root = tmp_path_factory.mktemp("backfill")
    landing, lake = root / "landing", root / "lake"
    env = {"WAREHOUSE_LAKE_ROOT": str(lake), "WAREHOUSE_LANDING_ROOT": str(landing)}
    # one landing segment per shard and day up to the range's end, where every shard is then applied: its last hour
    # is complete. The ingestion is not what this module tests: a day's segment is one merge, not 24
    until = datetime(END.year, END.month, END.day)
    simulate(landing, datetime(2026, 1, 1), until, SimulationConfig(seed=5, scale=SCALE, batch_minutes=SEGMENT_MINUTES))
    # the external producers deliver every day of the range (the ad partner's files come the next morning
    # or later, so their clock runs a few days past the range)
    simulate_external_for_landing(
        landing, landing / "external", datetime(END.year, END.month, END.day, tzinfo=TZ) + timedelta(days=4)
    )
    resources = resources_from_env(env)
    resources["landing"] = LandingResource(root=str(landing), timezone=str(TZ), segment_minutes=SEGMENT_MINUTES)
    # runs go straight to a launcher that executes them synchronously in this process (the real daemon would queue
    # them and launch each in its own process); one event log for every run, its connections pooled, in memory-backed
    # storage (tests/support/instances.py). Profiled: with a database per run and an index database on disk, the
    # ingestion's ~4,700 hour reports and check verdicts cost about 0.1 s each (five connections and commits per event);
    # a new connection per event still cost 2.9 times the pooled one
    with (
        pytest.MonkeyPatch.context() as patch,
        memory_backed_dir("backfill-home-") as home,
        instance_for_test(temp_dir=str(home), overrides={**SYNC_RUNS, **pooled_event_log(home)}) as instance,
    ):
        for name, value in env.items():
            patch.setenv(name, value)
        summary = run_ingest(instance, resources)
        end = datetime(END.year, END.month, END.day, tzinfo=TZ)
        # the ingestion run reports every hour its commits completed (the range's, and after it what the simulated
        # sources completed), so the readiness fallback finds none left
        assert all(summary[t.fqn]["hours_reported"] >= 24 * DAYS for t in catalog.ods()), summary
        assert report_ready_hours(instance, resources, until=end) == 0
        for table in catalog.ods():
            in_range = {k for k in instance.get_materialized_partitions(AssetKey(table.key)) if k < END.isoformat()}
            assert len(in_range) == 24 * DAYS, table.fqn  # every ODS hour of the range is ready
        assert report_external_deliveries(instance, resources) >= 2 * DAYS  # both producers, every day
        # the static tables, built as their sensor builds them once the code location loads
        for static in catalog.statics():
            assert build_static(instance, resources, build_assets(catalog), static), static.fqn
        with code_location(instance) as workspace:  # resources from the env above
            start = datetime(FIRST.year, FIRST.month, FIRST.day, tzinfo=TZ)
            end = datetime(END.year, END.month, END.day, tzinfo=TZ)
            plan = backfill_partitions(catalog, start, end)
            hourly_from = (end - timedelta(days=HOURLY_DAYS)).strftime("%Y-%m-%d")
            for fqn in [t.fqn for t in catalog.derived() if t.period == "hourly"]:
                plan[fqn] = [k for k in plan[fqn] if k >= hourly_from]
            title = f"whole graph, {FIRST} .. {END - timedelta(days=1)}"
            finished, iterations, seconds = launch_backfill(instance, workspace, "january", plan, title)
            yield Backfilled(instance, lake, landing, finished, plan, iterations, seconds, workspace)


def _runs(b: Backfilled) -> list[Any]:
    """The backfill's runs, oldest first."""
    records = b.instance.get_run_records(RunsFilter(tags={"dagster/backfill": "january"}))
    return sorted(records, key=lambda r: r.create_timestamp)


def _runs_of(b: Backfilled, fqn: str) -> list[Any]:
    key = AssetKey(catalog[fqn].key)
    return [r for r in _runs(b) if key in (r.dagster_run.asset_selection or set())]


def _regions(fqn: str) -> list[str]:
    """The regions a table declares (none: its days are the business days)."""
    table = catalog[fqn]
    return [name for name, _ in table.regions] if isinstance(table, DerivedTable) else []


def _rows(b: Backfilled, layer: str, name: str) -> list[dict[str, Any]]:
    return row_dicts(str(b.lake / layer / name))


def test_the_backfill_completes_and_materializes_every_planned_partition(backfilled: Backfilled) -> None:
    b = backfilled
    print(f"backfill: {len(_runs(b))} runs, {b.iterations} daemon iterations, {b.seconds:.0f}s")
    assert b.backfill.status == BulkActionStatus.COMPLETED_SUCCESS
    # every run the product started (the ingestion, the backfill's runs) is green, not only the backfill
    assert not failed_runs(b.instance), "runs that did not succeed:\n" + "\n".join(failed_runs(b.instance))
    for fqn, keys in b.plan.items():
        assert b.instance.get_materialized_partitions(AssetKey(catalog[fqn].key)) == set(keys), fqn
    # the whole graph, but for tables whose window is longer than the range (a 30-day window, a whole month)
    # (and a day on the latest month, which needs a month ended within the range)
    too_long = ({"ads.active_users"} if DAYS < 30 else set()) | (
        {"ads.monthly_report", "ads.gmv_vs_month"} if DAYS < 31 else set()
    )
    assert set(b.plan) == {t.fqn for t in catalog.derived()} - too_long


def test_each_table_runs_its_range_in_one_run(backfilled: Backfilled) -> None:
    """``BackfillPolicy.single_run``: each table's range in one run (Dagster puts tables whose ranges are ready
    together in the same run); a self-dependent table builds its days in time order inside it."""
    for fqn, keys in backfilled.plan.items():
        runs = _runs_of(backfilled, fqn)
        ranges = key_ranges(fqn, keys)
        regions = len(_regions(fqn))
        # a table with regions: one run per region, its range of dates (each region's dates are contiguous)
        assert len(ranges) == (regions or 1), f"{fqn}: {len(ranges)} ranges"
        assert len(runs) == len(ranges), f"{fqn}: {len(runs)} runs"
        spans = sorted(
            (
                r.dagster_run.tags["dagster/asset_partition_range_start"],
                r.dagster_run.tags["dagster/asset_partition_range_end"],
            )
            for r in runs
        )
        assert spans == sorted((r.start, r.end) for r in ranges), fqn
        if not regions:
            assert spans == [(keys[0], keys[-1])], fqn


def test_a_run_starts_only_after_the_runs_producing_its_upstream_partitions(backfilled: Backfilled) -> None:
    """Offsets are waited on: each run starts after every run that produced a partition it reads."""
    b = backfilled
    for fqn in b.plan:
        table = catalog[fqn]
        for run in _runs_of(b, fqn):
            tags = run.dagster_run.tags
            span = PartitionKeyRange(
                tags["dagster/asset_partition_range_start"], tags["dagster/asset_partition_range_end"]
            )
            own = partitions_def_of(table).get_partition_keys_in_range(span)
            for dep in table.deps:
                if dep.table == fqn or catalog[dep.table].is_ods:
                    continue
                needed = {k for key in own for k in upstream_partitions(catalog, table, dep, key).keys}
                for producer in _runs_of(b, dep.table):
                    tags = producer.dagster_run.tags
                    built = set(
                        partitions_def_of(catalog[dep.table]).get_partition_keys_in_range(
                            PartitionKeyRange(
                                tags["dagster/asset_partition_range_start"], tags["dagster/asset_partition_range_end"]
                            )
                        )
                    )
                    if built & needed and producer.dagster_run.run_id != run.dagster_run.run_id:
                        assert producer.end_time is not None and run.start_time is not None
                        assert producer.end_time <= run.start_time, f"{fqn} started before {dep.table} was built"


def _by(rows: list[dict[str, Any]], *columns: str) -> dict[Any, dict[str, Any]]:
    out: dict[Any, dict[str, Any]] = {}
    for row in rows:
        key = row[columns[0]] if len(columns) == 1 else tuple(row[c] for c in columns)
        assert key not in out, f"duplicate key {key}"
        out[key] = row
    return out


def _rate(value: float | None) -> Any:
    return None if value is None else pytest.approx(value, abs=1e-9)


def test_the_figures_match_an_independent_computation(backfilled: Backfilled) -> None:
    """Every ADS table the backfill built (and the self-dependent cumulative table), partition by partition,
    against the plain-Python replay of the generated events."""
    b = backfilled
    truth = oracle.replay(b.landing)
    expected_gmv = oracle.daily_gmv(truth["order"], "Asia/Shanghai")
    ads = {r["dt"]: r["gmv"] for r in _rows(b, "ads", "daily_gmv")}
    days = [(FIRST + timedelta(days=n)).isoformat() for n in range((END - FIRST).days)]
    assert sorted(ads) == days
    for day in days:
        assert ads[day] == expected_gmv.get(date.fromisoformat(day), Decimal("0")), day

    rates = _by(_rows(b, "ads", "attendance_rate_daily"), "dt")
    assert sorted(rates) == b.plan["ads.attendance_rate_daily"]
    for day, row in rates.items():
        expected = oracle.attendance_rate(truth, day)
        assert {k: row[k] for k in expected} == {**expected, "attendance_rate": _rate(expected["attendance_rate"])}

    for n in (1, 7):
        retention = _by(_rows(b, "ads", f"retention_d{n}"), "dt")
        assert sorted(retention) == b.plan[f"ads.retention_d{n}"] == days[n:]
        for day, row in retention.items():
            expected = oracle.retention(truth, day, n)
            assert {k: row[k] for k in expected} == {**expected, "retention_rate": _rate(expected["retention_rate"])}

    cumulative: dict[str, dict[int, dict[str, Any]]] = {}
    for row in _rows(b, "dws", "user_learning_cumulative"):
        cumulative.setdefault(row["dt"], {})[row["user_id"]] = {
            k: v for k, v in row.items() if k not in ("dt", "user_id")
        }
    assert sorted(cumulative) == days
    for day in days:
        assert cumulative[day] == oracle.user_learning_cumulative(truth, day, FIRST.isoformat()), day

    hourly = _by(_rows(b, "ads", "gmv_hourly"), "dt", "hh")
    assert len(hourly) == 24 * HOURLY_DAYS
    for (day, hh), row in hourly.items():
        expected = oracle.gmv_hourly(truth, f"{day} {hh}")
        assert {k: row[k] for k in expected} == expected, (day, hh)

    # each region's day from its own midnight to the next; the global day the sum of its date's four
    regional = {(r["dt"], r["region"]): r["dau"] for r in _rows(b, "ads", "dau_by_region")}
    assert sorted(f"{day}|{region}" for day, region in regional) == sorted(b.plan["ads.dau_by_region"])
    for (day, region), dau in regional.items():
        assert dau == oracle.regional_dau(truth, day, region), (day, region)
    global_dau = _by(_rows(b, "ads", "dau_global"), "dt")
    assert sorted(global_dau) == b.plan["ads.dau_global"]
    regions = _regions("ads.dau_by_region")
    for day, row in global_dau.items():
        assert (row["dau"], row["regions"]) == (sum(regional[(day, r)] for r in regions), len(regions)), day

    if "ads.active_users" in b.plan:  # 30-day windows: from the 30th on
        active = _by(_rows(b, "ads", "active_users"), "dt")
        assert sorted(active) == b.plan["ads.active_users"]
        for day, row in active.items():
            expected = oracle.dau_wau_mau(truth, day)
            assert {k: row[k] for k in expected} == expected, day
    if "ads.monthly_report" in b.plan:  # all of January
        (row,) = _rows(b, "ads", "monthly_report")
        expected = oracle.monthly_report(truth, "2026-01")
        assert {k: row[k] for k in expected} == {**expected, "avg_dau": pytest.approx(expected["avg_dau"], abs=1e-9)}


def test_a_two_day_backfill_launched_from_the_ui_succeeds(backfilled: Backfilled) -> None:
    """A backfill of ``dws.user_order_daily`` + ``ads.daily_gmv`` over two days, launched the UI's way: its run
    includes every check of its assets, the freshness check among them, which must not read ``partition_key`` in a
    ranged run. The backfill must complete and every run succeed; in the ranged
    runs each partition gets its own verdict of each quality check, and the freshness
    verdict stays the sensor's (the run records none)."""
    b = backfilled
    days = b.plan["ads.daily_gmv"][-2:]
    plan = {"dws.user_order_daily": days, "ads.daily_gmv": days}
    finished, _, _ = launch_backfill(b.instance, b.workspace, "two_days", plan, f"daily GMV {days[0]} .. {days[-1]}")
    runs = {r.dagster_run.run_id for r in b.instance.get_run_records(RunsFilter(tags={"dagster/backfill": "two_days"}))}
    assert runs
    assert finished.status == BulkActionStatus.COMPLETED_SUCCESS
    assert not failed_runs(b.instance), "runs that did not succeed:\n" + "\n".join(failed_runs(b.instance))

    storage = b.instance.event_log_storage
    for fqn in plan:
        table = catalog[fqn]
        keys = [AssetCheckKey(AssetKey(table.key), c.name) for c in table.checks]
        verdicts = {
            (info.check_key.name, info.partition_key): info
            for info in storage.get_asset_check_partition_info(keys, partition_keys=days)
        }
        for check in table.checks:
            for day in days:
                info = verdicts.get((check.name, day))
                assert info is not None and info.latest_planned_run_id in runs, (fqn, check.name, day)
                assert info.latest_execution_status != AssetCheckExecutionRecordStatus.PLANNED, (fqn, check.name, day)
                if check.blocking:
                    assert info.latest_execution_status == AssetCheckExecutionRecordStatus.SUCCEEDED, (fqn, check.name)
        for key in keys:  # nothing recorded without its partition
            unpartitioned = PartitionKeyFilter(key=None)
            assert not storage.get_asset_check_execution_history(key, limit=5, partition_filter=unpartitioned), key
    freshness = AssetCheckKey(AssetKey(["ads", "daily_gmv"]), "freshness")
    verdicts_by_runs = [
        r
        for r in storage.get_asset_check_execution_history(freshness, limit=100)
        if r.run_id in runs and r.status != AssetCheckExecutionRecordStatus.PLANNED
    ]
    assert not verdicts_by_runs
