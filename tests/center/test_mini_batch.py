"""Mini-batch tables: a table of a ``5min``, ``10min`` or ``15min`` period reads an ODS table window by window, and
each of its partitions runs as soon as the ODS table's completeness windows it covers are reported, not when the hour
is.

The catalog, the compiled asset graph and the dependency center's resolver over a temp-dir instance, at pinned times:
no Spark, no lake.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from dagster import AssetKey, AssetsDefinition, AssetSpec, DagsterInstance, TimeWindowPartitionMapping

from tests.center.test_center import Center, requested
from tests.support.small_catalog import ODS, assert_refused, sql_catalog
from warehouse_assets.catalog import Catalog, OdsWindows, upstream_partitions
from warehouse_assets.materialize.compiler import build_assets
from warehouse_assets.materialize.gate import MISSING, decide

TZ = ZoneInfo("Asia/Shanghai")
NOW = datetime(2026, 3, 6, 9, tzinfo=TZ)
TABLES = {
    "dws/m5.sql": ("period: 5min\n", "SELECT id FROM ods.src WHERE t >= '${start}'"),
    "dws/m10.sql": ("period: 10min\n", "SELECT id FROM ods.src"),
    "dws/m15.sql": ("period: 15min\n", "SELECT id FROM ods.src"),
    "dwd/day.sql": ("period: daily\n", "SELECT id FROM ods.src"),
}


@pytest.fixture
def instance(consolidated: DagsterInstance) -> DagsterInstance:
    return consolidated  # one SQLite event log (tests/conftest.py)


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    return sql_catalog(tmp_path_factory.mktemp("catalog"), TABLES)


def test_a_mini_batch_table_waits_for_the_ods_tables_windows_of_its_period_not_for_the_hour(catalog: Catalog) -> None:
    for period in ("5min", "10min", "15min"):
        windows = catalog[f"ods.src_{period}"]
        assert isinstance(windows, OdsWindows) and (windows.source, windows.period) == ("ods.src", period)
    assert [d.table for d in catalog["dws.m5"].deps] == ["ods.src_5min"]
    assert [d.table for d in catalog["dws.m15"].deps] == ["ods.src_15min"]
    assert [d.table for d in catalog["dwd.day"].deps] == ["ods.src"]  # an hourly roll-up stays on the hours
    m5 = catalog["dws.m5"]
    up = upstream_partitions(catalog, m5, m5.deps[0], "2026-03-06-08:55", current_time=NOW)
    assert (up.table, up.keys, up.nonexistent) == ("ods.src_5min", ["2026-03-06-08:55"], [])


def test_the_asset_graph_maps_windows_to_their_hour_and_cuts_mini_batch_partitions_every_n_minutes(
    catalog: Catalog,
) -> None:
    compiled = {key: a for a in build_assets(catalog) for key in ([a.key] if isinstance(a, AssetSpec) else a.keys)}
    m15 = compiled[AssetKey(["dws", "m15"])]
    assert isinstance(m15, AssetsDefinition) and m15.partitions_def is not None
    assert m15.partitions_def.get_partition_keys_between_indexes(0, 3) == [
        "2026-01-01-00:00",
        "2026-01-01-00:15",
        "2026-01-01-00:30",
    ]
    assert set(m15.dependency_keys) == {AssetKey(["ods", "src_15min"])}
    windows = compiled[AssetKey(["ods", "src_5min"])]
    assert isinstance(windows, AssetSpec) and windows.partitions_def is not None
    [dep] = windows.deps
    assert dep.asset_key == AssetKey(["ods", "src"]) and isinstance(dep.partition_mapping, TimeWindowPartitionMapping)
    hourly = compiled[AssetKey(["ods", "src"])].partitions_def
    assert hourly is not None
    upstream = dep.partition_mapping.get_upstream_mapped_partitions_result_for_partitions(
        windows.partitions_def.empty_subset().with_partition_keys(["2026-03-06-08:55"]), windows.partitions_def, hourly
    )
    assert list(upstream.partitions_subset.get_partition_keys()) == ["2026-03-06-08:00"]  # its hour's partition


class FakeStates:
    def __init__(self, done: dict[str, set[str]]):
        self.done = done

    def materialized(self, table, keys):  # type: ignore[no-untyped-def]
        return self.done.get(table.fqn, set()) & set(keys)

    def in_progress(self, table, keys):  # type: ignore[no-untyped-def]
        return set()

    def failed_blocking_checks(self, table, keys):  # type: ignore[no-untyped-def]
        return {}

    def tainted(self, table, keys):  # type: ignore[no-untyped-def]
        return {}

    def reached_states(self, table, keys):  # type: ignore[no-untyped-def]
        return dict.fromkeys(keys)

    def repair_running(self, backfill_id):  # type: ignore[no-untyped-def]
        return False


def test_the_gate_lets_a_15_minute_partition_run_once_its_three_windows_are_complete(catalog: Catalog) -> None:
    m15 = catalog["dws.m15"]
    windows = {"ods.src_15min": {"2026-03-06-08:30"}}
    assert decide(catalog, m15, "2026-03-06-08:30", FakeStates(windows), NOW).may_run
    waiting = decide(catalog, m15, "2026-03-06-08:45", FakeStates(windows), NOW)
    assert not waiting.may_run and waiting.edges[0].state("2026-03-06-08:45") == MISSING
    # the ODS hour itself reported changes nothing for it: it waits for the window
    assert not decide(catalog, m15, "2026-03-06-08:45", FakeStates({"ods.src": {"2026-03-06-08:00"}}), NOW).may_run


def test_a_5min_table_runs_per_window_as_each_is_reported(catalog: Catalog, instance: DagsterInstance) -> None:
    center = Center(instance, catalog)
    center.report("ods.src_5min", ["2026-03-06-08:50"])
    assert requested(center.step(NOW)) == {"dws.m5": [["2026-03-06-08:50"]]}
    center.report("ods.src_5min", ["2026-03-06-08:55"])
    center.report("ods.src_10min", ["2026-03-06-08:50"])
    assert requested(center.step(NOW)) == {"dws.m5": [["2026-03-06-08:55"]], "dws.m10": [["2026-03-06-08:50"]]}
    center.report("ods.src", ["2026-03-06-08:00"])  # the hour: the daily table still needs the others, m5 nothing
    assert requested(center.step(NOW)) == {}


def test_a_mini_batch_table_may_not_take_the_name_of_an_ods_tables_windows(tmp_path: Path) -> None:
    assert_refused(
        tmp_path,
        {
            "ods/src_5min.yaml": ODS.replace("ods.src", "ods.src_5min"),
            "dws/m5.sql": "/* ---\ntable: dws.m5\nperiod: 5min\n--- */\nSELECT id FROM ods.src\n",
        },
        "completeness windows are named ods.src_5min",
    )
