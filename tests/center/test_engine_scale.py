"""The product's real path at 1,000 tables: the code location builds, and the engine starts exactly what became ready.

A synthetic catalog of 1,000 tables (40 hourly ODS tables, 320 DWD days on 24 hours each, 320 DWS days on two DWD
days, 320 ADS days: half on the same DWS day, half also on the DWS day before) is compiled by the product's own
``build_definitions`` (the automation sensor it replaces was refused above 500 assets and checks). ODS hours are then
reported as the readiness sensor reports them (runless materializations) and each layer's runs as the runs write
them; at each step the engine (its store, reverse index and resolver, with a submitter that records) must request
exactly the expected partitions, each once, and nothing else.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from dagster import AssetKey, AssetMaterialization, DagsterInstance, Definitions

from warehouse_assets.catalog import Catalog, load_catalog
from warehouse_assets.center.engine import assemble_engine
from warehouse_assets.center.plans import RunPlan
from warehouse_assets.definitions import build_definitions
from warehouse_assets.materialize.compiler import max_partitions_per_run
from warehouse_assets.materialize.gate import decide

TZ = ZoneInfo("Asia/Shanghai")
DAY = "2026-03-05"
NOW = datetime(2026, 3, 6, 9, tzinfo=TZ)
ODS, DWD, DWS, ADS = 40, 320, 320, 320

ODS_YAML = """table: ods.s{i}
period: hourly
source: {{database: db, tables: "s{i}"}}
primary_key: [id]
partition_time: t
columns: {{id: bigint, t: timestamp, v: bigint}}
"""


def _derived(root: Path, fqn: str, deps: dict[str, str]) -> None:
    layer, name = fqn.split(".")
    header = "period: daily\ndepends_on:\n" + "".join(f"  {t}: {{{m}}}\n" for t, m in deps.items())
    sql = " UNION ALL ".join(f"SELECT id, v FROM {t}" for t in deps)
    (root / layer / f"{name}.sql").write_text(f"/* ---\ntable: {fqn}\n{header}--- */\n{sql}\n")


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    root = tmp_path_factory.mktemp("catalog1000")
    for layer in ("ods", "dwd", "dws", "ads"):
        (root / layer).mkdir()
    for i in range(ODS):
        (root / "ods" / f"s{i}.yaml").write_text(ODS_YAML.format(i=i))
    for i in range(DWD):
        _derived(root, f"dwd.d{i}", {f"ods.s{i % ODS}": "range: [0, 23]"})
    for i in range(DWS):
        _derived(root, f"dws.w{i}", {f"dwd.d{i}": "set: [0]", f"dwd.d{(i + 1) % DWD}": "set: [0]"})
    for i in range(ADS):
        deps = {f"dws.w{i}": "set: [0]"} if i % 2 == 0 else {f"dws.w{i}": "set: [0]", f"dws.w{i - 1}": "set: [-1]"}
        _derived(root, f"ads.a{i}", deps)
    catalog = load_catalog(root)
    assert len(list(catalog)) == 1000
    return catalog


class Recorder:
    """A submitter that records what the engine submits (the GraphQL submitter is exercised by test_embedded_stack)."""

    def __init__(self) -> None:
        self.plans: list[RunPlan] = []

    def submit(self, plan: RunPlan, asset_key: AssetKey) -> str:
        self.plans.append(plan)
        return f"run-{len(self.plans)}"


@pytest.fixture
def instance(consolidated: DagsterInstance) -> DagsterInstance:
    return consolidated  # one SQLite event log (tests/conftest.py): quick to write to


def test_the_code_location_of_1000_tables_builds_with_no_automation_limit(catalog: Catalog) -> None:
    started = time.perf_counter()
    defs = build_definitions(catalog)
    Definitions.validate_loadable(defs)
    graph = defs.resolve_asset_graph()
    print(f"1,000-table definitions built and validated in {time.perf_counter() - started:.1f} s")
    assert len(graph.get_all_asset_keys()) == 1000
    assert not any(s.name == "warehouse_automation" for s in defs.sensors or [])
    assert all(graph.get(k).automation_condition is None for k in graph.get_all_asset_keys())


def test_the_engine_requests_exactly_the_partitions_that_became_ready_at_1000_tables(
    catalog: Catalog, instance: DagsterInstance
) -> None:
    recorder = Recorder()
    engine = assemble_engine(instance, catalog, recorder, max_partitions_per_run, clock=lambda: NOW)
    assert engine.recover() == 0 and engine.tick() == []

    def report(tables: list[str], keys: list[str]) -> None:
        for fqn in tables:
            for key in keys:
                instance.report_runless_asset_event(AssetMaterialization(AssetKey(catalog[fqn].key), partition=key))

    def requested() -> dict[str, tuple[str, ...]]:
        submitted = engine.tick()
        assert engine.resolver.pending() == []
        runs = [plan for plan, _ in submitted]
        assert len({plan.table for plan in runs}) == len(runs), "one run per table"
        return {plan.table: plan.partitions for plan in runs}

    hours = [(datetime.fromisoformat(DAY) + timedelta(hours=h)).strftime("%Y-%m-%d-%H:00") for h in range(24)]
    ods = [f"ods.s{i}" for i in range(ODS)]
    report(ods, hours[:23])
    assert requested() == {}  # 23 hours of 24: no day yet
    report(ods, hours[23:])
    started = time.perf_counter()
    assert requested() == {f"dwd.d{i}": (DAY,) for i in range(DWD)}
    print(f"last ODS hours of 40 tables → 320 DWD runs requested in {time.perf_counter() - started:.2f} s")
    assert engine.resolver.evaluated == DWD  # the events' fan-out, not the catalog

    report([f"dwd.d{i}" for i in range(DWD)], [DAY])
    assert requested() == {f"dws.w{i}": (DAY,) for i in range(DWS)}

    report([f"dws.w{i}" for i in range(DWS)], [DAY])
    assert requested() == {f"ads.a{i}": (DAY,) for i in range(0, ADS, 2)}  # the others need the day before
    waiting = catalog["ads.a1"]
    verdict = decide(catalog, waiting, DAY, engine.store, current_time=NOW)
    assert not verdict.may_run and [e.missing for e in verdict.edges if e.dep.table == "dws.w0"] == [["2026-03-04"]]

    assert requested() == {}  # nothing twice
    assert len(recorder.plans) == DWD + DWS + ADS // 2
    engine.close()
