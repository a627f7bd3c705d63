"""Column lineage read from the tables' SQL: the example warehouse's columns traced by hand, through CTEs, joins,
aggregates, windows, set operations and ``SELECT *``; the rows' columns (filters, join keys, groupings) kept apart;
a column the SQL cannot be followed to given every input column and named; ``warehouse lineage`` printing it; the
materialization's ``dagster/column_lineage``. No Spark: the catalog and sqlglot only.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from dagster import AssetKey, TableColumnDep, TableColumnLineage

from resources.settings import Settings, using
from warehouse_assets.catalog import Catalog, load_catalog
from warehouse_assets.catalog.lineage import ROWS, ColumnRef, WarehouseLineage, table_lineage
from warehouse_assets.catalog.lineage_markdown import column_lineage_metadata
from warehouse_assets.cli import main


def refs(*names: str) -> frozenset[ColumnRef]:
    return frozenset(ColumnRef(*name.rsplit(".", 1)) for name in names)


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


@pytest.fixture(scope="module")
def lineage(catalog: Catalog) -> WarehouseLineage:
    return WarehouseLineage(catalog)


# --- three ADS columns, by hand -------------------------------------------------------------------------------


def test_daily_gmv_is_the_paid_amount_of_the_orders_amount_and_status(lineage: WarehouseLineage) -> None:
    gmv = lineage.of("ads.daily_gmv")
    assert gmv.columns["gmv"] == refs("dws.user_order_daily.paid_amount")  # sum(paid_amount)
    assert gmv.columns["paying_users"] == refs("dws.user_order_daily.paid_orders")  # count_if(paid_orders > 0)
    assert gmv.columns["ds"] == frozenset() and gmv.columns["dt"] == frozenset()  # the partition's, from no input
    assert gmv.rows == frozenset()  # no filter, join or grouping: one row of all of them
    # CASE WHEN status = 'paid' THEN amount: both, then each back to ods.order
    assert lineage.of("dws.user_order_daily").columns["paid_amount"] == refs(
        "dwd.order_detail.status", "dwd.order_detail.amount"
    )
    assert lineage.upstream(ColumnRef("ads.daily_gmv", "gmv")) == refs(
        "dws.user_order_daily.paid_amount",
        "dwd.order_detail.status",
        "dwd.order_detail.amount",
        "ods.order.status",
        "ods.order.amount",
    )
    # what decides the rows on the way: the grouping by user, the cleaning filter
    assert lineage.of("dws.user_order_daily").rows == refs("dwd.order_detail.user_id")
    assert lineage.of("dwd.order_detail").rows == refs("ods.order.id", "ods.order.amount")


def test_gmv_vs_month_reads_the_days_gmv_and_a_cte_of_the_months_report(lineage: WarehouseLineage) -> None:
    vs_month = lineage.of("ads.gmv_vs_month")
    # d.gmv / nullif(m.avg_daily_gmv, 0), the CTE's avg_daily_gmv = gmv / days of concat(month, '-01')
    assert vs_month.columns["vs_month"] == refs(
        "ads.daily_gmv.gmv", "ads.monthly_report.gmv", "ads.monthly_report.month"
    )
    assert vs_month.columns["month_avg_daily_gmv"] == refs("ads.monthly_report.gmv", "ads.monthly_report.month")
    assert vs_month.columns["month"] == refs("ads.monthly_report.month")
    assert vs_month.rows == frozenset()  # a cross join: no key
    assert lineage.of("ads.monthly_report").columns["month"] == frozenset()  # substr('${ds}', 1, 7)
    assert lineage.upstream(ColumnRef("ads.gmv_vs_month", "month")) == refs("ads.monthly_report.month")


def test_retention_rate_counts_the_active_users_joined_on_the_cohort(lineage: WarehouseLineage) -> None:
    d1 = lineage.of("ads.retention_d1")
    # count(a.user_id) / count(*): the active side's user id
    assert d1.columns["retention_rate"] == refs("dws.user_active_daily.user_id")
    assert d1.columns["cohort_users"] == frozenset()  # count(*): its rows only
    # the join key on both sides and the cohort's filter decide every row
    assert d1.rows == refs(
        "dwd.user_snapshot.user_id", "dws.user_active_daily.user_id", "dwd.user_snapshot.register_dt"
    )
    # user_active_daily: a UNION ALL of attendance and orders, grouped by user
    assert lineage.upstream(ColumnRef("ads.retention_d1", "retention_rate")) == refs(
        "dws.user_active_daily.user_id",
        "dwd.attendance_detail.user_id",
        "dwd.order_detail.user_id",
        "ods.attendance.user_id",
        "ods.order.user_id",
    )


def test_a_snapshot_through_select_star_a_window_and_a_union(lineage: WarehouseLineage) -> None:
    course = lineage.of("dwd.course_daily")
    # SELECT * of a UNION ALL of yesterday's picture and the day's changes: each column from both
    assert course.columns["title"] == refs("dwd.course_daily.title", "ods.course.title")
    assert course.columns["course_id"] == refs("dwd.course_daily.course_id", "ods.course.id")
    # row_number() OVER (PARTITION BY course_id ORDER BY changed_ms, change_pos) = 1 AND NOT removed
    assert course.rows == refs(
        "dwd.course_daily.course_id", "ods.course.id", "ods.course._es", "ods.course._pos", "ods.course._deleted"
    )
    assert not course.unresolved


def test_every_table_of_the_example_is_followed_to_its_inputs(lineage: WarehouseLineage, catalog: Catalog) -> None:
    for table in lineage.all():
        assert not table.unresolved, table.describe_unresolved()
        columns = set(lineage.columns(table.table))
        assert set(table.columns) == columns, table.table
        for ref in table.reads():
            assert ref.column in lineage.columns(ref.table), (table.table, ref)


# --- what cannot be followed is given everything, and named ----------------------------------------------------


def test_a_column_that_cannot_be_followed_depends_on_every_input_column_and_is_named() -> None:
    inputs = {"ods.src": ["id", "v", "dt"], "dwd.ref": ["id", "label"]}
    sql = "SELECT s.id, s.v + mystery AS w, r.label FROM ods.src s LEFT JOIN dwd.ref r ON s.id = r.id WHERE s.v > 0"
    found = table_lineage("dws.t", sql, inputs, added=["dt"])
    everything = refs("ods.src.id", "ods.src.v", "ods.src.dt", "dwd.ref.id", "dwd.ref.label")
    assert found.columns["w"] == everything  # never dropped
    assert found.columns["id"] == refs("ods.src.id") and found.columns["label"] == refs("dwd.ref.label")
    assert found.rows == refs("ods.src.id", "dwd.ref.id", "ods.src.v")
    assert list(found.unresolved) == ["w"] and "mystery" in found.unresolved["w"]
    [line] = found.describe_unresolved()
    assert line.startswith("dws.t.w: depends on every column of ods.src, dwd.ref (")

    # a lone source's unknown name is not taken for one of its columns
    lone = table_lineage("dws.t", "SELECT id, nope AS x FROM ods.src s", inputs)
    assert lone.columns["x"] == everything and lone.columns["id"] == refs("ods.src.id")
    assert lone.unresolved == {"x": "column nope is not a column of any table it reads"}
    # SQL the optimizer refuses (an unknown column of a named source): every column it names depends on everything
    refused = table_lineage("dws.t", "SELECT id, s.nix AS y FROM ods.src s", inputs, added=["dt"])
    assert refused.columns == {"id": everything, "y": everything, "dt": frozenset()}
    assert refused.rows == everything
    assert refused.unresolved["y"] == "the SQL could not be followed: Unknown column: nix"
    assert set(refused.unresolved) == {"id", "y", ROWS}


def test_an_unresolvable_column_of_a_catalog_table_reaches_the_build_and_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "ods").mkdir()
    (tmp_path / "dws").mkdir()
    (tmp_path / "ods" / "src.yaml").write_text(
        "table: ods.src\nperiod: hourly\nsource: {database: db, tables: src}\nprimary_key: [id]\n"
        "partition_time: t\ncolumns: {id: bigint, t: timestamp, v: bigint}\n"
    )
    (tmp_path / "dws" / "t.sql").write_text(
        "/* ---\ntable: dws.t\nperiod: daily\n--- */\nSELECT id, v * rate AS amount FROM ods.src\n"
    )
    catalog = load_catalog(tmp_path)
    found = WarehouseLineage(catalog).of("dws.t")
    assert found.columns["amount"] == refs(
        "ods.src.id", "ods.src.t", "ods.src.v", "ods.src._es", "ods.src._pos", "ods.src._stream",
        "ods.src._deleted", "ods.src.dt", "ods.src.hh",
    )  # fmt: skip
    metadata = column_lineage_metadata(found, catalog)
    assert "dws.t.amount: depends on every column of ods.src" in metadata["column_lineage_unresolved"].value
    with using(Settings.from_env({**os.environ, "WAREHOUSE_CATALOG_DIR": str(tmp_path)})):
        assert main(["lineage", "dws.t.amount", "--up"]) == 0
    out = capsys.readouterr().out
    assert (
        "unresolved: dws.t.amount: depends on every column of ods.src "
        "(column rate is not a column of any table it reads)" in out
    )


# --- Dagster's metadata and the command --------------------------------------------------------------------------


def test_the_materialization_carries_dagsters_column_lineage(lineage: WarehouseLineage, catalog: Catalog) -> None:
    metadata = column_lineage_metadata(lineage.of("ads.retention_d1"), catalog)
    value = metadata["dagster/column_lineage"]
    assert isinstance(value, TableColumnLineage)
    assert value.deps_by_column["retention_rate"] == [
        TableColumnDep(asset_key=AssetKey(["dws", "user_active_daily"]), column_name="user_id")
    ]
    assert value.deps_by_column["ds"] == []
    assert metadata["rows_depend_on"] == (
        "dwd.user_snapshot.register_dt, dwd.user_snapshot.user_id, dws.user_active_daily.user_id"
    )
    assert "column_lineage_unresolved" not in metadata


def test_the_lineage_command_up_and_down(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lineage", "ads.daily_gmv.gmv"]) == 0
    up = capsys.readouterr().out.splitlines()
    assert up[:6] == [
        "ads.daily_gmv.gmv",
        "  <- dws.user_order_daily.paid_amount",
        "    <- dwd.order_detail.amount",
        "      <- ods.order.amount",
        "    <- dwd.order_detail.status",
        "      <- ods.order.status",
    ]
    assert "rows of dwd.order_detail: ods.order.amount, ods.order.id" in up

    assert main(["lineage", "ods.order.pay_time", "--down"]) == 0
    down = capsys.readouterr().out.splitlines()
    assert down[:2] == [
        "ods.order.pay_time",
        f"  -> {'dwd.order_detail':<28} pay_time (computed from ods.order.pay_time)",
    ]
    assert len(down) == 3 and down[2].startswith("built from ods.order without reading it: ads.active_users, ")

    assert main(["lineage", "ods.order.amount", "--down"]) == 0
    amount = capsys.readouterr().out.splitlines()
    assert f"  -> {'dwd.order_detail':<28} every column (its rows depend on ods.order.amount)" in amount
    assert not any(line.startswith("built from ods.order without") for line in amount)  # all of them read it

    assert main(["lineage", "ads.daily_gmv.nope"]) == 2
    assert "ads.daily_gmv has no column nope; its columns: ds, gmv," in capsys.readouterr().err
    assert main(["lineage", "daily_gmv.gmv"]) == 2
    assert "'daily_gmv.gmv': name a column as layer.table.column" in capsys.readouterr().err
    assert main(["lineage", "ads.daily_gnv.gmv"]) == 2
    assert "did you mean ads.daily_gmv" in capsys.readouterr().err
