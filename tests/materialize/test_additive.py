"""Additive maintenance on Spark (:mod:`warehouse_assets.materialize.additive`): a late-data rebuild of a total
grouped by status over ``ods.order`` absorbs an update, a delete, an insert and rows moved between groups (and into
its filter) from the order table's change data feed, in one commit of the table, and leaves exactly the rows a whole
rebuild leaves; a group that loses all its rows is deleted; without its stored states the rebuild is whole and says
why, and that whole build stores them again. A whole build computes its rows from the states it stores, reading its
input once (counted in Spark's SQL status store), and they are what the table's SQL gives: a sum over null values
only, count_if, a total over an empty input (one row without GROUP BY, none with it).

The lake and the Dagster instance are the late-data end-to-end test's (:class:`tests.test_late_data_end_to_end.
Warehouse`: ``ods.order`` merged by Spark as the ingestion merges it, its hours reported with their checks); the
catalog is ``ods.order`` and the one total, each run materialized in process.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from dagster import AssetKey, instance_for_test, materialize
from pyspark.sql import SparkSession

from resources import resources_from_env
from resources.delta_lake import DeltaStore
from simulator.cdc_config import merged_order_row
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


def declared(name: str, sql: str) -> str:
    return f"/* ---\ntable: {name}\nperiod: daily\ndescription: A test total.\nowner: trade-data\n" + (
        "depends_on:\n  ods.order: {range: [0, 23]}\n--- */\n" + sql + "\n"
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


@pytest.fixture
def warehouse(spark: SparkSession, tmp_path: Path) -> Iterator[Warehouse]:
    tables = tmp_path / "catalog"
    (tables / "ods").mkdir(parents=True)
    (tables / "dwd").mkdir()
    shutil.copy(TABLES_DIR / "ods" / "order.yaml", tables / "ods" / "order.yaml")
    (tables / "dwd" / "orders_by_status.sql").write_text(DECLARATION)
    for name, sql in EDGES.items():
        (tables / "dwd" / f"{name.split('.')[1]}.sql").write_text(declared(name, sql))
    resources = resources_from_env(
        {"WAREHOUSE_LAKE_ROOT": str(tmp_path / "lake"), "WAREHOUSE_LANDING_ROOT": str(tmp_path / "landing")}
    )
    (tmp_path / "landing").mkdir()
    with (
        memory_backed_dir("additive-home-") as home,
        instance_for_test(temp_dir=str(home), overrides=pooled_event_log(home)) as instance,
    ):
        warehouse = Warehouse(load_catalog(tables), tmp_path, instance, resources)
        yield warehouse
        warehouse.engine.close()


def change(warehouse: Warehouse, spark: SparkSession, rows: list[dict[str, Any]], ops: list[str]) -> None:
    """Merge late changes into ``ods.order`` with Spark as the ingestion does (a DELETE kept as a tombstone), and
    report the hours they touched, as late."""
    schema = ods_arrow_schema(warehouse.catalog["ods.order"])
    batch = pa.Table.from_pylist(rows, schema=schema).append_column("_op", pa.array(ops, pa.string()))
    store = DeltaStore(str(warehouse.root / "lake"))
    store.merge(
        spark, ["ods", "order"], batch, primary_key=["id"], partition_by=["dt", "hh"], tombstone_column="_deleted"
    )
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


def logged(warehouse: Warehouse, run_id: str) -> list[str]:
    return [e.user_message for e in warehouse.instance.all_logs(run_id)]


def test_late_changes_to_a_total_replace_only_the_changed_groups_as_a_whole_rebuild_would(
    warehouse: Warehouse, spark: SparkSession
) -> None:
    day = first_day()
    warehouse.merge_orders(spark, day, moved_from={}, hours=HOURS)
    build(warehouse, late=False)
    groups = {row[0] for row in warehouse.partition_rows(spark, TOTAL)}
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
    assert not any("rebuilt whole" in m for m in logged(warehouse, run))
    maintained = warehouse.partition_rows(spark, TOTAL)
    assert {row[0] for row in maintained} == {"paid", "created", "cancelled"}  # the emptied group deleted

    build(warehouse, late=False)  # a whole rebuild of the same day: the same rows, exactly
    assert "keys_rebuilt" not in entry(warehouse)
    assert warehouse.partition_rows(spark, TOTAL) == maintained
    [paid_group] = [row for row in maintained if row[0] == "paid"]
    assert paid_group[1:3] == (4, Decimal("125.00"))  # 100 (15), 101 (20), 102 (30), 105 (60); not 103, user 13's


def test_without_its_stored_states_the_rebuild_is_whole_says_why_and_stores_them_again(
    warehouse: Warehouse, spark: SparkSession
) -> None:
    day = first_day()
    warehouse.merge_orders(spark, day, moved_from={}, hours=HOURS)
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
    maintained = warehouse.partition_rows(spark, TOTAL)
    build(warehouse, late=False)
    assert warehouse.partition_rows(spark, TOTAL) == maintained


def oracle(warehouse: Warehouse, spark: SparkSession, sql: str) -> list[tuple[Any, ...]]:
    """The table's own SQL run by Spark over the day's live orders, sorted as :meth:`Warehouse.partition_rows`."""
    rows = spark.read.format("delta").load(str(warehouse.root / "lake" / "ods" / "order"))
    rows.where(f"dt = '{DAY}' AND NOT _deleted").createOrReplaceTempView("__oracle_orders")
    found = spark.sql(sql.replace("FROM ods.order", "FROM __oracle_orders")).collect()
    return sorted(tuple(row) + (DAY,) for row in found)


def test_a_whole_build_computes_what_the_tables_sql_gives_for_null_sums_count_ifs_and_empty_inputs(
    warehouse: Warehouse, spark: SparkSession
) -> None:
    warehouse.merge_orders(spark, first_day(), moved_from={}, hours=HOURS)
    build(warehouse, late=False, tables=tuple(EDGES))  # one run builds the three
    for name, sql in EDGES.items():
        assert warehouse.partition_rows(spark, name) == oracle(warehouse, spark, sql), name
    edges = {row[0]: row[1:-1] for row in warehouse.partition_rows(spark, "dwd.orders_edges")}
    assert edges["created"] == (None, 7, 0, 0)  # its paid amount: a sum over null values only
    assert edges["paid"] == (Decimal("100.00"), 0, 4, 0)
    assert warehouse.partition_rows(spark, "dwd.orders_none_total") == [(0, None, 0, "all", DAY)]
    assert warehouse.partition_rows(spark, "dwd.orders_none_by_status") == []
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
    warehouse.merge_orders(spark, first_day(), moved_from={}, hours=HOURS)
    source = warehouse.root / "lake" / "ods" / "order"
    _, before = input_scans(spark, source, -1)
    build(warehouse, late=False)
    scans, _ = input_scans(spark, source, before)
    assert scans == 1
    assert (warehouse.root / "lake" / "dwd" / "orders_by_status__state").is_dir()
    assert warehouse.partition_rows(spark, TOTAL) == oracle(warehouse, spark, DECLARATION.split("--- */\n")[1])
