"""What makes a key-scoped rebuild cost what it touches (:mod:`warehouse_assets.materialize.key_scope`): a key-local
table's whole writes are laid out by the columns its rows are looked up by, the MERGE is told where the replaced
rows sit (from the input's rows as the last build read them), and a scan for the changed keys names them as literals."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from resources.delta_lake import CHANGE_TRACKING, DeltaStore
from warehouse_assets.catalog import Catalog, DerivedTable, load_catalog
from warehouse_assets.catalog.lineage import WarehouseLineage
from warehouse_assets.materialize.key_scope import KeyScope, KeyScoper, copied_columns, narrowed


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


ORDERS = ("dwd", "orders")


def forty_orders(spark: SparkSession) -> DataFrame:
    """Orders 0-39 of users 0-3 (``id mod 4``), amount ``10 id``: 0-29 of 2026-03-02, the others of 2026-03-03."""
    rows = spark.range(40).selectExpr("id AS order_id", "pmod(id, 4) AS user_id", "id * 10 AS amount")
    return rows.withColumn("dt", F.when(F.col("order_id") < 30, "2026-03-02").otherwise("2026-03-03"))


@pytest.fixture(scope="module")
def orders_lake(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lake holding :func:`forty_orders` as ``dwd.orders``, its changes recorded, written once for the module."""
    lake = tmp_path_factory.mktemp("key-scope") / "lake"
    days = [{"dt": "2026-03-02"}, {"dt": "2026-03-03"}]
    DeltaStore(str(lake)).overwrite(ORDERS, forty_orders(spark), ["dt"], days, configuration=dict(CHANGE_TRACKING))
    return lake


def orders_lake_copy(orders_lake: Path, tmp_path: Path) -> DeltaStore:
    """A copy of the module's lake for one test to write (the Delta log's paths are relative)."""
    shutil.copytree(orders_lake, tmp_path / "lake")
    return DeltaStore(str(tmp_path / "lake"))


def _scoper(catalog: Catalog, table: str) -> KeyScoper:
    return KeyScoper(catalog, catalog[table], None, {}, None, None)  # type: ignore[arg-type]  # no run, no Spark


def test_a_row_local_tables_plain_copies_of_input_columns_are_found(catalog: Catalog) -> None:
    lineage = WarehouseLineage(catalog)
    dwd, dws = catalog["dwd.order_detail"], catalog["dws.user_order_daily"]
    assert isinstance(dwd, DerivedTable) and isinstance(dws, DerivedTable)
    copied = copied_columns(dwd, lineage.input_columns(dwd))
    assert copied["order_id"] == ("ods.order", "id") and copied["user_id"] == ("ods.order", "user_id")
    assert "status" not in copied  # lower(trim(status)) is computed
    assert copied_columns(dws, lineage.input_columns(dws)) == {}  # a GROUP BY: a row is many input rows


def test_a_key_local_table_is_laid_out_by_its_z_order_else_its_key(catalog: Catalog) -> None:
    assert _scoper(catalog, "dwd.order_detail").cluster_columns() == ("user_id", "course_id")
    assert _scoper(catalog, "dws.user_order_daily").cluster_columns() == ("user_id",)
    assert _scoper(catalog, "ads.retention_d1").cluster_columns() == ()  # rebuilt whole: nothing to look up


def test_the_merge_is_told_where_the_replaced_rows_sit(catalog: Catalog) -> None:
    """The changed orders' rows as dwd.order_detail's last build read them from ods.order name the users whose files
    hold the rows the rebuild replaces; a null among them narrows by nothing."""
    scoper = _scoper(catalog, "dwd.order_detail")
    before = pa.table({"id": [1, 2, 3], "user_id": [40, 7, 40], "amount": [1, 2, 3]})
    assert {c: sorted(v) for c, v in scoper._sits("ods.order", before).items()} == {"user_id": [7, 40]}
    assert scoper._sits("ods.order", before.set_column(1, "user_id", pa.array([40, None, 7]))) == {}
    scope = KeyScope(("order_id",), pa.table({"order_id": [1, 2, 3]}), {"ods.order": ("id",)}, {}, {"user_id": (7, 40)})
    assert {c: sorted(v) for c, v in scope.narrow().items()} == {"order_id": [1, 2, 3], "user_id": [7, 40]}
    other = KeyScope(("order_id",), pa.table({"order_id": [9]}), {"ods.order": ("id",)})
    # one MERGE of two partitions narrows by what both can: the keys, not the users only one of them knows
    assert narrowed([scope, other]) == {"order_id": [1, 2, 3, 9]}


def test_a_whole_write_is_ranged_and_sorted_by_the_cluster_columns(catalog: Catalog, spark: SparkSession) -> None:
    rows = spark.range(2_000).selectExpr("id AS order_id", "pmod(id * 7919, 500) AS user_id", "1 AS course_id")
    laid = _scoper(catalog, "dws.user_order_daily").laid_out(rows.withColumn("dt", F.lit("2026-03-02")), ["dt"])
    spark.conf.set("spark.sql.adaptive.coalescePartitions.enabled", "false")  # small data: keep each range a file
    try:
        parts = laid.withColumn("part", F.spark_partition_id()).collect()
    finally:
        spark.conf.unset("spark.sql.adaptive.coalescePartitions.enabled")
    by_part: dict[int, list[Any]] = {}
    for r in parts:
        by_part.setdefault(r["part"], []).append(r["user_id"])
    ranges = sorted((min(v), max(v)) for v in by_part.values())
    assert len(ranges) > 1
    assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:], strict=False))  # each user in one file
    assert all(v == sorted(v) for v in by_part.values())  # sorted within it


def test_a_scan_for_the_changed_keys_names_them_as_literals(catalog: Catalog, spark: SparkSession) -> None:
    """Delta skips files, Parquet pages, by literals only: a broadcast join of the keys alone reads every file. The
    literals of a one-column key are the keys: no join with them (a job to broadcast them) on top."""
    scope = KeyScope(("user_id",), pa.table({"user_id": [3, 5]}), {"dwd.order_detail": ("user_id",)})
    df = spark.range(100).selectExpr("id AS order_id", "pmod(id, 10) AS user_id")
    found = scope.only_keys(spark, "dwd.order_detail", df)
    plan = found._jdf.queryExecution().optimizedPlan().toString().replace(" ", "").upper()
    assert "IN(3,5)" in plan and "JOIN" not in plan
    assert sorted(r["order_id"] for r in found.collect()) == [i for i in range(100) if i % 10 in (3, 5)]
    # two columns: each one's literals let pass pairs that are not keys, which the join with the keys drops
    pairs = KeyScope(("a", "b"), pa.table({"a": [1, 2], "b": [2, 1]}), {"t": ("a", "b")})
    grid = spark.range(9).selectExpr("id DIV 3 AS a", "id % 3 AS b")
    assert sorted(tuple(r) for r in pairs.only_keys(spark, "t", grid).collect()) == [(1, 2), (2, 1)]


def test_a_few_keys_rows_are_replaced_by_a_predicate_on_them_in_one_commit(
    spark: SparkSession, orders_lake: Path, tmp_path: Path
) -> None:
    """The rows of the keys named (one moved to another user, one updated, one gone) are replaced in one commit
    deleting by the keys as literals and appending, not a MERGE; the other rows and partitions stay; the change feed
    names exactly those keys for the next table down; a new row of a key not named is refused."""
    from resources.storage import DeltaLayerError

    store, key = orders_lake_copy(orders_lake, tmp_path), ORDERS
    day = {"dt": "2026-03-02"}
    new = spark.createDataFrame([(3, 9, 1), (5, 1, 2)], "order_id bigint, user_id bigint, amount bigint")
    new = new.withColumn("dt", F.lit("2026-03-02"))
    # order 3 moves from user 3 to 9, 5 changes its amount, 7 is gone; the old users say where the rows sit
    written = store.replace_rows_where(
        spark, key, new, ["dt"], day, "order_id", {"order_id": [3, 5, 7], "user_id": [3, 1]}
    )
    [commit] = store.history(key, 1)
    assert commit["operation"] == "WRITE" and written.version == 1 and written.by_partition[0].rows == 29
    # the live files it counted them from, for its checks: the log's, deletion vectors subtracted
    live = written.by_partition[0].live_files
    assert live is not None and sum(f["live_records"] for f in live) == 29
    assert sorted(f["path"] for f in live) == sorted(f["path"] for f in store.live_files(key, [day], 1)[0])
    after = {r["order_id"]: tuple(r)[1:] for r in spark.read.format("delta").load(store.spark_path(key)).collect()}
    assert len(after) == 39 and 7 not in after and after[3] == (9, 1, "2026-03-02") and after[5] == (1, 2, "2026-03-02")
    assert after[4] == (0, 40, "2026-03-02") and after[35] == (3, 350, "2026-03-03")
    feed = spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 1)
    changed = feed.load(store.spark_path(key)).select("order_id").distinct().collect()
    assert sorted(r[0] for r in changed) == [3, 5, 7]
    other = spark.createDataFrame([(6, 2, 0)], "order_id bigint, user_id bigint, amount bigint")
    with pytest.raises(DeltaLayerError):
        store.replace_rows_where(
            spark, key, other.withColumn("dt", F.lit("2026-03-02")), ["dt"], day, "order_id", {"order_id": [5]}
        )


def test_a_key_scoped_commit_records_what_it_changed_for_the_next_table_down(
    spark: SparkSession, orders_lake: Path, tmp_path: Path
) -> None:
    """Every row a replaceWhere removes or writes holds one of the values it names for each column: recorded in its
    commit, they give the next table down its changed keys from the log, the users the change feed names (an order
    moved names its old user and its new one). A commit to another partition adds none; any other write of the
    partition in between leaves it to the feed, and so does a column the commits did not name."""
    from resources.delta_keys import IN_LIST_PUSHDOWN

    store, key = orders_lake_copy(orders_lake, tmp_path), ORDERS
    rows = forty_orders(spark)
    day, other = {"dt": "2026-03-02"}, {"dt": "2026-03-03"}
    new = spark.createDataFrame([(3, 9, 1), (5, 1, 2)], "order_id bigint, user_id bigint, amount bigint")
    # order 3 moves from user 3 to 9, 5 changes its amount, 7 is gone; their old users say where the rows sit
    where = {"order_id": [3, 5, 7], "user_id": [3, 1]}
    probe = _ComputedWith(spark, new.withColumn("dt", F.lit(day["dt"])), IN_LIST_PUSHDOWN)
    store.replace_rows_where(spark, key, probe, ["dt"], day, "order_id", where)  # type: ignore[arg-type]
    # the new rows are computed with long IN lists pushed to Parquet: a scan of an input by the keys skips pages
    assert probe.seen == IN_LIST_PUSHDOWN
    feed = store.changed_values(spark, key, ["user_id"], [day], 0, 1, 100)
    assert feed is not None and sorted(feed.column("user_id").to_pylist()) == [1, 3, 9]
    assert sorted(store.replaced_values(key, "user_id", [day], 0, 1) or []) == [1, 3, 9]
    assert sorted(store.replaced_values(key, "order_id", [day], 0, 1) or []) == [3, 5, 7]
    assert store.replaced_values(key, "amount", [day], 0, 1) is None  # not named: the feed says
    assert store.replaced_values(key, "user_id", [other], 0, 1) == []  # that partition's rows did not change

    later = spark.createDataFrame([(35, 2, 0)], "order_id bigint, user_id bigint, amount bigint")
    where = {"order_id": [35], "user_id": [3]}  # order 35 moves from user 3 to 2
    store.replace_rows_where(spark, key, later.withColumn("dt", F.lit(other["dt"])), ["dt"], other, "order_id", where)
    assert sorted(store.replaced_values(key, "user_id", [day], 0, 2) or []) == [1, 3, 9]
    assert sorted(store.replaced_values(key, "user_id", [day, other], 0, 2) or []) == [1, 2, 3, 9]
    store.overwrite(key, rows.where("dt = '2026-03-02'"), ["dt"], [day])
    assert store.replaced_values(key, "user_id", [day], 0, 3) is None  # a whole write recorded nothing
    assert store.replaced_values(key, "user_id", [other], 2, 3) == []


class _ComputedWith:
    """A DataFrame whose ``toArrow`` notes the session's values of ``confs`` when it runs."""

    def __init__(self, spark: SparkSession, df: Any, confs: dict[str, str]):
        self.spark, self.df, self.confs = spark, df, confs
        self.seen: dict[str, str | None] = {}
        self.dtypes, self.columns = df.dtypes, df.columns

    def toArrow(self) -> pa.Table:  # noqa: N802  # DataFrame's name
        self.seen = {name: self.spark.conf.get(name, None) for name in self.confs}
        return self.df.toArrow()


def test_more_keys_than_literals_narrow_by_are_replaced_by_a_predicate_on_them_with_deletion_vectors(
    spark: SparkSession, tmp_path: Any
) -> None:
    """Past the values a scan narrows by, the keys of one column are still replaced by a ``replaceWhere`` naming
    them, not a MERGE: one commit whose deletion vectors mark the replaced rows (no data file rewritten), leaving the
    rows a whole rebuild of the partition leaves. The commit does not record that many keys; the change feed names
    them for the next table down."""
    from resources.delta_keys import MAX_LITERAL_VALUES

    store, key, whole = DeltaStore(str(tmp_path)), ("dwd", "orders"), ("dwd", "orders_whole")
    rows = spark.range(3 * MAX_LITERAL_VALUES).selectExpr("id AS order_id", "pmod(id, 7) AS user_id", "id AS amount")
    rows = rows.withColumn("dt", F.when(F.col("order_id") % 10 < 9, "2026-03-02").otherwise("2026-03-03"))
    day, other = {"dt": "2026-03-02"}, {"dt": "2026-03-03"}
    store.overwrite(key, rows, ["dt"], [day, other], configuration=dict(CHANGE_TRACKING))
    # every other order of the day changed: half of those have a new amount, a quarter a new user, a quarter are gone
    changed = [r[0] for r in rows.where("dt = '2026-03-02' AND order_id % 2 = 0").select("order_id").collect()]
    assert len(changed) > MAX_LITERAL_VALUES
    scope = KeyScope(("order_id",), pa.table({"order_id": changed}), {})
    where = scope.replaced_where()
    assert list(where) == ["order_id"] and sorted(where["order_id"]) == changed
    new = rows.where(F.col("order_id").isin(changed) & (F.col("order_id") % 8 != 6))
    new = new.withColumn("user_id", F.when(F.col("order_id") % 8 == 4, 99).otherwise(F.col("user_id")))
    new = new.withColumn("amount", F.col("amount") + 1)
    written = store.replace_rows_where(spark, key, new, ["dt"], day, "order_id", where)

    [commit] = store.history(key, 1)
    assert commit["operation"] == "WRITE" and written.version == 1
    assert written.files_removed == 0 and written.rows_deleted == len(changed)  # marked, not copied
    live, _ = store.live_files(key, [day], 1)
    assert sum(f["deleted_records"] for f in live) == len(changed)
    expected = rows.where("dt = '2026-03-02'").where(~F.col("order_id").isin(changed)).unionByName(new)
    store.overwrite(whole, expected, ["dt"], [day])
    scoped = spark.read.format("delta").load(store.spark_path(key)).where("dt = '2026-03-02'")
    rebuilt = spark.read.format("delta").load(store.spark_path(whole))
    assert scoped.count() == rebuilt.count() == written.by_partition[0].rows
    assert scoped.exceptAll(rebuilt).isEmpty() and rebuilt.exceptAll(scoped).isEmpty()
    assert spark.read.format("delta").load(store.spark_path(key)).where("dt = '2026-03-03'").count() == 600
    assert store.replaced_values(key, "order_id", [day], 0, 1) is None  # too many to record: the feed says
    feed = store.changed_values(spark, key, ["order_id"], [day], 0, 1, len(changed) + 10)
    assert feed is not None and sorted(feed.column("order_id").to_pylist()) == changed
