"""Retention: a time-travel window that stays readable, and storage that does not grow without bound."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from deltalake import DeltaTable, PostCommitHookProperties
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


def _copy(history: Path, tmp_path: Path, time_travel_hours: int) -> DeltaStore:
    shutil.copytree(history, tmp_path / "lake")
    return DeltaStore(str(tmp_path / "lake"), time_travel_hours=time_travel_hours, checkpoint_interval=5)


# versions 0-6: a checkpoint at 5 (every 5 commits) and versions before and after it
WRITES = 7
LAST = WRITES - 1


@pytest.fixture(scope="module")
def history(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lake whose table holds ``WRITES`` overwrites of one partition by Spark, each a version, in a window of an
    hour; written once for the module and copied for each test (the log's paths are relative), since the tests only
    differ in maintaining it."""
    lake = tmp_path_factory.mktemp("retention") / "lake"
    store = DeltaStore(str(lake), time_travel_hours=1, checkpoint_interval=5)
    for value in range(WRITES):
        _write(store, spark, value)
    return lake


@ENGINES
def test_window_stays_readable_and_vacuum_bounds_storage(
    spark: SparkSession, history: Path, tmp_path: Path, engine: str
) -> None:
    session = spark if engine == "spark" else None
    store = _copy(history, tmp_path, time_travel_hours=1)
    table_dir = Path(store.table_uri(KEY))
    config = DeltaTable(str(table_dir)).metadata().configuration
    assert config["delta.deletedFileRetentionDuration"] == "interval 1 hours"

    inside = store.maintain(KEY, spark=session)  # everything was replaced minutes ago: inside the window
    assert inside["files_vacuumed"] == 0
    assert (table_dir / "_delta_log" / f"{LAST:020d}.checkpoint.parquet").is_file()
    assert [_values(store, v) for v in (0, 3, LAST)] == [{0}, {3}, {LAST}]

    outside = store.maintain(KEY, retention_hours=0, spark=session)  # a window of zero: only the live version remains
    assert outside["files_vacuumed"] == LAST
    assert len(list(table_dir.rglob("*.parquet"))) == 1 + len(list(table_dir.glob("_delta_log/*.parquet")))
    assert _values(store) == {LAST}
    with pytest.raises(Exception):  # noqa: B017 - delta-rs raises its own error type for missing files
        _values(store, 3)


@ENGINES
def test_log_cleanup_keeps_the_table_loadable(spark: SparkSession, history: Path, tmp_path: Path, engine: str) -> None:
    store = _copy(history, tmp_path, time_travel_hours=0)
    table_dir = Path(store.table_uri(KEY))
    # the window closed to zero in the table's own properties, which the log cleanup reads: a commit more, no data
    # changed (the maintenance below, not this commit, checkpoints and cleans the log)
    configuration = store.table_configuration()
    window = {
        name: str(configuration[name]) for name in ("delta.logRetentionDuration", "delta.deletedFileRetentionDuration")
    }
    no_hooks = PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)
    DeltaTable(str(table_dir)).alter.set_table_properties(window, post_commithook_properties=no_hooks)
    commits = WRITES + 1  # the writes and the window
    store.maintain(KEY, spark=spark if engine == "spark" else None)
    # with a zero window the log entries before the last checkpoint are gone
    assert len(list((table_dir / "_delta_log").glob("*.json"))) < commits
    assert (table_dir / "_delta_log" / "_last_checkpoint").is_file()
    assert _values(store) == {LAST}
