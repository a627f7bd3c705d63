"""A taint of some columns: only the tables reading them, transitively through the columns each computes from them, are
tainted (a table whose filter, join or grouping reads one is tainted in every column); the plan counts what a taint of
the whole table would have marked besides; the repair is the same one backfill. No Spark: the reverse index, the
catalog's lineage and a temp-dir instance.
"""

from __future__ import annotations

import shutil
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from dagster import DagsterInstance, instance_for_test

from tests.center.test_taint import build, hours
from warehouse_assets.catalog import TABLES_DIR, Catalog, load_catalog
from warehouse_assets.catalog.lineage import WarehouseLineage
from warehouse_assets.center.reverse_index import ReverseIndex
from warehouse_assets.center.state_store import PartitionStateStore
from warehouse_assets.center.taint import build_taint_job, new_taint, plan_taint
from warehouse_assets.cli import main

TZ = ZoneInfo("Asia/Shanghai")
NOW = datetime(2026, 3, 20, 12, tzinfo=TZ)
DAY = "2026-03-10"
BAD = (f"{DAY}-08:00", f"{DAY}-17:00")

# two tables beside the example's that read ods.order but never its amount: the status mix of the orders
NO_AMOUNT = {
    "dws/order_status_hourly.sql": (
        "/* ---\ntable: dws.order_status_hourly\nperiod: hourly\ndescription: Orders of the hour per status.\n"
        "primary_key: [status]\n--- */\n"
        "SELECT status, count(*) AS orders, count(DISTINCT user_id) AS buyers\n"
        "FROM ods.order WHERE id IS NOT NULL GROUP BY status\n"
    ),
    "ads/order_status_daily.sql": (
        "/* ---\ntable: ads.order_status_daily\nperiod: daily\ndescription: Orders of the day per status.\n"
        "primary_key: [status]\n--- */\n"
        "SELECT status, CAST(sum(orders) AS bigint) AS orders FROM dws.order_status_hourly GROUP BY status\n"
    ),
}
SPARED = {"dws.order_status_hourly", "ads.order_status_daily"}
# every derived table built, directly or not, from ods.order in the example warehouse
FROM_ORDERS = {
    "dwd.order_detail", "dws.order_hourly", "dws.user_order_daily", "dws.user_active_daily", "dws.order_usd_daily",
    "dws.revenue_usd_daily", "ads.gmv_hourly", "ads.daily_gmv", "ads.active_users", "ads.retention_d1",
    "ads.retention_d7", "ads.monthly_report", "ads.gmv_usd_daily", "ads.gmv_vs_month", "ads.gmv_week_to_date",
    "ads.marketing_roi", "ads.revenue_flash",
}  # fmt: skip


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    """The example warehouse with the two tables that do not read the amount."""
    root = tmp_path_factory.mktemp("catalog") / "tables"
    shutil.copytree(TABLES_DIR, root)
    for path, text in NO_AMOUNT.items():
        (root / path).write_text(text)
    return load_catalog(root)


@pytest.fixture(scope="module")
def index(catalog: Catalog) -> ReverseIndex:
    return ReverseIndex.build(catalog, current_time=NOW)


def test_the_amount_reaches_every_table_reading_it_and_spares_the_two_that_do_not(
    catalog: Catalog, index: ReverseIndex
) -> None:
    impact = WarehouseLineage(catalog).impact("ods.order", ["amount"])
    # the cleaning filter (amount >= 0) of both readers of ods.order decides their rows: everything built from them
    assert impact.tables["dwd.order_detail"] is None and impact.tables["dws.order_hourly"] is None
    assert set(impact.tables) - {"ods.order"} == FROM_ORDERS
    whole = index.closure({"ods.order": hours(DAY, 8, 17)}, NOW)
    by_column = index.closure({"ods.order": hours(DAY, 8, 17)}, NOW, follows=impact.follows)
    assert set(whole) - set(by_column) == SPARED
    # the table-level closure restricted to the tables reading the amount
    assert by_column == {table: keys for table, keys in whole.items() if table in impact.tables}


def test_a_column_no_one_reads_past_the_detail_spares_everything_after_it(
    catalog: Catalog, index: ReverseIndex
) -> None:
    impact = WarehouseLineage(catalog).impact("ods.order", ["pay_time"])
    assert impact.tables == {"ods.order": frozenset({"pay_time"}), "dwd.order_detail": frozenset({"pay_time"})}
    closure = index.closure({"ods.order": hours(DAY, 8, 17)}, NOW, follows=impact.follows)
    assert closure == {"ods.order": hours(DAY, 8, 17), "dwd.order_detail": [DAY]}


def test_a_value_column_goes_only_where_it_is_computed_into(catalog: Catalog) -> None:
    lineage = WarehouseLineage(catalog)
    # the detail's status is a value of the per-user orders (count_if(status = 'paid'), the paid amount) and the
    # grouping key of the orders in USD: every column there, and what reads it
    impact = lineage.impact("dwd.order_detail", ["status"])
    assert impact.tables["dws.user_order_daily"] == frozenset({"paid_orders", "paid_amount", "refunded_orders"})
    assert impact.tables["dws.order_usd_daily"] is None  # GROUP BY o.status
    assert "dws.user_active_daily" not in impact.tables  # reads user_id only
    assert impact.tables["ads.daily_gmv"] == frozenset({"gmv", "paying_users", "paying_rate"})
    assert "orders" not in impact.tables["ads.daily_gmv"]  # sum(orders): the count of orders, not their status
    # a self-dependent table: the week's GMV carries the bad days on, its orders do not
    assert impact.tables["ads.gmv_week_to_date"] == frozenset({"week_gmv"})
    assert impact.follows("ads.gmv_week_to_date", "ads.gmv_week_to_date")
    assert impact.why["ads.gmv_week_to_date"].startswith("computed from ads.daily_gmv.gmv")


@pytest.fixture
def instance(consolidated: DagsterInstance) -> DagsterInstance:
    return consolidated


BUILT = {
    "ods.order": hours(DAY),
    "dwd.order_detail": [DAY],
    "dws.order_hourly": hours(DAY, 8, 17),
    "ads.gmv_hourly": hours(DAY, 8, 17),
    "dws.order_status_hourly": hours(DAY),
    "ads.order_status_daily": [DAY],
    "dws.user_order_daily": [DAY],
    "ads.daily_gmv": [DAY],
}


def test_the_plan_marks_the_readers_and_says_what_the_columns_spared(
    instance: DagsterInstance, catalog: Catalog, index: ReverseIndex
) -> None:
    build(instance, catalog, BUILT)
    store = PartitionStateStore(instance)
    taint = new_taint("ods.order", *BAD, "amounts 100x", "oncall", columns=["amount"])
    plan = plan_taint(catalog, index, store.view(), "ods.order", *BAD, taint, now=NOW, columns=["amount"])
    whole = plan_taint(catalog, index, store.view(), "ods.order", *BAD, taint, now=NOW)
    marked = {t.table: t.marked for t in plan.tables if t.marked}
    assert marked == {
        "ods.order": hours(DAY, 8, 17),
        "dwd.order_detail": [DAY],
        "dws.order_hourly": hours(DAY, 8, 17),
        "ads.gmv_hourly": hours(DAY, 8, 17),
        "dws.user_order_daily": [DAY],
        "ads.daily_gmv": [DAY],
    }
    # a taint of the whole table marks those and the status tables' built partitions of the bad hours
    assert {t.table: t.marked for t in whole.tables if t.marked} == {
        **marked,
        "dws.order_status_hourly": hours(DAY, 8, 17),
        "ads.order_status_daily": [DAY],
    }
    assert plan.spared == {"dws.order_status_hourly": hours(DAY, 8, 17), "ads.order_status_daily": [DAY]}
    lines = plan.lines()
    assert lines[0] == f"taint ods.order {BAD[0]} .. {BAD[1]}, column(s) amount: amounts 100x (by oncall)"
    assert (
        "the column restriction spared 11 partition(s) of 2 table(s) that a taint of the whole ods.order would mark, "
        "as they do not read amount: dws.order_status_hourly (10), ads.order_status_daily (1)"
    ) in lines
    assert f"  {'dwd.order_detail':<28} every column (its rows depend on ods.order.amount)" in lines
    assert plan.rebuild() == {t: keys for t, keys in marked.items() if t != "ods.order"}
    assert taint.root == f"ods.order {BAD[0]} .. {BAD[1]} (column(s) amount)"
    store.close()


def test_apply_marks_the_readers_only_and_launches_the_same_one_backfill(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    build(instance, catalog, BUILT)
    config = {"table": "ods.order", "start": BAD[0], "end": BAD[1], "reason": "amounts 100x", "apply": True}
    result = build_taint_job(catalog).execute_in_process(
        run_config={"ops": {"taint_and_repair": {"config": {**config, "by": "oncall", "columns": ["amount"]}}}},
        instance=instance,
    )
    assert result.success
    out = result.output_for_node("taint_and_repair")
    assert (out["marked"], out["spared"]) == (10 + 1 + 10 + 10 + 1 + 1, 11)
    [backfill] = instance.get_backfills()
    target = backfill.asset_backfill_data.target_subset  # type: ignore[union-attr]
    assert {key.to_user_string() for key in target.asset_keys} == {
        "dwd/order_detail",
        "dws/order_hourly",
        "ads/gmv_hourly",
        "dws/user_order_daily",
        "ads/daily_gmv",
    }


def test_the_command_takes_columns_and_refuses_an_unknown_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("WAREHOUSE_LAKE_ROOT", str(tmp_path / "lake"))
    monkeypatch.setenv("WAREHOUSE_LANDING_ROOT", str(tmp_path / "landing"))
    example = load_catalog()
    with instance_for_test(temp_dir=str(home)) as instance:
        build(instance, example, {"ods.order": hours(DAY), "dwd.order_detail": [DAY], "dws.user_order_daily": [DAY]})
    args = ["taint", "ods.order", *BAD, "--reason", "late pay times", "--by", "me"]
    assert main([*args, "--columns", "pay_time"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"taint ods.order {BAD[0]} .. {BAD[1]}, column(s) pay_time: late pay times (by me)"
    assert any(line.split()[:2] == ["dwd.order_detail", DAY] for line in out)
    assert not any(line.split()[:1] == ["dws.user_order_daily"] for line in out)  # it never reads pay_time
    assert (
        "the column restriction spared 1 partition(s) of 1 table(s) that a taint of the whole ods.order would mark, "
        "as they do not read pay_time: dws.user_order_daily (1)"
    ) in out
    assert main([*args, "--columns", "pay_time,amout"]) == 2
    assert "ods.order has no column amout; its columns: id, user_id, course_id, amount" in capsys.readouterr().err
