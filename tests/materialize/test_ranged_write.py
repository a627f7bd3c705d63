"""A ranged run of a derived table writes its partitions in one Delta commit, and reports each of them as before.

A run over a range of partitions (a backfill, the engine's catch-up) computes every partition's query and replaces
exactly those partitions with one ``replaceWhere`` write. What the product says per partition does not change: one
materialization each, its own row count and Delta version in the run's metadata, its own check verdicts, a
partition outside the range untouched. A self-dependent table, whose partition reads the one before it, reads the
run's earlier partitions from their rows computed in the run, and writes them in one commit too.
"""

from __future__ import annotations

import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from dagster import AssetCheckKey, AssetKey, AssetMaterialization, instance_for_test, materialize
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from resources import resources_from_env
from tests.support.small_catalog import write
from warehouse_assets.catalog import load_catalog
from warehouse_assets.materialize.compiler import build_assets

DAY = "2026-01-01"  # the warehouse start: the self-dependent table's first partition needs no T-1
NEXT = "2026-01-02"
HOURS = [f"{DAY}-{h:02d}:00" for h in range(24)]
HOURLY = AssetKey(["dws", "hour"])
CUM = AssetKey(["dws", "cum"])

TABLES = {
    "ods/src.yaml": """table: ods.src
period: hourly
source: {database: db, tables: "src"}
primary_key: [id]
partition_time: t
columns: {id: bigint, t: timestamp, v: bigint}
""",
    "dws/hour.sql": """/* ---
table: dws.hour
period: hourly
depends_on:
  ods.src: {set: [0]}
checks:
  range: {v: [0, null]}
zorder: [id]
--- */
SELECT id, v FROM ods.src
""",
    "dws/cum.sql": """/* ---
table: dws.cum
period: daily
columns: {id: bigint, v: bigint}
depends_on:
  dws.cum: {set: [-1]}
--- */
SELECT id, sum(v) AS v FROM (SELECT id, v FROM ods.src UNION ALL SELECT id, v FROM dws.cum) GROUP BY id
""",
}


def _rows_in_hour(hour: int) -> int:
    """Hour h of the day holds h % 4 rows: some hours are empty, the others differ."""
    return hour % 4


@pytest.fixture(scope="module")
def source_lake(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lake holding ``ods.src``'s two days, written once for the module (one overwrite of its 48 hours)."""
    lake = tmp_path_factory.mktemp("ranged") / "lake"
    rows = []
    for day in (DAY, NEXT):
        for hour in range(24):
            for i in range(_rows_in_hour(hour)):
                # one negative value on the day's 05:00 (which holds 1 row): that hour's range check fails
                v = -1 if (day, hour) == (DAY, 5) else hour
                rows.append((i, datetime.fromisoformat(f"{day}T{hour:02d}:00"), v, False, day, f"{hour:02d}"))
    df = spark.createDataFrame(rows, "id bigint, t timestamp, v bigint, _deleted boolean, dt string, hh string")
    specs = [{"dt": d, "hh": f"{h:02d}"} for d in (DAY, NEXT) for h in range(24)]
    store = resources_from_env({"WAREHOUSE_LAKE_ROOT": str(lake)})["lake"].store()
    store.overwrite(["ods", "src"], df, ["dt", "hh"], specs)
    return lake


@pytest.fixture
def warehouse(tmp_path: Path, spark: SparkSession, source_lake: Path) -> dict[str, Any]:
    """The catalog and resources over a copy of the module's lake (the Delta log's paths are relative)."""
    root = tmp_path / "catalog"
    for rel, body in TABLES.items():
        write(root, rel, body)
    catalog = load_catalog(root)
    resources = resources_from_env(
        {"WAREHOUSE_LAKE_ROOT": str(tmp_path / "lake"), "WAREHOUSE_LANDING_ROOT": str(tmp_path)}
    )
    shutil.copytree(source_lake, tmp_path / "lake")
    return {"catalog": catalog, "resources": resources, "lake": tmp_path / "lake"}


def _run(warehouse: dict[str, Any], instance: Any, key: AssetKey, first: str, last: str) -> Any:
    return materialize(
        build_assets(warehouse["catalog"]),
        instance=instance,
        resources=warehouse["resources"],
        selection=[key],
        tags={"dagster/asset_partition_range_start": first, "dagster/asset_partition_range_end": last},
        raise_on_error=False,
    )


def _report_hours(instance: Any, days: list[str]) -> None:
    for day in days:
        for hour in range(24):
            instance.report_runless_asset_event(
                AssetMaterialization(AssetKey(["ods", "src"]), partition=f"{day}-{hour:02d}:00")
            )


def test_a_24_hour_ranged_run_is_one_delta_commit_and_each_hour_keeps_its_own_figures_and_checks(
    warehouse: dict[str, Any],
) -> None:
    path = str(warehouse["lake"] / "dws" / "hour")
    with instance_for_test() as instance:
        _report_hours(instance, [DAY, NEXT])
        # the next day's first hour, built before: outside the range, it must stay as it is
        outside = f"{NEXT}-01:00"
        assert _run(warehouse, instance, HOURLY, outside, outside).success
        files_outside = {f for f in DeltaTable(path).file_uris() if f"dt={NEXT}/hh=01" in f}
        assert files_outside
        before = DeltaTable(path).version()

        result = _run(warehouse, instance, HOURLY, HOURS[0], HOURS[-1])
        # the 05:00 range check is blocking and fails: the step fails after reporting every partition
        assert not result.success

        table = DeltaTable(path)
        history = [h for h in table.history() if h["version"] > before]
        assert len(history) == 1, [h["operation"] for h in history]  # one commit for the 24 hours, not 24
        assert table.version() == before + 1
        predicate = str(history[0]["operationParameters"])
        assert all(f"'{h:02d}'" in predicate for h in range(24)) and NEXT not in predicate
        assert {f for f in table.file_uris() if f"dt={NEXT}/hh=01" in f} == files_outside  # untouched

        # one materialization per hour, each with its own rows and the commit's version
        assert instance.get_materialized_partitions(HOURLY) == {*HOURS, outside}
        [record] = instance.fetch_materializations(HOURLY, limit=1).records
        metadata = record.asset_materialization.metadata  # type: ignore[union-attr]
        listed = {p["partition"]: p for p in metadata["partitions"].value}  # type: ignore[union-attr]
        assert {k: p["rows"] for k, p in listed.items()} == {k: _rows_in_hour(h) for h, k in enumerate(HOURS)}
        assert {p["delta_version"] for p in listed.values()} == {before + 1}
        assert all((p["files_added"] > 0) == (p["rows"] > 0) for p in listed.values())  # an empty hour: no file
        assert metadata["rows"].value == sum(_rows_in_hour(h) for h in range(24))
        assert metadata["partitions_written"].value == 24
        rows = warehouse["resources"]["lake"].store().read_rows(["dws", "hour"])[0].to_pylist()
        by_hour: dict[str, int] = {}
        for row in rows:
            by_hour[f"{row['dt']}-{row['hh']}:00"] = by_hour.get(f"{row['dt']}-{row['hh']}:00", 0) + 1
        assert by_hour == {
            **{k: _rows_in_hour(h) for h, k in enumerate(HOURS) if _rows_in_hour(h)},
            outside: _rows_in_hour(1),
        }

        # the range check judged each hour on its own rows: 05:00 failed, the others passed
        check = AssetCheckKey(HOURLY, "range")
        verdicts = {
            info.partition_key: info.latest_execution_status.value
            for info in instance.event_log_storage.get_asset_check_partition_info([check], partition_keys=HOURS)
        }
        assert verdicts == {k: ("FAILED" if k == f"{DAY}-05:00" else "SUCCEEDED") for k in HOURS}


def test_a_self_dependent_table_writes_its_chain_in_one_commit_each_day_reading_the_day_before(
    warehouse: dict[str, Any],
) -> None:
    path = str(warehouse["lake"] / "dws" / "cum")
    store = warehouse["resources"]["lake"].store()
    source = [(d, h, i) for d in (DAY, NEXT) for h in range(24) for i in range(_rows_in_hour(h))]
    first = {i: sum(-1 if (d, h) == (DAY, 5) else h for d, h, j in source if d == DAY and j == i) for i in range(3)}
    second = {i: first[i] + sum(h for d, h, j in source if d == NEXT and j == i) for i in range(3)}
    expected = {**{(DAY, i): v for i, v in first.items()}, **{(NEXT, i): v for i, v in second.items()}}

    def totals() -> dict[tuple[str, int], int]:
        return {(r["dt"], r["id"]): r["v"] for r in store.read_rows(["dws", "cum"])[0].to_pylist()}

    with instance_for_test() as instance:
        _report_hours(instance, [DAY, NEXT])
        assert _run(warehouse, instance, CUM, DAY, NEXT).success  # NEXT reads DAY as computed in the run, unwritten
        assert [h["operation"] for h in DeltaTable(path).history()] == ["WRITE"]
        assert totals() == expected
        [record] = instance.fetch_materializations(CUM, limit=1).records
        listed = record.asset_materialization.metadata["partitions"].value  # type: ignore[union-attr]
        assert [(p["partition"], p["rows"], p["delta_version"]) for p in listed] == [(DAY, 3, 0), (NEXT, 3, 0)]  # type: ignore[union-attr]
        # NEXT again on its own: its T-1 is read from Delta, as written by the first run
        assert _run(warehouse, instance, CUM, NEXT, NEXT).success
        assert [h["operation"] for h in DeltaTable(path).history()] == ["WRITE", "WRITE"]
        assert totals() == expected


def test_the_zorder_job_optimizes_its_partitions_in_one_commit_and_observes_each(
    warehouse: dict[str, Any], spark: SparkSession
) -> None:
    from dagster import DagsterEventType, EventRecordsFilter

    from warehouse_assets.materialize.zorder import build_zorder_job

    path = str(warehouse["lake"] / "dws" / "hour")
    hours = [f"{DAY}-{h:02d}:00" for h in (1, 2, 3)]  # 1, 2 and 3 rows
    with instance_for_test() as instance:
        _report_hours(instance, [DAY])
        for hour in hours:  # one run each: the partitions are written by three commits
            assert _run(warehouse, instance, HOURLY, hour, hour).success
        before = DeltaTable(path).version()
        run = build_zorder_job(warehouse["catalog"]).execute_in_process(
            run_config={"ops": {"zorder_partition_files": {"config": {"table": "dws.hour", "partitions": hours}}}},
            instance=instance,
            resources={"lake": warehouse["resources"]["lake"], "spark": warehouse["resources"]["spark"]},
        )
        assert run.success
        history = [h for h in DeltaTable(path).history() if h["version"] > before]
        assert [h["operation"] for h in history] == ["OPTIMIZE"]  # one for the three hours, not three
        predicate = str(history[0]["operationParameters"])
        assert "'hh IN (01,02,03)" in predicate and f"'dt = {DAY}" in predicate, predicate  # the three hours only
        observations = instance.get_event_records(EventRecordsFilter(DagsterEventType.ASSET_OBSERVATION, HOURLY))
        numbers = {r.partition_key: r.asset_observation.metadata for r in observations}  # type: ignore[union-attr]
        assert set(numbers) == set(hours)
        for metadata in numbers.values():
            assert metadata["files_removed"].value == metadata["files_before"].value >= 1
            assert metadata["files_after"].value == metadata["files_added"].value >= 1
            assert metadata["delta_version"].value == before + 1
            assert metadata["zorder_by"].value == "id"
        rows = warehouse["resources"]["lake"].store().read_rows(["dws", "hour"])[0].to_pylist()
        assert sorted((r["hh"], r["id"]) for r in rows) == [(f"{h:02d}", i) for h in (1, 2, 3) for i in range(h)]
