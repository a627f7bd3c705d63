"""The cumulative data kind: a table whose period of data (the week so far) is not its period of processing
(the day). Each day adds its own data to the day before's, and the first day of each week starts afresh; the
mechanism beneath it, a window kept inside a coarser period (``within: weekly``), also gives the week or month to
date of any daily table. Judged by the gate, the reverse index and the taint closure at pinned times, and by the
dependency center stepped on a temp-dir instance: no Spark.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from dagster import (
    AssetKey,
    AssetMaterialization,
    DagsterInstance,
    Definitions,
    ResourceDefinition,
    build_sensor_context,
)

from sensors.static import CODE_VERSION_TAG, build_static_sensor
from tests.center.test_center import Center, days, requested
from tests.materialize.test_gate import FakeStates
from tests.support.small_catalog import assert_refused, sql_catalog, write
from warehouse_assets.catalog import (
    CHANGED_AT,
    WHOLE,
    Catalog,
    DerivedTable,
    OdsTable,
    StaticTable,
    upstream_partitions,
)
from warehouse_assets.center.reverse_index import ReverseIndex
from warehouse_assets.center.state_store import PartitionStateStore
from warehouse_assets.materialize.compiler import build_assets, code_version
from warehouse_assets.materialize.gate import decide
from warehouse_assets.materialize.validity import Taint

TZ = ZoneInfo("Asia/Shanghai")
CUMULATIVE = "kind: cumulative\nresets: weekly\ncolumns: {id: bigint}\n"
TABLES = {
    "dwd/day.sql": ("period: daily\n", "SELECT id FROM ods.src"),
    "dws/week_so_far.sql": (
        f"period: daily\n{CUMULATIVE}depends_on:\n  dws.week_so_far: {{set: [-1]}}\n",
        "SELECT id FROM dwd.day UNION ALL SELECT id FROM dws.week_so_far",
    ),
    "ads/month_to_date.sql": (
        "period: daily\ndepends_on:\n  dwd.day: {range: [-30, 0], within: monthly}\n",
        "SELECT id FROM dwd.day",
    ),
}
MONDAY, TUESDAY, SUNDAY = "2026-03-09", "2026-03-10", "2026-03-15"


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    return sql_catalog(tmp_path_factory.mktemp("kinds"), TABLES)


def hours(day: str) -> list[str]:
    return [f"{day}-{h:02d}:00" for h in range(24)]


def at(day: str, clock: str = "12:00") -> datetime:
    return datetime.fromisoformat(f"{day}T{clock}").replace(tzinfo=TZ)


def needs(catalog: Catalog, table: str, upstream: str, key: str) -> list[str]:
    dep = next(d for d in catalog[table].deps if d.table == upstream)
    up = upstream_partitions(catalog, catalog[table], dep, key, current_time=at("2026-06-01"))
    assert up.nonexistent == []
    return up.keys


def test_a_cumulative_day_reads_the_day_before_except_on_the_first_day_of_its_week(catalog: Catalog) -> None:
    table = catalog["dws.week_so_far"]
    assert (table.kind, table.resets) == ("cumulative", "weekly")
    assert needs(catalog, "dws.week_so_far", "dws.week_so_far", TUESDAY) == [MONDAY]
    assert needs(catalog, "dws.week_so_far", "dws.week_so_far", SUNDAY) == ["2026-03-14"]
    assert needs(catalog, "dws.week_so_far", "dws.week_so_far", MONDAY) == []  # a new week: nothing before
    # the month to date: from the 1st, however long the declared window
    assert needs(catalog, "ads.month_to_date", "dwd.day", "2026-03-03") == days("2026-03-01", "2026-03-03")
    assert needs(catalog, "ads.month_to_date", "dwd.day", "2026-03-31") == days("2026-03-01", "2026-03-31")


def test_the_gate_lets_a_monday_run_without_the_sunday_before(catalog: Catalog) -> None:
    table = catalog["dws.week_so_far"]
    states = FakeStates({"dwd.day": {MONDAY, TUESDAY}})
    assert decide(catalog, table, MONDAY, states, current_time=at("2026-03-11")).may_run
    waiting = decide(catalog, table, TUESDAY, states, current_time=at("2026-03-11"))
    assert waiting.reasons == [
        f"dws.week_so_far {TUESDAY} waits for 1 partition(s) of dws.week_so_far that are not materialized: {MONDAY}"
    ]


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("kind: cumulative\ncolumns: {id: bigint}\n", "kind cumulative needs resets: the period whose start begins"),
        ("kind: cumulative\nresets: daily\ncolumns: {id: bigint}\n", "one of weekly, monthly; got 'daily'"),
        ("kind: static\n", "a static table has no period: its one partition is the whole table"),
        ("kind: weekly_sum\n", "kind must be one of time_series, cumulative, snapshot for a table built from SQL"),
        ("kind: snapshot\ncolumns: {id: bigint}\n", r"the previous partition's \(dws.w: \{set: \[-1\]\}\) with"),
        ("resets: weekly\n", "resets is for kind: cumulative"),
    ],
)
def test_a_wrong_kind_is_refused_naming_what_is_wrong(tmp_path: Path, header: str, message: str) -> None:
    sql = f"/* ---\ntable: dws.w\nperiod: daily\n{header}depends_on:\n  dws.w: {{set: [-1]}}\n--- */\n"
    sql += "SELECT id FROM ods.src UNION ALL SELECT id FROM dws.w\n"
    assert_refused(tmp_path, {"dws/w.sql": sql}, message)


def test_a_cumulative_table_reads_itself_at_t_minus_1(tmp_path: Path) -> None:
    sql = f"/* ---\ntable: dws.w\nperiod: daily\n{CUMULATIVE}--- */\nSELECT id FROM ods.src\n"
    assert_refused(tmp_path, {"dws/w.sql": sql}, r"the table reads itself at T-1 \(dws.w: \{set: \[-1\]\}\)")


def test_within_is_for_a_same_period_window(tmp_path: Path) -> None:
    sql = "/* ---\ntable: dws.w\nperiod: daily\ndepends_on:\n  ods.src: {range: [0, 23], within: weekly}\n--- */\n"
    assert_refused(tmp_path, {"dws/w.sql": sql + "SELECT id FROM ods.src\n"}, "it is for a dependency of the same")


def test_a_taint_reaches_the_rest_of_its_week_and_no_further(catalog: Catalog) -> None:
    now = at("2026-03-31", "00:00")
    closure = ReverseIndex.build(catalog, current_time=now).closure({"dwd.day": [TUESDAY]}, now)
    assert closure["dws.week_so_far"] == days(TUESDAY, SUNDAY)  # not next Monday: it starts afresh
    assert closure["ads.month_to_date"] == days(TUESDAY, "2026-03-30")  # to the end of the month that has ended
    closure = ReverseIndex.build(catalog, current_time=now).closure({"dwd.day": ["2026-02-27"]}, now)
    assert closure["ads.month_to_date"] == days("2026-02-27", "2026-02-28")


def test_the_engine_starts_each_week_afresh_and_chains_its_days(
    consolidated: DagsterInstance, catalog: Catalog
) -> None:
    center = Center(consolidated, catalog)
    now = at("2026-03-17")
    center.report("dwd.day", ["2026-03-15", MONDAY, TUESDAY, "2026-03-16"])
    # Mondays 9th and 16th start weeks, and Tuesday follows Monday in the same run; Sunday 15th waits for Saturday
    assert requested(center.step(now)).get("dws.week_so_far") == [[MONDAY, TUESDAY], ["2026-03-16"]]
    center.report("dws.week_so_far", [MONDAY, TUESDAY, "2026-03-16"])
    assert "dws.week_so_far" not in requested(center.step(now))
    center.report("dwd.day", days("2026-03-11", "2026-03-14"))
    # the rest of the week in one chain, and nothing of it reaches Monday 16th
    assert requested(center.step(now)).get("dws.week_so_far") == [days("2026-03-11", SUNDAY)]
    center.report("dws.week_so_far", days("2026-03-11", SUNDAY))
    assert "dws.week_so_far" not in requested(center.step(now))  # Sunday's end is no new data for Monday 16th


# --- snapshot: a dimension without a time column, its changes kept per binlog hour and consolidated each day ---

SNAPSHOT_ODS = """table: ods.item
period: hourly
kind: snapshot
source: {database: db, tables: "item"}
primary_key: [id]
columns: {id: bigint, price: int}
"""
SNAPSHOT_SQL = (
    "period: daily\nkind: snapshot\nprimary_key: [id]\ncolumns: {id: bigint, price: int}\n"
    "depends_on:\n  dwd.item_daily: {set: [-1]}\n",
    "SELECT id, price FROM (SELECT *, row_number() OVER (PARTITION BY id ORDER BY e DESC) AS n FROM ("
    "SELECT id, price, false AS gone, -1L AS e FROM dwd.item_daily "
    "UNION ALL SELECT id, price, _deleted, _es FROM ods.item)) WHERE n = 1 AND NOT gone",
)


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    root = tmp_path_factory.mktemp("snapshot")
    write(root, "ods/item.yaml", SNAPSHOT_ODS)
    return sql_catalog(root, {"dwd/item_daily.sql": SNAPSHOT_SQL})


def test_a_snapshot_ods_table_keeps_each_change_in_the_hour_of_its_binlog_time(snapshots: Catalog) -> None:
    ods = snapshots["ods.item"]
    assert isinstance(ods, OdsTable)
    assert (ods.kind, ods.partition_time, ods.changelog) == ("snapshot", CHANGED_AT, True)
    assert ods.row_key == ("id", CHANGED_AT)  # one row per key and change, not per key
    assert dict(ods.columns)[CHANGED_AT] == "timestamp"
    daily = snapshots["dwd.item_daily"]
    assert daily.kind == "snapshot"
    assert needs(snapshots, "dwd.item_daily", "ods.item", "2026-03-10") == hours("2026-03-10")
    assert needs(snapshots, "dwd.item_daily", "dwd.item_daily", "2026-03-10") == ["2026-03-09"]


@pytest.mark.parametrize(
    ("declaration", "message"),
    [
        (SNAPSHOT_ODS + "partition_time: t\n", "a snapshot ODS table is partitioned by each change's binlog time"),
        (SNAPSHOT_ODS.replace("price: int", "price: int, _changed_at: timestamp"), "do not declare it"),
        (SNAPSHOT_ODS.replace("kind: snapshot\n", ""), "partition_time is required: .* kind: snapshot"),
        (SNAPSHOT_ODS.replace("kind: snapshot", "kind: static"), "kind must be one of time_series, snapshot"),
    ],
)
def test_a_wrong_snapshot_ods_declaration_says_what_to_declare(tmp_path: Path, declaration: str, message: str) -> None:
    assert_refused(tmp_path, {"ods/item.yaml": declaration}, message)


def test_a_snapshot_day_waits_for_the_day_before_and_its_24_hours_of_changes(snapshots: Catalog) -> None:
    table, day = snapshots["dwd.item_daily"], "2026-03-10"
    now = at("2026-03-11")
    complete = FakeStates({"ods.item": set(hours(day)), "dwd.item_daily": {"2026-03-09"}})
    assert decide(snapshots, table, day, complete, current_time=now).may_run
    waiting = decide(snapshots, table, day, FakeStates({"ods.item": set(hours(day))}), current_time=now)
    assert waiting.reasons == [
        f"dwd.item_daily {day} waits for 1 partition(s) of dwd.item_daily that are not materialized: 2026-03-09"
    ]


def test_a_tainted_hour_of_changes_reaches_its_day_and_every_picture_after_it(snapshots: Catalog) -> None:
    now = at("2026-03-14", "00:00")
    index = ReverseIndex.build(snapshots, current_time=now)
    closure = index.closure({"ods.item": ["2026-03-10-07:00"]}, now)
    assert closure["dwd.item_daily"] == days("2026-03-10", "2026-03-13")  # each day's picture carries the last


def test_the_engine_builds_a_snapshot_day_once_its_hours_are_in(
    consolidated: DagsterInstance, snapshots: Catalog
) -> None:
    center = Center(consolidated, snapshots)
    now = at("2026-03-12")
    center.report("dwd.item_daily", ["2026-03-09"])
    center.report("ods.item", hours("2026-03-10")[:-1])
    assert "dwd.item_daily" not in requested(center.step(now))  # 23 of its 24 hours
    center.report("ods.item", hours("2026-03-10")[-1:])
    assert requested(center.step(now)).get("dwd.item_daily") == [["2026-03-10"]]


# --- static: one unpartitioned reference table, read whole by every partition of the tables that read it ---------

STATIC_SQL = (
    "kind: static\nprimary_key: [code]\ncolumns: {code: string, name: string}\n",
    "SELECT code, name FROM VALUES ('CN', 'China'), ('FR', 'France') AS t(code, name)",
)
NO_RESOURCES = {"spark": ResourceDefinition.none_resource(), "lake": ResourceDefinition.none_resource()}
READS_STATIC = ("period: daily\n", "SELECT s.id, c.name FROM dwd.day s LEFT JOIN dwd.country c ON s.id = 1")


@pytest.fixture(scope="module")
def statics(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    return sql_catalog(
        tmp_path_factory.mktemp("static"),
        {"dwd/country.sql": STATIC_SQL, "dwd/day.sql": TABLES["dwd/day.sql"], "ads/named.sql": READS_STATIC},
    )


def built_static(instance: DagsterInstance, catalog: Catalog, fqn: str) -> None:
    """The static table's run, as Dagster records it: a materialization of the unpartitioned asset."""
    instance.report_runless_asset_event(AssetMaterialization(AssetKey(catalog[fqn].key)))


def test_a_static_table_has_no_partitions_and_is_read_whole_without_an_offset(statics: Catalog) -> None:
    country, named = statics["dwd.country"], statics["ads.named"]
    assert isinstance(country, StaticTable) and country.kind == "static" and country.partition_by == []
    assert isinstance(named, DerivedTable)
    assert [d.table for d in named.deps] == ["dwd.day"]  # the partitioned dependencies: the index's edges
    assert [r.table for r in named.references] == ["dwd.country"]
    assert statics.statics() == [country] and statics.referencing("dwd.country") == [named]
    defs = Definitions(assets=build_assets(statics), resources=NO_RESOURCES)
    graph = defs.resolve_asset_graph()
    assert graph.get(AssetKey(["dwd", "country"])).partitions_def is None  # compiles to no partitions
    assert AssetKey(["dwd", "country"]) in graph.get(AssetKey(["ads", "named"])).parent_keys


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"dwd/country.sql": ("period: daily\n" + STATIC_SQL[0], STATIC_SQL[1])}, "a static table has no period"),
        ({"dwd/country.sql": (STATIC_SQL[0], "SELECT id AS code, 'x' AS name FROM ods.src")}, "it reads no table"),
        ({"dwd/country.sql": ("kind: static\n", STATIC_SQL[1])}, "a static table declares its columns"),
        ({"dwd/country.sql": (STATIC_SQL[0] + "checks: {unique: true}\n", STATIC_SQL[1])}, "checks is for"),
        (
            {
                "dwd/country.sql": STATIC_SQL,
                "ads/named.sql": (
                    "period: daily\ndepends_on:\n  dwd.country: {set: [-1]}\n",
                    "SELECT * FROM dwd.country",
                ),
            },
            "reads the static table dwd.country: it has no partitions, so its dependency takes no offsets",
        ),
    ],
)
def test_a_wrong_static_declaration_says_what_is_wrong(
    tmp_path: Path, files: dict[str, tuple[str, str]], message: str
) -> None:
    texts = {}
    for rel, (header, sql) in files.items():
        layer, name = rel.removesuffix(".sql").split("/")
        texts[rel] = f"/* ---\ntable: {layer}.{name}\n{header}--- */\n{sql}\n"
    assert_refused(tmp_path, texts, message)


def test_every_partition_waits_for_the_static_table_to_be_built_and_valid(statics: Catalog) -> None:
    table, day, now = statics["ads.named"], "2026-03-10", at("2026-03-11")
    waiting = decide(statics, table, day, FakeStates({"dwd.day": {day}}), current_time=now)
    assert waiting.reasons == [f"ads.named {day} waits for the static table dwd.country, which is not built yet"]
    built = FakeStates({"dwd.day": {day}, "dwd.country": {WHOLE}})
    verdict = decide(statics, table, day, built, current_time=now)
    assert verdict.may_run and [e.used for e in verdict.edges] == [[day], [WHOLE]]
    taint = Taint("wrong country names", "dwd.country", "ops", 0.0)
    refused = decide(statics, table, day, FakeStates(built.done, taints={"dwd.country": {WHOLE: taint}}), now)
    assert refused.reasons[0].startswith(f"ads.named {day} waits for 1 partition(s) of dwd.country that are tainted")


def test_the_state_store_keeps_the_static_tables_one_partition(consolidated: DagsterInstance, statics: Catalog) -> None:
    store = PartitionStateStore(consolidated)
    built_static(consolidated, statics, "dwd.country")
    [change] = store.update()
    assert (change.asset_key, change.partition, "materialized" in change.fields) == ("dwd/country", WHOLE, True)
    assert store.materialized(statics["dwd.country"], [WHOLE]) == {WHOLE}


def test_the_engine_starts_what_waited_for_a_static_table_once_it_is_built_and_rebuilds_nothing(
    consolidated: DagsterInstance, statics: Catalog
) -> None:
    center = Center(consolidated, statics)
    now = at("2026-03-12")
    center.report("dwd.day", ["2026-03-10"])
    assert "ads.named" not in requested(center.step(now))  # its day is in; the static table is not built
    built_static(consolidated, statics, "dwd.country")
    assert requested(center.step(now)).get("ads.named") == [["2026-03-10"]]  # the day that waited for it
    center.report("ads.named", ["2026-03-10"])
    center.report("dwd.day", ["2026-03-11"])
    assert requested(center.step(at("2026-03-13"))).get("ads.named") == [["2026-03-11"]]
    center.report("ads.named", ["2026-03-11"])
    # a new version of the reference data: read by the partitions built from now on, not a rebuild of history
    built_static(consolidated, statics, "dwd.country")
    assert "ads.named" not in requested(center.step(at("2026-03-13")))


def test_the_static_tables_sensor_builds_a_static_table_when_missing_and_when_its_sql_changes(
    consolidated: DagsterInstance, statics: Catalog
) -> None:
    [sensor] = build_static_sensor(statics)
    version = code_version(statics["dwd.country"])

    def requests() -> list[str]:
        definitions = Definitions(assets=build_assets(statics), sensors=[sensor], resources=NO_RESOURCES)
        context = build_sensor_context(instance=consolidated, definitions=definitions)
        result = sensor.evaluate_tick(context)
        return [f"{r.run_key} {r.tags.get('warehouse/lane')}" for r in result.run_requests or []]

    assert requests() == [f"dwd.country@{version} first_build"]  # never built: in the first builds' lane
    key = AssetKey(statics["dwd.country"].key)
    consolidated.report_runless_asset_event(AssetMaterialization(key, tags={CODE_VERSION_TAG: version}))
    assert requests() == []  # built from its SQL as it is
    consolidated.report_runless_asset_event(AssetMaterialization(key, tags={CODE_VERSION_TAG: "an-older-sql"}))
    assert requests() == [f"dwd.country@{version} rebuild"]  # its SQL changed since its latest build: a rebuild
    assert build_static_sensor(sql_catalog_without_statics(statics)) == []


def sql_catalog_without_statics(catalog: Catalog) -> Catalog:
    return Catalog({fqn: t for fqn, t in catalog.tables.items() if not t.is_static})
