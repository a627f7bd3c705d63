"""Column taints on the example warehouse as it ships (no table added): a join key decides the rows of every table
joining on it, which is tainted whole; and a column that a bad delivery really gets wrong, an order's status, spares
the tables that never read it, which `warehouse taint --columns` names. No Spark: the catalog's lineage and a temp-dir
instance."""

from __future__ import annotations

from pathlib import Path

import pytest
from dagster import instance_for_test

from tests.center.test_taint import build, hours
from warehouse_assets.catalog import load_catalog
from warehouse_assets.catalog.lineage import WarehouseLineage
from warehouse_assets.cli import main

DAY = "2026-03-10"
BAD = (f"{DAY}-08:00", f"{DAY}-17:00")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("WAREHOUSE_LAKE_ROOT", str(tmp_path / "lake"))
    monkeypatch.setenv("WAREHOUSE_LANDING_ROOT", str(tmp_path / "landing"))
    return home


def test_a_join_key_taints_the_tables_joining_on_it_whole(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    example = load_catalog()
    lineage = WarehouseLineage(example)
    # the attendance detail joins the lessons ON a.lesson_id = l.lesson_id and outputs no lesson_id of theirs: the
    # key only decides which lesson each attendance gets, so a wrong key is wrong rows, in every column
    impact = lineage.impact("dwd.lesson_snapshot", ["lesson_id"])
    assert impact.tables["dwd.attendance_detail"] is None
    # the new users per city tier join the tiers ON u.city = c.city
    assert lineage.impact("dwd.city_tier", ["city"]).tables == {
        "dwd.city_tier": frozenset({"city"}),
        "ads.new_users_by_tier": None,
    }
    with instance_for_test(temp_dir=str(home)) as instance:
        build(instance, example, {"dwd.lesson_snapshot": [DAY], "dwd.attendance_detail": [DAY]})
    args = ["taint", "dwd.lesson_snapshot", DAY, DAY, "--columns", "lesson_id", "--reason", "keys shifted"]
    assert main([*args, "--by", "me"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert any(line.split()[:2] == ["dwd.attendance_detail", DAY] for line in out), out
    assert any("dwd.attendance_detail" in line and "every column" in line for line in out), out


def test_a_status_taint_spares_the_tables_that_never_read_the_status(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    example = load_catalog()
    impact = WarehouseLineage(example).impact("ods.order", ["status"])
    # the activity and retention tables read who ordered, never the status
    spared = {"dws.user_active_daily", "ads.active_users", "ads.retention_d1", "ads.retention_d7"}
    assert spared <= WarehouseLineage(example).downstream_tables("ods.order")
    assert not spared & set(impact.tables)
    assert impact.tables["dwd.order_detail"] == frozenset({"status"})  # carried, not filtered on
    with instance_for_test(temp_dir=str(home)) as instance:
        build(
            instance,
            example,
            {"ods.order": hours(DAY), "dwd.order_detail": [DAY], "dws.user_order_daily": [DAY],
             "dws.user_active_daily": [DAY]},
        )  # fmt: skip
    args = ["taint", "ods.order", *BAD, "--columns", "status", "--reason", "paid booked as refunded", "--by", "me"]
    assert main(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert any(line.split()[:2] == ["dws.user_order_daily", DAY] for line in out), out
    assert not any(line.split()[:1] == ["dws.user_active_daily"] for line in out), out
    assert any(
        line.startswith("the column restriction spared 1 partition(s) of 1 table(s)")
        and line.endswith("as they do not read status: dws.user_active_daily (1)")
        for line in out
    ), out
