"""Replica assets: a table declaring ``replicate_to: dc2`` gets ``dc2/<layer>/<table>`` in group ``dc2`` with its
partitions; each partition built at site 1 is due for replication, published on site 2's lake by its replica run (one
commit each, verified, its lag recorded), read the same there by Spark and delta-rs; a tainted partition is refused
and left out until its repair, whose rebuild is replicated again; the replication sensor requests each built partition
once. Declarations and sites are validated."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from dagster import (
    AssetKey,
    AssetMaterialization,
    DagsterInstance,
    Definitions,
    build_sensor_context,
    instance_for_test,
    materialize,
)
from pyspark.sql import SparkSession

from resources import resources_from_env
from resources.delta_lake import DeltaStore
from resources.delta_replica import ReplicaSitesResource
from resources.settings import Settings
from sensors.replication import build_replication_sensor
from tests.support.small_catalog import VALUED_ODS, assert_refused, write
from warehouse_assets.catalog import CatalogError, load_catalog
from warehouse_assets.materialize.compiler import build_assets
from warehouse_assets.materialize.quality import latest_materialization
from warehouse_assets.materialize.replication import (
    REPLICA_RESOURCE,
    build_replica_assets,
    replication_due,
    replication_lags,
)
from warehouse_assets.materialize.validity import Taint, taint_evaluation

DAY = "2026-01-01"
HOURS = [f"{DAY}-{h:02d}:00" for h in range(3)]
SOURCE, REPLICA = AssetKey(["dwd", "hour"]), AssetKey(["dc2", "dwd", "hour"])
HOUR_SQL = """/* ---
table: dwd.hour
period: hourly
replicate_to: dc2
--- */
SELECT id, v FROM ods.src
"""


@pytest.fixture
def sites(tmp_path: Path, spark: SparkSession) -> dict[str, Any]:
    root = tmp_path / "catalog"
    write(root, "ods/src.yaml", VALUED_ODS)
    write(root, "dwd/hour.sql", HOUR_SQL)
    catalog = load_catalog(root)
    site1, site2 = tmp_path / "site1", tmp_path / "site2"
    resources = resources_from_env({"WAREHOUSE_LAKE_ROOT": str(site1), "WAREHOUSE_LANDING_ROOT": str(tmp_path)})
    resources[REPLICA_RESOURCE] = ReplicaSitesResource(roots={"dc2": str(site2)})
    _ods(spark, resources["lake"].store(), 1)
    assets = [*build_assets(catalog), *build_replica_assets(catalog, {"dc2": str(site2)})]
    return {"catalog": catalog, "resources": resources, "assets": assets, "site1": site1, "site2": site2}


def _ods(spark: SparkSession, store: DeltaStore, factor: int) -> None:
    at = [datetime.fromisoformat(f"{DAY}T{h:02d}:00") for h in range(3)]
    rows = [(i, at[h], i * factor, False, DAY, f"{h:02d}") for h in range(3) for i in range(4)]
    df = spark.createDataFrame(rows, "id bigint, t timestamp, v bigint, _deleted boolean, dt string, hh string")
    store.overwrite(["ods", "src"], df, ["dt", "hh"], [{"dt": DAY, "hh": f"{h:02d}"} for h in range(3)])


def _run(sites: dict[str, Any], instance: DagsterInstance, key: AssetKey, first: str, last: str) -> Any:
    return materialize(
        sites["assets"],
        instance=instance,
        resources=sites["resources"],
        selection=[key],
        tags={"dagster/asset_partition_range_start": first, "dagster/asset_partition_range_end": last},
        raise_on_error=False,
    )


def _rows(store: DeltaStore, hour: str) -> list[tuple[int, int]]:
    rows, _ = store.read_rows(["dwd", "hour"], [{"dt": DAY, "hh": hour}], columns=["id", "v"])
    return sorted((r["id"], r["v"]) for r in rows.to_pylist())


def test_built_partitions_are_replicated_one_commit_each_and_a_repair_reaches_the_replica(
    sites: dict[str, Any], spark: SparkSession
) -> None:
    site1, site2 = DeltaStore(str(sites["site1"])), DeltaStore(str(sites["site2"]))
    with instance_for_test() as instance:
        for hour in HOURS:
            instance.report_runless_asset_event(AssetMaterialization(AssetKey(["ods", "src"]), partition=hour))
        assert _run(sites, instance, SOURCE, HOURS[0], HOURS[-1]).success  # one ranged commit at site 1
        due = replication_due(instance, sites["catalog"], None)
        assert due.partitions == {REPLICA: HOURS}
        for n, hour in enumerate(HOURS):
            assert _run(sites, instance, REPLICA, hour, hour).success
            assert site2.version(["dwd", "hour"]) == n  # one replica commit per partition
        assert replication_due(instance, sites["catalog"], due.cursor).partitions == {}
        for hh in ("00", "01", "02"):
            assert _rows(site2, hh) == _rows(site1, hh) == [(i, i) for i in range(4)]
        by_spark = DeltaStore(str(sites["site2"])).read(spark, ["dwd", "hour"])[0].collect()
        assert sorted((r["id"], r["v"], r["hh"]) for r in by_spark) == sorted(
            (i, i, f"{h:02d}") for h in range(3) for i in range(4)
        )
        lags = replication_lags(instance, sites["catalog"])
        assert len(lags["dc2"]) == 3 and all(lag >= 0 for lag in lags["dc2"])

        # a taint at site 1: the replica run refuses the partition, and it is not due
        table = sites["catalog"]["dwd.hour"]
        record = latest_materialization(instance, table, HOURS[1])
        taint = Taint("amounts wrong", f"dwd.hour {HOURS[1]}", "test", record.timestamp)
        target = (record.storage_id, record.run_id, record.timestamp)
        instance.report_runless_asset_event(taint_evaluation(table, HOURS[1], taint, target))
        refused = _run(sites, instance, REPLICA, HOURS[1], HOURS[1])
        assert not refused.success
        # the repair: the source hour rebuilt from corrected data, due again, and the replica follows
        _ods(spark, DeltaStore(str(sites["site1"])), 10)
        assert _run(sites, instance, SOURCE, HOURS[1], HOURS[1]).success
        repaired = replication_due(instance, sites["catalog"], due.cursor)
        assert repaired.partitions == {REPLICA: [HOURS[1]]}
        assert _run(sites, instance, REPLICA, HOURS[1], HOURS[1]).success
        assert _rows(site2, "01") == _rows(site1, "01") == [(i, i * 10) for i in range(4)]
        assert _rows(site2, "00") == [(i, i) for i in range(4)]  # the others untouched


def test_the_replica_asset_has_its_own_group_and_the_sources_partitions(sites: dict[str, Any]) -> None:
    [replica] = [a for a in sites["assets"] if getattr(a, "key", None) == REPLICA]
    [source] = [a for a in sites["assets"] if getattr(a, "key", None) == SOURCE]
    assert replica.group_names_by_key[REPLICA] == "dc2"
    assert replica.partitions_def == source.partitions_def
    assert SOURCE in replica.dependency_keys


def test_a_replicated_table_needs_a_configured_site(tmp_path: Path) -> None:
    write(tmp_path, "ods/src.yaml", VALUED_ODS)
    write(tmp_path, "dwd/hour.sql", HOUR_SQL)
    catalog = load_catalog(tmp_path)
    assert catalog["dwd.hour"].replicate_to == ("dc2",)
    with pytest.raises(CatalogError, match=r"hour.sql: dwd.hour replicates to site 'dc2'.*\(dc3\)"):
        build_replica_assets(catalog, {"dc3": "/tmp/elsewhere"})
    assert build_replica_assets(load_catalog(_plain(tmp_path / "plain")), {}) == []


def _plain(root: Path) -> Path:
    write(root, "ods/src.yaml", VALUED_ODS)
    write(root, "dwd/hour.sql", HOUR_SQL.replace("replicate_to: dc2\n", ""))
    return root


def test_a_site_name_in_a_declaration_is_checked(tmp_path: Path) -> None:
    assert_refused(tmp_path, {"dwd/hour.sql": HOUR_SQL.replace("dc2", "DC 2")}, "replicate_to names sites")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("not json", "expected a JSON object of sites"),
        ('{"DC2": "/x"}', "site 'DC2': a site is named in lower case"),
        ('{"dc2": "ftp://host/lake"}', "unsupported scheme 'ftp'"),
        ('{"dc2": ""}', "its lake root must be a path or URI"),
        ('{"dc2": "data/lake"}', "is the lake root itself"),
    ],
)
def test_sites_are_validated_naming_the_variable(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        Settings.from_env({"WAREHOUSE_SITES": value})
    assert "WAREHOUSE_SITES" in str(info.value)
    roots = Settings.from_env({"WAREHOUSE_SITES": '{"dc2": "s3://bucket/lake", "dc3": "/data/dc3"}'}).site_roots
    assert roots == {"dc2": "s3://bucket/lake", "dc3": "/data/dc3"}


def test_the_sensor_requests_a_replica_run_per_built_partition_once(tmp_path: Path) -> None:
    write(tmp_path, "ods/src.yaml", VALUED_ODS)
    write(tmp_path, "dwd/hour.sql", HOUR_SQL)
    catalog = load_catalog(tmp_path)
    [sensor_def] = build_replication_sensor(catalog)
    assert build_replication_sensor(load_catalog(_plain(tmp_path / "plain"))) == []
    assets = [*build_assets(catalog), *build_replica_assets(catalog, {"dc2": str(tmp_path / "site2")})]
    lake = {"WAREHOUSE_LAKE_ROOT": str(tmp_path / "site1"), "WAREHOUSE_LANDING_ROOT": str(tmp_path)}
    resources = {**resources_from_env(lake), REPLICA_RESOURCE: ReplicaSitesResource(roots={"dc2": "/x"})}
    defs = Definitions(assets=assets, sensors=[sensor_def], resources=resources)
    tick = sensor_def.evaluate_tick
    with instance_for_test() as instance:
        for hour in HOURS[:2]:
            instance.report_runless_asset_event(AssetMaterialization(SOURCE, partition=hour))
        first = tick(build_sensor_context(instance=instance, definitions=defs))
        assert [(r.asset_selection, r.partition_key) for r in first.run_requests or []] == [
            ([REPLICA], HOURS[0]),
            ([REPLICA], HOURS[1]),
        ]
        again = tick(build_sensor_context(instance=instance, cursor=first.cursor, definitions=defs))
        assert again.run_requests == []
        instance.report_runless_asset_event(AssetMaterialization(SOURCE, partition=HOURS[0]))  # rebuilt
        rebuilt = sensor_def.evaluate_tick(
            build_sensor_context(instance=instance, cursor=first.cursor, definitions=defs)
        )
        assert [r.partition_key for r in rebuilt.run_requests or []] == [HOURS[0]]
