"""Bad source data found and repaired exactly, on the example warehouse, end to end.

The simulated source sends one hour of orders (2026-01-05, the hour with the most paid orders confined to it) with
amounts 100 times too high. The warehouse ingests it and builds every table (by a backfill), so the bad hour flows
into DWD, DWS and ADS: the session's example warehouse (tests/support/warehouse.py), of which this module takes a
copy as built, and whose tables it reads are those of ``DAILY`` over 2026-01-01 .. 01-08 and after (the hourly ones on
the 5th); its catalog is those tables and their inputs. Then, as on-call would:
``warehouse taint ods.order H H --reason …`` prints the plan; the source re-sends the corrected rows; ``--apply``
marks the closure tainted and launches the repair backfill; the ingestion applies the corrected rows and reports the
hour again (its checks pass: valid again); the backfill daemon runs the repair.

Afterwards every ADS figure equals the independent replay of the landing area again, every partition the closure
does not hold kept its Delta files and its materialization (nothing else was rebuilt), and every run succeeded.

Then the two ways out for an hour the source will not send again, on the same warehouse: an hour whose rows were lost
in the lake (the landing area holds them right) is tainted and re-ingested from the landing area in one command, and its
repair rebuilds what was built from it; an hour the source vouches for is tainted, its repair's runs wait for it
instead of failing, and the hour is released ("accepted as is"): the waiting runs build, and status shows the release.
"""

from __future__ import annotations

import io
import re
import threading
import time
from collections.abc import Iterator
from contextlib import redirect_stdout
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pyarrow as pa
import pytest
from dagster import (
    AssetCheckKey,
    AssetKey,
    AssetRecordsFilter,
    DagsterEventType,
    DagsterInstance,
    DagsterRunStatus,
    RunsFilter,
    instance_for_test,
)
from deltalake import DeltaTable
from pyspark.sql import SparkSession

# the repairs' code location (tests/support/repair.py) reads the product's catalog, as when this module built its own
# warehouse: loaded now, before the module's fixture sets a catalog of its own for the commands
import warehouse_assets.definitions  # noqa: F401
from resources import LandingResource, resources_from_env
from resources.settings import Settings, using
from simulator.corrections import confined_rows_of_day, resend_corrected
from tests.support import oracle
from tests.support.instances import memory_backed_dir, pooled_event_log
from tests.support.lake import row_dicts
from tests.support.repair import SYNC_RUNS, code_location, run_backfill
from tests.support.small_catalog import product_tables
from tests.support.warehouse import BACKFILL_ID, BATCH_MINUTES, HOUR_DAY, ExampleWarehouse
from warehouse_assets.catalog import load_catalog
from warehouse_assets.cli import main
from warehouse_assets.cli.headless import run_ingest
from warehouse_assets.materialize.validity import tainted_in_instance

TZ = ZoneInfo("Asia/Shanghai")
DAYS = [date(2026, 1, 1) + timedelta(days=n) for n in range(8)]
# the per-test limit: the module's first test taints and repairs the eight days (its fixture), and builds the example
# warehouse first when no module of its group ran before it (the end-to-end module's limit)
pytestmark = pytest.mark.timeout(2400)
DAILY = [
    "dwd.user_snapshot",
    "dwd.lesson_snapshot",
    "dwd.order_detail",
    "dwd.attendance_detail",
    "dws.user_order_daily",
    "dws.user_learning_daily",
    "dws.user_learning_cumulative",
    "dws.user_active_daily",
    "ads.daily_gmv",
    "ads.attendance_rate_daily",
    "ads.retention_d1",
    "ads.retention_d7",
]
HOURLY = ["dws.order_hourly", "ads.gmv_hourly"]


@dataclass
class Repaired:
    landing: Path
    lake: Path
    instance: DagsterInstance
    hour: str  # the bad hour's partition key
    keys: set[int]  # the orders it corrupted
    plan: list[str]  # what `warehouse taint` printed
    applied: list[str]  # what `--apply` printed
    gmv_before: Decimal  # the bad day's GMV as built from the bad hour
    files_before: dict[str, dict[str, set[str]]]  # table → partition → its Delta files, before the repair
    latest_before: dict[str, dict[str, int]]  # table → partition → storage id of its latest materialization
    closure: dict[str, set[str]]  # table → the partitions the taint marked
    backfill: Any


def _rows(lake: Path, fqn: str) -> list[dict[str, Any]]:
    rows = row_dicts(lake / Path(*fqn.split(".")))
    return [r for r in rows if not r.get("_deleted")]


def _partition_of(fqn: str, row_partition: dict[str, Any]) -> str:
    if "hh" in row_partition and row_partition["hh"] is not None:
        return f"{row_partition['dt']}-{row_partition['hh']}:00"
    return str(row_partition["dt"])


def _files(lake: Path, fqn: str) -> dict[str, set[str]]:
    """Partition key → the data files of the table's current version holding it."""
    actions = pa.table(DeltaTable(str(lake / Path(*fqn.split(".")))).get_add_actions(flatten=True)).to_pylist()
    found: dict[str, set[str]] = {}
    for action in actions:
        values = {k.removeprefix("partition."): v for k, v in action.items() if k.startswith("partition.")}
        found.setdefault(_partition_of(fqn, values), set()).add(action["path"])
    return found


def _latest(instance: DagsterInstance, fqn: str) -> dict[str, int]:
    """Partition key → storage id of its latest materialization."""
    key = AssetKey(fqn.split("."))
    partitions = sorted(instance.get_materialized_partitions(key))
    out: dict[str, int] = {}
    for partition in partitions:
        [record] = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=key, asset_partitions=[partition]), limit=1
        ).records
        out[partition] = record.storage_id
    return out


@pytest.fixture(scope="module")
def home() -> Iterator[Path]:
    """The module's Dagster home, which its commands open too: one event log for every run, its connections pooled, in
    memory-backed storage (tests/support/instances.py), where the ingestion's thousands of hour reports and check
    verdicts cost no disk sync each and no new connection each."""
    with memory_backed_dir("taint-e2e-home-") as path:
        yield path


@pytest.fixture(scope="module")
def repaired(
    tmp_path_factory: pytest.TempPathFactory, spark: SparkSession, home: Path, example_warehouse: ExampleWarehouse
) -> Iterator[Repaired]:
    root = tmp_path_factory.mktemp("taint_e2e")
    # the example warehouse as built, copied: the bad hour ingested and built into every table of DAILY and HOURLY
    copy = example_warehouse.copy(root, home)
    landing, lake, hour, keys = copy.landing, copy.lake, example_warehouse.hour, example_warehouse.keys
    # the tables this module built when it built its own warehouse, and what they read: what the example warehouse
    # built besides (the week to date, the 30-day window, the month) would widen the closure and the repair
    tables = product_tables(root / "tables", [*DAILY, *HOURLY])
    env = {
        "WAREHOUSE_LAKE_ROOT": str(lake),
        "WAREHOUSE_LANDING_ROOT": str(landing),
        "WAREHOUSE_CATALOG_DIR": str(tables),
        "DAGSTER_HOME": str(home),
    }
    resources = resources_from_env(env)
    resources["landing"] = LandingResource(root=str(landing), timezone="Asia/Shanghai", segment_minutes=BATCH_MINUTES)
    # the commands read the process's settings, which another module of the worker may have read first: these are
    # the module's own for every command it runs
    with (
        pytest.MonkeyPatch.context() as patch,
        using(Settings.from_env(env)),
        # DAGSTER_HOME is the patch's to set and undo: set here too, the patch would record this value as the one to
        # restore, and leave the module's deleted home to the worker's later modules
        instance_for_test(
            temp_dir=str(home), overrides={**SYNC_RUNS, **pooled_event_log(home)}, set_dagster_home=False
        ) as instance,
    ):
        for name, value in env.items():
            patch.setenv(name, value)
        gmv_before = {r["dt"]: r["gmv"] for r in _rows(lake, "ads.daily_gmv")}[HOUR_DAY.isoformat()]
        derived = [*DAILY, *HOURLY]
        files_before = {fqn: _files(lake, fqn) for fqn in derived}
        latest_before = {fqn: _latest(instance, fqn) for fqn in ["ods.order", *derived]}

        key = f"{hour:%Y-%m-%d-%H}:00"
        reason = "order amounts 100x too high (a unit error at the source)"
        command = ["taint", "ods.order", key, key, "--reason", reason, "--by", "oncall"]
        with redirect_stdout(io.StringIO()) as out:
            assert main(command) == 0  # the plan, before anything is done
        plan = out.getvalue().splitlines()
        assert resend_corrected(landing, "order", hour, keys) == len(keys)  # the source is fixed
        with redirect_stdout(io.StringIO()) as out:
            assert main([*command, "--apply"]) == 0
        applied = out.getvalue().splitlines()
        catalog = load_catalog()
        closure = {
            fqn: set(tainted_in_instance(instance, catalog[fqn], list(latest_before[fqn])))
            for fqn in ["ods.order", *derived]
        }
        summary = run_ingest(instance, resources)  # the corrected rows: the hour is reported again, checked
        assert summary["ods.order"]["hours_reported"] >= 1
        assert tainted_in_instance(instance, catalog["ods.order"], [key]) == {}  # its checks passed on the new data
        [backfill_id] = re.findall(r"repair backfill (\w+)", applied[-1])
        with code_location(instance) as workspace:
            backfill = run_backfill(instance, workspace, backfill_id)
        yield Repaired(
            landing,
            lake,
            instance,
            key,
            keys,
            plan,
            applied,
            gmv_before,
            files_before,
            latest_before,
            closure,
            backfill,
        )


def test_the_plan_names_the_closure_before_anything_is_done(repaired: Repaired) -> None:
    day = HOUR_DAY.isoformat()
    plan = repaired.plan
    assert (
        plan[0]
        == f"taint ods.order {repaired.hour}: order amounts 100x too high (a unit error at the source) (by oncall)"
    )
    tables = {line.split()[0]: line.split()[1] for line in plan[1:] if line.startswith("  ") and "run(s)" in line}
    assert {t: tables[t] for t in ("dwd.order_detail", "dws.user_order_daily", "ads.daily_gmv")} == dict.fromkeys(
        ("dwd.order_detail", "dws.user_order_daily", "ads.daily_gmv"), day
    )
    assert tables["dws.order_hourly"] == tables["ads.gmv_hourly"] == repaired.hour
    assert any(line.startswith("nothing marked yet") for line in plan)
    # the plan alone launched nothing: one backfill, the apply's, besides the one that built the warehouse
    assert [b.backfill_id for b in repaired.instance.get_backfills()][1:] == [BACKFILL_ID]


def test_apply_marked_exactly_what_was_built_from_the_hour(repaired: Repaired) -> None:
    day = HOUR_DAY.isoformat()
    assert {t: k for t, k in repaired.closure.items() if k} == {
        "ods.order": {repaired.hour},
        "dwd.order_detail": {day},
        "dws.user_order_daily": {day},
        "dws.user_active_daily": {day},
        "ads.daily_gmv": {day},
        "ads.retention_d1": {day},
        "dws.order_hourly": {repaired.hour},
        "ads.gmv_hourly": {repaired.hour},
    }


def test_the_repair_succeeded_and_every_partition_is_valid_again(repaired: Repaired) -> None:
    assert repaired.backfill.status.value == "COMPLETED_SUCCESS"
    failed = [
        r.dagster_run for r in repaired.instance.get_run_records() if r.dagster_run.status != DagsterRunStatus.SUCCESS
    ]
    assert not failed, [(r.job_name, r.run_id) for r in failed]
    catalog = load_catalog()
    for fqn, keys in repaired.closure.items():
        assert tainted_in_instance(repaired.instance, catalog[fqn], sorted(keys)) == {}, fqn


def test_every_ads_figure_equals_the_replay_again(repaired: Repaired) -> None:
    truth = oracle.replay(repaired.landing)  # the corrected source
    day = HOUR_DAY.isoformat()
    gmv = {r["dt"]: r for r in _rows(repaired.lake, "ads.daily_gmv")}
    expected = oracle.daily_gmv(truth["order"], "Asia/Shanghai")
    assert repaired.gmv_before != expected[HOUR_DAY]  # the bad hour did show in the figure
    for d in DAYS:
        assert gmv[d.isoformat()]["gmv"] == expected.get(d, Decimal("0")), d
    hourly = {f"{r['dt']} {r['hh']}": r for r in _rows(repaired.lake, "ads.gmv_hourly")}
    for h in range(24):
        stamp = f"{day} {h:02d}"
        want = oracle.gmv_hourly(truth, stamp)
        assert {k: hourly[stamp][k] for k in want} == want, stamp
    rates = {r["dt"]: r for r in _rows(repaired.lake, "ads.attendance_rate_daily")}
    retention = {r["dt"]: r for r in _rows(repaired.lake, "ads.retention_d1")}
    for d in DAYS:
        want = oracle.attendance_rate(truth, d.isoformat())
        assert {k: rates[d.isoformat()][k] for k in want if k != "attendance_rate"} == {
            k: v for k, v in want.items() if k != "attendance_rate"
        }
        if d.isoformat() in retention:
            want = oracle.retention(truth, d.isoformat(), 1)
            assert {k: retention[d.isoformat()][k] for k in ("cohort_users", "retained_users")} == {
                k: want[k] for k in ("cohort_users", "retained_users")
            }


def test_nothing_outside_the_closure_was_rebuilt(repaired: Repaired) -> None:
    for fqn, before in repaired.files_before.items():
        after = _files(repaired.lake, fqn)
        marked = repaired.closure.get(fqn, set())
        for partition, files in before.items():
            if partition in marked:
                assert after[partition].isdisjoint(files), (fqn, partition)  # rebuilt
            else:
                assert after[partition] == files, (fqn, partition)  # the same Delta files
    for fqn, before in repaired.latest_before.items():
        after = _latest(repaired.instance, fqn)
        marked = repaired.closure.get(fqn, set())
        changed = {p for p, storage_id in before.items() if after[p] != storage_id}
        if fqn == "ods.order":
            assert changed == {repaired.hour}  # reported again with the corrected rows
        else:
            assert changed == marked, fqn


# --- the ways out for an hour its source will not send again ------------------------------------------------------


def _other_hours(landing: Path, taken: str) -> list[datetime]:
    """The hours of HOUR_DAY but ``taken``, those with the most paid orders confined to them first."""
    truth = oracle.replay(landing)["order"]
    found = []
    for hour, keys in confined_rows_of_day(landing, "order", HOUR_DAY).items():
        if f"{hour:%Y-%m-%d-%H}:00" != taken:
            found.append((sum(1 for k in keys if truth[k]["status"] == "paid"), hour))
    return [hour for paid, hour in sorted(found, reverse=True) if paid]


def _ods_hour(lake: Path, key: str) -> dict[int, dict[str, Any]]:
    """The live rows of ods.order's hour ``key``, by id."""
    day, hh = key[:10], key[11:13]
    return {r["id"]: r for r in _rows(lake, "ods.order") if str(r["dt"]) == day and r["hh"] == hh}


def _cli(argv: list[str]) -> list[str]:
    with redirect_stdout(io.StringIO()) as out:
        assert main(argv) == 0, argv
    return out.getvalue().splitlines()


def _unfinished_runs(instance: DagsterInstance) -> list[Any]:
    return [r.dagster_run for r in instance.get_run_records() if r.dagster_run.status != DagsterRunStatus.SUCCESS]


@dataclass
class Reingested:
    hour: str
    before: int  # the hour's live rows in the lake once lost
    printed: list[str]
    backfill: Any


@pytest.fixture(scope="module")
def reingested(repaired: Repaired, spark: SparkSession) -> Reingested:
    """An hour whose rows were lost in the lake, tainted and re-ingested from the landing area by one command."""
    hour = _other_hours(repaired.landing, repaired.hour)[0]
    key = f"{hour:%Y-%m-%d-%H}:00"
    ods = (repaired.lake / "ods" / "order").as_posix()
    spark.sql(f"DELETE FROM delta.`{ods}` WHERE dt = '{key[:10]}' AND hh = '{key[11:13]}'")  # lost in the lake
    before = len(_ods_hour(repaired.lake, key))
    reason = "the hour's rows were lost in the lake"
    printed = _cli(["taint", "ods.order", key, key, "--reason", reason, "--by", "oncall", "--apply", "--reingest"])
    [backfill_id] = re.findall(r"repair backfill (\w+)", printed[-1])
    with code_location(repaired.instance) as workspace:
        backfill = run_backfill(repaired.instance, workspace, backfill_id)
    return Reingested(key, before, printed, backfill)


def test_a_reingest_rebuilds_the_hour_from_the_landing_area_and_the_repair_rebuilds_what_read_it(
    repaired: Repaired, reingested: Reingested
) -> None:
    truth = oracle.replay(repaired.landing)["order"]
    day, hh = reingested.hour[:10], reingested.hour[11:13]
    want = {k: r for k, r in truth.items() if r["create_time"].startswith(f"{day} {hh}")}
    assert want and reingested.before == 0  # the lake had lost the hour
    assert any(
        line.startswith(f"ods.order: re-ingested {reingested.hour} ({len(want)} rows)") for line in reingested.printed
    )
    got = _ods_hour(repaired.lake, reingested.hour)
    assert {k: Decimal(str(r["amount"])) for k, r in got.items()} == {k: Decimal(r["amount"]) for k, r in want.items()}
    assert reingested.backfill.status.value == "COMPLETED_SUCCESS"
    failed = _unfinished_runs(repaired.instance)
    assert not failed, [(r.job_name, r.run_id, r.status) for r in failed]
    gmv = {r["dt"]: r["gmv"] for r in _rows(repaired.lake, "ads.daily_gmv")}
    expected = oracle.daily_gmv(truth, "Asia/Shanghai")
    assert {d: gmv[d.isoformat()] for d in DAYS} == {d: expected.get(d, Decimal("0")) for d in DAYS}
    hourly = {f"{r['dt']} {r['hh']}": r for r in _rows(repaired.lake, "ads.gmv_hourly")}
    stamp = f"{day} {hh}"
    want_hourly = oracle.gmv_hourly(oracle.replay(repaired.landing), stamp)
    assert {k: hourly[stamp][k] for k in want_hourly} == want_hourly
    catalog = load_catalog()
    for fqn in ["ods.order", "dwd.order_detail", "ads.daily_gmv", "dws.order_hourly", "ads.gmv_hourly"]:
        keys = [reingested.hour] if catalog[fqn].period == "hourly" else [day]
        assert tainted_in_instance(repaired.instance, catalog[fqn], keys) == {}, fqn


@dataclass
class Released:
    hour: str
    waited: str  # what a run of the repair logged while it waited
    printed: list[str]  # what `warehouse release` printed
    status: list[str]  # what `warehouse status ods.order` printed for the hour afterwards
    backfill: Any


@pytest.fixture(scope="module")
def released(repaired: Repaired, reingested: Reingested) -> Released:
    """An hour tainted with no correction coming: the repair's runs wait; the hour is released, and they build."""
    instance = repaired.instance
    hour = next(h for h in _other_hours(repaired.landing, repaired.hour) if f"{h:%Y-%m-%d-%H}:00" != reingested.hour)
    key = f"{hour:%Y-%m-%d-%H}:00"
    applied = _cli(["taint", "ods.order", key, key, "--reason", "amounts look wrong", "--by", "oncall", "--apply"])
    [backfill_id] = re.findall(r"repair backfill (\w+)", applied[-1])
    outcome: dict[str, Any] = {}

    def repair() -> None:  # the backfill daemon's iterations, whose runs execute in this thread
        try:
            with code_location(instance) as workspace:
                outcome["backfill"] = run_backfill(instance, workspace, backfill_id)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            outcome["error"] = exc

    daemon = threading.Thread(target=repair, name="backfill-daemon")
    daemon.start()
    waited, deadline = "", time.monotonic() + 600
    while not waited and daemon.is_alive():
        assert time.monotonic() < deadline, "no run of the repair waited for the tainted hour"
        runs = instance.get_run_records(RunsFilter(tags={"dagster/backfill": backfill_id}))
        messages = [e.message for r in runs for e in instance.all_logs(r.dagster_run.run_id)]
        waited = next((m for m in messages if m.endswith("; waiting")), "")
        time.sleep(0.5)
    assert waited, outcome.get("error") or "the repair ended without waiting"
    printed = _cli(["release", "ods.order", key, "--reason", "the source confirms the amounts", "--by", "oncall"])
    daemon.join(timeout=900)
    assert not daemon.is_alive(), "the repair did not finish once the hour was released"
    if "error" in outcome:
        raise outcome["error"]
    status = _cli(["status", "ods.order", "--range", key, key])
    return Released(key, waited, printed, status, outcome["backfill"])


def test_a_repairs_runs_wait_for_the_tainted_hour_naming_the_ways_out_not_the_taint(released: Released) -> None:
    assert f"ods.order that are tainted ({released.hour};" in released.waited
    assert f"`warehouse reingest ods.order {released.hour}`" in released.waited
    assert f"`warehouse release ods.order {released.hour} --reason" in released.waited
    assert "warehouse taint" not in released.waited


def test_a_release_is_recorded_shown_and_lets_what_was_built_from_the_hour_build(
    repaired: Repaired, released: Released
) -> None:
    instance = repaired.instance
    assert released.printed[0] == (
        f"released ods.order {released.hour}: accepted as is: the source confirms the amounts (by oncall)"
    )
    # an event of the log: the hour's latest `valid` verdict, passed, says so
    check = AssetCheckKey(AssetKey(["ods", "order"]), "valid")
    [info] = instance.event_log_storage.get_asset_check_partition_info([check], partition_keys=[released.hour])
    entry = instance.event_log_storage.get_logs_for_all_runs_by_log_id(
        after_cursor=info.latest_check_event_storage_id - 1,
        dagster_event_type=DagsterEventType.ASSET_CHECK_EVALUATION,
        limit=1,
    )[info.latest_check_event_storage_id]
    assert entry.dagster_event is not None
    verdict = entry.dagster_event.asset_check_evaluation_data
    assert verdict.passed and info.is_current
    assert {k: v.value for k, v in verdict.metadata.items()}["validity"] == "released"
    # `warehouse status` shows it where it showed the taint
    assert "released, accepted as is: the source confirms the amounts (by oncall)" in released.status[1]
    # the waiting repair built what was built from the hour, every run of it (and of the module) succeeded
    assert released.backfill.status.value == "COMPLETED_SUCCESS"
    failed = _unfinished_runs(instance)
    assert not failed, [(r.job_name, r.run_id, r.status) for r in failed]
    catalog = load_catalog()
    day = released.hour[:10]
    for fqn in ["ods.order", "dwd.order_detail", "ads.daily_gmv", "dws.order_hourly", "ads.gmv_hourly"]:
        keys = [released.hour] if catalog[fqn].period == "hourly" else [day]
        assert tainted_in_instance(instance, catalog[fqn], keys) == {}, fqn
    truth = oracle.replay(repaired.landing)["order"]
    gmv = {r["dt"]: r["gmv"] for r in _rows(repaired.lake, "ads.daily_gmv")}
    assert gmv[day] == oracle.daily_gmv(truth, "Asia/Shanghai")[HOUR_DAY]
