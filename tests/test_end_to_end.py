"""The vertical slice ODS → DWD → DWS → ADS on two simulated days, checked against an independent replay."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from dagster import AssetKey, DagsterInstance, instance_for_test
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from resources import resources_from_env
from resources.simulator import SimulationConfig, simulate
from tests import oracle
from warehouse_assets.cli import materialize_range

TZ = ZoneInfo("Asia/Shanghai")
DAYS = [date(2026, 3, 2), date(2026, 3, 3)]


@dataclass
class Warehouse:
    root: Path
    landing: Path
    lake: Path
    instance: DagsterInstance
    resources: dict[str, Any]
    truth: oracle.Tables


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory, spark: SparkSession) -> Iterator[Warehouse]:
    root = tmp_path_factory.mktemp("e2e")
    landing, lake = root / "landing", root / "lake"
    simulate(landing, datetime(2026, 3, 2), datetime(2026, 3, 4), SimulationConfig(seed=11, scale=0.05))
    resources = resources_from_env({"WAREHOUSE_LAKE_ROOT": str(lake), "WAREHOUSE_LANDING_ROOT": str(landing)})
    with instance_for_test() as instance:
        ok = materialize_range(instance, resources, datetime(2026, 3, 2, tzinfo=TZ), datetime(2026, 3, 4, tzinfo=TZ))
        assert ok, "the headless materialization failed"
        yield Warehouse(root, landing, lake, instance, resources, oracle.replay(landing))


def _table(w: Warehouse, layer: str, name: str) -> list[dict[str, Any]]:
    rows = DeltaTable(str(w.lake / layer / name)).to_pyarrow_table().to_pylist()
    return [r for r in rows if not r.get("_deleted")]  # ODS keeps deletes as tombstones


def _messages(landing: Path, db: str) -> Iterator[dict[str, Any]]:
    for path in sorted((landing / "binlog" / db).glob("*/*.jsonl")):
        for line in path.read_text().splitlines():
            message = oracle.parse_line(line)
            if message is not None:
                yield message


@pytest.mark.parametrize("table", ["order", "user", "course", "lesson", "attendance"])
def test_ods_holds_the_deduplicated_source_state(warehouse: Warehouse, table: str) -> None:
    rows = _table(warehouse, "ods", table)
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "duplicate primary keys in ODS"
    assert set(ids) == set(warehouse.truth[table])


def test_deleted_keys_are_absent_and_updated_keys_hold_their_latest_value(warehouse: Warehouse) -> None:
    messages = list(_messages(warehouse.landing, "edu_trade"))
    deleted = {int(r["id"]) for m in messages if m["type"] == "DELETE" for r in m["data"]}
    updated = {int(r["id"]) for m in messages if m["type"] == "UPDATE" for r in m["data"]} - deleted
    assert deleted and updated, "the simulation should contain deletes and updates"
    ods = {r["id"]: r for r in _table(warehouse, "ods", "order")}
    assert not deleted & set(ods)
    for key in sorted(updated):
        expected = warehouse.truth["order"][key]
        assert ods[key]["status"] == expected["status"]
        assert ods[key]["amount"] == Decimal(expected["amount"])
        paid = ods[key]["pay_time"]
        expected_paid = expected["pay_time"]
        if expected_paid is None:
            assert paid is None
        else:
            assert paid.astimezone(TZ).strftime("%Y-%m-%d %H:%M:%S") == expected_paid


def test_ods_partitions_follow_the_local_create_hour(warehouse: Warehouse) -> None:
    for row in _table(warehouse, "ods", "order"):
        local = row["create_time"].astimezone(TZ)
        assert (row["dt"], row["hh"]) == (local.strftime("%Y-%m-%d"), local.strftime("%H"))


def test_daily_gmv_equals_an_independent_computation(warehouse: Warehouse) -> None:
    expected = oracle.daily_gmv(warehouse.truth["order"], "Asia/Shanghai")
    ads = {r["dt"]: r for r in _table(warehouse, "ads", "daily_gmv")}
    assert sorted(ads) == [d.isoformat() for d in DAYS]
    for day in DAYS:
        assert ads[day.isoformat()]["gmv"] == expected.get(day, Decimal("0")), day
        paying = {
            r["user_id"]
            for r in warehouse.truth["order"].values()
            if r["status"] == "paid" and r["create_time"].startswith(day.isoformat())
        }
        assert ads[day.isoformat()]["paying_users"] == len(paying)


def test_dwd_and_dws_agree_with_the_replay(warehouse: Warehouse) -> None:
    dwd = _table(warehouse, "dwd", "order_detail")
    expected = {
        k for k, r in warehouse.truth["order"].items() if r["create_time"][:10] in {d.isoformat() for d in DAYS}
    }
    assert {r["order_id"] for r in dwd} == expected
    dws = _table(warehouse, "dws", "user_order_daily")
    assert sum(r["orders"] for r in dws) == len(expected)


def test_every_partition_is_materialized_in_dagster(warehouse: Warehouse) -> None:
    for key in (["dwd", "order_detail"], ["dws", "user_order_daily"], ["ads", "daily_gmv"]):
        assert warehouse.instance.get_materialized_partitions(AssetKey(key)) == {d.isoformat() for d in DAYS}
    hours = warehouse.instance.get_materialized_partitions(AssetKey(["ods", "order"]))
    assert len(hours) == 48 and "2026-03-02-00:00" in hours and "2026-03-03-23:00" in hours


def test_tables_are_valid_delta(warehouse: Warehouse) -> None:
    for table_dir in sorted(p.parent for p in warehouse.lake.glob("*/*/_delta_log")):
        dt = DeltaTable(str(table_dir))
        dt.to_pyarrow_table()  # readable by delta-rs
        live = oracle.delta_live_paths(table_dir)
        assert live == {str(Path(u).relative_to(table_dir)) for u in dt.file_uris()}, table_dir
        for rel in live:
            assert (table_dir / rel).is_file(), f"{table_dir}: {rel} in the log but not on disk"


def test_rerunning_the_range_changes_nothing(warehouse: Warehouse) -> None:
    before = sorted((r["dt"], str(r["gmv"])) for r in _table(warehouse, "ads", "daily_gmv"))
    detail_before = sorted(r["order_id"] for r in _table(warehouse, "dwd", "order_detail"))
    assert materialize_range(
        warehouse.instance, warehouse.resources, datetime(2026, 3, 2, tzinfo=TZ), datetime(2026, 3, 4, tzinfo=TZ)
    )
    assert sorted((r["dt"], str(r["gmv"])) for r in _table(warehouse, "ads", "daily_gmv")) == before
    assert sorted(r["order_id"] for r in _table(warehouse, "dwd", "order_detail")) == detail_before


def test_why_explains_a_ready_and_a_waiting_partition(warehouse: Warehouse) -> None:
    from warehouse_assets.definitions import catalog
    from warehouse_assets.why import explain

    store, landing = warehouse.resources["lake"].store(), warehouse.resources["landing"].landing()
    done = explain(warehouse.instance, catalog, store, landing, "ads.daily_gmv", "2026-03-02")
    assert done.own_state == "materialized"
    assert [(u.table, u.partition, u.state) for u in done.upstream] == [
        ("dws.user_order_daily", "2026-03-02", "materialized")
    ]
    assert done.verdict.startswith("all 1 upstream partition(s) are materialized")

    waiting = explain(warehouse.instance, catalog, store, landing, "dwd.order_detail", "2026-03-04")
    assert [u.partition for u in waiting.upstream] == [f"2026-03-04-{h:02d}:00" for h in range(24)]
    assert {u.state for u in waiting.upstream} == {"not ready"}
    assert "8 of 8 shard stream(s) not applied past 01:00" in waiting.upstream[0].detail
    assert (
        waiting.verdict == "waiting for 24 of 24 upstream partition(s); first: ods.order 2026-03-04-00:00 (not ready)"
    )

    with pytest.raises(ValueError, match="not a partition of dwd.order_detail"):
        explain(warehouse.instance, catalog, store, landing, "dwd.order_detail", "2026-03-04-01:00")


def test_why_waiting_job_reports_in_the_run(warehouse: Warehouse) -> None:
    from warehouse_assets.definitions import defs

    job = defs.get_job_def("why_waiting")
    result = job.execute_in_process(
        instance=warehouse.instance,
        resources={k: v for k, v in warehouse.resources.items() if k in ("lake", "landing", "external")},
        run_config={
            "ops": {"explain_partition": {"config": {"table": "dws.user_order_daily", "partition": "2026-03-03"}}}
        },
    )
    lines = result.output_for_node("explain_partition")
    assert lines[0] == "dws.user_order_daily 2026-03-03: materialized"
    assert "dwd.order_detail" in lines[1] and "materialized" in lines[1]


def test_zorder_follows_complete_partitions_off_the_critical_path(warehouse: Warehouse) -> None:
    from dagster import DagsterEventType, EventRecordsFilter, build_sensor_context

    from warehouse_assets.definitions import defs

    before = sorted(r["order_id"] for r in _table(warehouse, "dwd", "order_detail"))
    sensor = defs.get_sensor_def("zorder_complete_partitions")
    result = sensor(build_sensor_context(instance=warehouse.instance))
    requests = result.run_requests or []
    assert [r.run_config["ops"]["zorder_partition_files"]["config"] for r in requests] == [
        {"table": "dwd.order_detail", "partitions": ["2026-03-02", "2026-03-03"]}
    ]
    job = defs.get_job_def("zorder_partitions")
    run = job.execute_in_process(
        run_config=requests[0].run_config,
        instance=warehouse.instance,
        resources={"lake": warehouse.resources["lake"], "spark": warehouse.resources["spark"]},
    )
    assert run.success
    observations = warehouse.instance.get_event_records(
        EventRecordsFilter(DagsterEventType.ASSET_OBSERVATION, asset_key=AssetKey(["dwd", "order_detail"]))
    )
    numbers = {r.partition_key: r.asset_observation.metadata for r in observations}  # type: ignore[union-attr]
    assert set(numbers) == {"2026-03-02", "2026-03-03"}
    for metadata in numbers.values():
        assert metadata["files_removed"].value == metadata["files_before"].value >= 1
        assert metadata["files_after"].value >= 1 and metadata["zorder_by"].value == "user_id"
    assert sorted(r["order_id"] for r in _table(warehouse, "dwd", "order_detail")) == before
    # the next tick has nothing new: each complete partition is Z-ordered once
    again = sensor(build_sensor_context(instance=warehouse.instance, cursor=result.cursor))
    assert not again.run_requests
