"""``warehouse why``: from a partition to the root causes at the end of its chain, without Spark.

The lake and the landing area are empty here (an ODS hour then has no shard stream); the instance holds what
each test reports. The chain through a lagging shard, which needs ingested ODS data, is in
``test_completeness.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import AssetKey, AssetMaterialization, DagsterInstance, instance_for_test

from resources.delta_lake import DeltaStore
from resources.landing import Landing
from tests.center.test_state_store import taint
from warehouse_assets.build.quality import Outcome, evaluation, latest_materialization, report_valid
from warehouse_assets.catalog import Catalog, load_catalog
from warehouse_assets.center.why import WhyReport, explain

ROOT = Path(__file__).resolve().parents[2]
DAY = "2026-03-02"
HOURS = [f"{DAY}-{h:02d}:00" for h in range(24)]


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with instance_for_test() as instance:
        yield instance


def _why(instance: DagsterInstance, catalog: Catalog, tmp_path: Path, fqn: str, partition: str) -> WhyReport:
    return explain(instance, catalog, DeltaStore(str(tmp_path / "lake")), Landing(tmp_path / "landing"), fqn, partition)


def _causes(report: WhyReport) -> list[tuple[str, str, str]]:
    return [(c.table, c.partition, c.state) for c in report.root_causes]


def test_a_failed_check_two_levels_up_is_the_root_cause(
    instance: DagsterInstance, catalog: Catalog, tmp_path: Path
) -> None:
    order = catalog["ods.order"]
    for hour in HOURS[:10] + HOURS[11:]:
        report_valid(instance, order, hour, "loaded by the test")
    # hour 10 failed its uniqueness check: the day's DWD cannot run, so neither can the DWS day
    instance.report_runless_asset_event(AssetMaterialization(asset_key=AssetKey(order.key), partition=HOURS[10]))
    unique = next(c for c in order.checks if c.name == "unique")
    record = latest_materialization(instance, order, HOURS[10])
    outcome = Outcome(unique, HOURS[10], False, {}, "2 duplicated keys")
    instance.report_runless_asset_event(evaluation(instance, order, outcome, record))

    why = _why(instance, catalog, tmp_path, "dws.user_order_daily", DAY)
    assert [(u.table, u.partition, u.state) for u in why.upstream] == [("dwd.order_detail", DAY, "missing")]
    assert _causes(why) == [("ods.order", HOURS[10], "check failed")]
    assert "unique" in why.root_causes[0].detail
    lines = why.lines()
    assert lines[lines.index("root causes:") + 1].split()[:4] == ["ods.order", HOURS[10], "check", "failed"]

    # the next day every hour passed: the DWD day itself is what the DWS day waits for
    next_day = "2026-03-03"
    for h in range(24):
        report_valid(instance, order, f"{next_day}-{h:02d}:00", "loaded by the test")
    why = _why(instance, catalog, tmp_path, "dws.user_order_daily", next_day)
    assert _causes(why) == [("dwd.order_detail", next_day, "missing")]
    assert "every upstream partition is ready" in why.root_causes[0].detail


def test_a_tainted_partition_is_named_with_its_reason_and_root(
    instance: DagsterInstance, catalog: Catalog, tmp_path: Path
) -> None:
    order = catalog["ods.order"]
    for hour in HOURS:
        report_valid(instance, order, hour, "loaded by the test")
    bad = latest_materialization(instance, order, HOURS[13])
    taint(instance, AssetKey(order.key), HOURS[13], bad.storage_id, "amounts 100x", f"ods.order {HOURS[13]}")

    why = _why(instance, catalog, tmp_path, "dwd.order_detail", DAY)
    assert not why.verdict.startswith("all")
    tainted = [u for u in why.upstream if u.state == "tainted"]
    assert [(u.table, u.partition) for u in tainted] == [("ods.order", HOURS[13])]
    assert tainted[0].detail == f"tainted: amounts 100x, from ods.order {HOURS[13]}"
    assert _causes(why) == [("ods.order", HOURS[13], "tainted")]
    assert f"tainted — tainted: amounts 100x, from ods.order {HOURS[13]}" in why.lines()[-2]

    # a tainted partition asked about says so on its first line
    own = _why(instance, catalog, tmp_path, "ods.order", HOURS[13])
    assert own.lines()[0] == f"ods.order {HOURS[13]}: materialized, tainted: amounts 100x, from ods.order {HOURS[13]}"


def test_an_ods_hour_reached_through_two_tables_is_one_root_cause(
    instance: DagsterInstance, catalog: Catalog, tmp_path: Path
) -> None:
    # ads.monthly_report reads dws.user_order_daily and dws.user_active_daily, both over dwd.order_detail: every
    # hour of ods.order in January is reached twice, and listed once
    why = _why(instance, catalog, tmp_path, "ads.monthly_report", "2026-01-01")
    causes = _causes(why)
    assert len(causes) == len(set(causes))
    order_hours = [p for t, p, _ in causes if t == "ods.order"]
    assert len(order_hours) == 31 * 24
    assert {t for t, _, _ in causes} == {"ods.order", "ods.attendance", "ods.lesson"}  # only the deepest
    assert {s for _, _, s in causes} == {"not ready"}
    first_hour = next(c for c in why.root_causes if c.table == "ods.order")
    assert (first_hour.partition, first_hour.detail) == (
        "2026-01-01-00:00",
        "no shard stream of edu_trade.order_[0-9]{2} in the landing area",
    )
    # the output stays readable: a few per table, then how many more
    assert "  … and 741 more not ready partition(s) of ods.order, through 2026-01-31-23:00" in why.lines()
    assert len(why.lines()) < len(why.upstream) + 20


def test_a_window_before_the_warehouse_start_is_a_root_cause_that_never_clears(
    instance: DagsterInstance, catalog: Catalog, tmp_path: Path
) -> None:
    why = _why(instance, catalog, tmp_path, "ads.retention_d7", "2026-01-03")
    never = [u for u in why.upstream if u.state == "does not exist"]
    assert [(u.table, u.partition) for u in never] == [("dwd.user_snapshot", "2025-12-27")]
    assert "can never exist" in never[0].detail and "2026-01-01" in never[0].detail
    assert ("dwd.user_snapshot", "2025-12-27", "does not exist") in _causes(why)


def test_a_ready_partition_has_no_root_causes(instance: DagsterInstance, catalog: Catalog, tmp_path: Path) -> None:
    report_valid(instance, catalog["dwd.order_detail"], DAY, "loaded by the test")
    why = _why(instance, catalog, tmp_path, "dws.user_order_daily", DAY)
    assert why.verdict.startswith("all 1 upstream partition(s) are materialized: ready")
    assert why.root_causes == [] and "root causes:" not in why.lines()


def test_the_why_command_loads_neither_pyspark_nor_the_code_location(tmp_path: Path) -> None:
    # in a fresh interpreter (the tests' own has PySpark loaded): what `warehouse why` imports to answer
    script = (
        "import json, sys\n"
        "from warehouse_assets.cli import main\n"
        f"status = main(['why', 'ads.daily_gmv', {DAY!r}, '--dagster-home', {str(tmp_path / 'home')!r}])\n"
        "print(json.dumps({'status': status, 'modules': sorted(m for m in sys.modules if m.split('.')[0] in "
        "('pyspark', 'py4j') or m in ('warehouse_assets.definitions', 'warehouse_assets.build.compiler'))}))\n"
    )
    env = {
        **os.environ,
        "WAREHOUSE_LAKE_ROOT": str(tmp_path / "lake"),
        "WAREHOUSE_LANDING_ROOT": str(tmp_path / "landing"),
        "DAGSTER_TELEMETRY_ENABLED": "false",
    }
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    *answer, last = done.stdout.strip().splitlines()
    assert json.loads(last) == {"status": 0, "modules": []}
    assert answer[0] == f"ads.daily_gmv {DAY}: missing"
    assert "root causes:" in answer
    assert any(line.split()[:2] == ["ods.order", f"{DAY}-00:00"] for line in answer)
