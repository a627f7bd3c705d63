"""``warehouse why``: from a partition to the root causes at the end of its chain, without Spark.

The lake and the landing area are empty here (an ODS hour then has no shard stream); the instance holds what
each test reports. The chain through a lagging shard, which needs ingested ODS data, is in
``test_completeness.py``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import date, datetime, time, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from dagster import (
    AssetKey,
    AssetMaterialization,
    DagsterEvent,
    DagsterInstance,
    DagsterRunStatus,
    DailyPartitionsDefinition,
    Definitions,
    asset,
    instance_for_test,
)
from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

from resources.delta_lake import DeltaStore
from resources.landing import Landing
from resources.settings import Settings, using
from simulator.cdc import SimulationConfig, simulate
from tests.center.test_state_store import taint
from warehouse_assets.catalog import Catalog, load_catalog
from warehouse_assets.center.reverse_index import ReverseIndex
from warehouse_assets.center.state_store import PartitionStateStore
from warehouse_assets.center.taint import new_taint, plan_taint
from warehouse_assets.explain.why import WhyReport, explain
from warehouse_assets.materialize.compiler import first_partition_note
from warehouse_assets.materialize.quality import Outcome, evaluation, latest_materialization, report_valid

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


def test_a_static_table_not_built_yet_is_what_its_readers_wait_for(
    instance: DagsterInstance, catalog: Catalog, tmp_path: Path
) -> None:
    snapshot = catalog["dwd.user_snapshot"]
    report_valid(instance, snapshot, DAY, "loaded by the test")
    why = _why(instance, catalog, tmp_path, "ads.new_users_by_tier", DAY)
    assert ("dwd.city_tier", "whole", "missing") in [(u.table, u.partition, u.state) for u in why.upstream]
    assert _causes(why) == [("dwd.city_tier", "whole", "missing")]
    instance.report_runless_asset_event(AssetMaterialization(asset_key=AssetKey(catalog["dwd.city_tier"].key)))
    why = _why(instance, catalog, tmp_path, "ads.new_users_by_tier", DAY)
    # that day ended long before the dependency center's lookback: nothing builds it by itself, and why says so
    assert why.verdict.startswith("all 2 upstream partition(s) are materialized; but it ended over 35 days ago")
    assert "nothing builds it by itself — a backfill does" in why.verdict and why.root_causes == []
    own = _why(instance, catalog, tmp_path, "dwd.city_tier", "whole")  # asked about itself: reads nothing
    assert own.lines()[0].startswith("dwd.city_tier whole: materialized")
    with pytest.raises(ValueError, match="dwd.city_tier is a static table: it has no partitions"):
        _why(instance, catalog, tmp_path, "dwd.city_tier", DAY)


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
    # the output stays readable: consecutive hours alike in all but their key are one range, and so are the days
    assert [line for line in why.lines() if line.split()[:1] == ["ods.order"]] == [
        "  ods.order                    2026-01-01-00:00 .. 2026-01-31-23:00 (744) not ready — no shard stream of "
        "edu_trade.order_[0-9]{2} in the landing area"
    ]
    assert len(why.lines()) < 15


def test_a_window_before_the_warehouse_start_is_a_root_cause_that_never_clears(
    instance: DagsterInstance, catalog: Catalog, tmp_path: Path
) -> None:
    why = _why(instance, catalog, tmp_path, "ads.retention_d7", "2026-01-03")
    never = [u for u in why.upstream if u.state == "does not exist"]
    assert [(u.table, u.partition) for u in never] == [("dwd.user_snapshot", "2025-12-27")]
    assert "can never exist" in never[0].detail and "2026-01-01" in never[0].detail
    assert ("dwd.user_snapshot", "2025-12-27", "does not exist") in _causes(why)


def test_a_partition_that_can_never_be_built_names_only_what_makes_it_so(
    instance: DagsterInstance, catalog: Catalog, tmp_path: Path
) -> None:
    """Its other upstream partition waits in the queue: that run changes nothing, it is no root cause."""
    queued = _create_run(instance, ["dws", "user_active_daily"], "2026-01-03", DagsterRunStatus.QUEUED, "2026-01-01")
    why = _why(instance, catalog, tmp_path, "ads.retention_d7", "2026-01-03")
    # the date its own window needs (its T-7), as its upstream list says: not its first partition's (2025-12-25)
    assert why.verdict == (
        "can never be built: its window needs dwd.user_snapshot back to 2025-12-27, before the warehouse start "
        "2026-01-01; the first one that can be is 2026-01-08"
    )
    assert ("dws.user_active_daily", "2026-01-03", "queued") in [(u.table, u.partition, u.state) for u in why.upstream]
    assert _causes(why) == [("dwd.user_snapshot", "2025-12-27", "does not exist")]
    assert queued[:8] not in "\n".join(why.lines()[why.lines().index("root causes:") :])


def test_a_table_on_the_latest_month_before_its_first_month_can_never_be_built_and_the_taint_plan_agrees(
    instance: DagsterInstance, catalog: Catalog, tmp_path: Path
) -> None:
    """A stack started on a Tuesday, 2026-11-24: its first month is December, which has not ended on the 27th. A day
    of `ads.gmv_vs_month` reads the latest monthly report among the two months before its own, or its own once it
    ended: its days before 2026-12-31 can never be built, and `why`, the taint plan and the asset's description say so
    alike, naming the start and the first month (Dagster's first partition is None until that month ends)."""
    with using(Settings(start=date(2026, 11, 24))):
        now = datetime(2026, 11, 27, 12, tzinfo=ZoneInfo("Asia/Shanghai"))
        args = (instance, catalog, DeltaStore(str(tmp_path / "lake")), Landing(tmp_path / "landing"))
        why = explain(*args, "ads.gmv_vs_month", "2026-11-25", current_time=now)
        text = "\n".join(why.lines())
        assert "None" not in text and "2026-12-01 (the warehouse starts 2026-11-24)" in text, text
        assert why.verdict == (
            "can never be built: its window of ads.monthly_report (2026-09-01 .. 2026-10-01 (2)) holds fewer than 1 "
            "partition(s) that can exist: ads.monthly_report's from its first partition 2026-12-01 on (the warehouse "
            "starts 2026-11-24); the first one that can be is 2026-12-31"
        )
        months = [u for u in why.upstream if u.table == "ads.monthly_report"]
        assert [(u.partition, u.state) for u in months] == [(m, "does not exist") for m in ("2026-09-01", "2026-10-01")]
        assert {u.detail for u in months} == {
            "before ads.monthly_report's first partition 2026-12-01 (the warehouse starts 2026-11-24): it can never "
            "exist"
        }
        assert _causes(why) == [("ads.monthly_report", m, "does not exist") for m in ("2026-09-01", "2026-10-01")]
        # its first buildable day waits for December's report, which is built once December ends
        new_year = datetime(2027, 1, 1, 9, tzinfo=now.tzinfo)
        assert explain(*args, "ads.gmv_vs_month", "2026-12-30", current_time=new_year).verdict.startswith(
            "can never be built: "
        )
        december = explain(*args, "ads.gmv_vs_month", "2026-12-31", current_time=new_year)
        assert december.verdict.startswith("waiting for "), december.verdict
        assert ("ads.monthly_report", "2026-12-01", "missing") in [
            (u.table, u.partition, u.state) for u in december.upstream
        ]

        taint = new_taint("ads.daily_gmv", "2026-11-24", "2026-11-26", "bad", "oncall")
        index = ReverseIndex.build(catalog, current_time=now)
        states = PartitionStateStore(instance).view()
        plan = plan_taint(catalog, index, states, "ads.daily_gmv", "2026-11-24", "2026-11-26", taint, now=now)
        [gmv] = [t for t in plan.tables if t.table == "ads.gmv_vs_month"]
        assert (gmv.never, gmv.waiting) == (["2026-11-24", "2026-11-25", "2026-11-26"], [])
        note = first_partition_note(catalog, catalog["ads.gmv_vs_month"])  # type: ignore[arg-type]
        assert "**Built from 2026-12-31 on**" in note and "None" not in note, note


def test_a_partition_whose_window_reaches_before_the_start_can_never_be_built(
    instance: DagsterInstance, catalog: Catalog, tmp_path: Path
) -> None:
    # DAU/WAU/MAU reads 30 days: with the warehouse starting 2026-01-01, its days before the 30th never build
    why = _why(instance, catalog, tmp_path, "ads.active_users", "2026-01-10")
    # its own 30 days reach back to 2025-12-12 (the first partition's, 2026-01-01's, to 2025-12-03)
    assert why.verdict == (
        "can never be built: its window needs dws.user_active_daily back to 2025-12-12, before the warehouse start "
        "2026-01-01; the first one that can be is 2026-01-30"
    )
    # its 20 days before the start are one line, not 20 alike: in its upstream and its root causes
    never = (
        "  dws.user_active_daily        2025-12-12 .. 2025-12-31 (20) does not exist — before dws.user_active_daily's "
        "first partition 2026-01-01 (the warehouse starts 2026-01-01): it can never exist"
    )
    lines = why.lines()
    assert lines.count(never) == 2 and sum("can never exist" in line for line in lines) == 2, lines
    assert "  dws.user_active_daily        2026-01-01 .. 2026-01-10 (10) missing" in lines
    # from then on it waits like any partition, for what can still come
    assert _why(instance, catalog, tmp_path, "ads.active_users", "2026-01-30").verdict.startswith(
        "waiting for 30 of 30"
    )


def test_a_ready_partition_has_no_root_causes(instance: DagsterInstance, catalog: Catalog, tmp_path: Path) -> None:
    report_valid(instance, catalog["dwd.order_detail"], DAY, "loaded by the test")
    why = _why(instance, catalog, tmp_path, "dws.user_order_daily", DAY)
    assert why.verdict.startswith("all 1 upstream partition(s) are materialized; but it ended over 35 days ago")
    assert why.root_causes == [] and "root causes:" not in why.lines()


def test_the_why_command_loads_neither_pyspark_nor_the_code_location(tmp_path: Path) -> None:
    # in a fresh interpreter (the tests' own has PySpark loaded): what `warehouse why` imports to answer
    script = (
        "import json, sys\n"
        "from warehouse_assets.cli import main\n"
        f"status = main(['why', 'ads.daily_gmv', {DAY!r}, '--dagster-home', {str(tmp_path / 'home')!r}])\n"
        "print(json.dumps({'status': status, 'modules': sorted(m for m in sys.modules if m.split('.')[0] in "
        "('pyspark', 'py4j') or m in ('warehouse_assets.definitions', 'warehouse_assets.materialize.compiler'))}))\n"
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


def _create_run(instance: DagsterInstance, key: list[str], partition: str, status: DagsterRunStatus, start: str) -> str:
    """A run of the asset ``key`` for ``partition``, created as the webserver creates one (with its planned
    materialization events), queued or started, without a code server."""
    daily = DailyPartitionsDefinition(start_date=start, timezone="Asia/Shanghai")

    @asset(key=key, partitions_def=daily)
    def _table() -> None: ...

    job_def = Definitions(assets=[_table]).resolve_implicit_global_asset_job_def()
    # a queued run names its code location, as the webserver's do
    location = InProcessCodeLocationOrigin(LoadableTargetOrigin(module_name="tables"), location_name="warehouse")
    run = instance.create_run_for_job(
        job_def,
        tags={"dagster/partition": partition},
        asset_selection=frozenset({AssetKey(key)}),
        status=DagsterRunStatus.QUEUED if status == DagsterRunStatus.QUEUED else None,
        remote_job_origin=RemoteJobOrigin(RemoteRepositoryOrigin(location, "__repository__"), job_def.name),
    )
    if status == DagsterRunStatus.STARTED:
        instance.report_dagster_event(DagsterEvent("PIPELINE_START", job_name=run.job_name), run_id=run.run_id)
    return run.run_id


def test_why_on_a_dev_stack_started_later_knows_its_start_and_names_the_queued_run(tmp_path: Path) -> None:
    """Run by hand beside `make dev` (nothing exported): the start is the simulated sources' first day, a day before
    it can never exist, and a partition whose run waits in the queue is named by that run, not promised a start."""
    today = datetime.now(ZoneInfo("Asia/Shanghai")).date()
    start, before, yesterday = (today - timedelta(days=2)), (today - timedelta(days=3)), (today - timedelta(days=1))
    landing = tmp_path / "landing"
    simulate(landing, datetime.combine(start, time()), datetime.combine(start, time(1)), SimulationConfig(scale=0.01))
    home = tmp_path / "home"
    home.mkdir()
    with DagsterInstance.from_config(str(home)) as instance:
        busy = _create_run(instance, ["dwd", "order_detail"], f"{start}", DagsterRunStatus.STARTED, f"{start}")
        queued = _create_run(instance, ["ads", "daily_gmv"], f"{yesterday}", DagsterRunStatus.QUEUED, f"{start}")
    script = (
        "import sys\n"
        "from warehouse_assets.cli import main\n"
        "for table, key in zip(sys.argv[1::2], sys.argv[2::2]):\n"
        "    print('status', main(['why', table, key]), flush=True)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "WAREHOUSE_START"}
    env.update(
        DAGSTER_HOME=str(home),
        WAREHOUSE_LAKE_ROOT=str(tmp_path / "lake"),
        WAREHOUSE_LANDING_ROOT=str(landing),
        DAGSTER_TELEMETRY_ENABLED="false",
    )
    queries = ["ads.daily_gmv", f"{before}", "ods.order", f"{before}-23:00", "ads.daily_gmv", f"{yesterday}"]
    queries += ["dwd.order_detail", f"{start}"]
    done = subprocess.run(
        [sys.executable, "-c", script, *queries], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    answers = done.stdout.split("status 0\n")
    assert len(answers) == 5 and answers[4] == "", done.stdout
    never_day, never_hour, waiting, running = answers[:4]
    assert never_day.startswith(f"ads.daily_gmv {before}: can never exist\n"), never_day
    assert f"(the warehouse starts {start}, WAREHOUSE_START)" in never_day
    assert never_hour.startswith(f"ods.order {before}-23:00: can never exist\n"), never_hour
    assert waiting.startswith(f"ads.daily_gmv {yesterday}: queued\n"), waiting
    verdict = waiting.strip().splitlines()[-1]
    # how long: seconds, or minutes and seconds on a machine slow enough to start this interpreter in over 90 s
    assert re.fullmatch(
        rf"verdict: queued for (\d+ min )?\d+ s as run {queued[:8]}, behind 1 run\(s\) in progress \({busy[:8]} "
        rf"dwd\.order_detail {start}\)",
        verdict,
    ), verdict
    # the partition being built names the run building it
    assert running.startswith(f"dwd.order_detail {start}: in progress\n"), running
    verdict = running.strip().splitlines()[-1]
    assert re.fullmatch(rf"verdict: running for (\d+ min )?\d+ s as run {busy[:8]}", verdict), verdict
    assert "starts it within a second" not in done.stdout
