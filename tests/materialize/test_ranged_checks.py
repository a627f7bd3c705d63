"""The checks of a ranged write judge each partition as a run of its own would, for a few Spark jobs in all.

A ranged run writes its partitions in one Delta commit, then evaluates the table's checks on all of them
(warehouse_assets/materialize/written_checks.py): ``references``, ``row_count`` and ``anomaly`` count every partition
at once, not two or three Spark jobs per partition each. A daily table with the three over six days of an hourly
source, whose days pass and fail each check in turn (a day without rows, a ratio under its floor, a sum far from its
trailing mean, a key its input lacks): built one run per day or in one ranged run, every day gets the same verdicts
with the same numbers, those each kind's own evaluation of the one partition gives; and the checks of a six-day write
cost no more Spark jobs than those of a two-day write.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from dagster import AssetKey, AssetMaterialization, DagsterInstance, materialize
from pyspark.sql import SparkSession

from resources import resources_from_env
from resources.delta_lake import DeltaStore, Predicate
from tests.support.small_catalog import VALUED_ODS, write
from warehouse_assets.catalog import load_catalog
from warehouse_assets.materialize import runner
from warehouse_assets.materialize.compiler import build_assets

DAYS = [f"2026-01-0{d}" for d in range(1, 7)]
DAY_TABLE = AssetKey(["dws", "day"])
# each day's source values, one row per hour from 00:00 (ids 0, 1, ...); the table keeps the non-negative ones, each
# id one more than its source's: a day of 4 rows has an id (4) its source lacks
VALUES = {
    DAYS[0]: [10, 10, 10, 10],
    DAYS[1]: [10, 10, 10, 10],
    DAYS[2]: [10, 10, 10, -5],  # 3 of 4 rows kept (ids 1-3, all in the source): a ratio under 0.9
    DAYS[3]: [],  # no rows: under min_rows, and a sum of 0 against a trailing mean of 33
    DAYS[4]: [100, 100, 100, 100],  # a sum ten times its trailing mean (the empty day is no period)
    DAYS[5]: [10, 10, 10, 10],
}
TABLES = {
    "ods/src.yaml": VALUED_ODS,
    "dws/day.sql": """/* ---
table: dws.day
period: daily
depends_on:
  ods.src: {range: [0, 23]}
checks:
  references: {id: ods.src.id, blocking: false}
  row_count: {upstream: ods.src, min_ratio: 0.9, max_ratio: 1.0, min_rows: 1, blocking: false}
  anomaly: {metric: sum(v), max_deviation: 0.5, periods: 3, min_periods: 2, blocking: false}
--- */
SELECT id + 1 AS id, v FROM ods.src WHERE v >= 0
""",
}

Verdicts = dict[tuple[str, str], tuple[bool, str, dict[str, Any]]]


@pytest.fixture(scope="module")
def source_lake(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lake holding ``ods.src``'s six days, written once for the module."""
    lake = tmp_path_factory.mktemp("ranged-checks") / "lake"
    rows = [
        (i, datetime.fromisoformat(f"{day}T{i:02d}:00"), v, False, day, f"{i:02d}")
        for day, values in VALUES.items()
        for i, v in enumerate(values)
    ]
    df = spark.createDataFrame(rows, "id bigint, t timestamp, v bigint, _deleted boolean, dt string, hh string")
    specs = [{"dt": d, "hh": f"{h:02d}"} for d in DAYS for h in range(24)]
    store = resources_from_env({"WAREHOUSE_LAKE_ROOT": str(lake)})["lake"].store()
    store.overwrite(["ods", "src"], df, ["dt", "hh"], specs)
    return lake


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    """An in-memory instance (the runs need no other process) holding ``ods.src``'s hours, reported once: no SQLite
    database created per run, no disk sync per stored event."""
    with DagsterInstance.ephemeral() as instance:
        for day in DAYS:
            for hour in range(24):
                instance.report_runless_asset_event(
                    AssetMaterialization(AssetKey(["ods", "src"]), partition=f"{day}-{hour:02d}:00")
                )
        yield instance


@pytest.fixture
def build(tmp_path: Path, source_lake: Path) -> Callable[[Any, str, str], Any]:
    """A ranged run of ``dws.day`` (first .. last) on a copy of the module's lake."""
    root = tmp_path / "catalog"
    for rel, body in TABLES.items():
        write(root, rel, body)
    assets = build_assets(load_catalog(root))
    lake = {"WAREHOUSE_LAKE_ROOT": str(tmp_path / "lake"), "WAREHOUSE_LANDING_ROOT": str(tmp_path)}
    resources = resources_from_env(lake)
    shutil.copytree(source_lake, tmp_path / "lake")

    def run(instance: Any, first: str, last: str) -> Any:
        span = {"dagster/asset_partition_range_start": first, "dagster/asset_partition_range_end": last}
        result = materialize(assets, instance=instance, resources=resources, selection=[DAY_TABLE], tags=span)
        assert result.success
        return result

    return run


def verdicts(result: Any) -> Verdicts:
    """Each (check, partition)'s verdict in the run: passed, its description, its numbers."""
    return {
        (e.check_name, str(e.partition)): (e.passed, e.description or "", {k: v.value for k, v in e.metadata.items()})
        for e in result.get_asset_check_evaluations()
    }


def evaluated_alone(spark: SparkSession, lake: Path) -> Verdicts:
    """Each check's verdict on each day from the kind's own one-partition evaluation (``Check.evaluate``), on the
    rows as written, the day's source hours and its trailing days."""
    store = resources_from_env({"WAREHOUSE_LAKE_ROOT": str(lake)})["lake"].store()
    table = load_catalog(lake.parent / "catalog")["dws.day"]
    found: Verdicts = {}
    for day in DAYS:
        rows, _ = store.read(spark, ["dws", "day"], partitions=[{"dt": day}])
        hours = [{"dt": day, "hh": f"{h:02d}"} for h in range(24)]
        inputs = {"ods.src": store.read(spark, ["ods", "src"], hours, [Predicate("_deleted", "=", False)])[0]}
        for check in table.checks:
            earlier = [{"dt": k} for k in check.history_keys(table, day)]
            history = store.read(spark, ["dws", "day"], partitions=earlier)[0] if earlier else None
            outcome = check.evaluate(table, day, rows, inputs, history)
            numbers = {k: getattr(v, "value", v) for k, v in outcome.metadata.items()}
            found[check.name, day] = (outcome.passed, outcome.description, numbers)
    return found


def figures(result: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The run's partitions as recorded (without what its own commit made) and its read figures."""
    metadata = result.get_asset_materialization_events()[0].materialization.metadata
    entries = {
        p["partition"]: {k: v for k, v in p.items() if k not in ("delta_version", "files_added")}
        for p in metadata["partitions"].value
    }
    return entries, {k: metadata[k].value for k in ("files_read", "files_skipped")}


def test_a_ranged_run_reads_each_input_once_and_judges_and_records_each_partition_as_a_run_of_its_own(
    build: Callable[[Any, str, str], Any],
    instance: DagsterInstance,
    spark: SparkSession,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read = DeltaStore.read
    tables_read: list[tuple[str, ...]] = []

    def counted(store: DeltaStore, spark: SparkSession, key: Any, *args: Any, **kwargs: Any) -> Any:
        tables_read.append(tuple(key))
        return read(store, spark, key, *args, **kwargs)

    alone: Verdicts = {}
    recorded = []
    for day in DAYS:
        result = build(instance, day, day)
        alone |= verdicts(result)
        recorded.append(figures(result))
    monkeypatch.setattr(DeltaStore, "read", counted)
    result = build(instance, DAYS[0], DAYS[-1])
    monkeypatch.undo()
    together = verdicts(result)
    entries, totals = figures(result)
    assert tables_read.count(("ods", "src")) == 1, tables_read  # once for the six days, not once a day
    # each partition records what it read (partitions, versions) and wrote as a run of its own does
    assert entries == {k: v for one, _ in recorded for k, v in one.items()}
    assert totals == {k: sum(t[k] for _, t in recorded) for k in ("files_read", "files_skipped")}
    assert together == alone
    # ... which each kind's own evaluation of the partition gives too (the run adds the partition and result)
    for (check, day), (passed, description, numbers) in evaluated_alone(spark, tmp_path / "lake").items():
        assert together[check, day][:2] == (passed, description), (check, day)
        assert {k: together[check, day][2][k] for k in numbers} == numbers, (check, day)
    # the days pass and fail each check, with the numbers behind them
    passes = {(check, day): v[0] for (check, day), v in alone.items()}
    assert [passes["row_count", d] for d in DAYS] == [True, True, False, False, True, True]
    assert [passes["anomaly", d] for d in DAYS] == [True, True, True, False, False, False]
    assert [passes["references", d] for d in DAYS] == [False, False, True, True, False, False]
    assert alone["references", DAYS[0]][2]["columns"]["id"]["examples"] == ["4"]
    numbers = alone["row_count", DAYS[2]][2]
    assert (numbers["rows"], numbers["upstream_rows"], numbers["ratio"]) == (3, 4, 0.75)
    assert alone["row_count", DAYS[3]][1] == "0 rows < 1"
    assert alone["anomaly", DAYS[4]][2]["history_periods"] == 2  # the empty day is no period of its history
    assert alone["anomaly", DAYS[0]][1] == "0 of 3 trailing periods: too little history to judge"


def test_the_checks_of_a_six_day_write_cost_no_more_spark_jobs_than_those_of_a_two_day_write(
    build: Callable[[Any, str, str], Any],
    instance: DagsterInstance,
    spark: SparkSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tracker = spark.sparkContext.statusTracker()

    def last_job() -> int:  # Spark numbers its jobs in order
        return max([*tracker.getJobIdsForGroup(), *tracker.getActiveJobsIds()], default=-1)

    jobs: list[int] = []
    evaluate = runner.check_written

    def counted(*args: Any, **kwargs: Any) -> Any:
        before = last_job()
        try:
            return evaluate(*args, **kwargs)
        finally:
            jobs.append(last_job() - before)

    monkeypatch.setattr(runner, "check_written", counted)
    build(instance, DAYS[0], DAYS[1])
    build(instance, DAYS[0], DAYS[-1])
    two, six = jobs
    assert six <= two, f"the checks of 6 partitions ran {six} Spark jobs, of 2 partitions {two}"
