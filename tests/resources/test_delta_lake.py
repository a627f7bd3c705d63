"""The Delta lake layer: content after each operation, atomicity, idempotence, pruning, validity."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from datetime import datetime
from decimal import Decimal
from functools import reduce
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from resources.delta_lake import DeltaLayerError, DeltaStore, Predicate, warm_up
from tests.support import oracle

KEY = ("dwd", "sales")


def _sales(spark: SparkSession, day: str, n: int, offset: int = 0, amount: str = "1.50"):
    rows = [
        (i + offset, f"u{(i + offset) % 7}", Decimal(amount), datetime(2024, 3, 5, 10, 0, i % 60), day)
        for i in range(n)
    ]
    return spark.createDataFrame(rows, "id bigint, user string, amount decimal(10,2), ts timestamp, dt string")


def _rows(store: DeltaStore) -> list[tuple]:
    """``KEY``'s rows as delta-rs reads them, no Spark job: what the tests of a write's outcome compare (Spark's own
    reader is tested where its pruning and skipping are)."""
    columns = ["id", "user", "amount", "dt"]
    rows = store.read_rows(KEY, columns=columns)[0].to_pylist()
    return sorted(tuple(r[c] for c in columns) for r in rows)


_log_paths = oracle.delta_live_paths


@pytest.fixture(scope="module")
def first_day_lake(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lake whose table ``KEY`` holds one commit (version 0): 10 rows of 2024-03-05, written once for the
    module."""
    root = tmp_path_factory.mktemp("first-day") / "lake"
    DeltaStore(str(root)).overwrite(KEY, _sales(spark, "2024-03-05", 10), ["dt"], [{"dt": "2024-03-05"}])
    return root


@pytest.fixture
def first_day(first_day_lake: Path, tmp_path: Path) -> DeltaStore:
    """A copy of the module's one-commit table for one test to write (the Delta log's paths are relative): the
    tests that start from an existing table, not from its creation, skip a Spark write of their own."""
    shutil.copytree(first_day_lake, tmp_path / "lake")
    return DeltaStore(str(tmp_path / "lake"))


def test_overwrite_creates_and_replaces_exactly_one_partition(spark: SparkSession, store: DeltaStore) -> None:
    first = store.overwrite(KEY, _sales(spark, "2024-03-05", 20), ["dt"], [{"dt": "2024-03-05"}])
    assert first.version == 0 and first.rows == 20 and first.files_added >= 1
    store.overwrite(KEY, _sales(spark, "2024-03-06", 5, offset=100), ["dt"], [{"dt": "2024-03-06"}])
    again = store.overwrite(KEY, _sales(spark, "2024-03-05", 3, amount="9.00"), ["dt"], [{"dt": "2024-03-05"}])
    assert again.files_removed == first.files_added
    rows = _rows(store)
    assert [r for r in rows if r[3] == "2024-03-05"] == [
        (0, "u0", Decimal("9.00"), "2024-03-05"),
        (1, "u1", Decimal("9.00"), "2024-03-05"),
        (2, "u2", Decimal("9.00"), "2024-03-05"),
    ]
    assert len([r for r in rows if r[3] == "2024-03-06"]) == 5


def test_rerunning_the_same_partition_is_idempotent(spark: SparkSession, store: DeltaStore) -> None:
    for _ in range(3):
        store.overwrite(KEY, _sales(spark, "2024-03-05", 50), ["dt"], [{"dt": "2024-03-05"}])
    rows = _rows(store)
    assert len(rows) == 50 and len({r[0] for r in rows}) == 50


def test_range_overwrite_and_empty_partition(spark: SparkSession, first_day: DeltaStore) -> None:
    store = first_day  # 2024-03-05 written
    both = _sales(spark, "2024-03-06", 6, offset=10)
    result = store.overwrite(KEY, both, ["dt"], [{"dt": "2024-03-05"}, {"dt": "2024-03-06"}])
    assert result.rows == 6
    assert {r[3] for r in _rows(store)} == {"2024-03-06"}  # 03-05 replaced by nothing


def test_writing_nothing_over_an_empty_partition_is_a_commit_of_its_own(
    spark: SparkSession, first_day: DeltaStore
) -> None:
    # an hour without orders: the run replaces nothing with nothing, and still finds its own commit
    store = first_day  # version 0: 2024-03-05 written
    empty = store.overwrite(KEY, _sales(spark, "2024-03-07", 0), ["dt"], [{"dt": "2024-03-07"}])
    assert (empty.version, empty.rows, empty.files_added, empty.files_removed) == (1, 0, 0, 0)
    again = store.overwrite(KEY, _sales(spark, "2024-03-07", 0), ["dt"], [{"dt": "2024-03-07"}])
    assert again.version == 2
    assert [h.get("warehouse.operation") for h in store.history(KEY)] == ["overwrite"] * 3
    assert {r[3] for r in _rows(store)} == {"2024-03-05"}


def test_a_write_failing_midway_leaves_the_previous_version(spark: SparkSession, first_day: DeltaStore) -> None:
    store = first_day  # 2024-03-05's 10 rows written
    store.overwrite(KEY, _sales(spark, "2024-03-06", 10, offset=10), ["dt"], [{"dt": "2024-03-06"}])
    before = _rows(store)
    version = DeltaTable(store.table_uri(KEY)).version()
    # The first partition is written completely, the second blows up inside the Spark job.
    bad = _sales(spark, "2024-03-05", 10, amount="7.00").unionByName(_sales(spark, "2024-03-06", 10, offset=10))
    bad = bad.selectExpr(
        "id", "user", "if(dt = '2024-03-06' and id = 15, raise_error('injected failure'), amount) as amount", "ts", "dt"
    )
    with pytest.raises(Exception, match="injected failure"):
        store.overwrite(KEY, bad, ["dt"], [{"dt": "2024-03-05"}, {"dt": "2024-03-06"}])
    assert DeltaTable(store.table_uri(KEY)).version() == version
    assert _rows(store) == before


def test_a_crash_before_the_commit_leaves_only_invisible_orphans(spark: SparkSession, first_day: DeltaStore) -> None:
    store = first_day  # 2024-03-05's 10 rows written
    before = _rows(store)
    table_dir = Path(store.table_uri(KEY))
    files_before = set(table_dir.rglob("*.parquet"))

    def a_new_file_is_whole() -> bool:
        # a Parquet file begins with its magic bytes and ends with them again once its writer closed it
        written = [p.read_bytes() for p in set(table_dir.rglob("*.parquet")) - files_before]
        return any(len(data) > 8 and data.endswith(b"PAR1") for data in written)

    # One task writes its file, the other dies once that file is whole: the job fails before Delta commits.
    @F.udf("decimal(10,2)")
    def die_late(row_id: int, amount: Decimal) -> Decimal:
        if row_id == 3:
            deadline = time.monotonic() + 60
            while not a_new_file_is_whole() and time.monotonic() < deadline:
                time.sleep(0.05)
            raise RuntimeError("killed before commit")
        return amount

    new = _sales(spark, "2024-03-05", 4, amount="7.00").repartition(2, "id")
    crashing = new.withColumn("amount", die_late("id", "amount"))
    with pytest.raises(DeltaLayerError, match="killed before commit"):
        store.overwrite(KEY, crashing, ["dt"], [{"dt": "2024-03-05"}])
    assert _rows(store) == before
    on_disk = {str(p.relative_to(table_dir)) for p in table_dir.rglob("*.parquet")}
    assert _log_paths(table_dir) < on_disk  # the crashed write's files exist but are not in the table
    # the re-run produces what an undisturbed run produces
    store.overwrite(KEY, new, ["dt"], [{"dt": "2024-03-05"}])
    assert [r[2] for r in _rows(store)] == [Decimal("7.00")] * 4


def scanned_files(df: DataFrame) -> int:
    """The files Spark's scans read to run ``df`` (after Delta's partition pruning and data skipping)."""
    df.collect()
    plan = df._jdf.queryExecution().executedPlan()
    final = plan.finalPhysicalPlan() if plan.nodeName() == "AdaptiveSparkPlan" else plan
    leaves = final.collectLeaves()
    total = 0
    for i in range(leaves.length()):
        metric = leaves.apply(i).metrics().get("numFiles")
        if metric.isDefined():
            total += int(metric.get().value())
    return total


def test_partition_pruning_and_data_skipping_count_files(spark: SparkSession, store: DeltaStore) -> None:
    days = [f"2024-03-0{day}" for day in range(1, 6)]
    # the five days in one write: each of its 4 tasks writes a file into every day's partition
    frames = [_sales(spark, dt, 40, offset=day * 1000) for day, dt in enumerate(days, start=1)]
    df = reduce(DataFrame.unionByName, frames).repartition(4, "id")
    store.overwrite(KEY, df, ["dt"], [{"dt": dt} for dt in days])
    files, stats = store.live_files(KEY)
    assert stats.files_in_table == len(files) == 20
    _, by_partition = store.live_files(KEY, partitions=[{"dt": "2024-03-02"}])
    assert by_partition.files_after_partition_pruning == 4
    df, pruned = store.read(spark, KEY, partitions=[{"dt": "2024-03-02"}])
    assert pruned.files_read == 4 and scanned_files(df) == 4  # Spark's reader pruned to the partition too
    # ids 3000..3039 live in exactly one partition: Delta's statistics skip every other file in Spark's plan
    df, _ = store.read(spark, KEY, predicates=[Predicate("id", ">=", 3000), Predicate("id", "<", 3040)])
    assert scanned_files(df) == 4
    assert df.count() == 40


def test_merge_applies_latest_change_per_key_and_deletes(spark: SparkSession, store: DeltaStore) -> None:
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("v", pa.string()),
            ("_es", pa.int64()),
            ("_pos", pa.int64()),
            ("_op", pa.string()),
            ("dt", pa.string()),
        ]
    )
    first = pa.table(
        {
            "id": [1, 2, 3],
            "v": ["a", "b", "c"],
            "_es": [10, 10, 10],
            "_pos": [1, 2, 3],
            "_op": ["INSERT"] * 3,
            "dt": ["2024-03-05", "2024-03-05", "2024-03-06"],
        },
        schema=schema,
    )
    store.merge(spark, ("ods", "t"), first, primary_key=["id"], partition_by=["dt"], app_transaction=("shard-a", 1))
    second = pa.table(
        {
            "id": [1, 2, 3],
            "v": ["a2", "stale", "c"],
            "_es": [20, 5, 30],
            "_pos": [4, 0, 5],
            "_op": ["UPDATE", "UPDATE", "DELETE"],
            "dt": ["2024-03-05", "2024-03-05", "2024-03-06"],
        },
        schema=schema,
    )
    result = store.merge(
        spark, ("ods", "t"), second, primary_key=["id"], partition_by=["dt"], app_transaction=("shard-a", 2)
    )
    rows = sorted((r["id"], r["v"]) for r in store.read_rows(("ods", "t"))[0].to_pylist())
    assert rows == [(1, "a2"), (2, "b")]  # 1 updated, 2's older change ignored, 3 deleted
    assert store.app_version(("ods", "t"), "shard-a") == 2
    assert result.metadata()["rows_deleted"] == 1 and result.metadata()["rows_updated"] == 1
    # the same batch again under the same app transaction version is not applied a second time
    again = store.merge(
        spark, ("ods", "t"), first, primary_key=["id"], partition_by=["dt"], app_transaction=("shard-a", 2)
    )
    assert again.version == result.version and again.metadata()["rows_inserted"] == 0
    rows = sorted((r["id"], r["v"]) for r in store.read_rows(("ods", "t"))[0].to_pylist())
    assert rows == [(1, "a2"), (2, "b")]


def test_merge_applies_every_row_of_a_batch_holding_an_empty_record_batch(
    spark: SparkSession, store: DeltaStore
) -> None:
    # a filtered or concatenated Arrow table often holds empty record batches: PySpark's createDataFrame lost the
    # rows after one, so a merge applied part of its batch, silently
    schema = pa.schema(
        [("id", pa.int64()), ("_es", pa.int64()), ("_pos", pa.int64()), ("_op", pa.string()), ("dt", pa.string())]
    )

    def rows(ids: list[int]) -> pa.Table:
        n = len(ids)
        return pa.table(
            {"id": ids, "_es": [1] * n, "_pos": ids, "_op": ["INSERT"] * n, "dt": ["2024-03-05"] * n}, schema=schema
        )

    batch = pa.concat_tables([rows([1]), rows([]), rows([2, 3])])
    assert [b.num_rows for b in batch.to_batches()] == [1, 0, 2]
    result = store.merge(spark, ("ods", "e"), batch, primary_key=["id"], partition_by=["dt"])
    assert sorted(r["id"] for r in store.read_rows(("ods", "e"))[0].to_pylist()) == [1, 2, 3]
    assert result.metadata()["rows_inserted"] == 3


TEN_DAYS = [f"2024-03-{d:02d}" for d in range(1, 11)]


def _hundred_keys(tombstones: bool) -> pa.Table:
    """Keys 0-99 inserted, key i in day ``TEN_DAYS[i % 10]``; with the tombstone column ``_deleted`` or without."""
    flag = {"_deleted": [False] * 100} if tombstones else {}
    return pa.table(
        {"id": list(range(100)), "_es": [1] * 100, "_pos": [1] * 100, "_op": ["INSERT"] * 100, **flag}
        | {"dt": [TEN_DAYS[i % 10] for i in range(100)]}
    )


def _merge_args(tombstones: bool) -> dict[str, Any]:
    return {"primary_key": ["id"], "partition_by": ["dt"], "tombstone_column": "_deleted" if tombstones else None}


@pytest.fixture(scope="module")
def hundred_keys_lake(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The hundred keys merged by the store into a table it creates (a file per day), once for the module: as
    ``ods/plain`` without a tombstone column, as ``ods/tombstoned`` with one."""
    root = tmp_path_factory.mktemp("hundred-keys") / "lake"
    store = DeltaStore(str(root))
    for name, tombstones in (("plain", False), ("tombstoned", True)):
        store.merge(spark, ("ods", name), _hundred_keys(tombstones), **_merge_args(tombstones))
    return root


def _copy_hundred_keys(lake: Path, tombstones: bool, store: DeltaStore, key: tuple[str, str]) -> None:
    """The module's merged table of the hundred keys as ``key`` of ``store`` (its log's paths are relative)."""
    shutil.copytree(lake / "ods" / ("tombstoned" if tombstones else "plain"), store.table_uri(key))


def test_merge_scans_only_the_batch_partitions(spark: SparkSession, store: DeltaStore, hundred_keys_lake: Path) -> None:
    days = TEN_DAYS
    _copy_hundred_keys(hundred_keys_lake, False, store, ("ods", "p"))  # 100 keys merged into 10 days, a file each
    change = pa.table({"id": [5], "_es": [2], "_pos": [2], "_op": ["UPDATE"], "dt": [days[5]]})
    pruned = store.merge(spark, ("ods", "p"), change, primary_key=["id"], partition_by=["dt"], prune=True)
    unpruned = store.merge(spark, ("ods", "p"), change, primary_key=["id"], partition_by=["dt"], prune=False)
    # Delta's own figures for the merge's scan, not the product's inference: removing the partition predicate from
    # the merge condition makes Delta scan every file of every partition, and this fails
    assert {k: pruned.metadata()[k] for k in ("files_in_table", "files_scanned", "partitions_scanned")} == {
        "files_in_table": 10,
        "files_scanned": 1,
        "partitions_scanned": 1,
    }
    assert pruned.metadata()["files_skipped"] == 9
    # every file of every partition: the pruned merge's new row went to a file of its own (a deletion vector marks
    # the old one), so the table has 11
    assert (unpruned.metadata()["files_scanned"], unpruned.metadata()["partitions_scanned"]) == (11, 10)
    assert unpruned.metadata()["files_in_table"] == 11


@pytest.mark.parametrize("tombstones", [False, True])
def test_merge_moves_a_key_out_of_the_partition_it_left_scanning_only_both(
    spark: SparkSession, store: DeltaStore, hundred_keys_lake: Path, tombstones: bool
) -> None:
    days = TEN_DAYS
    merge_args = _merge_args(tombstones)
    _copy_hundred_keys(hundred_keys_lake, tombstones, store, ("ods", "m"))  # id i lives in days[i % 10]
    one = {"_deleted": [False]} if tombstones else {}
    change = pa.table({"id": [5], "_es": [2], "_pos": [2], "_op": ["UPDATE"], **one, "dt": [days[7]]})  # left days[5]
    left = pa.table({"id": [5], "_es": [2], "_pos": [2], "_op": ["UPDATE"], **one, "dt": [days[5]]})
    result = store.merge(spark, ("ods", "m"), change, moved_out=left, **merge_args)

    rows = store.read_rows(("ods", "m"))[0].to_pylist()
    oracle.assert_each_key_live_once(rows, ["id"], ["dt"])
    assert sorted((r["dt"], r.get("_deleted", False)) for r in rows if r["id"] == 5) == (
        [(days[5], True), (days[7], False)] if tombstones else [(days[7], False)]
    )
    assert len(rows) == (101 if tombstones else 100)
    meta = result.metadata()
    assert result.partitions == [{"dt": days[5]}, {"dt": days[7]}]
    assert (meta["source_rows"], meta["rows_moved_out"], meta["files_scanned"]) == (2, 1, 2)
    expected = (1, 1, 0) if tombstones else (1, 0, 1)  # a tombstone is an update, a plain delete a delete
    assert (meta["rows_inserted"], meta["rows_updated"], meta["rows_deleted"]) == expected


def test_optimize_zorder_and_history(spark: SparkSession, store: DeltaStore) -> None:
    df = _sales(spark, "2024-03-05", 200).repartition(8)
    store.overwrite(KEY, df, ["dt"], [{"dt": "2024-03-05"}])
    before = _rows(store)
    metrics = store.optimize(KEY, partitions=[{"dt": "2024-03-05"}], zorder_by=["user", "id"], spark=spark)
    assert metrics["numFilesRemoved"] == 8 and metrics["numFilesAdded"] >= 1
    assert _rows(store) == before
    operations = [h["operation"] for h in store.history(KEY)]
    assert operations[0] == "OPTIMIZE" and len(operations) == 2


def _grid(spark: SparkSession, n: int = 4096):
    """Rows whose (a, b) are uncorrelated with the row order: no file's min/max can skip before Z-order."""
    rows = [(i, (i * 2654435761) % 1000, (i * 40503 + 17) % 1000, "2024-03-05") for i in range(n)]
    return spark.createDataFrame(rows, "id bigint, a bigint, b bigint, dt string")


def _grid_rows(store: DeltaStore, key: tuple[str, str]) -> list[tuple[Any, ...]]:
    """The grid's rows (id, a, b, dt) as delta-rs reads them."""
    return sorted(tuple(r.values()) for r in store.read_rows(key, columns=["id", "a", "b", "dt"])[0].to_pylist())


def _mean_skipped(store: DeltaStore, key: tuple[str, str], lookups: list[tuple[int, int]]) -> float:
    """The share of files whose min/max of (a, b) in the log exclude a lookup (what data skipping can skip)."""
    files, _ = store.live_files(key, [{"dt": "2024-03-05"}])
    fractions = []
    for a, b in lookups:
        kept = [f for f in files if f["min.a"] <= a <= f["max.a"] and f["min.b"] <= b <= f["max.b"]]
        fractions.append(1 - len(kept) / len(files))
    return sum(fractions) / len(fractions)


def test_zorder_through_spark_clusters_files_in_z_order(spark: SparkSession, store: DeltaStore) -> None:
    key = ("dwd", "grid")
    df = _grid(spark)
    store.overwrite(key, df.repartition(16), ["dt"], [{"dt": "2024-03-05"}])
    before = _grid_rows(store, key)
    lookups = [(r[1], r[2]) for r in before[::97]]
    assert _mean_skipped(store, key, lookups) < 0.2  # random layout: every file spans almost the whole grid
    files_bytes = store.live_files(key, [{"dt": "2024-03-05"}])[1].bytes_read
    metrics = store.optimize(
        key, partitions=[{"dt": "2024-03-05"}], zorder_by=["a", "b"], target_size=files_bytes // 16, spark=spark
    )
    assert metrics["numFilesRemoved"] == 16 and 8 <= metrics["numFilesAdded"] <= 24
    assert _grid_rows(store, key) == before  # same rows, new layout
    assert len(before) == 4096
    assert _mean_skipped(store, key, lookups) > 0.75  # each file now covers a small box of (a, b)
    table_dir = Path(store.table_uri(key))
    last = sorted((table_dir / "_delta_log").glob("*.json"))[-1].read_text().splitlines()
    adds = [json.loads(line)["add"] for line in last if '"add"' in line]
    assert adds and all(a["dataChange"] is False for a in adds)  # a rewrite, not new data
    assert store.history(key)[0]["warehouse.operation"] == "zorder"


def test_zorder_never_replaces_a_concurrent_change(spark: SparkSession, store: DeltaStore) -> None:
    store.overwrite(KEY, _sales(spark, "2024-03-05", 400).repartition(8), ["dt"], [{"dt": "2024-03-05"}])
    rival = DeltaStore(store.root)
    outcome: dict[str, Any] = {}

    def optimize() -> None:
        try:
            outcome["metrics"] = store.optimize(KEY, partitions=[{"dt": "2024-03-05"}], zorder_by=["id"], spark=spark)
        except DeltaLayerError as exc:  # Delta refused the rewrite: the rival removed the files it read
            outcome["refused"] = str(exc)

    # late data replaces the partition while the Z-order rewrites it, whichever commits first
    thread = threading.Thread(target=optimize)
    thread.start()
    rival.overwrite(KEY, _sales(spark, "2024-03-05", 3, amount="8.00"), ["dt"], [{"dt": "2024-03-05"}])
    thread.join()
    assert outcome  # the Z-order either committed (before the rival) or was refused, never raised otherwise
    assert _rows(store) == [(i, f"u{i}", Decimal("8.00"), "2024-03-05") for i in range(3)]  # the rival's rows
    with pytest.raises(DeltaLayerError, match="Z-order runs on Spark's Delta"):
        store.optimize(KEY, partitions=[{"dt": "2024-03-05"}], zorder_by=["id"])


def test_written_tables_are_valid_delta(spark: SparkSession, first_day: DeltaStore) -> None:
    store = first_day  # version 0: 2024-03-05's 10 rows
    store.overwrite(KEY, _sales(spark, "2024-03-05", 12), ["dt"], [{"dt": "2024-03-05"}])
    table_dir = Path(store.table_uri(KEY))
    dt = DeltaTable(str(table_dir))
    assert store.read_rows(KEY)[0].num_rows == 12
    live = _log_paths(table_dir)
    assert live == {os.path.relpath(u, table_dir) for u in dt.file_uris()}
    for rel in live:
        assert (table_dir / rel).is_file()
    for line in (table_dir / "_delta_log" / "00000000000000000001.json").read_text().splitlines():
        action = json.loads(line)
        if "add" in action:
            stats = json.loads(action["add"]["stats"])
            assert stats["numRecords"] > 0 and "id" in stats["minValues"] and "id" in stats["maxValues"]


def test_bad_requests_are_named(spark: SparkSession, store: DeltaStore) -> None:
    with pytest.raises(DeltaLayerError, match="partition column"):
        store.overwrite(KEY, _sales(spark, "2024-03-05", 1).drop("dt"), ["dt"], [{"dt": "2024-03-05"}])
    with pytest.raises(DeltaLayerError, match="does not exist"):
        store.read(spark, ("dwd", "missing"))


def test_two_writers_on_one_partition_never_mix_or_lose(spark: SparkSession, first_day: DeltaStore) -> None:
    store = first_day  # 2024-03-05 written
    rival = DeltaStore(store.root)
    results = {}

    def rival_writes() -> None:
        new = _sales(spark, "2024-03-05", 2, offset=500, amount="5.00")
        results["rival"] = rival.overwrite(KEY, new, ["dt"], [{"dt": "2024-03-05"}])

    # both replace the same partition at the same time: Delta lets one commit first and refuses the
    # other, which is written again on the new version
    thread = threading.Thread(target=rival_writes)
    thread.start()
    results["ours"] = store.overwrite(
        KEY, _sales(spark, "2024-03-05", 3, amount="7.00"), ["dt"], [{"dt": "2024-03-05"}]
    )
    thread.join()
    operations = [h.get("warehouse.operation") for h in store.history(KEY)]
    assert operations[:3] == ["overwrite", "overwrite", "overwrite"]  # the rival's commit and ours both landed
    assert sorted(r.version for r in results.values()) == [1, 2]
    last = max(results.values(), key=lambda r: r.version)
    expected = {
        "ours": [(i, f"u{i % 7}", Decimal("7.00"), "2024-03-05") for i in range(3)],
        "rival": [(i, f"u{i % 7}", Decimal("5.00"), "2024-03-05") for i in range(500, 502)],
    }
    # the last commit replaced the partition as a whole: nothing of the other write or the first is mixed in
    winner = next(name for name, r in results.items() if r is last)
    assert _rows(store) == expected[winner]
    assert last.files_removed >= 1


def test_two_runs_creating_one_table_with_different_partitions_both_land(
    spark: SparkSession, store: DeltaStore
) -> None:
    """Two runs of a new table (two hours at once): both create it; Delta refuses the second creation
    (``ProtocolChangedException``: two writers on an empty directory), which is written again on the table."""
    barrier = threading.Barrier(2)
    results: dict[str, Any] = {}

    def write(day: str) -> None:
        barrier.wait()
        results[day] = DeltaStore(store.root).overwrite(KEY, _sales(spark, day, 2), ["dt"], [{"dt": day}])

    threads = [threading.Thread(target=write, args=(day,)) for day in ("2024-03-05", "2024-03-06")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(r.version for r in results.values()) == [0, 1]
    assert sorted({row[3] for row in _rows(store)}) == ["2024-03-05", "2024-03-06"]


def test_a_conflict_reported_through_spark_connect_is_recognized() -> None:
    """Over Spark Connect the first error of the chain is gRPC's; Delta's error class is on the PySpark error
    that follows it. The overwrite retries such a conflict (it failed a run of the embedded stack once)."""
    from resources.delta_sql import is_conflict

    grpc = RuntimeError("<_MultiThreadedRendezvous of RPC that terminated with:\n\tstatus = StatusCode.INTERNAL>")
    pyspark = RuntimeError("(io.delta.exceptions.ProtocolChangedException) [DELTA_PROTOCOL_CHANGED] two writers")
    pyspark.__context__ = grpc
    layer = DeltaLayerError(f"lake/dws/order_hourly: overwrite failed: {grpc}")
    layer.__cause__ = pyspark
    assert is_conflict(layer)
    assert not is_conflict(DeltaLayerError("lake/dws/order_hourly: overwrite failed: [PATH_NOT_FOUND] no such path"))


def test_the_warm_up_merges_as_ingestion_does_and_leaves_nothing_behind(spark: SparkSession, tmp_path: Path) -> None:
    scratch = tmp_path / "warm-up"
    seconds = warm_up(spark, str(scratch))
    assert seconds > 0
    assert not scratch.exists()
