"""The engine compares the lake with the partition states on its cadence: a day whose files were deleted, or whose
rebuild a Delta RESTORE rolled back, is marked missing once (one log line for its table), the engine requests it
again, and a day built empty (or one the restore kept) is left alone.

A small catalog (``ods.src`` → ``dwd.day``), its lake written with delta-rs, its events written as the product writes
them; the engine is stepped by hand with a recorder for a webserver: no Spark, no Dagster daemon.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pyarrow as pa
import pytest
from dagster import AssetKey, AssetMaterialization, DagsterInstance
from deltalake import DeltaTable, write_deltalake

from resources.delta_lake import DeltaStore
from tests.center.test_center import hours
from tests.center.test_engine_catalog import DAY_SQL, Recorder
from tests.support.small_catalog import VALUED_ODS, write
from warehouse_assets.catalog import Catalog, business_zone, load_catalog
from warehouse_assets.center.engine import assemble_engine
from warehouse_assets.center.reconcile import Reconciler, Reconciliation, lake_tables, reconcile
from warehouse_assets.center.state_store import PartitionStateStore
from warehouse_assets.materialize.compiler import max_partitions_per_run

TZ = ZoneInfo("Asia/Shanghai")
NOW = datetime(2026, 3, 6, 9, tzinfo=TZ)
DAYS = ["2026-03-03", "2026-03-04", "2026-03-05"]
EMPTY = "2026-03-05"  # built, with no rows: no files


@pytest.fixture
def instance(consolidated: DagsterInstance) -> DagsterInstance:
    return consolidated


def sweeping_engine(
    instance: DagsterInstance, catalog: Catalog, lake: Path, caplog: pytest.LogCaptureFixture
) -> tuple[Any, Recorder, Callable[[], None], Callable[[], list[str]]]:
    """An engine whose reconciliation is due at every round; one round (the sweep it started beside it finished) and
    what the sweeps said."""
    recorder = Recorder()
    reconciler = Reconciler(instance, DeltaStore(str(lake)), every=1e-6)
    engine = assemble_engine(
        instance, catalog, recorder, max_partitions_per_run, clock=lambda: NOW, reconciler=reconciler
    )
    caplog.set_level(logging.WARNING, logger="warehouse.engine")

    def round_() -> None:
        engine.tick()
        engine.finish_sweep(timeout=60)

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith("reconcile")]

    return engine, recorder, round_, said


def test_the_engine_marks_a_day_whose_files_are_gone_once_and_requests_it_again(
    instance: DagsterInstance, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "tables"
    write(root, "ods/src.yaml", VALUED_ODS)
    write(root, "dwd/day.sql", DAY_SQL)
    catalog = load_catalog(root)
    lake = tmp_path / "lake"
    rows = [{"id": i, "v": i, "dt": day} for i, day in enumerate(DAYS[:2])]
    write_deltalake(str(lake / "dwd" / "day"), pa.Table.from_pylist(rows), partition_by=["dt"])
    for day in DAYS:
        for hour in hours(day):  # hours with no rows, as their reports say: no files to lose
            instance.report_runless_asset_event(
                AssetMaterialization(AssetKey(["ods", "src"]), partition=hour, metadata={"rows": 0})
            )
        written = 0 if day == EMPTY else 1
        partitions = [{"partition": day, "rows": written, "delta_version": 0}]
        instance.report_runless_asset_event(
            AssetMaterialization(
                AssetKey(["dwd", "day"]), partition=day, metadata={"rows": written, "partitions": partitions}
            )
        )
    engine, recorder, round_, said = sweeping_engine(instance, catalog, lake, caplog)

    try:
        round_()
        round_()
        assert said() == [] and recorder.plans == []  # in step, all built: nothing said, nothing requested

        [gone] = (lake / "dwd" / "day" / f"dt={DAYS[0]}").glob("*.parquet")
        gone.unlink()  # a VACUUM gone wrong
        round_()
        assert said() == [
            f"reconcile: dwd.day: 1 partition(s) gone from the lake, marked missing and to be built again: {DAYS[0]} "
            "(1 of its 1 file(s) listed in the Delta log are gone from storage (vacuumed or deleted))"
        ]
        round_()  # reads the mark, and requests the day again
        assert [(p.table, p.partitions) for p in recorder.plans] == [("dwd.day", (DAYS[0],))]
        assert "gone from the lake" in recorder.plans[0].trigger.describe()
        state = engine.store.states(AssetKey(["dwd", "day"]), DAYS)
        assert state[DAYS[0]].missing is not None and not state[DAYS[0]].materialized
        assert state[DAYS[1]].materialized and state[EMPTY].materialized  # the empty day has no files to lose

        round_()  # the next sweeps say nothing more and request nothing more: marked once
        round_()
        assert len(said()) == 1 and len(recorder.plans) == 1
    finally:
        engine.close()


def test_the_engine_marks_a_day_a_restore_rolled_back_though_its_files_are_there_and_requests_it_again(
    instance: DagsterInstance, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "tables"
    write(root, "ods/src.yaml", VALUED_ODS)
    write(root, "dwd/day.sql", DAY_SQL)
    catalog = load_catalog(root)
    table = str(tmp_path / "lake" / "dwd" / "day")
    first = [{"id": i, "v": i, "dt": day} for i, day in enumerate(DAYS[:2])]
    write_deltalake(table, pa.Table.from_pylist(first), partition_by=["dt"])  # version 0: both days
    again = pa.Table.from_pylist([{"id": 7, "v": 70, "dt": DAYS[0]}])
    write_deltalake(table, again, mode="overwrite", predicate=f"dt = '{DAYS[0]}'")  # version 1: the first day rebuilt
    for day in DAYS[:2]:
        for hour in hours(day):
            instance.report_runless_asset_event(
                AssetMaterialization(AssetKey(["ods", "src"]), partition=hour, metadata={"rows": 0})
            )
        version = 1 if day == DAYS[0] else 0
        partitions = [{"partition": day, "rows": 1, "delta_version": version}]
        instance.report_runless_asset_event(
            AssetMaterialization(
                AssetKey(["dwd", "day"]), partition=day, metadata={"rows": 1, "partitions": partitions}
            )
        )
    engine, recorder, round_, said = sweeping_engine(instance, catalog, tmp_path / "lake", caplog)

    try:
        round_()
        round_()
        assert said() == [] and recorder.plans == []

        DeltaTable(table).restore(0)  # version 2: back to the first day's old rows, every file of them still there
        assert sorted(DeltaTable(table).to_pyarrow_table().column("id").to_pylist()) == [0, 1]
        round_()
        assert said() == [
            f"reconcile: dwd.day: 1 partition(s) gone from the lake, marked missing and to be built again: {DAYS[0]} "
            "(the table was restored to version 0 (RESTORE, Delta version 2), before Delta version 1 that built it: "
            "its data is older than its latest materialization)"
        ]
        round_()  # reads the mark, and requests the day again
        assert [(p.table, p.partitions) for p in recorder.plans] == [("dwd.day", (DAYS[0],))]
        state = engine.store.states(AssetKey(["dwd", "day"]), DAYS[:2])
        assert state[DAYS[0]].missing is not None and not state[DAYS[0]].materialized
        assert state[DAYS[1]].materialized  # written at version 0, which the restore went back to: as built
        round_()
        assert len(said()) == 1 and len(recorder.plans) == 1  # marked once
    finally:
        engine.close()


def test_a_write_a_later_restore_brought_back_is_not_rolled_back(tmp_path: Path) -> None:
    """The current version's content followed back through the restores: a restore undone by a later one rolls
    nothing back, and a restore that skipped no commit of a partition leaves it as built."""
    table = str(tmp_path / "lake" / "dwd" / "day")
    write_deltalake(table, pa.Table.from_pylist([{"id": 0, "v": 0, "dt": DAYS[0]}]), partition_by=["dt"])  # 0
    other = pa.Table.from_pylist([{"id": 1, "v": 1, "dt": DAYS[1]}])
    write_deltalake(table, other, mode="append")  # 1: the second day
    again = pa.Table.from_pylist([{"id": 2, "v": 2, "dt": DAYS[0]}])
    write_deltalake(table, again, mode="overwrite", predicate=f"dt = '{DAYS[0]}'")  # 2: the first day rebuilt
    reader = DeltaStore(str(tmp_path / "lake"))
    written = {DAYS[0]: (2, {"dt": DAYS[0]}), DAYS[1]: (1, {"dt": DAYS[1]})}
    DeltaTable(table).restore(1)  # 3: the rebuild of the first day undone; the second day's write kept
    assert {k: tuple(v) for k, v in reader.rolled_back(("dwd", "day"), written).items()} == {DAYS[0]: (3, 1)}
    DeltaTable(table).restore(2)  # 4: back to after the rebuild
    assert reader.rolled_back(("dwd", "day"), written) == {}
    DeltaTable(table).restore(0)  # 5: before both
    assert set(reader.rolled_back(("dwd", "day"), written)) == {DAYS[0], DAYS[1]}


def test_only_what_is_finished_is_judged_and_data_never_materialized_is_reported_without_advice_to_delete_it(
    instance: DagsterInstance, tmp_path: Path
) -> None:
    """A healthy stack: the ODS hour being ingested and today's day (its window still open) hold files the instance
    has not materialized yet; neither is reported. A past day that was never materialized is, with no advice to
    delete it: nothing proves it orphaned."""
    root = tmp_path / "tables"
    write(root, "ods/src.yaml", VALUED_ODS)
    write(root, "dwd/day.sql", DAY_SQL)
    catalog = load_catalog(root)
    lake = tmp_path / "lake"
    now = datetime.now(business_zone())
    hour = {"dt": now.strftime("%Y-%m-%d"), "hh": now.strftime("%H")}  # being ingested: not a partition yet
    write_deltalake(
        str(lake / "ods" / "src"), pa.Table.from_pylist([{"id": 1, "v": 1, **hour}]), partition_by=["dt", "hh"]
    )
    today = [{"id": 1, "v": 1, "dt": now.strftime("%Y-%m-%d")}]  # a run writing the day so far
    write_deltalake(str(lake / "dwd" / "day"), pa.Table.from_pylist(today), partition_by=["dt"])
    reader = DeltaStore(str(lake))

    def judged() -> Reconciliation:
        store = PartitionStateStore(instance)
        try:
            return reconcile(instance, catalog, store, reader, lake_tables(catalog))
        finally:
            store.close()

    healthy = judged()
    assert [t.table for t in healthy.tables if not t.in_step] == [], healthy.lines()
    assert healthy.lines() == ["2 table(s) compared with the lake: all in step"]

    stray = [{"id": 2, "v": 2, "dt": DAYS[0]}]  # a finished day the instance never materialized
    write_deltalake(str(lake / "dwd" / "day"), pa.Table.from_pylist(stray), mode="append")
    found = judged()
    [day] = [t for t in found.tables if not t.in_step]
    assert (day.table, day.gone, day.unknown) == ("dwd.day", {}, [DAYS[0]])
    assert "never materialized" in day.line() and "delete" not in day.line()
