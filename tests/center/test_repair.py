"""Repair without rollback: rebuilding one historical partition replaces that partition only, in one Delta commit.

``dwd.order_detail`` is built day by day over 2026-03-02 .. 03-05 (one Delta version each) from ODS rows whose amounts
on 03-03 were wrong; the source is fixed, the day tainted and repaired through the product's path (the
``taint_repair`` job, then its backfill run by Dagster's backfill daemon iteration). Afterwards: one new version, the
other days' files and every earlier version as they were, a time-travel read of the version before the repair still
reading the tainted rows, and the day valid again once its checks passed on the new data.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pyarrow as pa
import pytest
from dagster import AssetKey, DagsterInstance, DagsterRunStatus, instance_for_test, materialize
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from resources import resources_from_env
from simulator.cdc_config import merged_order_row
from tests.support.instances import memory_backed_dir, one_event_log
from tests.support.lake import table_rows
from tests.support.repair import SYNC_RUNS, apply_taint, code_location, run_backfill
from warehouse_assets.catalog import Catalog, load_catalog
from warehouse_assets.center.state_store import PartitionStateStore
from warehouse_assets.ingest.merge import ods_arrow_schema
from warehouse_assets.materialize.compiler import build_assets
from warehouse_assets.materialize.quality import report_valid
from warehouse_assets.materialize.validity import tainted_in_instance

TZ = ZoneInfo("Asia/Shanghai")
DAYS = ["2026-03-02", "2026-03-03", "2026-03-04", "2026-03-05"]
BAD = DAYS[1]
DWD = AssetKey(["dwd", "order_detail"])


def ods_rows(day: str, amount: str) -> list[dict[str, Any]]:
    base = 100 * (DAYS.index(day) + 1)
    rows = []
    for i in range(4):
        created = datetime.fromisoformat(day).replace(hour=9 + i, minute=30, tzinfo=TZ)
        rows.append({**merged_order_row(base + i, 10 + i % 2, created, base + i), "amount": Decimal(amount)})
    return rows


@dataclass
class Repaired:
    instance: DagsterInstance
    path: str
    before: int  # the table's version before the repair
    files_before: dict[str, set[str]]  # day → its data files before the repair
    rows_before: dict[int, list[tuple[Any, ...]]]  # version → its rows, read before the repair
    taint: Any  # the taint job's output
    backfill: Any


def files_by_day(path: str) -> dict[str, set[str]]:
    actions = pa.table(DeltaTable(path).get_add_actions(flatten=True)).to_pylist()
    found: dict[str, set[str]] = {}
    for action in actions:
        found.setdefault(action["partition.dt"], set()).add(action["path"])
    return found


def rows_at(path: str, version: int | None = None) -> list[tuple[Any, ...]]:
    """The table's rows at ``version`` (the latest without), read by time travel through delta-rs: a read of the log
    and the files that version names, no Spark job."""
    rows = table_rows(path, ["order_id", "amount", "dt"], version)
    return sorted(tuple(r.values()) for r in rows.to_pylist())


@pytest.fixture(scope="module")
def repaired(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Repaired]:
    root = tmp_path_factory.mktemp("repair")
    env = {"WAREHOUSE_LAKE_ROOT": str(root / "lake"), "WAREHOUSE_LANDING_ROOT": str(root / "landing")}
    (root / "landing").mkdir()
    resources = resources_from_env(env)
    catalog: Catalog = load_catalog()
    ods_path = str(root / "lake" / "ods" / "order")
    schema = ods_arrow_schema(catalog["ods.order"])
    # one event log in memory-backed storage (tests/support/instances.py): the 96 hours' reports and verdicts and the
    # runs' events without a database per run
    with (
        pytest.MonkeyPatch.context() as patch,
        memory_backed_dir("repair-home-") as home,
        instance_for_test(temp_dir=str(home), overrides={**SYNC_RUNS, **one_event_log(home)}) as instance,
    ):
        for name, value in env.items():
            patch.setenv(name, value)
        rows = [r for day in DAYS for r in ods_rows(day, "2000.00" if day == BAD else "20.00")]  # 03-03: 100x
        write_deltalake(ods_path, pa.Table.from_pylist(rows, schema=schema), partition_by=["dt", "hh"])
        for day in DAYS:
            for hour in range(24):
                report_valid(instance, catalog["ods.order"], f"{day}-{hour:02d}:00", "loaded by the test")
        for day in DAYS:  # one run, one Delta version per day
            assert materialize(
                build_assets(catalog), instance=instance, resources=resources, selection=[DWD], partition_key=day
            ).success
        path = str(root / "lake" / "dwd" / "order_detail")
        before = DeltaTable(path).version()
        files_before = files_by_day(path)
        rows_before = {v: rows_at(path, v) for v in range(before + 1)}

        # the source is fixed in place; the day built from it is tainted and repaired
        fixed = pa.Table.from_pylist(ods_rows(BAD, "20.00"), schema=schema)
        write_deltalake(ods_path, fixed, mode="overwrite", predicate=f"dt = '{BAD}'")
        taint = apply_taint(instance, catalog, "dwd.order_detail", BAD, BAD, "amounts 100x on 03-03")
        with code_location(instance) as workspace:
            backfill = run_backfill(instance, workspace, taint["backfill"])
        yield Repaired(instance, path, before, files_before, rows_before, taint, backfill)


def test_the_repair_is_one_backfill_run_and_one_delta_commit(repaired: Repaired) -> None:
    assert repaired.taint["marked"] == 1 and repaired.taint["runs"] == 1
    assert repaired.backfill.status.value == "COMPLETED_SUCCESS"
    runs = repaired.instance.get_run_records()
    assert all(r.dagster_run.status == DagsterRunStatus.SUCCESS for r in runs)  # every run the test started
    [repair] = [
        r.dagster_run for r in runs if r.dagster_run.tags.get("dagster/backfill") == repaired.backfill.backfill_id
    ]
    tags = repair.tags  # a backfill run of the single-run policy names its range
    assert (tags["dagster/asset_partition_range_start"], tags["dagster/asset_partition_range_end"]) == (BAD, BAD)
    history = DeltaTable(repaired.path).history()  # newest first
    assert history[0]["version"] == repaired.before + 1  # one commit, on top of the others: nothing rolled back
    assert DeltaTable(repaired.path).version() == repaired.before + 1
    assert BAD in str(history[0]["operationParameters"])  # its overwrite names the day only


def test_every_other_partition_and_every_earlier_version_is_untouched(repaired: Repaired) -> None:
    after = files_by_day(repaired.path)
    for day in DAYS:
        if day == BAD:
            assert after[day].isdisjoint(repaired.files_before[day])  # the day's files replaced
        else:
            assert after[day] == repaired.files_before[day], day  # the same files: not rewritten
    for version, rows in repaired.rows_before.items():  # later days' versions included: still readable, unchanged
        assert rows_at(repaired.path, version) == rows, version


def test_version_as_of_before_the_repair_still_reads_the_tainted_rows(repaired: Repaired) -> None:
    def amounts(version: int | None) -> set[Decimal]:
        return {amount for _, amount, dt in rows_at(repaired.path, version) if dt == BAD}

    assert amounts(repaired.before) == {Decimal("2000.00")}
    assert amounts(None) == {Decimal("20.00")}


def test_the_repaired_partition_is_valid_again_once_its_checks_passed(repaired: Repaired) -> None:
    catalog = load_catalog()
    assert tainted_in_instance(repaired.instance, catalog["dwd.order_detail"], DAYS) == {}
    store = PartitionStateStore(repaired.instance, Path(repaired.path).parent.parent.parent / "states.db")
    store.rebuild()
    [state] = store.states(DWD, [BAD]).values()
    assert not state.tainted and all(state.checks.values()) and state.checks
    store.close()
