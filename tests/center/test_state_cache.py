"""The state store's rows kept between reads: never a stale row after anyone else's write to the store's file (another
process's store applying the log, a bare SQL writer), and no row read again after the store's own writes."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import AssetKey, AssetMaterialization, DagsterInstance, instance_for_test

from warehouse_assets.center.state_store import PartitionState, PartitionStateStore

A = AssetKey(["dwd", "a"])
DAY = "2026-03-01"


@pytest.fixture
def instance(tmp_path: Path) -> Iterator[DagsterInstance]:
    (tmp_path / "home").mkdir()
    with instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
        yield instance


def report(instance: DagsterInstance, version: int) -> None:
    instance.report_runless_asset_event(AssetMaterialization(A, partition=DAY, metadata={"delta_version": version}))


def partition_reads(store: PartitionStateStore) -> list[str]:
    """The statements reading partition rows that the store's connection runs from now on."""
    reads: list[str] = []
    store._db.set_trace_callback(lambda sql: reads.append(sql) if sql.startswith("SELECT asset_key") else None)
    return reads


def test_a_row_another_store_wrote_is_read_again_not_served_from_memory(instance: DagsterInstance) -> None:
    """The engine keeps the rows it read; a second store on the same file (a restarted engine's, a ``warehouse``
    command's) applies a newer materialization and moves the shared cursor, so the engine's own update finds
    nothing new: only the file's generation tells the engine its kept row is stale."""
    engine = PartitionStateStore(instance)
    report(instance, 1)
    engine.update()
    assert engine.states(A, [DAY])[DAY].delta_version == 1
    other = PartitionStateStore(instance, engine.path)
    report(instance, 2)
    assert other.update()  # the other connection writes the row and the cursor
    assert engine.update() == []  # nothing left past the shared cursor for the engine
    assert engine.states(A, [DAY])[DAY].delta_version == 2
    other.close()
    engine.close()


def test_a_row_written_by_another_process_is_read_again(instance: DagsterInstance) -> None:
    store = PartitionStateStore(instance)
    report(instance, 1)
    store.update()
    assert store.states(A, [DAY, "2026-03-02"])[DAY].delta_version == 1
    writer = (
        "import sqlite3, sys; db = sqlite3.connect(sys.argv[1]); "
        "db.execute(\"UPDATE partitions SET delta_version = 7 WHERE asset_key = 'dwd/a'\"); "
        'db.execute("INSERT INTO partitions (asset_key, partition, storage_id, run_id, checks, in_progress, failed, '
        "queued) VALUES ('dwd/a', '2026-03-02', 99, '', '{}', 0, 0, 0)\"); "
        "db.commit()"
    )
    subprocess.run([sys.executable, "-c", writer, str(store.path)], check=True)
    found = store.states(A, [DAY, "2026-03-02"])
    assert found[DAY].delta_version == 7
    assert found["2026-03-02"].storage_id == 99  # a partition read before as never built
    store.close()


def test_a_row_deleted_on_the_same_connection_outside_the_store_is_read_again(
    instance: DagsterInstance, tmp_path: Path
) -> None:
    store = PartitionStateStore(instance, tmp_path / "same.db")
    store.put([PartitionState("dwd/a", DAY, storage_id=5, run_id="")])
    assert store.states(A, [DAY])[DAY].materialized
    store._db.execute("DELETE FROM partitions")  # what a hand repair or an older version would do
    assert not store.states(A, [DAY])[DAY].materialized
    store.close()


def test_rows_read_or_written_by_the_store_itself_are_not_read_again(instance: DagsterInstance) -> None:
    """What makes the resolver's calls cheap: the upstream windows it reads each call, and the rows each update
    writes, come from memory while no one else writes the file."""
    store = PartitionStateStore(instance)
    report(instance, 1)
    store.update()
    reads = partition_reads(store)
    assert store.states(A, [DAY])[DAY].delta_version == 1  # written by the update: kept
    assert store.states(A, ["2026-03-02"])["2026-03-02"].storage_id is None  # read once
    assert store.states(A, [DAY, "2026-03-02"])["2026-03-02"].storage_id is None
    assert len(reads) == 1
    report(instance, 2)
    store.update()
    store.put([PartitionState("dwd/a", "2026-03-02", storage_id=50, run_id="")])
    found = store.states(A, [DAY, "2026-03-02"])
    assert (found[DAY].delta_version, found["2026-03-02"].storage_id) == (2, 50)
    assert len(reads) == 1
    store.close()


def test_a_rebuild_from_the_log_replaces_every_row_kept(instance: DagsterInstance) -> None:
    store = PartitionStateStore(instance)
    store.put([PartitionState("dwd/a", DAY, storage_id=5, run_id="")])  # no event says so: a rebuild forgets it
    assert store.states(A, [DAY])[DAY].materialized
    store.rebuild()
    assert not store.states(A, [DAY])[DAY].materialized
    store.close()


def test_a_reader_opening_the_store_writes_nothing(instance: DagsterInstance, tmp_path: Path) -> None:
    """Sensors and ``warehouse why`` open the store on every tick while the engine writes: once the file has its
    generation, opening it must not take the write lock."""
    PartitionStateStore(instance, tmp_path / "s.db").close()
    lock = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")  # the engine in the middle of a write
    reader = PartitionStateStore(instance, tmp_path / "s.db")
    assert reader.states(A, [DAY])[DAY].storage_id is None
    reader.close()
    lock.execute("ROLLBACK")
    lock.close()
