"""A 5-minute table builds each window once its completeness window is reported, from the ODS rows of that window
only, and its run guard refuses a window not reported yet (the ODS hour reported or not)."""

from __future__ import annotations

import shutil
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pyarrow as pa
import pytest
from dagster import AssetKey, AssetMaterialization, DagsterInstance, instance_for_test, materialize
from deltalake import write_deltalake
from pyspark.sql import SparkSession

from resources import resources_from_env
from resources.delta_lake import DeltaStore
from simulator.cdc_config import merged_order_row
from warehouse_assets.catalog import TABLES_DIR, Catalog, load_catalog
from warehouse_assets.ingest.merge import ods_arrow_schema
from warehouse_assets.materialize.compiler import build_assets

TZ = ZoneInfo("Asia/Shanghai")
M5 = AssetKey(["dws", "order_5min"])
SQL = """/* ---
table: dws.order_5min
period: 5min
description: Orders per course of each 5-minute window.
--- */
SELECT course_id, count(*) AS orders FROM ods.order GROUP BY course_id
"""


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    root = tmp_path / "tables"
    (root / "ods").mkdir(parents=True)
    shutil.copy(TABLES_DIR / "ods" / "order.yaml", root / "ods" / "order.yaml")
    (root / "dws").mkdir()
    (root / "dws" / "order_5min.sql").write_text(SQL)
    return load_catalog(root)


def _build(catalog: Catalog, instance: DagsterInstance, lake: Path, key: str) -> bool:
    resources = resources_from_env({"WAREHOUSE_LAKE_ROOT": str(lake)})
    result = materialize(
        build_assets(catalog), instance=instance, resources=resources, selection=[M5], partition_key=key,
        raise_on_error=False,
    )  # fmt: skip
    return result.success


def test_a_5min_table_builds_each_reported_window_from_its_rows(
    spark: SparkSession, tmp_path: Path, catalog: Catalog
) -> None:
    lake = tmp_path / "lake"
    created = [datetime(2026, 3, 2, 9, minute, 30, tzinfo=TZ) for minute in (31, 33, 34, 36, 44)]
    rows = [merged_order_row(100 + i, 10, at, 100 + i, course_id=1 + i % 2) for i, at in enumerate(created)]
    schema = ods_arrow_schema(catalog["ods.order"])
    write_deltalake(str(lake / "ods" / "order"), pa.Table.from_pylist(rows, schema=schema), partition_by=["dt", "hh"])
    with instance_for_test() as instance:
        for window in ("2026-03-02-09:30", "2026-03-02-09:35"):
            instance.report_runless_asset_event(AssetMaterialization(AssetKey(["ods", "order_5min"]), partition=window))
        assert _build(catalog, instance, lake, "2026-03-02-09:30")
        assert _build(catalog, instance, lake, "2026-03-02-09:35")
        # 09:40 is not reported (its hour neither): the run guard refuses it
        assert not _build(catalog, instance, lake, "2026-03-02-09:40")
        built = instance.get_materialized_partitions(M5)
    assert built == {"2026-03-02-09:30", "2026-03-02-09:35"}
    out, _ = DeltaStore(str(lake)).read_rows(("dws", "order_5min"), None)
    got = sorted((r["mi"], r["course_id"], r["orders"]) for r in out.to_pylist())
    # 09:31 (course 1), 09:33 (2), 09:34 (1) in 09:30; 09:36 (2) in 09:35; 09:44 in 09:40, never built
    assert got == [("30", 1, 2), ("30", 2, 1), ("35", 2, 1)]
