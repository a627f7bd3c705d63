"""Retention: a time-travel window that stays readable, and storage that does not grow without bound."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from resources.delta_lake import DeltaStore

KEY = ("dws", "kept")
# the tables Spark writes are vacuumed by Spark's VACUUM, the ops tables by delta-rs: both keep the window
ENGINES = pytest.mark.parametrize("engine", ["spark", "delta-rs"])


def _write(store: DeltaStore, spark: SparkSession, value: int) -> None:
    df = spark.createDataFrame([(i, value, "2026-03-02") for i in range(3)], "id bigint, v bigint, dt string")
    store.overwrite(KEY, df.repartition(1), ["dt"], [{"dt": "2026-03-02"}])


def _values(store: DeltaStore, version: int | None = None) -> set[int]:
    return set(store.read_rows(KEY, columns=["v"], version=version)[0].column("v").to_pylist())


def _history(spark: SparkSession, lake: Path, time_travel_hours: int, writes: int) -> Path:
    """A lake whose table holds ``writes`` overwrites of one partition, each a version; written once per module and
    copied for each engine's test (the log's paths are relative), since the engines only differ in maintaining it."""
    store = DeltaStore(str(lake), time_travel_hours=time_travel_hours, checkpoint_interval=5)
    for value in range(writes):
        _write(store, spark, value)
    return lake


def _copy(history: Path, tmp_path: Path, time_travel_hours: int) -> DeltaStore:
    shutil.copytree(history, tmp_path / "lake")
    return DeltaStore(str(tmp_path / "lake"), time_travel_hours=time_travel_hours, checkpoint_interval=5)


@pytest.fixture(scope="module")
def twelve_versions(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _history(spark, tmp_path_factory.mktemp("retention") / "lake", time_travel_hours=1, writes=12)


@pytest.fixture(scope="module")
def seven_versions(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _history(spark, tmp_path_factory.mktemp("cleanup") / "lake", time_travel_hours=0, writes=7)


@ENGINES
def test_window_stays_readable_and_vacuum_bounds_storage(
    spark: SparkSession, twelve_versions: Path, tmp_path: Path, engine: str
) -> None:
    session = spark if engine == "spark" else None
    store = _copy(twelve_versions, tmp_path, time_travel_hours=1)
    table_dir = Path(store.table_uri(KEY))
    config = DeltaTable(str(table_dir)).metadata().configuration
    assert config["delta.deletedFileRetentionDuration"] == "interval 1 hours"

    inside = store.maintain(KEY, spark=session)  # everything was replaced minutes ago: inside the window
    assert inside["files_vacuumed"] == 0
    assert (table_dir / "_delta_log" / "00000000000000000011.checkpoint.parquet").is_file()
    assert [_values(store, v) for v in (0, 3, 11)] == [{0}, {3}, {11}]

    outside = store.maintain(KEY, retention_hours=0, spark=session)  # a window of zero: only the live version remains
    assert outside["files_vacuumed"] == 11
    assert len(list(table_dir.rglob("*.parquet"))) == 1 + len(list(table_dir.glob("_delta_log/*.parquet")))
    assert _values(store) == {11}
    with pytest.raises(Exception):  # noqa: B017 - delta-rs raises its own error type for missing files
        _values(store, 3)


@ENGINES
def test_log_cleanup_keeps_the_table_loadable(
    spark: SparkSession, seven_versions: Path, tmp_path: Path, engine: str
) -> None:
    store = _copy(seven_versions, tmp_path, time_travel_hours=0)
    table_dir = Path(store.table_uri(KEY))
    store.maintain(KEY, spark=spark if engine == "spark" else None)
    # 7 commits, but with a zero window the entries before the last checkpoint are gone
    assert len(list((table_dir / "_delta_log").glob("*.json"))) < 7
    assert (table_dir / "_delta_log" / "_last_checkpoint").is_file()
    assert _values(store) == {6}
