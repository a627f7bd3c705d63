"""Storage and status kept in step, end to end on the example warehouse: partitions whose data left the lake are found
by ``warehouse reconcile``, marked missing (``warehouse why`` and ``status`` name them, nothing is built on them),
built again by the dependency center, and the ADS figure equals the independent oracle's again.

The trade chain of one day (``dwd.order_detail`` → ``dws.user_order_daily`` → ``ads.daily_gmv``) is built as in the
late-data test (``ods.order`` written directly, the engine stepped at pinned times, its runs materialized in process
with Spark). Then the lake loses data three ways: the day's files of ``dwd.order_detail`` are deleted from storage
(a VACUUM gone wrong: the Delta log still lists them), the day of ``ads.daily_gmv`` is deleted through Delta (the
current version lists no file of it), and a day of ``dws.user_order_daily`` the instance never materialized is
written beside it (reported, never marked).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from dagster import (
    AssetCheckEvaluation,
    AssetKey,
    AssetMaterialization,
    DagsterEvent,
    DagsterEventType,
    instance_for_test,
)
from dagster._core.definitions.asset_checks.asset_check_evaluation import AssetCheckEvaluationTargetMaterializationData
from dagster._core.utils import make_new_run_id
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from resources import resources_from_env
from resources.settings import Settings, using
from tests.center.test_state_store import materializations
from tests.support.instances import memory_backed_dir, pooled_event_log
from tests.test_late_data_end_to_end import CHAIN, CLOSED, DAY, Warehouse, expected_gmv, orders
from warehouse_assets.catalog import load_catalog
from warehouse_assets.center.state_store import PartitionStateStore
from warehouse_assets.cli import main

pytestmark = pytest.mark.spark

OTHER_DAY = "2026-03-01"  # a day of dws.user_order_daily written outside the warehouse


class ReportingRows(Warehouse):
    """The late-data test's warehouse, its ODS hours reported with their row counts as the ingestion reports them
    (an hour without rows has no files in the lake, and its report says so), their checks passed."""

    def report_hour(self, hour: str) -> None:
        key = AssetKey(["ods", "order"])
        rows = sum(1 for r in self.rows if f"{r['dt']}-{r['hh']}:00" == hour)
        self.instance.report_runless_asset_event(AssetMaterialization(key, partition=hour, metadata={"rows": rows}))
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


@pytest.fixture
def warehouse(spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ReportingRows]:
    env = {"WAREHOUSE_LAKE_ROOT": str(tmp_path / "lake"), "WAREHOUSE_LANDING_ROOT": str(tmp_path / "landing")}
    (tmp_path / "landing").mkdir()
    # the instance (tests/support/instances.py: one pooled event log, in memory-backed storage); instance_for_test
    # writes its dagster.yaml into the home, which the commands open too. The commands read the process's settings,
    # which another module of the worker may have read first
    with memory_backed_dir("reconcile-home-") as home, using(Settings.from_env(env)):
        for name, value in {**env, "DAGSTER_HOME": str(home)}.items():
            monkeypatch.setenv(name, value)  # the `warehouse` commands' instance and lake are the test's
        with instance_for_test(temp_dir=str(home), overrides=pooled_event_log(home)) as instance:
            warehouse = ReportingRows(load_catalog(), tmp_path, instance, resources_from_env(env))
            yield warehouse
            warehouse.engine.close()


def command(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    code = main(list(args))
    return code, capsys.readouterr().out.splitlines()


def test_partitions_gone_from_the_lake_are_found_marked_rebuilt_and_the_figures_equal_the_oracle_again(
    warehouse: ReportingRows, spark: SparkSession, capsys: pytest.CaptureFixture[str]
) -> None:
    warehouse.write_orders(orders(paid={100, 101, 102, 104}), [f"{DAY}-{h:02d}:00" for h in range(24)])
    first = warehouse.settle(CLOSED)
    assert all(first[t] == [[DAY]] for t in CHAIN)
    truth = expected_gmv(warehouse.rows)
    assert warehouse.daily_gmv() == truth
    code, out = command(capsys, "reconcile")
    assert code == 0 and len(out) == 1 and out[0].endswith("table(s) compared with the lake: all in step"), out

    lake = warehouse.root / "lake"
    day_files = sorted((lake / "dwd" / "order_detail" / f"dt={DAY}").glob("*.parquet"))
    assert day_files
    for file in day_files:  # a VACUUM gone wrong: the log still lists them
        file.unlink()
    spark.sql(f"DELETE FROM delta.`{lake / 'ads' / 'daily_gmv'}` WHERE dt = '{DAY}'").collect()  # a manual delete
    daily = str(lake / "dws" / "user_order_daily")
    stray = spark.read.format("delta").load(daily).where(F.col("dt") == DAY).withColumn("dt", F.lit(OTHER_DAY))
    stray.write.format("delta").mode("append").save(daily)  # written outside the warehouse

    code, out = command(capsys, "reconcile")
    assert code == 1 and len(out) == 4  # one line per table out of step, and the summary
    assert sorted(out[:3]) == [
        f"ads.daily_gmv: 1 partition(s) gone from the lake, marked missing and to be built again: {DAY} (the "
        f"table's current Delta version lists no file for dt={DAY} (deleted, or restored to an older version))",
        f"dwd.order_detail: 1 partition(s) gone from the lake, marked missing and to be built again: {DAY} "
        f"({len(day_files)} of its {len(day_files)} file(s) listed in the Delta log are gone from storage (vacuumed "
        "or deleted))",
        f"dws.user_order_daily: 1 partition(s) hold data in the lake that the instance never materialized: "
        f"{OTHER_DAY} (reported, not marked: materialize them if they are the warehouse's, or find out who wrote them)",
    ]
    assert out[3].endswith("table(s) compared with the lake: 3 out of step, 2 partition(s) marked missing")

    # the marks are events of the log: status and why read them, and the gate holds back what reads them
    code, out = command(capsys, "status", "dwd.order_detail", "--range", DAY, DAY)
    assert out[0] == "dwd.order_detail (daily): 1 partition(s), 0 materialized, 0 tainted, 1 missing from the lake"
    assert "MISSING from the lake: " in out[1] and "to be built again" in out[1]
    code, out = command(capsys, "why", "ads.daily_gmv", DAY)
    assert out[0].startswith(f"ads.daily_gmv {DAY}: missing from the lake: the table's current Delta version lists no")
    assert "the engine builds it again" in out[0]
    code, out = command(capsys, "why", "dws.user_order_daily", DAY)
    assert any(line.split()[:5] == ["dwd.order_detail", DAY, "missing", "from", "the"] for line in out), out
    assert out[-1].startswith("verdict: waiting for 1 of ")
    assert out[-1].endswith(f"first: dwd.order_detail {DAY} (missing from the lake)")
    store = PartitionStateStore(warehouse.instance)
    gone = store.view().states(AssetKey(["dwd", "order_detail"]), [DAY])[DAY]
    assert gone.missing is not None and not gone.materialized
    assert not store.view().states(AssetKey(["dws", "user_order_daily"]), [OTHER_DAY])[OTHER_DAY].materialized
    store.close()

    # the engine builds both again (a mark is a change of its own), then what was built on the rebuilt day
    rebuilt = warehouse.settle(CLOSED + timedelta(hours=1))
    assert rebuilt["dwd.order_detail"][0] == [DAY] and rebuilt["ads.daily_gmv"][0] == [DAY]
    warehouse.settle(CLOSED + timedelta(hours=3))  # the late-data rebuilds the rebuilt day causes, as its policy says
    assert warehouse.daily_gmv() == truth == expected_gmv(warehouse.rows)
    files = pa.table(DeltaTable(str(lake / "dwd" / "order_detail")).get_add_actions(flatten=True)).to_pylist()
    assert all((lake / "dwd" / "order_detail" / str(f["path"])).exists() for f in files)

    # in step again, but for the day nobody materialized: still reported, still there, never marked
    code, out = command(capsys, "reconcile")
    assert code == 1 and len(out) == 2 and out[0].startswith("dws.user_order_daily: 1 partition(s) hold data")
    assert out[1].endswith("1 out of step, 0 partition(s) marked missing")
    assert spark.read.format("delta").load(daily).where(F.col("dt") == OTHER_DAY).count() > 0
