"""Regional days: a daily table that declares regions has one partition per region each day, [that region's midnight,
the next one), built as soon as the hours in it are in; a daily table reading it needs every region's day of the date,
so its day waits for the last region's.

The catalog, the exact mappings, the gate and the dependency center's resolver over a temp-dir instance, at pinned
times with pinned history: no Spark, no lake. The business time zone is Asia/Shanghai (UTC+8, no daylight saving);
Los Angeles keeps daylight saving time: 2026-03-08 has 23 hours there, 2026-11-01 has 25.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pyarrow as pa
import pytest
from dagster import (
    AssetKey,
    AssetMaterialization,
    AssetsDefinition,
    DagsterInstance,
    MultiPartitionsDefinition,
    partition_loading_context,
)
from deltalake import write_deltalake

from resources.delta_lake import DeltaStore
from resources.landing import Landing
from tests.center.test_center import Center, requested
from tests.center.test_mini_batch import FakeStates
from tests.center.test_state_store import report
from tests.support.small_catalog import assert_refused, sql_catalog
from warehouse_assets.catalog import (
    Catalog,
    PartitionKeyError,
    check_partition_key,
    partition_key_from_values,
    partition_values_of,
    partition_window,
    partitions_def_of,
    upstream_partitions,
)
from warehouse_assets.catalog import periods as catalog_periods
from warehouse_assets.center.reconcile import TableReconciliation, reconcile
from warehouse_assets.center.reverse_index import ReverseIndex
from warehouse_assets.center.state_store import PartitionStateStore
from warehouse_assets.center.taint import root_keys
from warehouse_assets.explain.status import status_keys, status_lines
from warehouse_assets.explain.why import NOT_YET, explain
from warehouse_assets.materialize.buildable import never_buildable
from warehouse_assets.materialize.compiler import build_assets
from warehouse_assets.materialize.gate import NONEXISTENT, decide

TZ = ZoneInfo("Asia/Shanghai")
REGIONS = "regions: {shanghai: Asia/Shanghai, karachi: Asia/Karachi, utc: UTC, los_angeles: America/Los_Angeles}\n"
TABLES = {
    "ads/dau_by_region.sql": (f"period: daily\n{REGIONS}", "SELECT count(DISTINCT id) AS dau FROM ods.src"),
    "ads/global_dau.sql": ("period: daily\n", "SELECT sum(dau) AS dau FROM ads.dau_by_region"),
}
DAY = "2026-03-06"


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    return sql_catalog(tmp_path_factory.mktemp("catalog"), TABLES)


@pytest.fixture
def instance(consolidated: DagsterInstance) -> DagsterInstance:
    return consolidated  # one SQLite event log (tests/conftest.py)


def hours_between(first: datetime, count: int) -> list[str]:
    """``count`` hourly partition keys (business time) from ``first`` on."""
    return [(first + timedelta(hours=n)).astimezone(TZ).strftime("%Y-%m-%d-%H:00") for n in range(count)]


def at(text: str) -> datetime:
    """A business-time instant, ``2026-03-07 08:00``."""
    return datetime.fromisoformat(text).replace(tzinfo=TZ)


def hours_of(catalog: Catalog, key: str, now: datetime) -> list[str]:
    table = catalog["ads.dau_by_region"]
    up = upstream_partitions(catalog, table, table.deps[0], key, current_time=now)
    assert up.nonexistent == []
    return up.keys


def test_each_regions_day_reads_exactly_the_hours_between_its_midnights(catalog: Catalog) -> None:
    later = at("2026-03-10 00:00")
    # Shanghai's midnight is the business one; Karachi's is 03:00 there, UTC's 08:00, Los Angeles' (PST) 16:00
    assert hours_of(catalog, f"{DAY}|shanghai", later) == hours_between(at(f"{DAY} 00:00"), 24)
    assert hours_of(catalog, f"{DAY}|karachi", later) == hours_between(at(f"{DAY} 03:00"), 24)
    assert hours_of(catalog, f"{DAY}|utc", later) == hours_between(at(f"{DAY} 08:00"), 24)
    assert hours_of(catalog, f"{DAY}|los_angeles", later) == hours_between(at(f"{DAY} 16:00"), 24)
    la = partition_window(catalog["ads.dau_by_region"], f"{DAY}|los_angeles")
    assert (la.start.isoformat(), la.end.isoformat()) == ("2026-03-06T00:00:00-08:00", "2026-03-07T00:00:00-08:00")


def test_a_daylight_saving_day_is_23_or_25_hours_in_its_region_only(catalog: Catalog) -> None:
    table = catalog["ads.dau_by_region"]
    spring = hours_of(catalog, "2026-03-08|los_angeles", at("2026-03-10 00:00"))
    assert spring == hours_between(at("2026-03-08 16:00"), 23)  # 00:00 PST to 00:00 PDT
    autumn = hours_of(catalog, "2026-11-01|los_angeles", at("2026-11-03 00:00"))
    assert autumn == hours_between(at("2026-11-01 15:00"), 25)  # 00:00 PDT to 00:00 PST
    window = partition_window(table, "2026-11-01|los_angeles")
    assert window.end.timestamp() - window.start.timestamp() == 25 * 3600
    assert len(hours_of(catalog, "2026-11-01|utc", at("2026-11-03 00:00"))) == 24
    # the gate waits for the 25th hour, and lets the 23-hour day run on its 23
    now = at("2026-11-03 00:00")
    autumn_day = decide(catalog, table, "2026-11-01|los_angeles", FakeStates({"ods.src": set(autumn[:24])}), now)
    assert not autumn_day.may_run and autumn_day.edges[0].missing == autumn[24:]
    assert decide(catalog, table, "2026-11-01|los_angeles", FakeStates({"ods.src": set(autumn)}), now).may_run
    spring_day = decide(catalog, table, "2026-03-08|los_angeles", FakeStates({"ods.src": set(spring)}), now)
    assert spring_day.may_run


def test_the_global_day_is_every_regions_day_of_its_date_each_existing_once_that_day_ends(catalog: Catalog) -> None:
    table = catalog["ads.global_dau"]
    up = upstream_partitions(catalog, table, table.deps[0], DAY, current_time=at("2026-03-07 08:00"))
    assert up.keys == [f"{DAY}|shanghai", f"{DAY}|karachi", f"{DAY}|utc"]
    assert up.nonexistent == [f"{DAY}|los_angeles"]  # its midnight is 16:00 business time


def test_the_first_regions_days_build_while_the_global_day_waits_for_the_last_region(
    catalog: Catalog, instance: DagsterInstance
) -> None:
    center = Center(instance, catalog)
    # 08:00 on the 7th (midnight UTC): Shanghai's, Karachi's and UTC's days of the 6th have ended and their hours are in
    morning = at("2026-03-07 08:00")
    center.report("ods.src", hours_between(at(f"{DAY} 00:00"), 32))
    first = requested(center.step(morning))
    assert {k: sorted(runs) for k, runs in first.items()} == {
        "ads.dau_by_region": [[f"{DAY}|karachi"], [f"{DAY}|shanghai"], [f"{DAY}|utc"]]
    }
    center.report("ads.dau_by_region", [f"{DAY}|shanghai", f"{DAY}|karachi", f"{DAY}|utc"])
    assert center.step(morning) == []  # three regions built: the global day waits for Los Angeles
    global_dau = catalog["ads.global_dau"]
    built = {"ads.dau_by_region": {f"{DAY}|shanghai", f"{DAY}|karachi", f"{DAY}|utc"}}
    waiting = decide(catalog, global_dau, DAY, FakeStates(built), morning)
    assert not waiting.may_run and waiting.edges[0].state(f"{DAY}|los_angeles") == NONEXISTENT
    # 16:00: Los Angeles' midnight; its last hours in, its day builds, and only then the global day
    afternoon = at("2026-03-07 16:00")
    center.report("ods.src", hours_between(at("2026-03-07 08:00"), 8))
    assert requested(center.step(afternoon)) == {"ads.dau_by_region": [[f"{DAY}|los_angeles"]]}
    center.report("ads.dau_by_region", [f"{DAY}|los_angeles"])
    assert requested(center.step(afternoon)) == {"ads.global_dau": [[DAY]]}


def test_a_late_hour_reaches_the_regions_days_holding_it_and_their_global_days(catalog: Catalog) -> None:
    index = ReverseIndex.build(catalog, current_time=at("2026-03-08 00:00"))
    now = at("2026-03-08 00:00")
    # 10:00 business time on the 6th is in the 6th of Shanghai, Karachi and UTC, and in the 5th of Los Angeles
    expected = [f"{DAY}|shanghai", f"{DAY}|karachi", f"{DAY}|utc", "2026-03-05|los_angeles"]
    assert sorted(index.downstream_of("ods.src", f"{DAY}-10:00", now)["ads.dau_by_region"]) == sorted(expected)
    assert index.downstream_of("ads.dau_by_region", f"{DAY}|los_angeles", now) == {"ads.global_dau": [DAY]}
    closure = index.closure({"ods.src": [f"{DAY}-10:00"]}, now)
    assert sorted(closure["ads.dau_by_region"]) == sorted(expected)
    assert closure["ads.global_dau"] == ["2026-03-05", DAY]


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("period: daily\nregions: {mumbai: Asia/Kolkata}\n", "Asia/Kolkata is \\+0530 .* not a whole number of hours"),
        ("period: daily\nregions: {mars: Mars/Olympus}\n", "'Mars/Olympus' is not an IANA time zone"),
        ("period: hourly\nregions: {utc: UTC}\n", "period must be daily"),
        ("period: daily\nregions: {utc: UTC}\ndepends_on:\n  ods.src: {set: [-1]}\n", "takes no offsets"),
        ('period: daily\nregions: {utc: UTC}\nsla: {deadline: "09:00"}\n', "declares no sla"),
        (
            "period: daily\nregions: {utc: UTC}\nchecks:\n  anomaly: {metric: count(*), max_deviation: 0.5}\n",
            "declares no anomaly check",
        ),
    ],
)
def test_a_regions_declaration_that_cannot_be_exact_is_refused(tmp_path: Path, header: str, message: str) -> None:
    assert_refused(tmp_path, {"ads/r.sql": f"/* ---\ntable: ads.r\n{header}--- */\nSELECT id FROM ods.src\n"}, message)


def test_regions_read_hours_and_are_read_whole_by_a_day(tmp_path: Path) -> None:
    regional = f"/* ---\ntable: ads.r\nperiod: daily\n{REGIONS}--- */\nSELECT id FROM ods.src\n"
    day = "/* ---\ntable: dwd.day\nperiod: daily\n--- */\nSELECT id FROM ods.src\n"
    on_day = f"/* ---\ntable: ads.r\nperiod: daily\n{REGIONS}--- */\nSELECT id FROM dwd.day\n"
    assert_refused(tmp_path / "a", {"dwd/day.sql": day, "ads/r.sql": on_day}, "reads hourly tables only")
    t1 = "/* ---\ntable: ads.g\nperiod: daily\ndepends_on:\n  ads.r: {set: [-1]}\n--- */\nSELECT id FROM ads.r\n"
    assert_refused(tmp_path / "b", {"ads/r.sql": regional, "ads/g.sql": t1}, "reads a day of it whole")
    weekly = "/* ---\ntable: ads.g\nperiod: weekly\n--- */\nSELECT id FROM ads.r\n"
    assert_refused(tmp_path / "c", {"ads/r.sql": regional, "ads/g.sql": weekly}, "reads a day of it whole")


def test_a_table_with_regions_compiles_to_dagster_partitions_whose_keys_are_the_centers(catalog: Catalog) -> None:
    assets = {a.key: a for a in build_assets(catalog) if isinstance(a, AssetsDefinition)}
    regional = assets[AssetKey(["ads", "dau_by_region"])]
    pdef = regional.partitions_def
    assert isinstance(pdef, MultiPartitionsDefinition)
    keys = pdef.get_partition_keys(current_time=at("2026-03-07 08:00"))
    assert sorted(k for k in keys if k.startswith(DAY)) == sorted(
        f"{DAY}|{region}" for region in ("shanghai", "karachi", "utc", "los_angeles")
    )
    # its checks are per region's day too; the global day's asset stays a plain day of the business calendar
    assert {spec.partitions_def for spec in regional.check_specs} == {pdef}
    assert assets[AssetKey(["ads", "global_dau"])].partitions_def == catalog_periods().daily
    assert pdef.partitions_defs[0].partitions_def == catalog_periods().daily  # the dates: the business days


def test_a_region_ahead_of_the_business_time_zone_is_a_dagster_partition_once_its_day_ends(tmp_path: Path) -> None:
    east = sql_catalog(
        tmp_path, {"ads/r.sql": ("period: daily\nregions: {tokyo: Asia/Tokyo, utc: UTC}\n", "SELECT id FROM ods.src")}
    )
    pdef = partitions_def_of(east["ads.r"])
    with partition_loading_context(at("2026-03-06 23:30")):  # Tokyo's 6th ended at 23:00, the business 6th has not
        assert pdef.has_partition_key("2026-03-06|tokyo")


def test_a_regions_key_is_checked_as_one_regions_day(catalog: Catalog) -> None:
    table, now = catalog["ads.dau_by_region"], at("2026-03-07 08:00")
    check_partition_key(table, f"{DAY}|utc", now)  # UTC's 6th ended at 08:00
    wrong = {
        DAY: ("wrong_period", "each region's day, written YYYY-MM-DD|region with a region of shanghai, karachi, utc, "),
        f"{DAY}|mars": ("wrong_period", "names no region of the table"),
        "2026-13-45|utc": ("malformed", "is not a partition key"),
        "2025-12-31|utc": ("before_start", "can never exist"),
        f"{DAY}|los_angeles": ("unfinished", "that day ends at 2026-03-07 00:00 America/Los_Angeles"),
    }
    for key, (kind, message) in wrong.items():
        with pytest.raises(PartitionKeyError) as info:
            check_partition_key(table, key, now)
        assert (info.value.kind, message in info.value.message) == (kind, True), info.value.message


def test_why_and_status_take_a_regions_key(catalog: Catalog, instance: DagsterInstance, tmp_path: Path) -> None:
    lake, landing = DeltaStore(str(tmp_path / "lake")), Landing(tmp_path / "landing")
    morning = at("2026-03-07 08:00")
    utc_hours = hours_between(at(f"{DAY} 08:00"), 24)
    for hour in utc_hours[:23]:
        report(instance, AssetKey(["ods", "src"]), hour)
    why = explain(instance, catalog, lake, landing, "ads.dau_by_region", f"{DAY}|utc", current_time=morning)
    assert [u.partition for u in why.upstream] == utc_hours  # exactly the hours of UTC's day, 08:00 to 07:00
    assert [(u.table, u.partition) for u in why.upstream if u.blocks] == [("ods.src", utc_hours[-1])]
    assert [(c.table, c.partition) for c in why.root_causes] == [("ods.src", utc_hours[-1])]
    later = explain(instance, catalog, lake, landing, "ads.dau_by_region", f"{DAY}|los_angeles", current_time=morning)
    assert later.own_state == NOT_YET and "ends at 2026-03-07 00:00 America/Los_Angeles" in later.verdict
    # status: a day names every region's day of it; a region's day starts or ends a range
    regional = [f"{DAY}|{region}" for region in ("shanghai", "karachi", "utc", "los_angeles")]
    assert status_keys(catalog, "ads.dau_by_region", DAY, DAY, now=morning) == regional
    between = status_keys(catalog, "ads.dau_by_region", f"{DAY}|karachi", "2026-03-07|shanghai", now=morning)
    assert between == [*regional[1:], "2026-03-07|shanghai"]
    with pytest.raises(ValueError, match="'2026-03-06[|]mars' is not a partition of ads.dau_by_region"):
        status_keys(catalog, "ads.dau_by_region", f"{DAY}|mars", DAY, now=morning)
    report(instance, AssetKey(["ads", "dau_by_region"]), f"{DAY}|karachi")
    lines = status_lines(catalog, PartitionStateStore(instance).view(), "ads.dau_by_region", regional)
    assert lines[0].startswith("ads.dau_by_region (daily): 4 partition(s), 1 materialized")
    assert [line.split()[:2] for line in lines[1:]] == [
        [regional[0], "missing"],
        [regional[1], "materialized"],
        [regional[2], "missing"],
        [regional[3], "missing"],
    ]


def test_a_taint_takes_days_or_regions_days_as_its_ends(catalog: Catalog) -> None:
    regional = [f"{DAY}|{region}" for region in ("shanghai", "karachi", "utc", "los_angeles")]
    assert root_keys(catalog, "ads.dau_by_region", DAY, DAY) == regional
    assert root_keys(catalog, "ads.dau_by_region", f"{DAY}|utc", f"{DAY}|utc") == [f"{DAY}|utc"]
    with pytest.raises(ValueError, match="START must not come after END"):
        root_keys(catalog, "ads.dau_by_region", f"{DAY}|utc", f"{DAY}|karachi")
    with pytest.raises(ValueError, match="'2026-03-06-10:00' is not a partition of ads.dau_by_region"):
        root_keys(catalog, "ads.dau_by_region", f"{DAY}-10:00", DAY)


def test_a_regions_day_is_a_delta_partition_of_its_own_read_back_as_its_key(catalog: Catalog) -> None:
    """What the runner writes (``dt`` and ``region``) and what the reconciliation reads back from the lake."""
    table = catalog["ads.dau_by_region"]
    assert table.partition_by == ["dt", "region"]
    assert partition_values_of(table, f"{DAY}|utc") == {"dt": DAY, "region": "utc"}
    assert partition_key_from_values(table, {"dt": DAY, "region": "utc"}) == f"{DAY}|utc"
    for stray in ({"dt": DAY, "region": "mars"}, {"dt": DAY}, {"dt": "2026-13-45", "region": "utc"}):
        assert partition_key_from_values(table, stray) is None, stray
    with pytest.raises(ValueError, match="has no region 'mars'"):
        partition_values_of(table, f"{DAY}|mars")
    # a day of a table without regions stays its business day
    assert partition_key_from_values(catalog["ads.global_dau"], {"dt": DAY}) == DAY


def test_the_reconciliation_reads_each_regions_day_from_its_own_delta_partition(
    catalog: Catalog, instance: DagsterInstance, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    regions = ("shanghai", "karachi", "utc")
    rows = [{"dau": n, "dt": DAY, "region": region} for n, region in enumerate(regions)]
    write_deltalake(str(lake / "ads" / "dau_by_region"), pa.Table.from_pylist(rows), partition_by=["dt", "region"])
    table = catalog["ads.dau_by_region"]
    for region in regions:
        key = f"{DAY}|{region}"
        partitions = [{"partition": key, "rows": 1, "delta_version": 0}]
        metadata = {"rows": 1, "partitions": partitions}
        instance.report_runless_asset_event(AssetMaterialization(AssetKey(table.key), partition=key, metadata=metadata))

    def sweep() -> TableReconciliation:
        found = reconcile(instance, catalog, PartitionStateStore(instance), DeltaStore(str(lake)), [table], by="test")
        return found.tables[0]

    assert sweep().in_step  # each (dt, region) partition is the region's day built: none gone, none unknown
    [gone] = (lake / "ads" / "dau_by_region" / f"dt={DAY}" / "region=utc").glob("*.parquet")
    gone.unlink()
    found = sweep()
    assert (list(found.gone), found.unknown) == ([f"{DAY}|utc"], [])  # that region's day alone


def test_a_region_whose_first_day_starts_before_the_warehouse_can_never_build_it_nor_that_global_day(
    tmp_path: Path,
) -> None:
    # Tokyo's 2026-01-01 starts at 23:00 on 2025-12-31 business time, an hour before the warehouse's first
    east = sql_catalog(
        tmp_path,
        {
            "ads/r.sql": ("period: daily\nregions: {tokyo: Asia/Tokyo, utc: UTC}\n", "SELECT id FROM ods.src"),
            "ads/g.sql": ("period: daily\n", "SELECT id FROM ads.r"),
        },
    )
    regional, daily = east["ads.r"], east["ads.g"]
    assert "before the warehouse start 2026-01-01" in never_buildable(east, regional, "2026-01-01|tokyo")
    assert never_buildable(east, regional, "2026-01-02|tokyo") == ""
    assert never_buildable(east, regional, "2026-01-01|utc") == ""
    assert "it needs ads.r 2026-01-01|tokyo, which can never be built" in never_buildable(east, daily, "2026-01-01")
    assert never_buildable(east, daily, "2026-01-02") == ""


def test_why_names_the_last_regions_day_the_global_day_waits_for_and_when_it_ends(
    catalog: Catalog, instance: DagsterInstance, tmp_path: Path
) -> None:
    regional = AssetKey(catalog["ads.dau_by_region"].key)
    for region in ("shanghai", "karachi", "utc"):
        report(instance, regional, f"{DAY}|{region}")
    lake, landing = DeltaStore(str(tmp_path / "lake")), Landing(tmp_path / "landing")
    why = explain(instance, catalog, lake, landing, "ads.global_dau", DAY, current_time=at("2026-03-07 08:00"))
    first = f"first: ads.dau_by_region {DAY}|los_angeles"
    assert why.verdict.startswith(f"waiting for 1 of 4 upstream partition(s); {first}")
    [cause] = why.root_causes
    assert (cause.table, cause.partition, cause.state) == ("ads.dau_by_region", f"{DAY}|los_angeles", NONEXISTENT)
    assert "ends at 2026-03-07 16:00+08:00" in cause.detail
