"""Regional days built for real: each region's day of the example warehouse's ``ads.dau_by_region`` is a Delta
partition of its own (``dt``, ``region``), written by Spark alone, while the global day (``ads.dau_global``) waits for
the last region's. (The whole graph's backfill, tests/test_backfill.py, builds both tables over eleven days and checks
every figure against a replay of the simulated sources.)

The example warehouse's three files (``ods.attendance``, ``ads.dau_by_region``, ``ads.dau_global``) in a catalog of
their own; ``ods.attendance`` written directly with delta-rs; the dependency center's resolver over the same instance
decides what may run, at pinned times. The business time zone is Asia/Shanghai. On 2026-03-02 Los Angeles keeps
standard time (UTC-8): its day is 16:00 on the 2nd to 16:00 on the 3rd, business time, the last of the four to end.
"""

from __future__ import annotations

import shutil
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pyarrow as pa
import pytest
from dagster import AssetCheckEvaluation, AssetKey, DagsterEvent, DagsterEventType, DagsterInstance, materialize
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)
from dagster._core.utils import make_new_run_id
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from resources import resources_from_env
from simulator.cdc_world import USER_REGIONS, user_region
from tests.center.test_center import Center, requested
from tests.center.test_state_store import materializations, report
from warehouse_assets.catalog import TABLES_DIR, Catalog, load_catalog
from warehouse_assets.ingest.merge import ods_arrow_schema
from warehouse_assets.materialize.compiler import build_assets
from warehouse_assets.materialize.gate import NONEXISTENT, InstanceStates, decide

TZ = ZoneInfo("Asia/Shanghai")
DAY = "2026-03-02"
FIRST = datetime(2026, 3, 2, 0, tzinfo=TZ)  # the data: 40 hours from here, to the end of Los Angeles' day
REGIONAL = AssetKey(["ads", "dau_by_region"])
FILES = ("ods/attendance.yaml", "ads/dau_by_region.sql", "ads/dau_global.sql")


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    root = tmp_path / "tables"
    for name in FILES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(TABLES_DIR / name, root / name)
    return load_catalog(root)


def attendance(n: int, user_id: int, at: datetime, deleted: bool = False) -> dict[str, Any]:
    """One ``ods.attendance`` row as the ingestion merges it, in the hour partition of its creation time."""
    return {
        "id": n,
        "user_id": user_id,
        "lesson_id": 1,
        "course_id": 1,
        "join_time": at,
        "leave_time": at + timedelta(minutes=30),
        "duration_sec": 1800,
        "create_time": at,
        "update_time": at,
        "_es": int(at.timestamp() * 1000),
        "_pos": n,
        "_stream": "edu_learning.attendance_00",
        "_deleted": deleted,
        "dt": at.strftime("%Y-%m-%d"),
        "hh": at.strftime("%H"),
    }


def business_hours(first: datetime, count: int) -> list[str]:
    return [(first + timedelta(hours=n)).strftime("%Y-%m-%d-%H:00") for n in range(count)]


def report_hours(instance: DagsterInstance, catalog: Catalog, hours: list[str]) -> None:
    """``ods.attendance``'s hours reported, each with a passed verdict of every blocking check on that materialization,
    as the ingestion run reports them."""
    table = catalog["ods.attendance"]
    key = AssetKey(table.key)
    for hour in hours:
        report(instance, key, hour)
        target = AssetCheckEvaluationTargetMaterializationData(
            storage_id=materializations(instance, key, hour)[0], run_id="", timestamp=0.0
        )
        for check in table.checks:
            evaluation = AssetCheckEvaluation(
                asset_key=key, check_name=check.name, passed=True, partition=hour, target_materialization_data=target
            )
            event = DagsterEvent(
                DagsterEventType.ASSET_CHECK_EVALUATION.value, "checks", event_specific_data=evaluation
            )
            instance.report_dagster_event(event, make_new_run_id())


def expected_dau(rows: list[dict[str, Any]], region: str) -> int:
    """The oracle: the region's users with a live attendance between its midnights of DAY, in plain Python."""
    zone = ZoneInfo(dict(USER_REGIONS)[region])
    start = datetime.fromisoformat(DAY).replace(tzinfo=zone)
    end = start + timedelta(days=1)  # wall-clock arithmetic: the next local midnight
    return len(
        {
            r["user_id"]
            for r in rows
            if not r["_deleted"] and start <= r["create_time"] < end and user_region(r["user_id"]) == region
        }
    )


def test_the_global_day_waits_for_the_last_region_while_the_first_regions_days_are_built(
    spark: SparkSession, tmp_path: Path, catalog: Catalog, consolidated: DagsterInstance
) -> None:
    # an attendance every 20 minutes over the 40 hours, by 37 users (ids 1..37: every region has some)
    rows = [attendance(n, 1 + (n * 7) % 37, FIRST + timedelta(minutes=20 * n)) for n in range(40 * 3)]
    rows.append(attendance(1000, 101, FIRST + timedelta(hours=12), deleted=True))  # deleted: nobody active
    lake = tmp_path / "lake"
    write_deltalake(
        str(lake / "ods" / "attendance"),
        pa.Table.from_pylist(rows, schema=ods_arrow_schema(catalog["ods.attendance"])),
        partition_by=["dt", "hh"],
    )
    resources = resources_from_env({"WAREHOUSE_LAKE_ROOT": str(lake)})
    assets = build_assets(catalog)

    def build(key: AssetKey, partition: str) -> None:
        run = materialize(assets, instance=consolidated, resources=resources, selection=[key], partition_key=partition)
        assert run.success, (key, partition)

    center = Center(consolidated, catalog)
    # 08:00 on the 3rd, midnight UTC: Shanghai's, Karachi's and UTC's 2nd have ended, and their hours are in
    morning = datetime(2026, 3, 3, 8, tzinfo=TZ)
    report_hours(consolidated, catalog, business_hours(FIRST, 32))
    plans = requested(center.step(morning))
    first_three = [f"{DAY}|{region}" for region in ("shanghai", "karachi", "utc")]
    assert sorted(plans["ads.dau_by_region"]) == sorted([key] for key in first_three)  # each a run of its own
    assert "ads.dau_global" not in plans

    # two of them built by Spark, each its own Delta partition: the second write leaves the first's alone
    for key in first_three[:2]:
        build(REGIONAL, key)
    path = str(lake / "ads" / "dau_by_region")
    assert DeltaTable(path).metadata().partition_columns == ["dt", "region"]
    built = {(r["dt"], r["region"]): r["dau"] for r in spark.read.format("delta").load(path).collect()}
    assert built == {(DAY, region): expected_dau(rows, region) for region in ("shanghai", "karachi")}
    assert built[(DAY, "shanghai")] != built[(DAY, "karachi")]  # the data tells the regions' days apart

    # UTC's day built too (reported, as its run would): three regions done, the global day still waits for Los
    # Angeles', whose day has not ended
    center.report("ads.dau_by_region", first_three[2:])
    assert consolidated.get_materialized_partitions(REGIONAL) == set(first_three)
    assert "ads.dau_global" not in requested(center.step(morning))
    waiting = decide(catalog, catalog["ads.dau_global"], DAY, InstanceStates(consolidated), morning)
    assert not waiting.may_run and waiting.edges[0].state(f"{DAY}|los_angeles") == NONEXISTENT

    # 16:00: Los Angeles' midnight. Its last hours in, its day is requested; once built, the global day
    afternoon = datetime(2026, 3, 3, 16, tzinfo=TZ)
    report_hours(consolidated, catalog, business_hours(FIRST + timedelta(hours=32), 8))
    plans = requested(center.step(afternoon))
    assert plans.get("ads.dau_by_region") == [[f"{DAY}|los_angeles"]] and "ads.dau_global" not in plans
    center.report("ads.dau_by_region", [f"{DAY}|los_angeles"])
    assert requested(center.step(afternoon)).get("ads.dau_global") == [[DAY]]
