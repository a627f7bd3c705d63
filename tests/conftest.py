"""Shared fixtures: one Spark session for the whole test session, temporary lakes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from resources import resources_from_env
from resources.delta_lake import DeltaStore
from resources.spark import stop_session

os.environ.setdefault("DAGSTER_TELEMETRY_ENABLED", "false")
# tests are written for the default warehouse start (2026-01-01); a developer's own value must not leak in
os.environ.pop("WAREHOUSE_START", None)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    # the same configuration the resources use, so assets materialized in tests share this session
    session = resources_from_env({})["spark"].session()
    yield session
    stop_session()


@pytest.fixture
def store(tmp_path: Path) -> DeltaStore:
    return DeltaStore(str(tmp_path / "lake"))
