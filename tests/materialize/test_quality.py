"""Per-partition data-quality gates with exact partitions.

``ods.order`` is written directly (two days, 2026-03-02 and 03) with a duplicated order on day D = 03-02;
``dwd.order_detail`` is materialized in process, its ``unique`` check fails on D only; the dependency center is
stepped at a pinned time (``tests.support.center_harness``). D's downstream (``dws.user_order_daily``) is held back,
D+1's is not; an ``ignore_dq`` dependency proceeds; fixing the data and re-running D clears the block.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
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
    DagsterInstance,
    materialize,
)
from deltalake import write_deltalake
from pyspark.sql import SparkSession

from resources import resources_from_env
from resources.landing import Landing
from simulator.cdc_config import merged_order_row
from tests.support.center_harness import CenterTicker
from warehouse_assets.catalog import Catalog, load_catalog
from warehouse_assets.explain.why import explain
from warehouse_assets.ingest.merge import ods_arrow_schema
from warehouse_assets.materialize.compiler import build_assets
from warehouse_assets.materialize.runner import RETRY_ON_STEP_FAILURE_TAG

TZ = ZoneInfo("Asia/Shanghai")
D, D1 = "2026-03-02", "2026-03-03"
DWD, DWS = AssetKey(["dwd", "order_detail"]), AssetKey(["dws", "user_order_daily"])
NOW = datetime(2026, 3, 4, 10, tzinfo=TZ)


def ods_rows(duplicate_on_d: bool) -> list[dict[str, Any]]:
    rows = []
    for day, base in ((2, 100), (3, 200)):
        for i in range(4):
            created = datetime(2026, 3, day, 9 + i, 30, tzinfo=TZ)
            rows.append(merged_order_row(base + i, 10 + i % 2, created, base + i))
    if duplicate_on_d:  # the same order twice in another hour of D (what a broken merge could leave)
        copy = dict(rows[0], hh="15", _pos=999)
        rows.append(copy)
    return rows


@dataclass
class Env:
    catalog: Catalog
    root: Path
    instance: DagsterInstance
    resources: dict[str, Any]
    engine: CenterTicker | None = None  # the main chain's engine, started before anything was built

    def write_ods(self, duplicate_on_d: bool) -> None:
        table = self.catalog["ods.order"]
        data = pa.Table.from_pylist(ods_rows(duplicate_on_d), schema=ods_arrow_schema(table))
        write_deltalake(str(self.root / "lake" / "ods" / "order"), data, partition_by=["dt", "hh"], mode="overwrite")

    def build(self, catalog: Catalog, key: AssetKey, partition: str) -> Any:
        return materialize(
            build_assets(catalog),
            instance=self.instance,
            resources=self.resources,
            selection=[key],
            partition_key=partition,
            raise_on_error=False,
        )

    def requested(self, catalog: Catalog, key: AssetKey, *, chain: bool = True, at: datetime = NOW) -> list[str]:
        """One engine step at the pinned time (or ``at``): the main chain's engine (``chain``), or an engine of its
        own over the whole history (for variant catalogs)."""
        table = next(t.fqn for t in catalog if AssetKey(t.key) == key)
        if chain:
            assert self.engine is not None
            return self.engine.tick(at).get(table, [])
        engine = CenterTicker(
            self.instance, catalog, [table], self.root / f"variant-{len(list(self.root.iterdir()))}.db"
        )
        try:
            return engine.tick(NOW)[table]
        finally:
            engine.close()

    def check_status(self, key: AssetKey, name: str) -> dict[str, bool]:
        records = self.instance.event_log_storage.get_asset_check_execution_history(AssetCheckKey(key, name), limit=20)
        status: dict[str, bool] = {}
        for record in reversed(records):  # oldest first, the latest evaluation per partition wins
            evaluation = record.evaluation
            if isinstance(evaluation, AssetCheckEvaluation) and evaluation.partition is not None:
                status[evaluation.partition] = evaluation.passed
        return status


@pytest.fixture(scope="module")
def env(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("quality")
    (root / "landing").mkdir()
    resources = resources_from_env(
        {"WAREHOUSE_LAKE_ROOT": str(root / "lake"), "WAREHOUSE_LANDING_ROOT": str(root / "landing")}
    )
    # in memory (no other process opens it): the 48 hours' reports and the builds' events cost ~20 ms each instead
    # of ~130 ms in instance_for_test's SQLite files
    with DagsterInstance.ephemeral() as instance:
        env = Env(load_catalog(), root, instance, resources)
        env.write_ods(duplicate_on_d=True)
        for day in (2, 3):  # the readiness sensor's reports of the 48 ODS hours
            for hour in range(24):
                instance.report_runless_asset_event(
                    AssetMaterialization(AssetKey(["ods", "order"]), partition=f"2026-03-{day:02d}-{hour:02d}:00")
                )
        env.engine = CenterTicker(instance, env.catalog)
        env.engine.tick(NOW)  # the engine's first step: the 48 hours are in, nothing built yet
        yield env
        env.engine.close()


def test_checks_are_declared_per_partition_and_blocking(env: Env) -> None:
    dwd = env.catalog["dwd.order_detail"]
    assert [c.name for c in dwd.checks] == ["unique", "not_null", "range", "row_count"]
    assert all(c.blocking for c in dwd.checks)
    gmv = env.catalog["ads.daily_gmv"]
    assert {c.name: c.blocking for c in gmv.checks}["anomaly"] is False


def test_a_dq_failure_on_d_blocks_d_downstream_but_not_d_plus_1(env: Env) -> None:
    bad = env.build(env.catalog, DWD, D)
    assert not bad.success  # a failed blocking check fails the step (Dagster's in-run gate) …
    good = env.build(env.catalog, DWD, D1)
    assert good.success
    assert env.instance.get_materialized_partitions(DWD) == {D, D1}  # … after the partition was written
    # the daemon's run retries would fail on the same data twice more: the run says it is not worth retrying
    assert env.instance.get_run_by_id(bad.run_id).tags.get(RETRY_ON_STEP_FAILURE_TAG) == "false"
    assert RETRY_ON_STEP_FAILURE_TAG not in env.instance.get_run_by_id(good.run_id).tags
    assert env.check_status(DWD, "unique") == {D: False, D1: True}
    unique = [
        r.evaluation
        for r in env.instance.event_log_storage.get_asset_check_execution_history(AssetCheckKey(DWD, "unique"), limit=5)
        if r.evaluation and r.evaluation.partition == D
    ][0]
    assert unique is not None
    assert unique.metadata["duplicated_keys"].value == 1 and unique.metadata["rows"].value == 5
    assert env.check_status(DWD, "row_count") == {D: True, D1: True}

    # later runs: D's downstream waits, D+1's runs
    assert env.requested(env.catalog, DWS) == [D1]

    # the manual-run guard refuses D with a clear message …
    refused = env.build(env.catalog, DWS, D)
    assert not refused.success
    failure = next(e for e in refused.all_events if e.event_type_value == "STEP_FAILURE")
    assert "failed a blocking data-quality check" in str(failure.event_specific_data)
    assert env.instance.get_run_by_id(refused.run_id).tags.get(RETRY_ON_STEP_FAILURE_TAG) == "false"
    assert "dwd.order_detail" in str(failure.event_specific_data)

    # … and why says so
    why = explain(
        env.instance,
        env.catalog,
        env.resources["lake"].store(),
        Landing(env.root / "landing"),
        "dws.user_order_daily",
        D,
    )
    assert [(u.partition, u.state) for u in why.upstream] == [(D, "check failed")]
    assert "unique" in why.upstream[0].detail


def test_an_ignore_dq_dependency_proceeds(env: Env) -> None:
    dws = env.catalog["dws.user_order_daily"]
    lenient = replace(dws, deps=tuple(replace(d, ignore_dq=True) for d in dws.deps))
    catalog = Catalog(tables={**env.catalog.tables, dws.fqn: lenient})
    assert env.check_status(DWD, "unique")[D] is False
    assert env.requested(catalog, DWS, chain=False) == [D, D1]
    result = env.build(catalog, DWS, D)  # the guard lets it through
    assert result.success
    assert D in env.instance.get_materialized_partitions(DWS)
    # the strict world's next tick: D is built now and nothing upstream changed, so nothing to run
    assert env.requested(env.catalog, DWS) == []


def test_fixing_the_data_and_rerunning_d_clears_the_block(env: Env) -> None:
    env.write_ods(duplicate_on_d=False)
    fixed = env.build(env.catalog, DWD, D)
    assert fixed.success
    assert env.check_status(DWD, "unique") == {D: True, D1: True}
    # D was built (on the failed day, through ignore_dq): the fixed day is late data for it, which its late-data
    # policy (the default for a key-local table: at most one rebuild in 15 minutes) rebuilds 15 minutes after the
    # engine saw it, once
    assert env.requested(env.catalog, DWS) == []
    assert env.requested(env.catalog, DWS, at=NOW + timedelta(minutes=14)) == []
    assert env.requested(env.catalog, DWS, at=NOW + timedelta(minutes=15)) == [D]  # updated and passed: D re-runs
    rerun = env.build(env.catalog, DWS, D)
    assert rerun.success
    assert env.check_status(DWS, "references")[D] is True


def test_arrow_and_spark_give_the_same_verdicts_on_row_local_checks(spark: SparkSession) -> None:
    """An ODS hour's row-local checks run on Arrow when the hours are small (the handoff's path) and on Spark
    otherwise: the same verdicts and numbers, hour by hour, on rows with every case the checks tell apart."""
    from warehouse_assets.catalog.checks import PARTITION, NotNull, Range, Unique, evaluate_grouped

    table = load_catalog()["ods.order"]
    checks = [
        Unique(),
        Unique(columns=("user_id", "status")),
        NotNull(columns=("id", "create_time", "pay_time")),
        Range(bounds=(("user_id", 1.0, 3.0), ("id", None, 7.0))),
    ]
    hours = ["2026-03-02-09:00", "2026-03-02-10:00", "2026-03-02-11:00", "2026-03-02-12:00"]
    created = datetime(2026, 3, 2, 9, 5, tzinfo=TZ)
    rows = [  # 09:00 clean; 10:00 a key three times, another twice, a null key twice, nulls; 11:00 one row; 12:00 none
        *[(hours[0], i, i, "paid", created) for i in range(5)],
        *[(hours[1], 7, 1, "paid", created)] * 3,
        *[(hours[1], 8, 2, "paid", None)] * 2,
        *[(hours[1], None, 3, None, created)] * 2,
        (hours[1], 9, 4, "created", None),
        (hours[2], 1, None, None, None),
    ]
    data = pa.table(
        {
            PARTITION: [r[0] for r in rows],
            "id": pa.array([r[1] for r in rows], pa.int64()),
            "user_id": pa.array([r[2] for r in rows], pa.int64()),
            "status": pa.array([r[3] for r in rows], pa.string()),
            "create_time": pa.array([r[4] for r in rows], pa.timestamp("us", tz="UTC")),
            "pay_time": pa.array([None] * len(rows), pa.timestamp("us", tz="UTC")),
        }
    )
    by_arrow = evaluate_grouped(table, checks, hours, data)
    by_spark = evaluate_grouped(table, checks, hours, spark.createDataFrame(data))
    assert len(by_arrow) == len(by_spark) == len(checks) * len(hours)

    def comparable(outcome: Any) -> tuple[Any, ...]:
        metadata = {k: getattr(v, "value", v) for k, v in outcome.metadata.items()}
        examples = sorted(metadata.pop("examples", []))  # Spark collects them in no defined order
        return outcome.check, outcome.partition, outcome.passed, metadata, outcome.description, len(examples)

    assert [comparable(o) for o in by_arrow] == [comparable(o) for o in by_spark]
    verdicts = {(o.check.name, o.partition): o.passed for o in by_arrow if o.check == checks[0]}
    assert verdicts == {
        ("unique", hours[0]): True,
        ("unique", hours[1]): False,
        ("unique", hours[2]): True,
        ("unique", hours[3]): True,
    }
    ten = next(o for o in by_arrow if o.check == checks[0] and o.partition == hours[1])
    # keys 7 (3 rows), 8 (2 rows) and the null key (2 rows) are duplicated; 2 null keys
    assert (ten.metadata["duplicated_keys"], ten.metadata["null_keys"], ten.metadata["rows"]) == (3, 2, 8)
    # user_id in [1, 3]: 09:00's 0 and 4 are outside, a null (11:00) is in no range; id above 7: 10:00's 8s and 9
    outside = {o.partition: o.metadata["outside"] for o in by_arrow if o.check == checks[3]}
    assert outside == {hours[0]: 2, hours[1]: 4, hours[2]: 0, hours[3]: 0}
    eleven = next(o for o in by_arrow if o.check == checks[3] and o.partition == hours[2])
    assert eleven.passed and eleven.metadata["columns"].value["user_id"]["min"] is None
    examples = {
        e
        for o in by_arrow + by_spark
        if o.check == checks[0] and o.partition == hours[1]
        for e in o.metadata["examples"].value
    }
    assert "{'id': 7, 'count': 3}" in examples
