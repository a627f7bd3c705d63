"""Fixtures shared by the ingestion tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from resources.delta_lake import DeltaStore
from warehouse_assets.catalog import load_catalog
from warehouse_assets.ingest.merge import ensure_ods_table


@pytest.fixture(scope="module")
def created_order_lake(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lake holding ``ods.order`` as the first batch creates it (no rows; deletion vectors and the change feed
    on), created once for the module: a test copies it (the Delta log's paths are relative) instead of paying the
    creation's Spark jobs again."""
    lake = tmp_path_factory.mktemp("ods") / "lake"
    ensure_ods_table(DeltaStore(str(lake)), load_catalog()["ods.order"], spark)
    return lake
