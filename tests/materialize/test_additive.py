"""Additive maintenance on Spark (:mod:`warehouse_assets.materialize.additive`): a late-data rebuild of a total
grouped by status over ``ods.order`` absorbs an update, a delete, an insert and rows moved between groups (and into
its filter) from the order table's change data feed, in one commit of the table, and leaves exactly the rows a whole
rebuild leaves; a group that loses all its rows is deleted; without its stored states the rebuild is whole and says
why, and that whole build stores them again. A whole build computes its rows from the states it stores, reading its
input once (counted in Spark's SQL status store), and they are what the table's SQL gives: a sum over null values
only, count_if, a total over an empty input (one row without GROUP BY, none with it). Totals over a join of the
orders with ``ods.user`` (a LEFT JOIN and an inner one) absorb changes to the orders, to the users (rows flipping
between matched and NULL-extended) and to both in one rebuild, each equal to their SQL over the inputs now.

The lake and the Dagster instance are the late-data end-to-end test's (:class:`tests.test_late_data_end_to_end.
Warehouse`: ``ods.order`` merged by Spark as the ingestion merges it, its hours reported with their checks); the
catalog is ``ods.order``, ``ods.user`` and the totals, each run materialized in process.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from dagster import (
    AssetCheckEvaluation,
    AssetKey,
    AssetMaterialization,
    DagsterEvent,
    DagsterEventType,
    instance_for_test,
    materialize,
)
from dagster._core.definitions.asset_checks.asset_check_evaluation import AssetCheckEvaluationTargetMaterializationData
from dagster._core.utils import make_new_run_id
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from resources import resources_from_env
from resources.delta_lake import DeltaStore
from resources.spark import arrow_frame
from simulator.cdc_config import merged_order_row
from tests.center.test_state_store import materializations
from tests.support.instances import memory_backed_dir, pooled_event_log
from tests.test_late_data_end_to_end import TZ, Warehouse
from warehouse_assets.catalog import TABLES_DIR, load_catalog
from warehouse_assets.ingest.merge import ods_arrow_schema
from warehouse_assets.materialize.gate import LATE_CHANGES_TAG

pytestmark = pytest.mark.spark

DAY = "2026-03-02"
TOTAL = "dwd.orders_by_status"
HOURS = [f"{DAY}-{h:02d}:00" for h in range(24)]
# no primary key: grouped by a status, not by a key the key-scoped rebuild could replace by; user 13 filtered out
DECLARATION = """/* ---
table: dwd.orders_by_status
period: daily
description: The day's orders by status (a test total).
owner: trade-data
depends_on:
  ods.order: {range: [0, 23]}
--- */
SELECT
  status,
  count(*) AS orders,
  sum(amount) AS amount,
  count(pay_time) AS with_pay_time,
  count_if(amount >= 60) AS big,
  CAST(count_if(amount >= 60) / count(*) AS double) AS big_share
FROM ods.order
WHERE user_id <> 13
GROUP BY status
"""

# totals whose rows a computation from wrong states would get wrong: a sum over only null values (NULL, not 0),
# count_if, and an input left empty by the filter (one row for a total without GROUP BY, none for a grouped one)
EDGES = {
    "dwd.orders_edges": """SELECT status, sum(CASE WHEN status = 'paid' THEN amount END) AS paid_amount,
  count_if(pay_time IS NULL) AS unpaid, count(pay_time) AS with_pay_time, sum(amount) - sum(amount) AS zero
FROM ods.order GROUP BY status""",
    "dwd.orders_none_total": """SELECT count(*) AS orders, sum(amount) AS amount, count_if(amount > 0) AS positive,
  'all' AS scope FROM ods.order WHERE user_id = 999""",
    "dwd.orders_none_by_status": """SELECT status, count(*) AS orders, sum(amount) AS amount
FROM ods.order WHERE user_id = 999 GROUP BY status""",
}


# totals over a join of the orders with their users: a LEFT JOIN (an order of a user not there is NULL-extended)
# and an inner one, each summing the users' columns
JOINED = {
    "dwd.orders_by_grade": """SELECT o.status, count(*) AS orders, count(u.id) AS with_user, sum(o.amount) AS amount,
  sum(o.amount * u.grade) AS graded, count_if(u.city = 'beijing') AS in_beijing
FROM ods.order o LEFT JOIN ods.user u ON o.user_id = u.id
GROUP BY o.status""",
    "dwd.orders_by_city": """SELECT u.city, count(*) AS orders, sum(o.amount) AS amount, sum(u.grade) AS grades
FROM ods.order o JOIN ods.user u ON u.id = o.user_id
WHERE o.status <> 'cancelled'
GROUP BY u.city""",
}

# distinct counts and extremes (their (group, value) pairs kept with their multiplicities) beside a sum, over the
# LEFT JOIN: a NULL-extended order's city is NULL, which count(DISTINCT) and min ignore
DISTINCT = {
    "dwd.orders_distinct": """SELECT o.status, count(DISTINCT o.user_id) AS buyers, min(o.amount) AS least,
  max(o.amount) AS most, sum(o.amount) AS amount, count(DISTINCT u.city) AS cities, min(u.city) AS first_city
FROM ods.order o LEFT JOIN ods.user u ON o.user_id = u.id
GROUP BY o.status""",
}
TOTALS = {**JOINED, **DISTINCT}


def declared(name: str, sql: str) -> str:
    users = "  ods.user: {range: [0, 23]}\n" if name in TOTALS else ""
    return f"/* ---\ntable: {name}\nperiod: daily\ndescription: A test total.\nowner: trade-data\n" + (
        "depends_on:\n  ods.order: {range: [0, 23]}\n" + users + "--- */\n" + sql + "\n"
    )


def order(i: int, status: str, **changed: Any) -> dict[str, Any]:
    """Order ``100 + i`` of the day (created at hour 2i mod 24), of user ``10 + i % 4``, amount ``10 (i + 1)``."""
    row = merged_order_row(100 + i, 10 + i % 4, datetime(2026, 3, 2, 2 * i % 24, 15, tzinfo=TZ), 100 + i)
    row.update(status=status, amount=Decimal(10 * (i + 1)), pay_time=row["pay_time"] if status == "paid" else None)
    return {**row, **changed}


def paid(row: dict[str, Any]) -> dict[str, Any]:
    """The order paid, later: a change that moves it from the created group to the paid one."""
    return {**row, "status": "paid", "pay_time": row["create_time"], "_pos": 1000 + row["id"] - 100}


def first_day() -> list[dict[str, Any]]:
    """Four paid orders, one refunded (the only one of its group), seven created; 103, 107, 111 are user 13's."""
    return [order(i, "paid" if i < 4 else "refunded" if i == 4 else "created") for i in range(12)]


@cache
def ods_schema(fqn: str) -> pa.Schema:
    return ods_arrow_schema(load_catalog()[fqn])


def merged(spark: SparkSession, lake: Path, key: list[str], rows: list[dict[str, Any]], ops: list[str]) -> None:
    """Merge changes into ``key``'s table with Spark as the ingestion does (a DELETE kept as a tombstone)."""
    schema = ods_schema(".".join(key))
    batch = pa.Table.from_pylist(rows, schema=schema).append_column("_op", pa.array(ops, pa.string()))
    store = DeltaStore(str(lake))
    store.merge(spark, key, batch, primary_key=["id"], partition_by=["dt", "hh"], tombstone_column="_deleted")


@pytest.fixture(scope="module")
def first_day_lake(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lake holding ``ods.order`` with the first day's orders merged, written once for the module (each test
    starts from it)."""
    lake = tmp_path_factory.mktemp("additive") / "lake"
    day = first_day()
    merged(spark, lake, ["ods", "order"], day, ["UPDATE"] * len(day))
    return lake


@pytest.fixture
def warehouse(first_day_lake: Path, tmp_path: Path) -> Iterator[Warehouse]:
    """The first day's orders (a copy of the module's lake: the Delta log's paths are relative), each of its hours
    reported with its checks passed, in a test's own instance."""
    tables = tmp_path / "catalog"
    (tables / "ods").mkdir(parents=True)
    (tables / "dwd").mkdir()
    shutil.copy(TABLES_DIR / "ods" / "order.yaml", tables / "ods" / "order.yaml")
    shutil.copy(TABLES_DIR / "ods" / "user.yaml", tables / "ods" / "user.yaml")
    (tables / "dwd" / "orders_by_status.sql").write_text(DECLARATION)
    for name, sql in {**EDGES, **TOTALS}.items():
        (tables / "dwd" / f"{name.split('.')[1]}.sql").write_text(declared(name, sql))
    resources = resources_from_env(
        {"WAREHOUSE_LAKE_ROOT": str(tmp_path / "lake"), "WAREHOUSE_LANDING_ROOT": str(tmp_path / "landing")}
    )
    (tmp_path / "landing").mkdir()
    shutil.copytree(first_day_lake, tmp_path / "lake")
    with (
        memory_backed_dir("additive-home-") as home,
        instance_for_test(temp_dir=str(home), overrides=pooled_event_log(home)) as instance,
    ):
        warehouse = Warehouse(load_catalog(tables), tmp_path, instance, resources)
        for hour in HOURS:
            warehouse.report_hour(hour)
        yield warehouse
        warehouse.engine.close()


def change(warehouse: Warehouse, spark: SparkSession, rows: list[dict[str, Any]], ops: list[str]) -> None:
    """Merge late changes into ``ods.order`` with Spark as the ingestion does, and report the hours they touched, as
    late."""
    merged(spark, warehouse.root / "lake", ["ods", "order"], rows, ops)
    for hour in sorted({f"{r['dt']}-{r['hh']}:00" for r in rows}):
        warehouse.report_hour(hour)


def build(warehouse: Warehouse, late: bool, tables: tuple[str, ...] = (TOTAL,)) -> str:
    """Materialize the totals' day: a late-data rebuild (as the dependency center tags one) or a build by hand."""
    tags = {LATE_CHANGES_TAG: json.dumps({DAY: 1})} if late else {}
    result = materialize(
        warehouse.assets,
        instance=warehouse.instance,
        resources=warehouse.resources,
        selection=[AssetKey(t.split(".")) for t in tables],
        partition_key=DAY,
        tags=tags,
    )
    assert result.success
    return result.run_id


def entry(warehouse: Warehouse) -> dict[str, Any]:
    [found] = [e for e in warehouse.builds(TOTAL, DAY)[-1]["partitions"].value if e["partition"] == DAY]  # type: ignore[attr-defined]
    return found


def day_tuples(rows: pa.Table) -> list[tuple[Any, ...]]:
    return [tuple(row.values()) for row in rows.to_pylist()]


def day_rows(warehouse: Warehouse, table: str) -> list[tuple[Any, ...]]:
    """The day's rows of ``table`` as delta-rs's DataFusion reader sees them (deletion vectors applied), sorted: as
    Spark's reader sees them, without a Spark job."""
    rows, _ = DeltaStore(str(warehouse.root / "lake")).read_rows(table.split("."), [{"dt": DAY}])
    return sorted(day_tuples(rows))


def logged(warehouse: Warehouse, run_id: str) -> list[str]:
    return [e.user_message for e in warehouse.instance.all_logs(run_id)]


def test_late_changes_to_a_total_replace_only_the_changed_groups_as_a_whole_rebuild_would(
    warehouse: Warehouse, spark: SparkSession
) -> None:
    day = first_day()
    build(warehouse, late=False)
    groups = {row[0] for row in day_rows(warehouse, TOTAL)}
    assert groups == {"paid", "refunded", "created"}
    before = warehouse.version(TOTAL)

    changed = [
        {**day[0], "amount": Decimal("15.00"), "_pos": 1000},  # an update within its group (paid)
        paid(day[5]),  # moved: created → paid
        {**day[4], "_deleted": True, "_pos": 1004},  # deleted: the refunded group's only order
        {**day[7], "user_id": 20, "_pos": 1007},  # user 13 → 20: into the filter (created)
        order(12, "cancelled", _pos=1012),  # inserted: a new group
    ]
    change(warehouse, spark, changed, ["UPDATE", "UPDATE", "DELETE", "UPDATE", "INSERT"])
    run = build(warehouse, late=True)

    found = entry(warehouse)
    assert found["keys_rebuilt"] == 4  # paid, created, refunded (gone), cancelled (new)
    assert found["changed_rows_read"] == 9  # a pre- and a post-image per update and delete, the insert's one
    assert warehouse.version(TOTAL) == before + 1  # one commit
    # the changed groups deleted by their values as literals and appended (a replaceWhere), not a MERGE's joins
    [commit] = DeltaTable(str(warehouse.root / "lake" / "dwd" / "orders_by_status")).history(1)
    assert commit["operation"] == "WRITE" and "`status` IN (" in commit["operationParameters"]["predicate"]
    assert not any("rebuilt whole" in m for m in logged(warehouse, run))
    maintained = day_rows(warehouse, TOTAL)
    assert {row[0] for row in maintained} == {"paid", "created", "cancelled"}  # the emptied group deleted

    build(warehouse, late=False)  # a whole rebuild of the same day: the same rows, exactly
    assert "keys_rebuilt" not in entry(warehouse)
    assert day_rows(warehouse, TOTAL) == maintained
    [paid_group] = [row for row in maintained if row[0] == "paid"]
    assert paid_group[1:3] == (4, Decimal("125.00"))  # 100 (15), 101 (20), 102 (30), 105 (60); not 103, user 13's


def test_without_its_stored_states_the_rebuild_is_whole_says_why_and_stores_them_again(
    warehouse: Warehouse, spark: SparkSession
) -> None:
    day = first_day()
    build(warehouse, late=False)
    shutil.rmtree(warehouse.root / "lake" / "dwd" / "orders_by_status__state")

    change(
        warehouse, spark, [{**day[5], "status": "paid", "pay_time": day[5]["create_time"], "_pos": 1005}], ["UPDATE"]
    )
    run = build(warehouse, late=True)
    assert "keys_rebuilt" not in entry(warehouse)
    assert any("rebuilt whole: no partial states stored" in m for m in logged(warehouse, run))

    change(
        warehouse, spark, [{**day[6], "status": "paid", "pay_time": day[6]["create_time"], "_pos": 1006}], ["UPDATE"]
    )
    build(warehouse, late=True)  # the whole rebuild wrote the states: this one is maintained
    assert entry(warehouse)["keys_rebuilt"] == 2  # created → paid
    maintained = day_rows(warehouse, TOTAL)
    build(warehouse, late=False)
    assert day_rows(warehouse, TOTAL) == maintained


def live_view(warehouse: Warehouse, spark: SparkSession, table: str, view: str) -> None:
    """The day's live rows of ``ods.<table>`` as Spark's temporary view ``view``: read by delta-rs's DataFusion reader
    (deletion vectors applied, tombstones left out) and handed to Spark as local rows, so that the oracle's SQL runs
    on Spark without the jobs that list and scan a Delta table's files."""
    rows, _ = DeltaStore(str(warehouse.root / "lake")).read_rows(["ods", table], [{"dt": DAY}], where='NOT "_deleted"')
    arrow_frame(spark, rows).createOrReplaceTempView(view)


def oracle(warehouse: Warehouse, spark: SparkSession, sql: str) -> list[tuple[Any, ...]]:
    """The table's own SQL run by Spark over the day's live orders, sorted as :func:`day_rows`."""
    live_view(warehouse, spark, "order", "__oracle_orders")
    found = spark.sql(sql.replace("FROM ods.order", "FROM __oracle_orders")).collect()
    return sorted(tuple(row) + (DAY,) for row in found)


def test_a_whole_build_computes_what_the_tables_sql_gives_for_null_sums_count_ifs_and_empty_inputs(
    warehouse: Warehouse, spark: SparkSession
) -> None:
    build(warehouse, late=False, tables=tuple(EDGES))  # one run builds the three
    for name, sql in EDGES.items():
        assert day_rows(warehouse, name) == oracle(warehouse, spark, sql), name
    edges = {row[0]: row[1:-1] for row in day_rows(warehouse, "dwd.orders_edges")}
    assert edges["created"] == (None, 7, 0, 0)  # its paid amount: a sum over null values only
    assert edges["paid"] == (Decimal("100.00"), 0, 4, 0)
    assert day_rows(warehouse, "dwd.orders_none_total") == [(0, None, 0, "all", DAY)]
    assert day_rows(warehouse, "dwd.orders_none_by_status") == []
    for name in EDGES:  # each whole build stored the states its rows came from
        assert (warehouse.root / "lake" / "dwd" / f"{name.split('.')[1]}__state").is_dir(), name


def _scans(line: str, path: Path) -> bool:
    """A plan's line naming the data files of the Delta table at ``path`` that a scan reads (its log is read by
    other scans, of the log's own path)."""
    return line.startswith("Location: ") and line.endswith(f":{path}]")


def input_scans(spark: SparkSession, path: Path, after: int) -> tuple[int, int]:
    """The SQL executions after the one numbered ``after`` whose physical plan scans the Delta table at ``path``,
    and the last execution's number: Spark's SQL status store (what its UI's SQL tab lists) read through the JVM,
    once its listener bus has delivered every event."""
    session = spark._jsparkSession  # type: ignore[attr-defined]
    session.sparkContext().listenerBus().waitUntilEmpty()
    executions = session.sharedState().statusStore().executionsList()
    last, scans = after, 0
    for i in range(executions.size()):
        execution = executions.apply(i)
        number = int(execution.executionId())
        last = max(last, number)
        plan = execution.physicalPlanDescription() or ""
        if number > after and any(_scans(line, path) for line in plan.splitlines()):
            scans += 1
    return scans, last


def test_a_whole_build_reads_its_input_once_for_its_rows_and_its_states(
    warehouse: Warehouse, spark: SparkSession
) -> None:
    """Counts the Spark SQL executions whose physical plan scans ``ods.order``'s files during one whole build of the
    total (the runner reads the input as one lazy DataFrame: each Spark job over it scans it again). Computing the
    states and the rows each from the input scans it twice; the rows from the states, once."""
    source = warehouse.root / "lake" / "ods" / "order"
    _, before = input_scans(spark, source, -1)
    build(warehouse, late=False)
    scans, _ = input_scans(spark, source, before)
    assert scans == 1
    assert (warehouse.root / "lake" / "dwd" / "orders_by_status__state").is_dir()
    assert day_rows(warehouse, TOTAL) == oracle(warehouse, spark, DECLARATION.split("--- */\n")[1])


# --- totals over joins ----------------------------------------------------------------------------------------


def user(uid: int, city: str, grade: int, pos: int, **changed: Any) -> dict[str, Any]:
    """User ``uid``, registered in the day's hour 01 (the ``ods.user`` partition the totals read)."""
    created = datetime(2026, 3, 2, 1, uid, tzinfo=TZ)
    row = {"id": uid, "name": f"u{uid}", "city": city, "grade": grade, "channel": "app", "create_time": created}
    row |= {"update_time": created, "_es": pos, "_pos": pos, "_stream": "edu_user.user_00", "_deleted": False}
    return {**row, "dt": DAY, "hh": "01", **changed}


def report_user_hours(warehouse: Warehouse) -> None:
    """Every ``ods.user`` hour of the day reported with its checks passed, as the ingestion reports them (again:
    late)."""
    key = AssetKey(["ods", "user"])
    for hour in HOURS:
        warehouse.instance.report_runless_asset_event(AssetMaterialization(key, partition=hour))
        [target, *_] = materializations(warehouse.instance, key, hour)
        data = AssetCheckEvaluationTargetMaterializationData(storage_id=target, run_id="", timestamp=0.0)
        for check in warehouse.catalog["ods.user"].checks:
            evaluation = AssetCheckEvaluation(
                asset_key=key, check_name=check.name, passed=True, partition=hour, target_materialization_data=data
            )
            event = DagsterEvent(
                DagsterEventType.ASSET_CHECK_EVALUATION.value, "checks", event_specific_data=evaluation
            )
            warehouse.instance.report_dagster_event(event, make_new_run_id())


def change_users(warehouse: Warehouse, spark: SparkSession, rows: list[dict[str, Any]], ops: list[str]) -> None:
    merged(spark, warehouse.root / "lake", ["ods", "user"], rows, ops)
    report_user_hours(warehouse)


def differences(warehouse: Warehouse, spark: SparkSession, name: str) -> int:
    """The rows of ``name``'s day that a whole build of its SQL over the live orders and users would not leave, and
    those it would that are not there: the SQL's rows computed by Spark, the table's read by delta-rs (no Spark job),
    compared as multisets."""
    lake = warehouse.root / "lake"
    for table in ("order", "user"):
        live_view(warehouse, spark, table, f"__oracle_{table}")
    sql = TOTALS[name].replace("ods.order", "__oracle_order").replace("ods.user", "__oracle_user")
    expected = spark.sql(sql).withColumn("dt", F.lit(DAY)).toArrow()
    found, _ = DeltaStore(str(lake)).read_rows(name.split("."), [{"dt": DAY}])
    assert found.column_names == expected.column_names
    rows, wanted = Counter(day_tuples(found)), Counter(day_tuples(expected))
    return (rows - wanted).total() + (wanted - rows).total()


def maintained_late(warehouse: Warehouse, spark: SparkSession, tables: tuple[str, ...]) -> None:
    """A late-data rebuild of ``tables``: each maintained (not whole), in one commit, equal to its SQL now."""
    before = {t: warehouse.version(t) for t in tables}
    run = build(warehouse, late=True, tables=tables)
    assert not any("rebuilt whole" in m for m in logged(warehouse, run))
    for t in tables:
        [found] = [e for e in warehouse.builds(t, DAY)[-1]["partitions"].value if e["partition"] == DAY]  # type: ignore[attr-defined]
        assert found.get("keys_rebuilt"), t  # maintained, not rebuilt whole
        assert warehouse.version(t) == before[t] + 1, t  # one commit
        assert differences(warehouse, spark, t) == 0, t


def test_totals_over_joins_are_maintained_from_the_fact_the_dimension_or_both_as_a_whole_rebuild_computes_them(
    warehouse: Warehouse, spark: SparkSession
) -> None:
    """An order's amount, status or user changed; a user's city and grade changed, a user registered whose orders
    were NULL-extended, a user deleted whose orders become NULL-extended (the LEFT JOIN's rows flipping); and both in
    one rebuild, an order moved to a user changed in the same batch: each late-data rebuild replaces the changed
    groups in one commit of each total and leaves the rows its SQL gives over the inputs now."""
    change_users(
        warehouse,
        spark,
        [user(10, "beijing", 1, 1), user(11, "shanghai", 2, 2), user(12, "beijing", 3, 3)],
        ["INSERT"] * 3,
    )
    day = first_day()  # of users 10-13: 13 not registered, its orders NULL-extended
    tables = tuple(JOINED)
    build(warehouse, late=False, tables=tables)
    assert all(differences(warehouse, spark, t) == 0 for t in tables)

    def rebuilt_late() -> None:
        maintained_late(warehouse, spark, tables)

    # (a) the orders only: an amount, a status, a user (11 → 12), an insert, a delete
    orders = [
        {**day[0], "amount": Decimal("15.00"), "_pos": 1000},
        paid(day[5]),
        {**day[1], "user_id": 12, "_pos": 1001},
        {**day[4], "_deleted": True, "_pos": 1004},
        order(12, "created", _pos=1012),
    ]
    change(warehouse, spark, orders, ["UPDATE", "UPDATE", "UPDATE", "DELETE", "INSERT"])
    rebuilt_late()

    # (b) the users only: 10 moves and changes grade; 13 registers (its orders matched); 11 is deleted (NULL-extended)
    users = [user(10, "shanghai", 5, 10), user(13, "beijing", 2, 11), user(11, "shanghai", 2, 12, _deleted=True)]
    change_users(warehouse, spark, users, ["UPDATE", "INSERT", "DELETE"])
    rebuilt_late()
    grades = {row[0]: row[1:-1] for row in day_rows(warehouse, "dwd.orders_by_grade")}
    assert grades["created"][:2] == (7, 6)  # 109 (user 11) NULL-extended; 107 and 111 (user 13) matched

    # (c) both: order 102 moved to user 10 and repriced while 10 changes again; a new user with a new order
    change_users(warehouse, spark, [user(10, "beijing", 4, 20), user(14, "hangzhou", 1, 21)], ["UPDATE", "INSERT"])
    change(
        warehouse,
        spark,
        [{**day[2], "user_id": 10, "amount": Decimal("99.00"), "_pos": 1102}, order(13, "paid", user_id=14, _pos=1113)],
        ["UPDATE", "INSERT"],
    )
    rebuilt_late()


def test_distinct_counts_and_extremes_are_maintained_from_their_value_pairs_as_a_whole_rebuild_computes_them(
    warehouse: Warehouse, spark: SparkSession
) -> None:
    """The paid group's least amount deleted (its pair gone: the group's remaining pairs read for the new least) with
    its only order of user 10 (a buyer gone), a smaller amount appearing in another group; user 10 back among the
    paid (a value 0 → present) with a new least; a user registering (a city present through the LEFT JOIN); the
    created group's greatest amount moved away: each late-data rebuild is maintained in one commit of the table and
    leaves the rows its SQL gives over the inputs now, as do the value states a whole build writes."""
    change_users(warehouse, spark, [user(10, "beijing", 1, 1), user(11, "shanghai", 2, 2)], ["INSERT"] * 2)
    day = first_day()  # paid: 100-103 (10-40, users 10-13); refunded: 104 (50); created: 105-111 (60-120)
    table = "dwd.orders_distinct"
    build(warehouse, late=False, tables=(table,))
    assert differences(warehouse, spark, table) == 0
    assert (warehouse.root / "lake" / "dwd" / "orders_distinct__state_0").is_dir()  # o.user_id's pairs

    def rows() -> dict[str, tuple[Any, ...]]:
        return {r[0]: r for r in day_rows(warehouse, table)}

    # (a) 100 (paid's least, user 10's only paid order) deleted; 106 repriced below every created amount
    change(
        warehouse,
        spark,
        [{**day[0], "_deleted": True, "_pos": 1000}, {**day[6], "amount": Decimal("5.00"), "_pos": 1006}],
        ["DELETE", "UPDATE"],
    )
    maintained_late(warehouse, spark, (table,))
    found = rows()
    assert found["paid"][1:3] == (3, Decimal("20.00"))  # users 11-13; the least read again from the remaining pairs
    assert found["created"][2] == Decimal("5.00")

    # (b) user 10 pays again (0 → present) at a new least; user 13 registers (its orders' city present); 111
    # (created's greatest) moved to paid: created's greatest read again from its remaining pairs
    change(
        warehouse,
        spark,
        [order(12, "paid", user_id=10, amount=Decimal("7.00"), _pos=1012), paid(day[11])],
        ["INSERT", "UPDATE"],
    )
    change_users(warehouse, spark, [user(13, "hangzhou", 3, 13)], ["INSERT"])
    maintained_late(warehouse, spark, (table,))
    found = rows()
    assert found["paid"][1:4] == (4, Decimal("7.00"), Decimal("120.00"))
    assert found["paid"][5] == 3  # beijing, shanghai, hangzhou
    assert found["created"][3] == Decimal("110.00")
    # the maintained rebuild's states, held in Arrow, written by delta-rs in this process (no Spark job): the group
    # states overwritten, each argument's touched pairs merged
    for states in ("orders_distinct__state", *(f"orders_distinct__state_{n}" for n in range(3))):
        [commit] = DeltaTable(str(warehouse.root / "lake" / "dwd" / states)).history(1)
        assert commit.get("engineInfo", "").startswith("delta-rs"), (states, commit)
