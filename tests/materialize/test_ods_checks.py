"""ODS hours' checks: blocking, evaluated in one batched run per sensor tick, with exact partitions.

``ods.order`` holds two days, D and D+1 (yesterday and the day before, so that they lie within the sensor's
lookback); on D the 10:00 hour holds the same order id twice. The readiness sensor's reports of the 48
hours are simulated; ``ods_quality_checks`` is evaluated as the daemon would, and its run is executed in
process. D's DWD day is held back by the failed hour, D+1's is not; a fix, re-reported by the readiness
sensor, is re-checked alone and releases D.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pyarrow as pa
import pytest
from dagster import (
    AssetCheckKey,
    AssetKey,
    AssetMaterialization,
    AssetSelection,
    DagsterInstance,
    DagsterRunStatus,
    DefaultSensorStatus,
    Definitions,
    RunRequest,
    SkipReason,
    build_sensor_context,
    define_asset_job,
    instance_for_test,
)
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from dagster._core.test_utils import create_run_for_test
from deltalake import write_deltalake
from pyspark.sql import SparkSession

from resources import resources_from_env
from resources.landing import Landing
from sensors.ods import build_ods_checks_sensor
from simulator.cdc_config import merged_order_row
from tests.support.center_harness import CenterTicker
from warehouse_assets.catalog import Catalog, hourly, load_catalog
from warehouse_assets.definitions import catalog, defs
from warehouse_assets.explain.why import explain
from warehouse_assets.ingest.merge import ods_arrow_schema
from warehouse_assets.materialize.compiler import build_assets, build_checks
from warehouse_assets.materialize.hour_checks import (
    JOB,
    build_ods_checks_job,
    checked_tables,
    next_batch,
    unchecked_hours,
)

TZ = ZoneInfo("Asia/Shanghai")
TODAY = datetime.now(TZ).date()
D, D1 = TODAY - timedelta(days=2), TODAY - timedelta(days=1)
ODS, DWD = AssetKey(["ods", "order"]), AssetKey(["dwd", "order_detail"])
BAD_HOUR = f"{D}-10:00"


def hours(day: date) -> list[str]:
    return [f"{day}-{h:02d}:00" for h in range(24)]


def ods_rows(duplicate: bool) -> list[dict[str, Any]]:
    rows = []
    for day, base in ((D, 100), (D1, 200)):
        for i in range(4):
            created = datetime(day.year, day.month, day.day, 9 + i, 30, tzinfo=TZ)
            rows.append(merged_order_row(base + i, 10 + i % 2, created, base + i))
    if duplicate:  # order 101 twice in D's 10:00 hour (what a broken merge could leave)
        rows.append(dict(rows[1], _pos=999))
    return rows


@dataclass
class Env:
    catalog: Catalog
    root: Path
    instance: DagsterInstance
    resources: dict[str, Any]
    defs: Definitions
    engine: CenterTicker | None = None

    def write_ods(self, duplicate: bool) -> None:
        data = pa.Table.from_pylist(ods_rows(duplicate), schema=ods_arrow_schema(self.catalog["ods.order"]))
        write_deltalake(str(self.root / "lake" / "ods" / "order"), data, partition_by=["dt", "hh"], mode="overwrite")

    def report(self, keys: list[str]) -> None:
        """What the readiness sensor reports for a ready (or re-reported) hour."""
        for key in keys:
            self.instance.report_runless_asset_event(AssetMaterialization(ODS, partition=key))

    def tick(self) -> RunRequest | SkipReason:
        sensor = build_ods_checks_sensor(self.catalog, build_ods_checks_job(self.catalog))
        result = sensor(build_sensor_context(instance=self.instance))
        assert isinstance(result, RunRequest | SkipReason)
        return result

    def run(self, request: RunRequest) -> Any:
        job = self.defs.get_job_def(JOB)
        return job.execute_in_process(run_config=request.run_config, instance=self.instance, raise_on_error=False)

    def verdicts(self, name: str) -> dict[str, bool]:
        key = AssetCheckKey(ODS, name)
        out = {}
        for info in self.instance.event_log_storage.get_asset_check_partition_info([key]):
            if info.partition_key and info.is_current:
                out[info.partition_key] = info.latest_execution_status.value == "SUCCEEDED"
        return out

    def dwd_requested(self) -> list[str]:
        """One step of the engine (started at the first call): the DWD days it starts."""
        if self.engine is None:
            self.engine = CenterTicker(self.instance, self.catalog, ["dwd.order_detail"])
        return self.engine.tick(datetime.now(TZ))["dwd.order_detail"]


@pytest.fixture(scope="module")
def env(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("ods_checks")
    (root / "landing").mkdir()
    resources = resources_from_env(
        {"WAREHOUSE_LAKE_ROOT": str(root / "lake"), "WAREHOUSE_LANDING_ROOT": str(root / "landing")}
    )
    catalog = load_catalog()
    job = build_ods_checks_job(catalog)
    defs = Definitions(
        assets=build_assets(catalog), asset_checks=build_checks(catalog), jobs=[job], resources=resources
    )
    with instance_for_test() as instance:
        env = Env(catalog, root, instance, resources, defs)
        env.write_ods(duplicate=True)
        env.dwd_requested()  # the engine's first step, before any hour is reported
        yield env
        assert env.engine is not None
        env.engine.close()


def test_ods_checks_are_blocking_and_batched_by_a_running_sensor() -> None:
    graph = defs.resolve_asset_graph()  # the code location's own definitions
    for table in catalog.ods():
        keys = graph.get_check_keys_for_assets({AssetKey(table.key)})
        specs = [graph.get_check_spec(k) for k in keys if k.name not in ("freshness", "sla_forecast", "valid")]
        assert {s.key.name for s in specs} == {"unique", "not_null"}, table.fqn
        assert all(s.blocking for s in specs), table.fqn
        # validity is the gate's, never Dagster's in-run blocking
        assert not graph.get_check_spec(AssetCheckKey(AssetKey(table.key), "valid")).blocking, table.fqn
        assert all(s.automation_condition is None for s in specs), table.fqn  # the sensor batches them
    sensor = defs.get_sensor_def("ods_quality_checks")
    assert sensor.default_status == DefaultSensorStatus.RUNNING
    assert sensor.job_name == JOB


def test_the_oldest_table_hours_go_first() -> None:
    pending = {"ods.user": ["2026-03-02-01:00", "2026-03-02-02:00"], "ods.order": ["2026-03-02-00:00"]}
    assert next_batch(pending, limit=2) == {"ods.order": ["2026-03-02-00:00"], "ods.user": ["2026-03-02-01:00"]}
    assert next_batch(pending) == {"ods.order": ["2026-03-02-00:00"], "ods.user": pending["ods.user"]}


def test_one_run_checks_every_reported_hour_and_gates_dwd(env: Env) -> None:
    assert isinstance(env.tick(), SkipReason)  # nothing reported yet
    env.report(hours(D) + hours(D1))
    assert env.dwd_requested() == []  # every hour is there, but no verdict yet: the blocking checks hold DWD

    request = env.tick()
    assert isinstance(request, RunRequest)
    assert request.run_config == {
        "ops": {"check_ods_hours": {"config": {"hours": {"ods.order": hours(D) + hours(D1)}}}}
    }

    # while a run is in flight, the sensor starts no other
    queued = create_run_for_test(env.instance, job_name=JOB, status=DagsterRunStatus.STARTED)
    assert "still checking" in str(env.tick().skip_message)  # type: ignore[union-attr]
    env.instance.report_run_canceled(queued)

    result = env.run(request)
    assert result.success
    assert result.output_for_node("check_ods_hours") == {"table_hours": 48, "evaluations": 96, "failed": 1}
    unique = env.verdicts("unique")
    assert set(unique) == set(hours(D) + hours(D1))
    assert [k for k, ok in unique.items() if not ok] == [BAD_HOUR]
    assert all(env.verdicts("not_null").values())
    assert isinstance(env.tick(), SkipReason)  # every hour judged: nothing to do

    # D's DWD day waits for its failed hour, D+1's runs
    assert env.dwd_requested() == [str(D1)]
    why = explain(
        env.instance,
        env.catalog,
        env.resources["lake"].store(),
        Landing(env.root / "landing"),
        "dwd.order_detail",
        str(D),
    )
    failed = [u for u in why.upstream if u.state == "check failed"]
    assert [u.partition for u in failed] == [BAD_HOUR]
    assert "unique" in failed[0].detail


def test_a_reported_fix_is_rechecked_alone_and_releases_the_day(env: Env) -> None:
    env.write_ods(duplicate=False)
    env.report([BAD_HOUR])  # late changes merged: the readiness sensor reports the hour again
    request = env.tick()
    assert isinstance(request, RunRequest)
    assert request.run_config["ops"]["check_ods_hours"]["config"]["hours"] == {"ods.order": [BAD_HOUR]}
    assert env.run(request).success
    assert env.verdicts("unique")[BAD_HOUR] is True
    assert env.dwd_requested() == [str(D)]


def test_a_failed_run_leaves_its_hours_pending(env: Env) -> None:
    env.report([f"{D1}-05:00"])
    request = env.tick()
    assert isinstance(request, RunRequest)
    (env.root / "lake" / "ods" / "order").rename(env.root / "moved")  # the run cannot read the table
    try:
        failed = env.run(request)
        assert not failed.success
        assert "has no Delta table" in str(failed.failure_data_for_node("check_ods_hours").error)  # type: ignore[union-attr]
        assert "failed; retrying" in str(env.tick().skip_message)  # type: ignore[union-attr]
    finally:
        (env.root / "moved").rename(env.root / "lake" / "ods" / "order")
    # the hour still lacks a current verdict, so the next run (after the back-off) checks it
    assert unchecked_hours(env.instance, checked_tables(env.catalog)) == {"ods.order": [f"{D1}-05:00"]}


def test_a_bad_request_names_what_is_wrong(env: Env) -> None:
    bad = RunRequest(
        run_config={"ops": {"check_ods_hours": {"config": {"hours": {"dwd.order_detail": [f"{D}-01:00"]}}}}}
    )
    result = env.run(bad)
    assert "not an ODS table with checks: dwd.order_detail" in str(
        result.failure_data_for_node("check_ods_hours").error
    )
    bad = RunRequest(run_config={"ops": {"check_ods_hours": {"config": {"hours": {"ods.order": [str(D)]}}}}})
    result = env.run(bad)
    assert "not hour partition keys" in str(result.failure_data_for_node("check_ods_hours").error)


def test_the_checks_executed_by_hand_over_a_range_judge_each_hour(env: Env) -> None:
    """From the UI (hours older than the engine's lookback are checked by hand), an ODS table's checks over
    a range of hours: one verdict per check and hour. The check read ``partition_key`` and failed the ranged
    run, and a result without its partition would be recorded as partition None."""
    keys = [AssetCheckKey(ODS, check.name) for check in env.catalog["ods.order"].checks]
    checked = [f"{D}-11:00", f"{D}-12:00"]
    env.report(checked)
    by_hand = define_asset_job("ods_order_checks_by_hand", AssetSelection.checks(*keys), partitions_def=hourly)
    location = Definitions(
        assets=build_assets(env.catalog),
        asset_checks=build_checks(env.catalog),
        jobs=[by_hand],
        resources=env.resources,
    )
    tags = {"dagster/asset_partition_range_start": checked[0], "dagster/asset_partition_range_end": checked[-1]}
    result = location.resolve_job_def(by_hand.name).execute_in_process(
        instance=env.instance, tags=tags, raise_on_error=False
    )
    assert result.success, [e.message for e in result.all_events if e.is_failure]
    storage = env.instance.event_log_storage
    recorded = {
        (record.key.name, record.partition): record.status
        for key in keys
        for record in storage.get_asset_check_execution_history(key, limit=50)
        if record.run_id == result.run_id
    }
    assert recorded == {(key.name, hour): AssetCheckExecutionRecordStatus.SUCCEEDED for key in keys for hour in checked}


def test_small_hours_are_judged_by_arrow_and_large_ones_by_spark_alike(spark: SparkSession, tmp_path: Path) -> None:
    """check_ods_hours reads small hours with Arrow in the run (no Spark job on the handoff's path) and larger ones
    with Spark: the same verdicts and numbers either way."""
    from resources.delta_lake import DeltaStore
    from warehouse_assets.materialize.runner import check_ods_hours

    table = load_catalog()["ods.order"]
    data = pa.Table.from_pylist(ods_rows(duplicate=True), schema=ods_arrow_schema(table))
    write_deltalake(str(tmp_path / "ods" / "order"), data, partition_by=["dt", "hh"])
    store, keys = DeltaStore(str(tmp_path)), hours(D)[8:12]

    def comparable(outcomes: list[Any]) -> list[tuple[Any, ...]]:
        return [
            (
                o.check.name,
                o.partition,
                o.passed,
                o.description,
                {k: v for k, v in o.metadata.items() if k != "examples"},
            )
            for o in outcomes
        ]

    by_arrow = check_ods_hours(table, keys, spark, store)  # a few KiB: Arrow
    by_spark = check_ods_hours(table, keys, spark, store, arrow_max_bytes=0)  # any file is too large: Spark
    assert comparable(by_arrow) == comparable(by_spark)
    failed = {(o.check.name, o.partition) for o in by_arrow if not o.passed}
    assert failed == {("unique", BAD_HOUR)}
