"""Deletion vectors on the tables Spark merges into: Spark's MERGE marks replaced and deleted rows instead of
rewriting their files; delta-rs's DataFusion reader (the Delta seam's one reader of rows), Spark and an independent
replay of the log read the same rows; delta-rs's Arrow path refuses the table rather than return deleted rows;
maintenance purges them past a threshold, time travel and vacuum still work; an existing lake is upgraded in place."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import DeltaProtocolError
from pyspark.sql import SparkSession

from resources.delta_keys import NET
from resources.delta_lake import DeltaStore, Predicate
from tests.support import datafusion_plans as plans
from tests.support import oracle
from warehouse_assets.catalog import load_catalog
from warehouse_assets.ingest.maintenance import upgrade_to_deletion_vectors

COLUMNS = ["id", "v", "dt", "hh"]
SCHEMA = pa.schema(
    [("id", pa.int64()), ("v", pa.string()), ("_es", pa.int64()), ("_pos", pa.int64()), ("_op", pa.string()),
     ("dt", pa.string()), ("hh", pa.string())]
)  # fmt: skip
MERGE_ARGS: dict[str, Any] = {"primary_key": ["id"], "partition_by": ["dt", "hh"]}
DAY = "2026-03-02"
Rows = dict[int, tuple[str, str, str]]  # id → (v, dt, hh)


def _batch(changes: list[tuple[int, str | None, str, int]], op: str = "UPSERT") -> pa.Table:
    """(id, v, hh, binlog time) → change rows; ``v`` None is a DELETE."""
    return pa.table(
        {
            "id": [c[0] for c in changes],
            "v": [c[1] for c in changes],
            "_es": [c[3] for c in changes],
            "_pos": [0] * len(changes),
            "_op": ["DELETE" if c[1] is None else op for c in changes],
            "dt": [DAY] * len(changes),
            "hh": [c[2] for c in changes],
        },
        schema=SCHEMA,
    )


def _base() -> tuple[pa.Table, Rows]:
    # one big hour (10,000 keys) so that the deletion vectors hold more than a few rows, and a small one
    changes = [(i, f"v{i}", "10", 1) for i in range(10_000)] + [(i, f"v{i}", "11", 1) for i in range(10_000, 10_100)]
    return _batch(changes, "INSERT"), {i: (v, DAY, hh) for i, v, hh, _ in changes if v is not None}


def seam_rows(store: DeltaStore, key: tuple[str, ...], version: int | None = None) -> Rows:
    rows, _ = store.read_rows(key, columns=COLUMNS, version=version)
    return _keyed(rows.to_pylist())


def spark_rows(store: DeltaStore, spark: SparkSession, key: tuple[str, ...], version: int | None = None) -> Rows:
    df, _ = store.read(spark, key, version=version)
    return _keyed(r.asDict() for r in df.select(*COLUMNS).collect())


def replayed_rows(store: DeltaStore, key: tuple[str, ...]) -> Rows:
    return _keyed(oracle.delta_live_rows(Path(store.table_uri(key))))


def _keyed(rows: Any) -> Rows:
    out: Rows = {}
    for r in rows:
        assert r["id"] not in out, f"key {r['id']} read twice"
        out[r["id"]] = (r["v"], r["dt"], r["hh"])
    return out


def _dv_commit_metrics(store: DeltaStore, key: tuple[str, ...]) -> dict[str, int]:
    return {k: int(v) for k, v in store.history(key, 1)[0]["operationMetrics"].items()}


@dataclass
class Merged:
    store: DeltaStore
    key: tuple[str, ...]
    before: Rows  # the rows of version ``before_version``, before the change batch
    before_version: int
    expected: Rows
    metadata: dict[str, Any]
    metrics: dict[str, int]


def merge_with_deletion_vectors(spark: SparkSession, root: Path, name: str) -> Merged:
    """A table created by the store's MERGE, then one batch: an update, 5,000 contiguous deletes plus every third
    key of another range, a key moved to another hour, an insert."""
    store = DeltaStore(str(root))
    key = ("ods", name)
    base, expected = _base()
    store.merge(spark, key, base, **MERGE_ARGS)
    before, before_version = dict(expected), store.version(key)
    assert before_version is not None
    deleted = [*range(100, 5_100), *range(6_000, 9_000, 3)]
    changes = [(5, "updated", "10", 2), (10_050, "moved", "12", 2), (20_000, "inserted", "12", 2)]
    changes += [(i, None, "10", 2) for i in deleted]
    moved_out = _batch([(10_050, "moved", "11", 2)])  # the hour the moved key left (merged as its DELETE)
    result = store.merge(spark, key, _batch(changes), moved_out=moved_out, **MERGE_ARGS)
    for i in deleted:
        del expected[i]
    expected[5] = ("updated", DAY, "10")
    expected[10_050] = ("moved", DAY, "12")
    expected[20_000] = ("inserted", DAY, "12")
    return Merged(store, key, before, before_version, expected, result.metadata(), _dv_commit_metrics(store, key))


@pytest.fixture(scope="module")
def merged(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Merged:
    return merge_with_deletion_vectors(spark, tmp_path_factory.mktemp("dv") / "lake", "orders")


def test_a_merge_marks_rows_in_deletion_vectors_instead_of_copying_them(merged: Merged) -> None:
    assert merged.store.has_deletion_vectors(merged.key)
    assert merged.metadata["rows_copied"] == 0  # no unchanged row was rewritten
    assert merged.metadata["deletion_vectors_added"] == merged.metrics["numTargetDeletionVectorsAdded"] >= 2
    # 6,000 deletes and the moved key's old row; the update, and the moved key's new row is an insert
    assert (merged.metadata["rows_deleted"], merged.metadata["rows_updated"]) == (6_001, 1)


def test_delta_rs_spark_and_a_log_replay_read_the_same_rows(spark: SparkSession, merged: Merged) -> None:
    store, key = merged.store, merged.key
    assert seam_rows(store, key) == merged.expected
    assert spark_rows(store, spark, key) == merged.expected
    assert replayed_rows(store, key) == merged.expected
    # the version before the batch, read by time travel, still holds every row the batch replaced or deleted
    assert seam_rows(store, key, merged.before_version) == merged.before
    assert spark_rows(store, spark, key, merged.before_version) == merged.before


def test_live_file_counts_subtract_the_rows_deletion_vectors_mark(merged: Merged) -> None:
    files, _ = merged.store.live_files(merged.key)
    per_hour: dict[str, int] = {}
    for f in files:
        per_hour[f["partition.hh"]] = per_hour.get(f["partition.hh"], 0) + f["live_records"]
    assert sum(f["deleted_records"] for f in files) == 6_000 + 1 + 1  # the deletes, the update, the move
    expected: dict[str, int] = {}
    for _, _, hh in merged.expected.values():
        expected[hh] = expected.get(hh, 0) + 1
    assert per_hour == expected


def test_the_arrow_path_refuses_a_table_with_deletion_vectors(merged: Merged) -> None:
    table = DeltaTable(merged.store.table_uri(merged.key))
    with pytest.raises(DeltaProtocolError, match="deletionVectors"):
        table.to_pyarrow_table()
    with pytest.raises(DeltaProtocolError, match="deletionVectors"):
        table.to_pyarrow_dataset()


def test_product_code_reads_rows_only_through_the_delta_seam() -> None:
    root = Path(__file__).resolve().parents[2]
    offenders = [
        f"{path.relative_to(root)}:{n}"
        for package in ("resources", "warehouse_assets", "sensors", "simulator")
        for path in sorted((root / package).rglob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if any(call in line for call in (".to_pyarrow_table(", ".to_pyarrow_dataset(", ".to_pandas("))
    ]
    assert offenders == []


def test_maintenance_purges_deletion_vectors_past_the_threshold(
    spark: SparkSession, merged: Merged, tmp_path: Path
) -> None:
    # the purge changes the table: a copy of the module's (its paths in the log are relative), not a second build
    copy = DeltaStore(str(tmp_path / "lake"))
    shutil.copytree(merged.store.table_uri(merged.key), copy.table_uri(merged.key))
    m = replace(merged, store=copy)
    store, key = m.store, m.key
    changed = store.version(key)

    # hour 10 has 6,001 of 10,000 rows marked deleted, hour 11 one of 100: only hour 10 is past 10 %
    done = store.maintain(key, spark=spark)
    assert (done["partitions_purged"], done["rows_purged"], done["files_vacuumed"]) == (1, 6_001, 0)
    files, _ = store.live_files(key)
    assert {f["partition.hh"] for f in files if f["deleted_records"]} == {"11"}
    purged = store.version(key)
    assert purged is not None and changed is not None and purged > changed
    for version in (None, changed):  # the purge changed no row
        assert seam_rows(store, key, version) == spark_rows(store, spark, key, version) == m.expected
    assert replayed_rows(store, key) == m.expected
    # inside the time-travel window the versions before the purge read as they did
    assert seam_rows(store, key, m.before_version) == spark_rows(store, spark, key, m.before_version) == m.before

    # a zero window: every deletion vector purged, then vacuum removes the replaced files and the vectors
    done = store.maintain(key, retention_hours=0, spark=spark, max_deleted_fraction=0.0)
    assert done["partitions_purged"] == 1 and done["files_vacuumed"] > 0
    assert not any(f["deleted_records"] for f in store.live_files(key)[0])
    assert not list(Path(store.table_uri(key)).rglob("deletion_vector_*.bin"))
    assert seam_rows(store, key) == spark_rows(store, spark, key) == replayed_rows(store, key) == m.expected


def test_an_existing_lake_is_upgraded_in_place(spark: SparkSession, tmp_path: Path) -> None:
    store = DeltaStore(str(tmp_path / "lake"))
    key = ("ods", "order")  # a table of the catalog, created as a lake from before deletion vectors has it
    base, expected = _base()
    store.create_table(key, SCHEMA.remove(SCHEMA.get_field_index("_op")), ["dt", "hh"])
    store.merge(spark, key, base, **MERGE_ARGS)
    rewrite = store.merge(spark, key, _batch([(1, "a", "10", 2)]), **MERGE_ARGS)
    assert not store.has_deletion_vectors(key) and rewrite.metadata()["rows_copied"] > 0  # the old cost
    files, version = oracle.delta_live_paths(Path(store.table_uri(key))), store.version(key)

    upgraded = upgrade_to_deletion_vectors(store, load_catalog(), spark)
    assert upgraded == {"ods.order": True}  # the catalog's other ODS tables do not exist here
    assert store.version(key) == (version or 0) + 1  # one commit
    assert oracle.delta_live_paths(Path(store.table_uri(key))) == files  # no data file rewritten
    assert store.has_deletion_vectors(key)
    assert upgrade_to_deletion_vectors(store, load_catalog(), spark) == {"ods.order": False}

    after = store.merge(spark, key, _batch([(2, "b", "10", 3), (3, None, "10", 3)]), **MERGE_ARGS)
    assert after.metadata()["rows_copied"] == 0 and after.metadata()["deletion_vectors_added"] >= 1
    expected.update({1: ("a", DAY, "10"), 2: ("b", DAY, "10")})
    del expected[3]
    assert seam_rows(store, key) == spark_rows(store, spark, key) == replayed_rows(store, key) == expected


def test_a_merged_table_is_created_as_an_upgrade_leaves_one_in_one_commit(spark: SparkSession, tmp_path: Path) -> None:
    """The table a first merge creates (Spark's create, with deletion vectors and the change data feed) has the
    protocol, properties, schema and description of a table created by delta-rs and upgraded, in one commit."""
    store = DeltaStore(str(tmp_path / "lake"))
    schema, about = SCHEMA.remove(SCHEMA.get_field_index("_op")), "the source's orders \\ by hour"
    store.create_table(("ods", "upgraded"), schema, ["dt", "hh"], about)
    assert store.enable_deletion_vectors(spark, ("ods", "upgraded"))
    store.create_merged_table(spark, ("ods", "created"), schema, ["dt", "hh"], about)
    upgraded, created = (DeltaTable(store.table_uri(("ods", name))) for name in ("upgraded", "created"))
    assert (created.version(), upgraded.version()) == (0, 1)

    def described(table: DeltaTable) -> tuple[Any, ...]:
        p, m = table.protocol(), table.metadata()
        features = (sorted(p.reader_features or []), sorted(p.writer_features or []))
        return p.min_reader_version, p.min_writer_version, features, m.configuration, m.partition_columns, m.description

    assert described(created) == described(upgraded)
    assert created.schema().to_json() == upgraded.schema().to_json()
    assert not store.enable_deletion_vectors(spark, ("ods", "created"))  # nothing left to upgrade
    store.create_merged_table(spark, ("ods", "created"), schema, ["dt", "hh"], about)  # there already: no commit
    assert DeltaTable(store.table_uri(("ods", "created"))).version() == 0


def test_the_change_feed_holds_every_changed_keys_row_as_it_is_now(spark: SparkSession, merged: Merged) -> None:
    """A table unique by its key: the feed's net images above 0 are the changed keys' rows now (the update, the moved
    key in its new hour, the insert), those below 0 the rows they replaced or deleted; no unchanged key is there."""
    store, key = merged.store, merged.key
    hours = [{"dt": DAY, "hh": hh} for hh in ("10", "11", "12")]
    now = store.version(key)
    assert now is not None
    images = store.changed_rows(spark, key, hours, merged.before_version, now, 100_000)
    assert images is not None
    written = _keyed(r for r in images.to_pylist() if r[NET] > 0)
    removed = _keyed(r for r in images.to_pylist() if r[NET] < 0)
    changed = {k for k in {*merged.before, *merged.expected} if merged.before.get(k) != merged.expected.get(k)}
    assert written == {k: merged.expected[k] for k in changed if k in merged.expected}
    assert removed == {k: merged.before[k] for k in changed if k in merged.before}
    # only the hours read count: the moved key's new hour alone holds its row, not a removal
    only_12 = store.changed_rows(spark, key, [{"dt": DAY, "hh": "12"}], merged.before_version, now, 100_000)
    assert only_12 is not None and {r["id"] for r in only_12.to_pylist()} == {10_050, 20_000}


def test_datafusion_counts_of_a_partition_apply_its_deletion_vectors(merged: Merged) -> None:
    """What the checks of a key-scoped rebuild count without Spark: a merged hour's replaced and deleted rows (still
    stored, marked in deletion vectors) are not counted, nor twice."""
    store, key = merged.store, merged.key
    now = store.version(key)
    assert now is not None
    hour = {"dt": DAY, "hh": "10"}
    live = [k for k, (_, _, hh) in merged.expected.items() if hh == "10"]
    assert store.distinct_keys(key, now, hour, ["id"]) == (len(live), len(live), 0)
    updated = [Predicate("v", "=", "updated")]
    assert store.count_live(key, now, [hour, {"dt": DAY, "hh": "11"}], updated) == 1
    # hour 12's keys now against hours 10-11 before the batch: the moved key was there, the inserted one was not
    before = (key, merged.before_version, [hour, {"dt": DAY, "hh": "11"}], [])
    assert store.key_references(key, now, {"dt": DAY, "hh": "12"}, "id", before, "id") == (2, 2, 0, 1)


def test_a_key_scoped_merge_narrowed_by_its_keys_reads_only_the_files_holding_them(
    spark: SparkSession, tmp_path: Path
) -> None:
    """``replace_keys`` with ``narrow``: the keys as literals on the MERGE's target let Delta skip every file whose
    statistics hold none of them. Here one of four files (each a range of 1,000 keys) is gone from storage: the
    narrowed MERGE never opens it and replaces the keys' rows as it should; the same MERGE unnarrowed reads it."""
    from urllib.parse import unquote

    from pyspark.sql import functions as F

    from resources.delta_lake import CHANGE_TRACKING
    from resources.storage import DeltaLayerError

    store = DeltaStore(str(tmp_path / "lake"))
    key = ("dwd", "narrowed")
    rows = spark.range(4_000).selectExpr("id", "CAST(id AS STRING) AS v", f"'{DAY}' AS dt")
    laid = rows.repartitionByRange(4, "id").sortWithinPartitions("id")
    result = store.overwrite(key, laid, ["dt"], [{"dt": DAY}], configuration=CHANGE_TRACKING)
    files, _ = store.live_files(key, [{"dt": DAY}], result.version)
    assert len(files) == 4
    last = max(files, key=lambda f: int(f["min.id"]))
    (Path(store.table_uri(key)) / unquote(str(last["path"]))).unlink()  # keys 3,000 and up: no longer readable
    new = spark.createDataFrame([(5, "five", DAY), (7, "seven", DAY)], "id long, v string, dt string")
    changed = spark.createDataFrame([(5, DAY), (7, DAY), (9, DAY)], "id long, dt string")  # key 9 is gone

    def replace(narrow: dict[str, list[Any]] | None) -> None:
        store.replace_keys(spark, key, new, changed, ["id"], ["dt"], [{"dt": DAY}], narrow=narrow)

    with pytest.raises(DeltaLayerError):
        replace(None)  # reads every file of the partition
    replace({"id": [5, 7, 9]})
    df, _ = store.read(spark, key)
    found = {r["id"]: r["v"] for r in df.where(F.col("id") < 12).collect()}
    assert found == {**{i: str(i) for i in range(12) if i != 9}, 5: "five", 7: "seven"}


def test_narrowing_refuses_values_it_cannot_narrow_by() -> None:
    from resources.delta_keys import MAX_LITERAL_VALUES, literal_in
    from resources.storage import DeltaLayerError

    assert literal_in("t.`id`", [1, "a'b"]) == "t.`id` IN (1, 'a''b')"
    for values in ([], [1, None], list(range(MAX_LITERAL_VALUES + 1))):
        with pytest.raises(DeltaLayerError):
            literal_in("t.`id`", values)


def test_the_partition_counts_read_each_table_once(merged: Merged, monkeypatch: pytest.MonkeyPatch) -> None:
    """The counts the checks of a key-scoped rebuild judge by read each table they count once: the unique check's
    one scan of the partition, the references check's one scan of each side. DataFusion shares no subquery, so the
    same values written into two sub-selects (a count and an anti-join of them) are read twice."""
    store, key = merged.store, merged.key
    now = store.version(key)
    assert now is not None
    hour, other = {"dt": DAY, "hh": "10"}, {"dt": DAY, "hh": "11"}
    queries = plans.recorded(store, monkeypatch)
    live = sum(1 for _, _, hh in merged.expected.values() if hh == "10")
    assert store.distinct_keys(key, now, hour, ["id", "v"]) == (live, live, 0)
    # hour 10's keys now against hour 11's before the batch: none of them there
    referenced = (key, merged.before_version, [other], [])
    assert store.key_references(key, now, hour, "id", referenced, "id") == (live, live, 0, live)
    assert [plans.scans(store, q) for q in queries] == [1, 2]
