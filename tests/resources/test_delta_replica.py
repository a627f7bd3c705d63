"""Partition-exact replication to a second lake: each partition of a Spark-written table published on the replica as
one delta-rs commit holding exactly the files of the source commit that built it, verified, and read the same by
Spark and by delta-rs; a ranged write's replacement removes the replica's old files; rows marked deleted by deletion
vectors stay deleted on the replica; an older source version never overwrites a newer one; two first publications at
once both land; a version whose files were vacuumed is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyspark.sql import SparkSession

from resources import delta_replica
from resources.delta_lake import DeltaStore
from resources.delta_read import DeltaReader
from resources.delta_replica import ReplicationError, replicate_partition
from tests.resources.test_deletion_vectors import COLUMNS, merge_with_deletion_vectors
from tests.resources.test_deletion_vectors import DAY as MERGED_DAY

KEY = ("dwd", "visits")
DAY = "2026-01-01"
HOURS = ["00", "01", "02"]


def _hour(hh: str) -> dict[str, str]:
    return {"dt": DAY, "hh": hh}


def _write(spark: SparkSession, store: DeltaStore, hours: list[str], factor: int) -> int:
    """One ranged overwrite of ``hours`` (a Spark ``replaceWhere`` commit, as a ranged run writes), 5 rows each."""
    rows = [(i, i * factor, DAY, hh) for hh in hours for i in range(5)]
    df = spark.createDataFrame(rows, "id bigint, v bigint, dt string, hh string")
    return store.overwrite(KEY, df, ["dt", "hh"], [_hour(hh) for hh in hours]).version


def _commit_adds(store: DeltaStore, version: int, hh: str) -> set[str]:
    """The add actions of one source commit in hour ``hh``, read from its log entry."""
    entry = Path(store.table_uri(KEY)) / "_delta_log" / f"{version:020d}.json"
    actions = [json.loads(line) for line in entry.read_text().splitlines() if line.strip()]
    return {a["add"]["path"] for a in actions if "add" in a and a["add"]["partitionValues"]["hh"] == hh}


def _rows(spark: SparkSession, root: str, key: tuple[str, ...] = KEY) -> list[tuple[Any, ...]]:
    df, _ = DeltaStore(root).read(spark, key)
    return sorted(tuple(r) for r in df.select(*df.columns).collect())


def _rs_rows(root: str, key: tuple[str, ...] = KEY) -> list[tuple[Any, ...]]:
    rows, _ = DeltaStore(root).read_rows(key)
    return sorted(tuple(r.values()) for r in rows.to_pylist())


@pytest.fixture
def lakes(tmp_path: Path) -> tuple[DeltaStore, DeltaReader]:
    return DeltaStore(str(tmp_path / "site1")), DeltaReader(str(tmp_path / "site2"))


def test_each_partition_is_one_replica_commit_of_exactly_its_source_files(
    spark: SparkSession, lakes: tuple[DeltaStore, DeltaReader]
) -> None:
    store, replica = lakes
    built = _write(spark, store, HOURS, 1)
    published = []
    for hh in HOURS:
        before = replica.version(KEY)
        done = replicate_partition(store, replica, KEY, _hour(hh), built)
        assert done.replica_version == (0 if before is None else before + 1)  # one commit per partition
        assert set(done.copied_paths) == _commit_adds(store, built, hh)  # exactly the commit's files there
        assert (done.rows, done.files_removed, done.source_version) == (5, 0, built)
        assert done.lag_s is not None and done.lag_s >= 0
        published.append(done.replica_version)
    assert published == [0, 1, 2]
    # a plain Spark and delta-rs read the replica as the source
    assert _rows(spark, replica.root) == _rows(spark, store.root) == _rs_rows(replica.root)
    # publishing the same version again commits nothing
    again = replicate_partition(store, replica, KEY, _hour("01"), built)
    assert again.replica_version is None and replica.version(KEY) == 2


def test_a_ranged_replacement_removes_the_replicas_old_files(
    spark: SparkSession, lakes: tuple[DeltaStore, DeltaReader]
) -> None:
    store, replica = lakes
    first = _write(spark, store, HOURS, 1)
    for hh in HOURS:
        replicate_partition(store, replica, KEY, _hour(hh), first)
    old = {f["path"] for f in replica.live_files(KEY, [_hour("01")])[0]}
    replaced = _write(spark, store, ["01", "02"], 100)  # one commit replacing two hours
    done = replicate_partition(store, replica, KEY, _hour("01"), replaced)
    assert done.files_removed == len(old) and set(done.copied_paths) == _commit_adds(store, replaced, "01")
    assert not old & {f["path"] for f in replica.live_files(KEY, [_hour("01")])[0]}
    replica_hour = [r for r in _rs_rows(replica.root) if r[3] == "01"]
    assert replica_hour == [(i, i * 100, DAY, "01") for i in range(5)]
    # an older source version never replaces what a newer one published
    stale = replicate_partition(store, replica, KEY, _hour("01"), first)
    assert stale.replica_version is None
    assert [r for r in _rs_rows(replica.root) if r[3] == "01"] == replica_hour


def test_rows_marked_deleted_by_deletion_vectors_stay_deleted_on_the_replica(
    spark: SparkSession, tmp_path: Path
) -> None:
    merged = merge_with_deletion_vectors(spark, tmp_path / "site1", "orders")
    store, key = merged.store, merged.key
    replica = DeltaReader(str(tmp_path / "site2"))
    hours = sorted({hh for _, _, hh in merged.expected.values()})
    results = [replicate_partition(store, replica, key, {"dt": MERGED_DAY, "hh": hh}) for hh in hours]
    assert sum(r.files_rewritten for r in results) >= 1  # the files with a vector were written without those rows
    replica_rows, _ = DeltaStore(replica.root).read_rows(key, columns=COLUMNS)
    assert {r["id"]: (r["v"], r["dt"], r["hh"]) for r in replica_rows.to_pylist()} == merged.expected
    by_spark = DeltaStore(replica.root).read(spark, key)[0].select(*COLUMNS).collect()
    assert {r["id"]: (r["v"], r["dt"], r["hh"]) for r in by_spark} == merged.expected
    assert sum(r.rows for r in results) == len(merged.expected)


def test_a_partition_the_table_is_not_partitioned_by_is_refused(
    spark: SparkSession, lakes: tuple[DeltaStore, DeltaReader]
) -> None:
    store, replica = lakes
    _write(spark, store, ["00"], 1)
    with pytest.raises(ReplicationError, match=r"partitioned by \['dt', 'hh'\], not by \['dt'\]"):
        replicate_partition(store, replica, KEY, {"dt": DAY})


def _rs_source(root: Path) -> DeltaReader:
    """A source table written by delta-rs (no JVM): hours 01 and 02, two rows each."""
    rows = pa.table({"id": [1, 2, 3, 4], "dt": [DAY] * 4, "hh": ["01", "01", "02", "02"]})
    write_deltalake(str(root / "dwd" / "visits"), rows, partition_by=["dt", "hh"])
    return DeltaReader(str(root))


def test_two_first_publications_at_once_both_land(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source, replica = _rs_source(tmp_path / "site1"), DeltaReader(str(tmp_path / "site2"))
    real = delta_replica.create_table_with_add_actions

    def racing(*args: Any, **kwargs: Any) -> None:
        # another partition's replication creates the replica table between our look and our commit
        monkeypatch.setattr(delta_replica, "create_table_with_add_actions", real)
        replicate_partition(source, replica, KEY, _hour("02"))
        real(*args, **kwargs)

    monkeypatch.setattr(delta_replica, "create_table_with_add_actions", racing)
    done = replicate_partition(source, replica, KEY, _hour("01"))
    assert (done.replica_version, done.rows) == (1, 2)
    assert _rs_rows(replica.root) == _rs_rows(source.root)


def test_a_vacuumed_version_is_refused_naming_the_file(tmp_path: Path) -> None:
    source, replica = _rs_source(tmp_path / "site1"), DeltaReader(str(tmp_path / "site2"))
    [gone] = [f["path"] for f in source.live_files(KEY, [_hour("01")])[0]]
    (Path(source.table_uri(KEY)) / gone).unlink()
    with pytest.raises(ReplicationError, match="is gone from storage"):
        replicate_partition(source, replica, KEY, _hour("01"))
