"""Tables declared at a second site: each replica is a catalog table (``dc2.dwd_hour``) whose partitions the dependency
center knows from the replica runs, so a table declared ``site: dc2`` reading it is requested once its replicas are
published (not when the source is built), builds on the site's lake what the same SQL builds at site 1, and a taint at
site 1 reaches the replica and the site's table through the closure, repaired through to site 2. Declarations reading
across sites are refused."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from dagster import AssetKey, AssetMaterialization, DagsterInstance, instance_for_test, materialize
from pyspark.sql import SparkSession

from resources import resources_from_env
from resources.delta_lake import DeltaStore
from resources.delta_replica import ReplicaSitesResource
from tests.materialize.test_replication import HOUR_SQL, _ods
from tests.support.center_harness import CenterTicker
from tests.support.repair import apply_taint
from tests.support.small_catalog import ODS, VALUED_ODS, write
from warehouse_assets.catalog import CatalogError, ReplicaTable, load_catalog
from warehouse_assets.catalog.calendars import BY_PERIOD
from warehouse_assets.catalog.lineage import ColumnRef, WarehouseLineage
from warehouse_assets.materialize.compiler import build_assets, build_checks
from warehouse_assets.materialize.gate import InstanceStates, decide
from warehouse_assets.materialize.replication import REPLICA_RESOURCE, build_replica_assets, replication_due
from warehouse_assets.materialize.validity import tainted_in_instance

REPLICA, SITE_TABLE, SITE1_TABLE = "dc2.dwd_hour", "dws.doubled_dc2", "dws.doubled"
# the same SQL at both sites, each reading its own site's dwd.hour
DOUBLED = """/* ---
table: dws.doubled
period: hourly
--- */
SELECT id, v * 2 AS v2 FROM dwd.hour
"""
DOUBLED_DC2 = """/* ---
table: dws.doubled_dc2
period: hourly
site: dc2
--- */
SELECT id, v * 2 AS v2 FROM dc2.dwd_hour
"""
HOURS = ["2026-01-01-00:00", "2026-01-01-01:00"]
NOW = datetime(2026, 1, 1, 4, tzinfo=ZoneInfo(BY_PERIOD["hourly"].timezone or "UTC"))


@pytest.fixture
def sites(tmp_path: Path, spark: SparkSession) -> Iterator[dict[str, Any]]:
    root = tmp_path / "catalog"
    write(root, "ods/src.yaml", VALUED_ODS)
    write(root, "dwd/hour.sql", HOUR_SQL)
    write(root, "dws/doubled.sql", DOUBLED)
    write(root, "dws/doubled_dc2.sql", DOUBLED_DC2)
    catalog = load_catalog(root)
    site1, site2 = tmp_path / "site1", tmp_path / "site2"
    resources = resources_from_env({"WAREHOUSE_LAKE_ROOT": str(site1), "WAREHOUSE_LANDING_ROOT": str(tmp_path)})
    resources[REPLICA_RESOURCE] = ReplicaSitesResource(roots={"dc2": str(site2)})
    _ods(spark, resources["lake"].store(), 1)
    assets = [*build_assets(catalog), *build_replica_assets(catalog, {"dc2": str(site2)})]
    with instance_for_test() as instance:
        yield {
            "catalog": catalog,
            "resources": resources,
            "assets": assets,
            "checks": build_checks(catalog),
            "site1": DeltaStore(str(site1)),
            "site2": DeltaStore(str(site2)),
            "instance": instance,
        }


def _run(sites: dict[str, Any], table: str, keys: list[str]) -> None:
    instance: DagsterInstance = sites["instance"]
    result = materialize(
        [*sites["assets"], *sites["checks"]],
        instance=instance,
        resources=sites["resources"],
        selection=[AssetKey(sites["catalog"][table].key)],
        tags={"dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]},
    )
    assert result.success


def _replicate(sites: dict[str, Any], cursor: int | None) -> tuple[list[str], int]:
    """The replica runs the replication sensor requests after ``cursor``, executed: the hours published."""
    due = replication_due(sites["instance"], sites["catalog"], cursor)
    published = due.partitions.get(AssetKey(["dc2", "dwd", "hour"]), [])
    for hour in published:
        _run(sites, REPLICA, [hour])
    return published, due.cursor


def _rows(store: DeltaStore, key: list[str], hh: str) -> list[tuple[int, int]]:
    rows, _ = store.read_rows(key, [{"dt": "2026-01-01", "hh": hh}], columns=["id", "v2"])
    return sorted((r["id"], r["v2"]) for r in rows.to_pylist())


def test_the_replica_is_a_catalog_table_named_by_its_site_with_the_sources_partitions(sites: dict[str, Any]) -> None:
    catalog = sites["catalog"]
    replica = catalog[REPLICA]
    assert isinstance(replica, ReplicaTable) and replica.is_source
    assert replica.key == ["dc2", "dwd", "hour"] and replica.period == catalog["dwd.hour"].period
    assert [d.table for d in replica.deps] == ["dwd.hour"] and replica.columns == catalog["dwd.hour"].columns
    assert catalog[SITE_TABLE].site == "dc2" and catalog[SITE_TABLE].group == "dc2"
    [asset] = [a for a in sites["assets"] if getattr(a, "key", None) == AssetKey(catalog[SITE_TABLE].key)]
    assert AssetKey(["dc2", "dwd", "hour"]) in asset.dependency_keys


def test_a_site_table_starts_once_its_replicas_are_published_and_a_taint_is_repaired_through_to_it(
    sites: dict[str, Any], spark: SparkSession
) -> None:
    instance, catalog = sites["instance"], sites["catalog"]
    site1, site2 = sites["site1"], sites["site2"]
    engine = CenterTicker(instance, catalog, [REPLICA, SITE1_TABLE, SITE_TABLE])
    try:
        for hour in HOURS:
            instance.report_runless_asset_event(AssetMaterialization(AssetKey(["ods", "src"]), partition=hour))
        _run(sites, "dwd.hour", HOURS)
        # the source is built at site 1: its site-1 reader is requested, the site-2 table waits for the replicas
        assert engine.tick(NOW) == {REPLICA: [], SITE1_TABLE: HOURS, SITE_TABLE: []}
        _run(sites, SITE1_TABLE, HOURS)
        published, cursor = _replicate(sites, None)
        assert published == HOURS
        # requested by the replicas' publication; the replicas themselves are the replication sensor's to request
        assert engine.tick(NOW) == {REPLICA: [], SITE1_TABLE: [], SITE_TABLE: HOURS}
        _run(sites, SITE_TABLE, HOURS)
        for hh in ("00", "01"):
            assert _rows(site2, ["dws", "doubled_dc2"], hh) == _rows(site1, ["dws", "doubled"], hh)
            assert _rows(site2, ["dws", "doubled_dc2"], hh) == [(i, 2 * i) for i in range(4)]
        assert not site1.exists(["dws", "doubled_dc2"])  # built on the site's lake only

        # a taint at site 1: the closure reaches the replica and the site-2 table
        bad = HOURS[1]
        apply_taint(instance, catalog, "dwd.hour", bad, bad, "amounts wrong")
        for fqn in ("dwd.hour", REPLICA, SITE1_TABLE, SITE_TABLE):
            assert set(tainted_in_instance(instance, catalog[fqn], HOURS)) == {bad}, fqn
        # the source repaired at site 1: the site-2 table still waits for the replica published again
        _ods(spark, site1, 10)
        _run(sites, "dwd.hour", [bad])
        _run(sites, SITE1_TABLE, [bad])
        verdict = decide(catalog, catalog[SITE_TABLE], bad, InstanceStates(instance))
        assert not verdict.may_run and verdict.waits_for_repair, verdict.reasons
        published, cursor = _replicate(sites, cursor)
        assert published == [bad]
        assert tainted_in_instance(instance, catalog[REPLICA], HOURS) == {}
        assert decide(catalog, catalog[SITE_TABLE], bad, InstanceStates(instance)).may_run
        _run(sites, SITE_TABLE, [bad])
        assert _rows(site2, ["dws", "doubled_dc2"], "01") == _rows(site1, ["dws", "doubled"], "01")
        assert _rows(site2, ["dws", "doubled_dc2"], "01") == [(i, 20 * i) for i in range(4)]
        assert _rows(site2, ["dws", "doubled_dc2"], "00") == [(i, 2 * i) for i in range(4)]
        assert tainted_in_instance(instance, catalog[SITE_TABLE], HOURS) == {}
    finally:
        engine.close()


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"dws/x.sql": DOUBLED.replace("doubled", "x").replace("period", "site: dc2\nperiod")}, "at site dc2 and reads "
         "dwd.hour, which is at the first site: read its replica dc2.dwd_hour"),
        ({"dws/x.sql": DOUBLED_DC2.replace("doubled_dc2", "x").replace("site: dc2\n", "")}, "dws.x is at the first "
         "site .* and reads dc2.dwd_hour, which is at site dc2"),
        ({"ods/src.yaml": ODS + "replicate_to: dc2\n", "dws/x.sql": DOUBLED_DC2.replace("doubled_dc2", "x").replace(
            "dc2.dwd_hour", "dc2.ods_src")}, "dws.x reads dc2.ods_src, the replica of an ODS table"),
    ],
)  # fmt: skip
def test_a_table_reads_the_tables_of_its_own_site_only(tmp_path: Path, files: dict[str, str], message: str) -> None:
    write(tmp_path, "ods/src.yaml", files.pop("ods/src.yaml", ODS))
    for rel, text in {"dwd/hour.sql": HOUR_SQL, **files}.items():
        write(tmp_path, rel, text)
    with pytest.raises(CatalogError, match=message) as info:
        load_catalog(tmp_path)
    assert str(tmp_path) in str(info.value)


def test_the_column_lineage_follows_a_site_table_through_its_replica_to_the_source(tmp_path: Path) -> None:
    """A replica is a copy of its source's files: its columns are the source's, each copied from the source's own.
    The lineage of every table (computed when the code location loads) reaches through it, instead of asking the
    replica's columns of the replica again without end."""
    write(tmp_path, "ods/src.yaml", VALUED_ODS)
    write(tmp_path, "dwd/hour.sql", HOUR_SQL)
    write(tmp_path, "dws/doubled_dc2.sql", DOUBLED_DC2)
    lineage = WarehouseLineage(load_catalog(tmp_path))
    assert {t.table for t in lineage.all()} >= {REPLICA, SITE_TABLE}
    assert lineage.columns(REPLICA) == lineage.columns("dwd.hour")
    assert lineage.of(REPLICA).upstream_of("v") == {ColumnRef("dwd.hour", "v")}
    assert lineage.of(SITE_TABLE).upstream_of("v2") == {ColumnRef(REPLICA, "v")}
