"""A backfill of the whole graph through Dagster's own backfill machinery: the one that builds the session's example
warehouse (tests/support/warehouse.py), checked here on a copy of it as built.

The backfill is created as the UI's GraphQL ``launchPartitionBackfill`` creates it with
``partitionsByAssets`` (``PartitionBackfill.from_partitions_by_assets`` on the workspace's asset graph,
``instance.add_backfill``), and the backfill daemon's iteration (``execute_backfill_iteration``) runs it
until it is done, submitting runs through the instance's run coordinator to a synchronous in-process run
launcher (so runs share this process's Spark session). Nothing calls an asset function directly.

The range starts on 2026-01-01, the warehouse's first day (default ``WAREHOUSE_START``): the self-dependent
tables start their chains in the backfill, and the partitions reaching before the start are left out by
``backfill_partitions`` (D1 retention from the 2nd, D7 from the 8th, 30-day windows from the 30th).

Size: ``BACKFILL_DAYS`` days (default 11: the chains, D7 retention on days 8–11 waiting for days 1–4, one
whole ISO week), hourly tables over ``BACKFILL_HOURLY_DAYS`` days (default 1) from 2026-01-05, or the range's last
ones where they would reach past it (they build one Delta partition per hour). ``BACKFILL_DAYS=31
BACKFILL_HOURLY_DAYS=31`` is the whole graph for all of January, the monthly report and the 30-day windows included;
on a shared 2-core machine it takes far longer than a test should (ingestion alone ~3.5 min), so the default is the
short range. After the backfill, the example warehouse builds the rest of the month on some of its tables (the chain
under the 30-day window, January's last day): what the backfill materialized is recorded as it left it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

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
from dagster._core.event_api import PartitionKeyFilter
from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from dagster._core.workspace.context import WorkspaceProcessContext

from tests.support import oracle
from tests.support.instances import memory_backed_dir, pooled_event_log
from tests.support.lake import row_dicts
from tests.support.repair import SYNC_RUNS, code_location, key_ranges, launch_backfill
from tests.support.warehouse import (
    BACKFILL_DAYS,
    BACKFILL_END,
    BACKFILL_ID,
    FIRST,
    HOURLY_DAYS,
    MONTH,
    ExampleWarehouse,
)
from warehouse_assets.catalog import DerivedTable, partitions_def_of, upstream_partitions
from warehouse_assets.definitions import catalog

DAYS = BACKFILL_DAYS
END = BACKFILL_END
# the per-test limit: the module's first test may build the session's example warehouse, the backfill with it (the
# end-to-end module's limit); `make test-backfill-month` (~25 min on 2 cores) gets an hour
pytestmark = pytest.mark.timeout(2400 if (DAYS, HOURLY_DAYS) <= (11, 1) else 3600)
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
    materialized: dict[str, set[str]]  # each planned table's partitions as the backfill left them


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
def backfilled(tmp_path_factory: pytest.TempPathFactory, example_warehouse: ExampleWarehouse) -> Iterator[Backfilled]:
    """The example warehouse as built (its backfill included), copied: whatever the session's other modules did to
    the original, and this module's own backfill does to the copy, stay apart."""
    built = example_warehouse.backfill
    with memory_backed_dir("backfill-home-") as home:
        copy = example_warehouse.copy(tmp_path_factory.mktemp("backfill"), home)
        env = {"WAREHOUSE_LAKE_ROOT": str(copy.lake), "WAREHOUSE_LANDING_ROOT": str(copy.landing)}
        with (
            pytest.MonkeyPatch.context() as patch,
            instance_for_test(temp_dir=str(home), overrides={**SYNC_RUNS, **pooled_event_log(home)}) as instance,
        ):
            for name, value in env.items():
                patch.setenv(name, value)
            with code_location(instance) as workspace:  # resources from the env above
                yield Backfilled(
                    instance,
                    copy.lake,
                    copy.landing,
                    built.finished,
                    built.plan,
                    built.iterations,
                    built.seconds,
                    workspace,
                    built.materialized,
                )


def _runs(b: Backfilled) -> list[Any]:
    """The backfill's runs, oldest first."""
    records = b.instance.get_run_records(RunsFilter(tags={"dagster/backfill": BACKFILL_ID}))
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
        assert b.materialized[fqn] == set(keys), fqn  # as the backfill left them
        assert set(keys) <= b.instance.get_materialized_partitions(AssetKey(catalog[fqn].key)), fqn  # and kept
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
        ranges = key_ranges(catalog[fqn], keys)
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
    assert sorted(ads) == sorted({*days, MONTH[-1].isoformat()})  # and January's last day, built after the backfill
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
    title = f"daily GMV {days[0]} .. {days[-1]}"
    finished, _, _ = launch_backfill(b.instance, b.workspace, catalog, "two_days", plan, title)
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
