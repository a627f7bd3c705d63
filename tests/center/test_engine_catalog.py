"""A table declared while the engine runs is built by itself: the engine notices the new declaration file, loads the
catalog again, asks the webserver to reload the code location, and requests the new table's partitions whose inputs
were all there before it existed (no event would ever name them). A declaration that does not load changes nothing.
And ``why`` never calls a partition "ready" that nothing will build: it names what builds it, or says why nothing will.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from dagster import AssetKey, DagsterInstance

from resources.delta_lake import DeltaStore
from resources.landing import Landing
from tests.center.test_center import hours
from tests.center.test_state_store import report
from tests.support.small_catalog import VALUED_ODS, write
from warehouse_assets.catalog import Catalog, load_catalog
from warehouse_assets.center import heartbeat
from warehouse_assets.center.engine import assemble_engine
from warehouse_assets.center.heartbeat import Heartbeat
from warehouse_assets.center.plans import RunPlan
from warehouse_assets.explain.why import explain
from warehouse_assets.materialize.compiler import max_partitions_per_run

TZ = ZoneInfo("Asia/Shanghai")
NOW = datetime(2026, 3, 6, 9, tzinfo=TZ)
DAY_SQL = "/* ---\ntable: dwd.day\nperiod: daily\n--- */\nSELECT id, v FROM ods.src\n"
NEW_SQL = "/* ---\ntable: dws.new\nperiod: daily\n--- */\nSELECT id, sum(v) AS v FROM dwd.day GROUP BY id\n"


class Recorder:
    """Records what the engine submits, and the catalogs it is told of (the GraphQL submitter reloads the code
    location then)."""

    def __init__(self) -> None:
        self.plans: list[RunPlan] = []
        self.catalogs: list[Catalog] = []

    def submit(self, plan: RunPlan, asset_key: AssetKey) -> str:
        self.plans.append(plan)
        return f"run-{len(self.plans)}"

    def catalog_changed(self, catalog: Catalog) -> None:
        self.catalogs.append(catalog)


@pytest.fixture
def instance(consolidated: DagsterInstance) -> DagsterInstance:
    return consolidated


def test_a_table_declared_while_the_engine_runs_is_built_without_a_restart(
    instance: DagsterInstance, tmp_path: Path
) -> None:
    root = tmp_path / "tables"
    for layer in ("ods", "dwd", "dws"):
        (root / layer).mkdir(parents=True)
    write(root, "ods/src.yaml", VALUED_ODS)
    (root / "dwd" / "day.sql").write_text(DAY_SQL)
    recorder = Recorder()
    engine = assemble_engine(instance, load_catalog(root), recorder, max_partitions_per_run, clock=lambda: NOW)
    try:
        assert engine.recover() == 0 and engine.tick() == []
        for day in ("2026-03-04", "2026-03-05"):
            for hour in hours(day):
                report(instance, AssetKey(["ods", "src"]), hour)
        engine.tick()
        assert sorted(p for plan in recorder.plans for p in plan.partitions) == ["2026-03-04", "2026-03-05"]
        built = len(recorder.plans)
        for day in ("2026-03-04", "2026-03-05"):
            report(instance, AssetKey(["dwd", "day"]), day)  # built
        engine.tick()
        assert len(recorder.plans) == built

        # a broken declaration: logged, the previous catalog kept, nothing requested
        (root / "dws" / "new.sql").write_text(NEW_SQL.replace("FROM dwd.day", "FROM dwd.nowhere"))
        assert engine.follow_catalog() == [] and "dws.new" not in engine.catalog.tables
        engine.tick()
        assert len(recorder.plans) == built and recorder.catalogs == []

        # fixed: the new table's two days, whose inputs were there before it, are requested, once
        (root / "dws" / "new.sql").write_text(NEW_SQL)
        assert engine.follow_catalog() == ["dws.new"]
        assert [c.tables.keys() for c in recorder.catalogs] == [engine.catalog.tables.keys()]
        engine.tick()
        new = [plan for plan in recorder.plans if plan.table == "dws.new"]
        assert [plan.partitions for plan in new] == [("2026-03-04", "2026-03-05")]
        assert "table declared" in new[0].trigger.describe()
        engine.tick()
        assert engine.follow_catalog() == [] and len(recorder.plans) == built + 1
    finally:
        engine.close()


def test_why_names_what_builds_a_ready_partition_or_that_nothing_will(
    instance: DagsterInstance, tmp_path: Path
) -> None:
    root = tmp_path / "tables"
    for layer in ("ods", "dwd"):
        (root / layer).mkdir(parents=True)
    write(root, "ods/src.yaml", VALUED_ODS)
    (root / "dwd" / "day.sql").write_text(DAY_SQL)
    catalog = load_catalog(root)
    for day in ("2026-01-20", "2026-03-05"):
        for hour in hours(day):
            report(instance, AssetKey(["ods", "src"]), hour)
    lake, landing = DeltaStore(str(tmp_path / "lake")), Landing(tmp_path / "landing")
    old = explain(instance, catalog, lake, landing, "dwd.day", "2026-01-20", current_time=NOW)
    assert old.verdict == (
        "all 24 upstream partition(s) are materialized; but it ended over 35 days ago, before the dependency "
        "center's lookback: nothing builds it by itself — a backfill does (the UI's Materialize or Backfill on this "
        "partition)"
    )
    # a recent one is the engine's to build: while it runs, why names it; while it does not, nothing builds it
    recent = explain(instance, catalog, lake, landing, "dwd.day", "2026-03-05", current_time=NOW)
    assert "ready" not in recent.verdict
    assert recent.verdict.startswith(
        "all 24 upstream partition(s) are materialized; but the dependency center's engine is not running, and "
        "nothing else builds it: the dependency center's engine has never run against this instance"
    ), recent.verdict
    heartbeat.beat(instance, Heartbeat(at=NOW.timestamp() - 3, started_at=NOW.timestamp() - 600))
    recent = explain(instance, catalog, lake, landing, "dwd.day", "2026-03-05", current_time=NOW)
    assert re.fullmatch(
        r"all 24 upstream partition\(s\) are materialized; ready: the dependency center's engine submits its run "
        r"\(engine alive \(pid \d+ on .+, up 10 min, last beat 3 s ago\)\)",
        recent.verdict,
    ), recent.verdict
    # an ODS hour nothing has reported: what reports it, not "ready"
    hour = explain(instance, catalog, lake, landing, "ods.src", "2026-03-06-00:00", current_time=NOW)
    assert "ready:" not in hour.verdict and hour.verdict.startswith("not reported yet ("), hour.verdict
    assert "the ingestion (`ods_ingest`, launched by the `ods_landing` sensor)" in hour.verdict
