"""Late data end to end on the example warehouse: late payments to a closed day are absorbed by one rebuild when the
day's late-data policy says (the default: every 15 minutes for its key-local and additive tables), its figures then
equal the independent oracle's, and the new hours' first builds never wait for that rebuild.

``ods.order`` is written directly (a day of orders, some unpaid), its hours reported as the ingestion reports them; the
dependency center is stepped at pinned times (``tests.support.center_harness``) and each of its runs of the trade
chain (``dwd.order_detail`` → ``dws.user_order_daily`` → ``ads.daily_gmv``) is materialized in process with Spark; the
hourly ``dws.order_hourly``'s runs are only recorded (when each is requested is what the test looks at).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pyarrow as pa
import pytest
from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetKey,
    AssetMaterialization,
    AssetRecordsFilter,
    DagsterEvent,
    DagsterEventType,
    DagsterInstance,
    instance_for_test,
    materialize,
)
from dagster._core.definitions.asset_checks.asset_check_evaluation import AssetCheckEvaluationTargetMaterializationData
from dagster._core.utils import make_new_run_id
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from resources import resources_from_env
from resources.delta_lake import DeltaStore
from simulator.cdc_config import merged_order_row
from tests.center.test_state_store import materializations
from tests.support import oracle
from tests.support.center_harness import CenterTicker
from tests.support.instances import memory_backed_dir, pooled_event_log
from tests.support.lake import row_dicts
from warehouse_assets.catalog import Catalog, load_catalog
from warehouse_assets.ingest.merge import ods_arrow_schema
from warehouse_assets.materialize.compiler import build_assets
from warehouse_assets.materialize.log_checks import BY_DATAFUSION, FROM_LOG, JUDGED_BY

pytestmark = pytest.mark.spark

TZ = ZoneInfo("Asia/Shanghai")
DAY = "2026-03-02"
CHAIN = ["dwd.order_detail", "dws.user_order_daily", "ads.daily_gmv"]  # built
HOURLY = "dws.order_hourly"  # requested, not built
CLOSED = datetime(2026, 3, 3, 0, 30, tzinfo=TZ)  # half an hour after the day ended


def orders(paid: set[int]) -> list[dict[str, Any]]:
    """Twelve orders of the day, one every other hour; those in ``paid`` are paid."""
    rows = []
    for i in range(12):
        row = merged_order_row(100 + i, 10 + i % 3, datetime(2026, 3, 2, 2 * i, 15, tzinfo=TZ), 100 + i)
        if 100 + i not in paid:
            row.update(status="created", pay_time=None)
        rows.append(row)
    return rows


class Warehouse:
    def __init__(self, catalog: Catalog, root: Path, instance: DagsterInstance, resources: dict[str, Any]):
        self.catalog, self.root, self.instance, self.resources = catalog, root, instance, resources
        self.engine = CenterTicker(instance, catalog, [*CHAIN, HOURLY])
        self.assets = build_assets(catalog)
        self.rows: list[dict[str, Any]] = []

    def write_orders(self, rows: list[dict[str, Any]], hours: list[str]) -> None:
        """Write ``ods.order`` as the merge leaves it and report ``hours`` as the ingestion does (again: late)."""
        self.rows = rows
        table = self.catalog["ods.order"]
        data = pa.Table.from_pylist(rows, schema=ods_arrow_schema(table))
        write_deltalake(str(self.root / "lake" / "ods" / "order"), data, partition_by=["dt", "hh"], mode="overwrite")
        for hour in hours:
            self.report_hour(hour)

    def merge_orders(
        self, spark: SparkSession, rows: list[dict[str, Any]], moved_from: dict[int, str], hours: Sequence[str] = ()
    ) -> None:
        """Merge ``rows`` (new images of orders) into ``ods.order`` with Spark's MERGE as the ingestion does, each
        order in ``moved_from`` retired from the hour (``dt-hh``) it left, and report ``hours`` and every hour touched
        (again: late)."""
        table = self.catalog["ods.order"]
        schema = ods_arrow_schema(table)
        batch = pa.Table.from_pylist(rows, schema=schema)
        batch = batch.append_column("_op", pa.array(["UPDATE"] * len(rows), pa.string()))
        left = [
            {**r, "dt": moved_from[r["id"]][:10], "hh": moved_from[r["id"]][11:]} for r in rows if r["id"] in moved_from
        ]
        moved = pa.Table.from_pylist(left, schema=schema) if left else None
        store = DeltaStore(str(self.root / "lake"))
        store.merge(
            spark,
            table.key,
            batch,
            primary_key=["id"],
            partition_by=["dt", "hh"],
            tombstone_column="_deleted",
            moved_out=moved,
        )
        by_id = {r["id"]: r for r in self.rows}
        by_id.update({r["id"]: r for r in rows})
        self.rows = list(by_id.values())
        touched = {f"{r['dt']}-{r['hh']}:00" for r in rows} | {f"{h}:00" for h in moved_from.values()}
        for hour in sorted(touched | set(hours)):
            self.report_hour(hour)

    def partition_rows(self, table: str) -> list[tuple[Any, ...]]:
        """The day's rows of ``table`` as delta-rs's DataFusion reader sees them (deletion vectors applied, as
        Spark's reader applies them), sorted: without a Spark job."""
        rows, _ = DeltaStore(str(self.root / "lake")).read_rows(table.split("."), [{"dt": DAY}])
        return sorted(tuple(row.values()) for row in rows.to_pylist())

    def version(self, table: str) -> int:
        return int(DeltaTable(str(self.root / "lake" / table.replace(".", "/"))).version())

    def report_hour(self, hour: str) -> None:
        """An ODS hour reported and its blocking checks passed on that report, as the ingestion run does."""
        key = AssetKey(["ods", "order"])
        self.instance.report_runless_asset_event(AssetMaterialization(key, partition=hour))
        [target, *_] = materializations(self.instance, key, hour)
        for check in self.catalog["ods.order"].checks:
            data = AssetCheckEvaluationTargetMaterializationData(storage_id=target, run_id="", timestamp=0.0)
            evaluation = AssetCheckEvaluation(
                asset_key=key, check_name=check.name, passed=True, partition=hour, target_materialization_data=data
            )
            event = DagsterEvent(
                DagsterEventType.ASSET_CHECK_EVALUATION.value, "checks", event_specific_data=evaluation
            )
            self.instance.report_dagster_event(event, make_new_run_id())

    def step(self, at: datetime) -> dict[str, list[list[str]]]:
        """One engine step at ``at``; each of its runs of the chain materialized (each must succeed), in order."""
        self.engine.tick(at)
        runs: dict[str, list[list[str]]] = {}
        for plan in self.engine.plans:
            if plan.table not in (*CHAIN, HOURLY) or plan.job:
                continue
            runs.setdefault(plan.table, []).append(list(plan.partitions))
            if plan.table == HOURLY:
                continue
            single = len(plan.partitions) == 1
            result = materialize(
                self.assets,
                instance=self.instance,
                resources=self.resources,
                selection=[AssetKey(plan.table.split("."))],
                partition_key=plan.partitions[0] if single else None,
                tags={k: v for k, v in plan.tags.items() if not (single and k == "dagster/partition")},
                raise_on_error=False,
            )
            assert result.success, f"{plan.table} {plan.partitions}"
        return runs

    def settle(self, at: datetime) -> dict[str, list[list[str]]]:
        """Step at ``at`` until the engine requests nothing more (a chain takes a step per layer)."""
        every: dict[str, list[list[str]]] = {}
        for _ in range(8):
            runs = self.step(at)
            if not runs:
                return every
            for table, partitions in runs.items():
                every.setdefault(table, []).extend(partitions)
        raise AssertionError(f"the engine did not settle: {every}")

    def builds(self, table: str, partition: str) -> list[dict[str, Any]]:
        """The metadata of each materialization of the partition, oldest first."""
        found = self.instance.fetch_materializations(
            AssetRecordsFilter(asset_key=AssetKey(table.split(".")), asset_partitions=[partition]), limit=50
        ).records
        return [dict(r.asset_materialization.metadata) for r in reversed(found)]  # type: ignore[union-attr]

    def daily_gmv(self) -> Decimal:
        rows = row_dicts(str(self.root / "lake" / "ads" / "daily_gmv"))
        [row] = [r for r in rows if r["dt"] == DAY]
        return Decimal(row["gmv"])


@pytest.fixture
def warehouse(spark: SparkSession, tmp_path: Path) -> Iterator[Warehouse]:
    resources = resources_from_env(
        {"WAREHOUSE_LAKE_ROOT": str(tmp_path / "lake"), "WAREHOUSE_LANDING_ROOT": str(tmp_path / "landing")}
    )
    (tmp_path / "landing").mkdir()
    # one event log for the reports and runs, its connections pooled, in memory-backed storage
    # (tests/support/instances.py)
    with (
        memory_backed_dir("late-data-home-") as home,
        instance_for_test(temp_dir=str(home), overrides=pooled_event_log(home)) as instance,
    ):
        warehouse = Warehouse(load_catalog(), tmp_path, instance, resources)
        yield warehouse
        warehouse.engine.close()


def judged_by(instance: DagsterInstance, table: str, check: str) -> str | None:
    """How the latest evaluation of ``table``'s ``check`` was judged without Spark (None: by Spark)."""
    key = AssetCheckKey(AssetKey(table.split(".")), check)
    [record] = instance.event_log_storage.get_asset_check_execution_history(key, limit=1)
    evaluation = record.event.dagster_event.event_specific_data  # type: ignore[union-attr]
    assert isinstance(evaluation, AssetCheckEvaluation), evaluation
    judged = evaluation.metadata.get(JUDGED_BY)
    return str(judged.value) if judged is not None else None


def expected_gmv(rows: list[dict[str, Any]]) -> Decimal:
    truth = [{**r, "create_time": f"{r['create_time']:%Y-%m-%d %H:%M:%S}"} for r in rows]
    return oracle.daily_gmv(truth, "Asia/Shanghai")[datetime.fromisoformat(DAY).date()]


def test_late_payments_are_absorbed_by_one_rebuild_per_policy_and_the_figures_equal_the_oracle(
    warehouse: Warehouse,
) -> None:
    hours = [f"{DAY}-{h:02d}:00" for h in range(24)]
    warehouse.write_orders(orders(paid={100, 101, 102}), hours)
    first = warehouse.settle(CLOSED)
    assert first["dwd.order_detail"] == [[DAY]] and first["ads.daily_gmv"] == [[DAY]]
    assert warehouse.daily_gmv() == expected_gmv(warehouse.rows) == Decimal("60.00")

    # a payment ten minutes later (00:40) is the day settling, within its policy's grace (1 h after the day ended):
    # the day is rebuilt at once, and the chain follows
    paid = {100, 101, 102, 103}
    warehouse.write_orders(orders(paid), [f"{DAY}-06:00"])
    settling = warehouse.settle(CLOSED + timedelta(minutes=10))
    assert settling["dwd.order_detail"] == [[DAY]] and settling["ads.daily_gmv"] == [[DAY]]
    assert warehouse.daily_gmv() == expected_gmv(warehouse.rows) == Decimal("80.00")

    # three rounds of late payments to the closed day past the grace (01:10, 01:15, 01:20)
    for n, (order, minute) in enumerate(((105, 40), (107, 45), (111, 50))):
        paid.add(order)
        hour = f"{DAY}-{2 * (order - 100):02d}:00"
        warehouse.write_orders(orders(paid), [hour])
        runs = warehouse.settle(CLOSED + timedelta(minutes=minute))
        assert "dwd.order_detail" not in runs, n  # the default policy: at most one rebuild in 15 minutes
        assert warehouse.daily_gmv() == Decimal("80.00")  # stale meanwhile, as the policy allows

    # the next day's first hour arrives: its first build starts at once, whatever waits to be rebuilt
    warehouse.report_hour("2026-03-03-00:00")
    fresh = warehouse.settle(CLOSED + timedelta(minutes=54))
    assert fresh["dws.order_hourly"] == [["2026-03-03-00:00"]]

    # 15 minutes after the first late payment was seen: one rebuild of the day absorbs all three, and the chain follows
    rebuilt = warehouse.settle(CLOSED + timedelta(minutes=56))
    assert rebuilt["dwd.order_detail"] == [[DAY]]
    assert rebuilt["dws.user_order_daily"] == [[DAY]] and rebuilt["ads.daily_gmv"] == [[DAY]]
    assert warehouse.daily_gmv() == expected_gmv(warehouse.rows) == Decimal("140.00")
    assert len(warehouse.builds("dwd.order_detail", DAY)) == 3  # the first build, the settling one, one rebuild
    assert len(warehouse.builds("ads.daily_gmv", DAY)) == 3
    assert warehouse.builds("dwd.order_detail", DAY)[-1]["late_changes_absorbed"].value == {DAY: 3}  # type: ignore[attr-defined]
    assert warehouse.settle(CLOSED + timedelta(hours=4)) == {}  # nothing more


def test_a_late_change_rebuilds_only_the_keys_it_touched_and_leaves_the_rows_a_whole_rebuild_would(
    warehouse: Warehouse, spark: SparkSession
) -> None:
    """ods.order merged by Spark records its changes (Delta's change data feed); the late-data rebuild of the
    key-local dwd.order_detail (by order) and dws.user_order_daily (by user) replaces the rows of the changed keys
    only, each in one Delta commit: an order paid, an order moved to another user (both users' rows change), an order
    re-dated to another hour (its old hour loses it); the total ads.daily_gmv over the users' rows is maintained from
    the changed users' rows. The rows equal a whole rebuild's, and the oracle's GMV."""
    day = orders(paid={100, 101, 102})
    warehouse.merge_orders(spark, day, moved_from={}, hours=[f"{DAY}-{h:02d}:00" for h in range(24)])
    first = warehouse.settle(CLOSED)
    assert first["dwd.order_detail"] == [[DAY]] and first["dws.user_order_daily"] == [[DAY]]
    before = {t: warehouse.version(t) for t in CHAIN}

    by_id = {r["id"]: r for r in day}
    paid = {**by_id[105], "status": "paid", "pay_time": by_id[105]["create_time"], "_pos": 1105}
    moved_user = {**by_id[107], "user_id": 99, "_pos": 1107}  # user 10 → 99: both users' rows change
    redated = by_id[111].copy()  # 22:15 → 03:40: its hour-22 row is retired, hour 03 gets it
    redated.update(create_time=datetime(2026, 3, 2, 3, 40, tzinfo=TZ), hh="03", _pos=1111)
    warehouse.merge_orders(spark, [paid, moved_user, redated], moved_from={111: f"{DAY}-22"})
    rebuilt = warehouse.settle(CLOSED + timedelta(minutes=40))  # past the grace: waits for the interval
    assert "dwd.order_detail" not in rebuilt
    rebuilt = warehouse.settle(CLOSED + timedelta(minutes=101))
    assert rebuilt["dwd.order_detail"] == [[DAY]] and rebuilt["dws.user_order_daily"] == [[DAY]]

    def entry(table: str) -> dict[str, Any]:
        [found] = [e for e in warehouse.builds(table, DAY)[-1]["partitions"].value if e["partition"] == DAY]  # type: ignore[attr-defined]
        return found

    assert entry("dwd.order_detail")["keys_rebuilt"] == 3  # orders 105, 107, 111
    assert entry("dws.user_order_daily")["keys_rebuilt"] == 3  # 105's user, 107's old user and its new one
    # the orders' rows come from ods.order's change feed (unique by id); a user's orders are not all in the DWD's
    assert entry("dwd.order_detail")["key_rows_from_feed"] == ["ods.order"]
    assert "key_rows_from_feed" not in entry("dws.user_order_daily")
    # the users whose rows changed are those the DWD's key-scoped commit recorded: its change feed is not read
    assert entry("dws.user_order_daily")["keys_from_commits"] == ["dwd.order_detail"]
    # one row for the whole day, a sum of the users' rows: maintained from the changed users' rows
    assert entry("ads.daily_gmv")["keys_rebuilt"] == 1 and entry("ads.daily_gmv")["changed_rows_read"] > 0
    assert {t: warehouse.version(t) - before[t] for t in CHAIN} == dict.fromkeys(CHAIN, 1)  # one commit each
    # a few keys of one column: deleted by them as literals and appended (a replaceWhere), not a MERGE's joins
    for table in ("dwd.order_detail", "dws.user_order_daily"):
        [commit] = DeltaTable(str(warehouse.root / "lake" / table.replace(".", "/"))).history(1)
        assert commit["operation"] == "WRITE" and "IN (" in commit["operationParameters"]["predicate"], table
    # the total's one row of the day replaces the partition's (no MERGE), and its checks that the Delta log or a
    # DataFusion count prove are judged so, without reading the partition back into Spark
    [commit] = DeltaTable(str(warehouse.root / "lake" / "ads" / "daily_gmv")).history(1)
    assert commit["operation"] == "WRITE", commit
    assert {c: judged_by(warehouse.instance, "ads.daily_gmv", c) for c in ("unique", "range", "row_count")} == {
        "unique": BY_DATAFUSION,
        "range": FROM_LOG,
        "row_count": FROM_LOG,
    }
    assert warehouse.daily_gmv() == expected_gmv(warehouse.rows) == Decimal("80.00")
    scoped = {t: warehouse.partition_rows(t) for t in CHAIN}
    users = {row[0] for row in scoped["dws.user_order_daily"]}
    assert 99 in users

    # a whole rebuild of the same partitions (launched by hand: no late-data tag) leaves the same rows
    for table in CHAIN:
        result = materialize(
            warehouse.assets,
            instance=warehouse.instance,
            resources=warehouse.resources,
            selection=[AssetKey(table.split("."))],
            partition_key=DAY,
        )
        assert result.success
        assert "keys_rebuilt" not in entry(table)
        assert warehouse.partition_rows(table) == scoped[table], table

    # dwd.order_detail rebuilt whole again, after one more order is paid: its commit rewrites every row, but the
    # rows written the same are no change, so dws.user_order_daily's late-data rebuild touches that order's user only
    one_more = {**by_id[109], "status": "paid", "pay_time": by_id[109]["create_time"], "_pos": 1109}
    warehouse.merge_orders(spark, [one_more], moved_from={})
    by_hand = materialize(
        warehouse.assets,
        instance=warehouse.instance,
        resources=warehouse.resources,
        selection=[AssetKey(["dwd", "order_detail"])],
        partition_key=DAY,
    )
    assert by_hand.success and "keys_rebuilt" not in entry("dwd.order_detail")
    rebuilt = warehouse.settle(CLOSED + timedelta(minutes=200))
    assert rebuilt.get("dws.user_order_daily") == [[DAY]]
    assert entry("dws.user_order_daily")["keys_rebuilt"] == 1  # from the whole commit's change feed: it recorded none
    assert "keys_from_commits" not in entry("dws.user_order_daily")
    assert warehouse.daily_gmv() == expected_gmv(warehouse.rows) == Decimal("100.00")
