"""A partition's build and its checks see the same upstream rows, even when the upstream changes in between.

The checks evaluate the build's inputs again after the write (``row_count`` compares the partition with its upstream).
An ingestion may merge late changes into those upstream partitions meanwhile: `make dev` builds the first day while
the rest of the backlog is merged, and a later day's changes delete orders of the first. The build must be judged on
what it read; the late change re-reports the upstream hour, and the engine builds the day again.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pyarrow as pa
import pytest
from dagster import AssetCheckKey, AssetKey, AssetMaterialization, instance_for_test, materialize
from deltalake import write_deltalake
from pyspark.sql import SparkSession

from resources import resources_from_env
from resources.delta_lake import DeltaStore
from simulator.cdc_config import merged_order_row
from warehouse_assets.catalog import load_catalog
from warehouse_assets.ingest.merge import ods_arrow_schema
from warehouse_assets.materialize.compiler import build_assets

TZ = ZoneInfo("Asia/Shanghai")
DAY = "2026-03-02"
DWD = AssetKey(["dwd", "order_detail"])


def test_a_late_delete_between_the_build_and_its_checks_does_not_fail_them(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog = load_catalog()
    ods_path = str(tmp_path / "lake" / "ods" / "order")
    schema = ods_arrow_schema(catalog["ods.order"])
    rows = [merged_order_row(100 + i, 10, datetime(2026, 3, 2, 9 + i, 30, tzinfo=TZ), 100 + i) for i in range(4)]
    write_deltalake(ods_path, pa.Table.from_pylist(rows, schema=schema), partition_by=["dt", "hh"])
    written = DeltaStore.overwrite

    def overwrite_then_delete_upstream(self: DeltaStore, *args: Any, **kwargs: Any) -> Any:
        result = written(self, *args, **kwargs)
        # the ingestion commits a late DELETE of one of the day's orders right after the build's write
        late = [dict(rows[0], _deleted=True, _pos=999), *rows[1:]]
        write_deltalake(ods_path, pa.Table.from_pylist(late, schema=schema), mode="overwrite")
        return result

    monkeypatch.setattr(DeltaStore, "overwrite", overwrite_then_delete_upstream)
    resources = resources_from_env({"WAREHOUSE_LAKE_ROOT": str(tmp_path / "lake")})
    with instance_for_test() as instance:
        for hour in range(24):
            instance.report_runless_asset_event(
                AssetMaterialization(AssetKey(["ods", "order"]), partition=f"{DAY}-{hour:02d}:00")
            )
        result = materialize(
            build_assets(catalog), instance=instance, resources=resources, selection=[DWD], partition_key=DAY
        )
        assert result.success
        [row_count] = instance.event_log_storage.get_asset_check_execution_history(
            AssetCheckKey(DWD, "row_count"), limit=1
        )
    assert row_count.evaluation is not None and row_count.evaluation.passed, row_count.evaluation
    assert row_count.evaluation.description == "4 rows"  # the four orders the build read
