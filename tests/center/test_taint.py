"""Taint and repair: the exact closure of bad partitions across periods, offsets, windows and self-dependencies; the
plan printed before anything is done; ``--apply`` marking every built partition and launching one asset backfill
that the dependency center leaves alone; ``warehouse status``.

The closure is the reverse index's (no Dagster instance); the plan and the job read a temp-dir instance whose events
are written as the product writes them: no Spark, no code location.
"""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from dagster import (
    AssetKey,
    AssetMaterialization,
    DagsterEvent,
    DagsterEventType,
    DagsterInstance,
    instance_for_test,
)
from dagster._core.definitions.asset_checks.asset_check_evaluation import AssetCheckEvaluationPlanned
from dagster._core.definitions.partitions.subset import DefaultPartitionsSubset
from dagster._core.utils import make_new_run_id

from tests.center.test_state_store import materializations, report, verdict
from tests.center.test_state_store import taint as mark
from tests.support.center_harness import CenterTicker
from warehouse_assets.catalog import BY_PERIOD, WHOLE, Catalog, load_catalog, upstream_partitions
from warehouse_assets.center.resolver import Resolver
from warehouse_assets.center.reverse_index import ReverseIndex
from warehouse_assets.center.state_store import PartitionStateStore
from warehouse_assets.center.taint import JOB, build_taint_job, new_taint, plan_taint
from warehouse_assets.cli import main
from warehouse_assets.materialize.compiler import max_partitions_per_run
from warehouse_assets.materialize.validity import VALID, Taint, tainted_in_instance

TZ = ZoneInfo("Asia/Shanghai")
NOW = datetime(2026, 3, 20, 12, tzinfo=TZ)

ODS = """table: ods.{name}
period: hourly
source: {{database: db, tables: "{name}"}}
primary_key: [id]
partition_time: t
columns: {{id: bigint, t: timestamp, v: bigint}}
checks:
  not_null: [id]
"""
DERIVED = {  # table → (header, SQL)
    "dwd.day": ("period: daily\nchecks:\n  not_null: [id]\n", "SELECT id, v FROM ods.src"),  # 24 hours
    "dws.hourly": ("period: hourly\n", "SELECT id, v FROM ods.src"),  # the same hour
    "dws.week": ("period: weekly\n", "SELECT id, v FROM dwd.day"),  # its 7 days
    "ads.month": ("period: monthly\n", "SELECT id, v FROM dwd.day"),  # the days of the month
    "ads.win7": ("period: daily\ndepends_on:\n  dwd.day: {range: [-6, 0]}\n", "SELECT id, v FROM dwd.day"),
    "dws.cum": (
        "period: daily\ncolumns: {id: bigint, v: bigint}\ndepends_on:\n  dws.cum: {set: [-1]}\n  dwd.day: {set: [0]}\n",
        "SELECT id, v FROM dwd.day UNION ALL SELECT id, v FROM dws.cum",
    ),
    "dws.other": ("period: daily\n", "SELECT id, v FROM ods.other"),  # nothing to do with ods.src ...
    # ... and a report on it that also reads yesterday's cumulative figures: downstream all the same
    "ads.mix": (
        "period: daily\ndepends_on:\n  dws.cum: {set: [-1]}\n",
        "SELECT o.id, c.v FROM dws.other o JOIN dws.cum c ON o.id = c.id",
    ),
    "ads.t7": ("period: daily\ndepends_on:\n  dwd.day: {set: [-7]}\n", "SELECT id, v FROM dwd.day"),
}


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    root = tmp_path_factory.mktemp("catalog")
    (root / "ods").mkdir()
    for name in ("src", "other"):
        (root / "ods" / f"{name}.yaml").write_text(ODS.format(name=name))
    for fqn, (header, sql) in DERIVED.items():
        layer, name = fqn.split(".")
        (root / layer).mkdir(exist_ok=True)
        (root / layer / f"{name}.sql").write_text(f"/* ---\ntable: {fqn}\n{header}--- */\n{sql}\n")
    return load_catalog(root)


@pytest.fixture(scope="module")
def index(catalog: Catalog) -> ReverseIndex:
    return ReverseIndex.build(catalog, current_time=NOW)


def days(first: str, last: str) -> list[str]:
    start, stop = datetime.fromisoformat(first), datetime.fromisoformat(last)
    return [(start + timedelta(days=n)).strftime("%Y-%m-%d") for n in range((stop - start).days + 1)]


def hours(day: str, first: int = 0, last: int = 23) -> list[str]:
    return [f"{day}-{h:02d}:00" for h in range(first, last + 1)]


# --- the exact closure ------------------------------------------------------------------------------------------


def test_ten_bad_hours_taint_their_day_its_week_and_month_and_everything_downstream(index: ReverseIndex) -> None:
    bad = hours("2026-02-10", 8, 17)
    assert index.closure({"ods.src": bad}, NOW) == {
        "ods.src": bad,  # those 10 hours
        "dws.hourly": bad,  # an hourly table reading them: the same 10 hours
        "dwd.day": ["2026-02-10"],  # 1 day of the daily table reading them
        "dws.week": ["2026-02-09"],  # the week of that day
        "ads.month": ["2026-02-01"],  # the month of that day
        "ads.win7": days("2026-02-10", "2026-02-16"),  # the 7 windows containing it
        "ads.t7": ["2026-02-17"],  # T-7 reads it 7 days later
        "dws.cum": days("2026-02-10", "2026-03-19"),  # that day and every later day (03-19 ended by NOW)
        "ads.mix": days("2026-02-11", "2026-03-19"),  # however unrelated it looks: it reads yesterday's cum
    }


def test_two_bad_hours_straddling_midnight_taint_two_days(index: ReverseIndex) -> None:
    closure = index.closure({"ods.src": ["2026-02-10-23:00", "2026-02-11-00:00"]}, NOW)
    assert closure["dwd.day"] == ["2026-02-10", "2026-02-11"]
    assert closure["dws.hourly"] == ["2026-02-10-23:00", "2026-02-11-00:00"]
    assert closure["ads.win7"] == days("2026-02-10", "2026-02-17")  # the windows containing either
    assert closure["ads.month"] == ["2026-02-01"] and closure["dws.week"] == ["2026-02-09"]


def test_a_tainted_day_taints_the_seven_sliding_windows_that_contain_it(index: ReverseIndex) -> None:
    closure = index.closure({"dwd.day": ["2026-03-02"]}, NOW)
    assert closure["ads.win7"] == days("2026-03-02", "2026-03-08")
    assert "ods.src" not in closure and "dws.hourly" not in closure  # nothing upstream
    assert "ads.month" not in closure  # March has not ended at NOW: not a partition yet


def test_a_tainted_day_of_a_self_dependent_table_taints_every_later_day(index: ReverseIndex) -> None:
    closure = index.closure({"dws.cum": ["2026-03-02"]}, NOW)
    assert closure == {"dws.cum": days("2026-03-02", "2026-03-19"), "ads.mix": days("2026-03-03", "2026-03-19")}
    # later: the days that ended since are tainted too
    later = index.closure({"dws.cum": ["2026-03-02"]}, NOW + timedelta(days=2))
    assert later["dws.cum"][-1] == "2026-03-21"


def test_the_closure_equals_the_transitive_exact_mappings(catalog: Catalog, index: ReverseIndex) -> None:
    """The closure against an independent computation: every existing partition's exact upstream partitions (Dagster's
    mappings, unclamped), followed forward until nothing new is reached."""
    now = datetime(2026, 1, 20, 12, tzinfo=TZ)
    small = ReverseIndex.build(catalog, current_time=now)
    reads: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for table in catalog.derived():
        pdef = BY_PERIOD[table.period]
        for key in pdef.get_partition_keys(current_time=now):
            for dep in table.deps:
                for up in upstream_partitions(catalog, table, dep, key, current_time=now).keys:
                    reads.setdefault((dep.table, up), set()).add((table.fqn, key))

    def expected(roots: set[tuple[str, str]]) -> dict[str, list[str]]:
        found, frontier = set(roots), list(roots)
        while frontier:
            for nxt in reads.get(frontier.pop(), ()):
                if nxt not in found:
                    found.add(nxt)
                    frontier.append(nxt)
        by_table: dict[str, list[str]] = {}
        for fqn, key in sorted(found):
            by_table.setdefault(fqn, []).append(key)
        return by_table

    cases = [
        {"ods.src": hours("2026-01-05", 8, 17)},
        {"ods.src": ["2026-01-09-23:00", "2026-01-10-00:00"]},
        {"dwd.day": ["2026-01-03"]},
        {"dwd.day": ["2026-01-01", "2026-01-02", "2026-01-12"]},
        {"dws.cum": ["2026-01-15"]},
        {"ods.other": hours("2026-01-19")},
    ]
    for roots in cases:
        got = small.closure(roots, now)
        want = expected({(t, k) for t, keys in roots.items() for k in keys})
        assert {t: sorted(k) for t, k in got.items()} == want, roots


# --- the plan ---------------------------------------------------------------------------------------------------


@pytest.fixture
def instance(consolidated: DagsterInstance) -> DagsterInstance:
    return consolidated  # one SQLite event log (tests/conftest.py): quick to write to


def build(instance: DagsterInstance, catalog: Catalog, tables: dict[str, list[str]]) -> None:
    """Report partitions materialized with their blocking checks passed, in the order given (upstream first)."""
    for fqn, keys in tables.items():
        key = AssetKey(catalog[fqn].key)
        for partition in keys:
            report(instance, key, partition)
            if catalog[fqn].checks:
                verdict(instance, key, partition, True, materializations(instance, key, partition)[0])


BUILT = {
    "ods.src": hours("2026-03-09") + hours("2026-03-10"),
    "dwd.day": ["2026-03-09", "2026-03-10"],
    "dws.hourly": hours("2026-03-10", 12, 15),
    "ads.win7": ["2026-03-10"],  # 03-11 .. 03-16 not built yet (a week without the engine)
    "dws.cum": days("2026-03-01", "2026-03-12"),
    "ads.t7": ["2026-03-17"],
}


def test_the_plan_marks_what_was_built_and_names_what_waits_or_can_never_be(
    instance: DagsterInstance, catalog: Catalog, index: ReverseIndex
) -> None:
    build(instance, catalog, BUILT)
    store = PartitionStateStore(instance)
    taint = new_taint("ods.src", "2026-03-10-12:00", "2026-03-10-14:00", "amounts 100x", "oncall")
    plan = plan_taint(catalog, index, store.view(), "ods.src", "2026-03-10-12:00", "2026-03-10-14:00", taint, now=NOW)
    by_table = {t.table: t for t in plan.tables}
    assert {t: p.marked for t, p in by_table.items() if p.marked} == {
        "ods.src": hours("2026-03-10", 12, 14),
        "dwd.day": ["2026-03-10"],
        "dws.hourly": hours("2026-03-10", 12, 14),
        "ads.win7": ["2026-03-10"],
        "dws.cum": ["2026-03-10", "2026-03-11", "2026-03-12"],
        "ads.t7": ["2026-03-17"],
    }
    assert plan.rebuild() == {t: p.marked for t, p in by_table.items() if p.marked and t != "ods.src"}
    assert by_table["ads.win7"].waiting == days("2026-03-11", "2026-03-16")
    assert by_table["dws.cum"].waiting == days("2026-03-13", "2026-03-19")
    # one run per table and run of consecutive partitions: the backfill policy runs a range in one run
    assert plan.runs == 5 and plan.marked == 12 and plan.rebuilt == 9
    lines = plan.lines()
    assert lines[0] == "taint ods.src 2026-03-10-12:00 .. 2026-03-10-14:00: amounts 100x (by oncall)"
    assert any(line.split()[:5] == ["dws.cum", "2026-03-10", "..", "2026-03-12", "(3)"] for line in lines)
    assert (
        "12 partition(s) of 6 table(s) to mark tainted; the repair rebuilds 9 partition(s) of 5 table(s) in 5 run(s)"
        in ("\n".join(lines))
    )
    assert "| `dws.cum` | 2026-03-10 .. 2026-03-12 (3) | 3 | rebuilt in 1 run(s) |" in plan.markdown()


def test_a_window_before_the_warehouse_start_is_named_and_left_out(
    instance: DagsterInstance, catalog: Catalog, index: ReverseIndex
) -> None:
    build(instance, catalog, {"ods.src": hours("2026-01-02"), "dwd.day": ["2026-01-02"]})
    store = PartitionStateStore(instance)
    taint = new_taint("dwd.day", "2026-01-02", "2026-01-02", "bad", "oncall")
    plan = plan_taint(catalog, index, store.view(), "dwd.day", "2026-01-02", "2026-01-02", taint, now=NOW)
    by_table = {t.table: t for t in plan.tables}
    # the 7-day windows of 01-02 .. 01-06 reach before 01-01: never built, never to be; 01-07 and 01-08 wait
    assert by_table["ads.win7"].never == days("2026-01-02", "2026-01-06")
    assert by_table["ads.win7"].waiting == ["2026-01-07", "2026-01-08"]
    assert by_table["ads.t7"].waiting == ["2026-01-09"]
    assert any(line.startswith("can never be built") for line in plan.lines())


def test_a_root_reported_again_after_what_was_built_from_it_is_taken_as_corrected(
    instance: DagsterInstance, catalog: Catalog, index: ReverseIndex
) -> None:
    build(instance, catalog, {"ods.src": hours("2026-03-10"), "dwd.day": ["2026-03-10"]})
    build(instance, catalog, {"ods.src": ["2026-03-10-13:00"]})  # the corrected source, re-ingested
    store = PartitionStateStore(instance)
    taint = new_taint("ods.src", "2026-03-10-12:00", "2026-03-10-13:00", "bad", "oncall")
    plan = plan_taint(catalog, index, store.view(), "ods.src", "2026-03-10-12:00", "2026-03-10-13:00", taint, now=NOW)
    by_table = {t.table: t for t in plan.tables}
    assert by_table["ods.src"].marked == ["2026-03-10-12:00"] and by_table["ods.src"].corrected == ["2026-03-10-13:00"]
    assert by_table["dwd.day"].marked == ["2026-03-10"]


# --- applying: the job marks them and launches one backfill; the engine leaves them to it -----------------------


def test_apply_marks_every_built_partition_and_launches_one_backfill_the_engine_leaves_alone(
    instance: DagsterInstance, catalog: Catalog, index: ReverseIndex
) -> None:
    build(instance, catalog, BUILT)
    config = {
        "table": "ods.src",
        "start": "2026-03-10-12:00",
        "end": "2026-03-10-14:00",
        "reason": "amounts 100x",
        "apply": True,
        "by": "oncall",
    }
    result = build_taint_job(catalog).execute_in_process(
        run_config={"ops": {"taint_and_repair": {"config": config}}}, instance=instance
    )
    assert result.success and result.dagster_run.job_name == JOB
    out = result.output_for_node("taint_and_repair")
    assert (out["marked"], out["rebuilt"], out["runs"]) == (12, 9, 5)

    # every partition marked, with reason, root, who and its repair
    store = PartitionStateStore(instance)
    store.update()
    tainted = {(s.asset_key, s.partition): s.taint for s in store.all_states() if s.taint is not None}
    assert len(tainted) == 12
    some = tainted[("dws/cum", "2026-03-11")]
    assert some is not None
    assert (some.reason, some.root, some.by, some.repair) == (
        "amounts 100x",
        "ods.src 2026-03-10-12:00 .. 2026-03-10-14:00",
        "oncall",
        out["backfill"],
    )
    # the plan, as Markdown, in the run's metadata
    [materialized_output] = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"]
    plan = materialized_output.event_specific_data.metadata["plan"].value  # type: ignore[union-attr]
    assert "| `dwd.day` | 2026-03-10 | 1 | rebuilt in 1 run(s) |" in plan

    # one asset backfill of exactly the derived partitions marked, as ranges per asset
    [backfill] = instance.get_backfills()
    assert backfill.backfill_id == out["backfill"] and backfill.is_asset_backfill
    target = backfill.asset_backfill_data.target_subset  # type: ignore[union-attr]
    assert {
        key.to_user_string(): sorted(target.get_partitions_subset(key).get_partition_keys())
        for key in target.asset_keys
    } == {
        "dwd/day": ["2026-03-10"],
        "dws/hourly": hours("2026-03-10", 12, 14),
        "ads/win7": ["2026-03-10"],
        "dws/cum": ["2026-03-10", "2026-03-11", "2026-03-12"],
        "ads/t7": ["2026-03-17"],
    }
    assert backfill.tags["warehouse/taint"] == result.run_id

    # the engine: nothing is built on a tainted partition, and what the backfill rebuilds is left to it
    resolver = Resolver(catalog, index, store, max_partitions_per_run)
    build(instance, catalog, {"ods.src": hours("2026-03-11")})  # the next day arrives
    build(instance, catalog, {"dwd.day": ["2026-03-10"]})  # the backfill rebuilt the day
    requested = {(p.table, k) for p in resolver.step(NOW) for k in p.partitions}
    assert ("dws.cum", "2026-03-10") not in requested and ("ads.win7", "2026-03-10") not in requested  # the backfill's
    assert ("dwd.day", "2026-03-11") in requested  # untouched by the taint
    assert ("dws.cum", "2026-03-13") not in requested  # its T-1 is tainted: it waits for the repair
    resolver.close()
    store.close()


# --- the command line -------------------------------------------------------------------------------------------


def test_the_taint_command_prints_the_plan_and_apply_acts_status_shows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("WAREHOUSE_LAKE_ROOT", str(tmp_path / "lake"))
    monkeypatch.setenv("WAREHOUSE_LANDING_ROOT", str(tmp_path / "landing"))
    day = "2026-03-02"
    catalog = load_catalog()
    with instance_for_test(temp_dir=str(home)) as instance:
        build(instance, catalog, {"ods.order": hours(day), "dwd.order_detail": [day], "dws.user_order_daily": [day]})
    assert main(["taint", "ods.order", f"{day}-08:00", f"{day}-17:00", "--reason", "amounts 100x", "--by", "me"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"taint ods.order {day}-08:00 .. {day}-17:00: amounts 100x (by me)"
    assert out[1].split()[:5] == ["ods.order", f"{day}-08:00", "..", f"{day}-17:00", "(10)"]
    assert any(line.split()[:2] == ["dwd.order_detail", day] for line in out)
    assert out[-1].startswith("nothing marked yet")
    assert main(["status", "dwd.order_detail", "--range", day, day]) == 0
    status = capsys.readouterr().out.splitlines()
    assert status[0] == "dwd.order_detail (daily): 1 partition(s), 1 materialized, 0 tainted"
    assert "valid" in status[1] and "tainted" not in status[1]

    args = ["taint", "ods.order", f"{day}-08:00", f"{day}-17:00", "--reason", "amounts 100x", "--by", "me"]
    assert main([*args, "--apply"]) == 0
    applied = capsys.readouterr().out.splitlines()
    assert applied[-1].startswith("marked 12 partition(s) tainted; repair backfill ")
    assert main(["status", "dwd.order_detail", "--range", day, day]) == 0
    status = capsys.readouterr().out.splitlines()
    assert status[0] == "dwd.order_detail (daily): 1 partition(s), 1 materialized, 1 tainted"
    assert f"tainted: amounts 100x, from ods.order {day}-08:00 .. {day}-17:00" in status[1]
    assert main(["why", "dws.user_order_daily", "2026-03-03"]) == 0  # read by why as the engine reads it
    assert main(["taint", "ods.order", f"{day}-18:00", f"{day}-08:00", "--reason", "x"]) == 2


def test_a_tainted_static_table_taints_every_partition_built_from_it_and_is_repaired_by_its_sql(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("WAREHOUSE_LAKE_ROOT", str(tmp_path / "lake"))
    monkeypatch.setenv("WAREHOUSE_LANDING_ROOT", str(tmp_path / "landing"))
    catalog = load_catalog()
    static = AssetKey(catalog["dwd.city_tier"].key)
    built = days("2026-03-02", "2026-03-04")
    with instance_for_test(temp_dir=str(home)) as instance:
        instance.report_runless_asset_event(AssetMaterialization(static))  # the static table, unpartitioned
        build(instance, catalog, {"dwd.user_snapshot": built, "ads.new_users_by_tier": built})
    index = ReverseIndex.build(catalog, current_time=NOW)
    # every partition that exists of the table that reads it, and on from there
    assert index.closure({"dwd.city_tier": [WHOLE]}, NOW)["ads.new_users_by_tier"] == days("2026-01-01", "2026-03-19")
    assert main(["taint", "dwd.city_tier", "2026-03-02", "2026-03-02", "--reason", "x"]) == 2
    assert "dwd.city_tier is a static table: it has no partitions" in capsys.readouterr().err
    args = ["taint", "dwd.city_tier", "--reason", "tiers swapped", "--by", "me"]
    assert main([*args, "--apply"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "taint dwd.city_tier (static, whole): tiers swapped (by me)"
    assert any(line.split()[:2] == ["dwd.city_tier", "whole"] and "correcting its SQL" in line for line in out)
    assert out[-1].startswith("marked 4 partition(s) tainted; repair backfill ")  # the table and its 3 days
    with instance_for_test(temp_dir=str(home)) as instance:
        store = PartitionStateStore(instance)
        store.update()
        taint = store.states(static, [WHOLE])[WHOLE].taint
        assert taint is not None and taint.root == "dwd.city_tier" and taint.reason == "tiers swapped"
        reader = store.states(AssetKey(catalog["ads.new_users_by_tier"].key), ["2026-03-03"])["2026-03-03"].taint
        assert reader is not None and reader.root == "dwd.city_tier"
        # the run guard reads the same from the instance
        assert set(tainted_in_instance(instance, catalog["dwd.city_tier"], [WHOLE])) == {WHOLE}
        instance.report_runless_asset_event(AssetMaterialization(static))  # its SQL corrected, built again
        assert tainted_in_instance(instance, catalog["dwd.city_tier"], [WHOLE]) == {}
        store.update()
        assert store.states(static, [WHOLE])[WHOLE].taint is None
        store.close()


def planned(instance: DagsterInstance, key: AssetKey, partition: str) -> None:
    """The ``valid`` check of a partition planned in a run of its own, as a run that rebuilds it logs it first."""
    subset = DefaultPartitionsSubset({partition})
    plan = AssetCheckEvaluationPlanned(asset_key=key, check_name=VALID, partitions_subset=subset)
    event = DagsterEvent(DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED.value, "repair", event_specific_data=plan)
    instance.report_dagster_event(event, make_new_run_id())


def test_the_run_guard_reads_a_partition_tainted_while_its_repair_runs_and_after_it_failed_before_building(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    day = AssetKey(["dwd", "day"])
    build(instance, catalog, {"ods.src": hours("2026-03-10"), "dwd.day": ["2026-03-09", "2026-03-10"]})
    bad = materializations(instance, day, "2026-03-10")[0]
    mark(instance, day, "2026-03-10", bad, reason="amounts 100x")
    guard = lambda: tainted_in_instance(instance, catalog["dwd.day"], ["2026-03-09", "2026-03-10"])  # noqa: E731
    assert {p: t.reason for p, t in guard().items()} == {"2026-03-10": "amounts 100x"}

    planned(instance, day, "2026-03-10")  # the repair's run starts; it fails before its build, or is still running
    assert {p: t.reason for p, t in guard().items()} == {"2026-03-10": "amounts 100x"}
    planned(instance, day, "2026-03-09")  # a plan on a partition never tainted taints nothing
    assert set(guard()) == {"2026-03-10"}

    report(instance, day, "2026-03-10")  # the repair built it: the taint was on the build before
    assert guard() == {}
    verdict(instance, day, "2026-03-10", True, materializations(instance, day, "2026-03-10")[0])
    assert guard() == {}


def test_every_example_of_the_closure_is_cheap_in_lookups(index: ReverseIndex) -> None:
    # a 10-day taint of an ODS table: the closure is computed on runs of partitions, not partition by partition
    roots = {"ods.src": [h for d in days("2026-02-01", "2026-02-10") for h in hours(d)]}
    closure = index.closure(roots, NOW)
    assert closure["dwd.day"] == days("2026-02-01", "2026-02-10")
    assert closure["dws.cum"] == days("2026-02-01", "2026-03-19")
    assert list(itertools.chain(closure["dws.week"])) == ["2026-01-26", "2026-02-02", "2026-02-09"]


# --- late data failing its checks taints what was built before it, and the fix rebuilds it once -----------------


def store_taints(store: PartitionStateStore) -> list[Taint]:
    return [s.taint for s in store.all_states() if s.taint is not None]


def test_a_late_failed_verdict_taints_what_was_built_holds_it_back_and_the_fix_rebuilds_it_once(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    src = AssetKey(["ods", "src"])
    late = "2026-03-10-13:00"
    build(instance, catalog, {"ods.src": hours("2026-03-09") + hours("2026-03-10")})
    build(instance, catalog, {"dwd.day": days("2026-03-04", "2026-03-10"), "dws.cum": days("2026-03-01", "2026-03-10")})
    build(instance, catalog, {"ads.win7": ["2026-03-10"], "dws.hourly": hours("2026-03-10")})
    engine = CenterTicker(instance, catalog)
    at = datetime(2026, 3, 11, 0, 30, tzinfo=TZ)
    engine.tick(at)  # the engine starts: everything there is already built

    # late data re-reports the hour; then, with the next day's data, its check fails on the new data
    report(instance, src, late)
    assert engine.tick(at)["dwd.day"] == [] and not engine.jobs  # its verdict is still to come
    build(instance, catalog, {"ods.src": hours("2026-03-11"), "dwd.day": ["2026-03-11"]})
    verdict(instance, src, late, False, materializations(instance, src, late)[0])
    at = datetime(2026, 3, 12, 0, 30, tzinfo=TZ)
    requested = engine.tick(at)
    # nothing is built on what the old data made, from this very step: not the next cumulative day, not the windows
    assert requested["dws.cum"] == [] and requested["ads.win7"] == []
    [job] = engine.jobs  # the taint run, executed
    store = PartitionStateStore(instance)
    store.update()
    tainted = {(s.asset_key, s.partition) for s in store.all_states() if s.tainted}
    assert tainted == {
        ("dwd/day", "2026-03-10"),
        ("dws/cum", "2026-03-10"),
        ("ads/win7", "2026-03-10"),
        ("dws/hourly", late),
    }
    [(reason, root, by, repair)] = {(t.reason, t.root, t.by, t.repair) for t in store_taints(store)}
    assert (root, by, repair) == (f"ods.src {late} (check not_null failed)", "engine", "")
    assert reason.startswith("late data: not_null failed on its materialization of ")
    assert not store.states(src, [late])[late].tainted  # the hour itself failed its check: that is what it is
    assert engine.tick(at) == {t: [] for t in engine.tables} and len(engine.jobs) == 1  # once

    # the hour is fixed: re-reported, its check passes; the tainted closure is rebuilt, each partition once
    build(instance, catalog, {"ods.src": [late]})
    rebuilt: list[tuple[str, str]] = []
    for _ in range(6):
        for fqn, keys in engine.tick(at).items():
            rebuilt.extend((fqn, k) for k in keys)
            build(instance, catalog, {fqn: keys})  # each run succeeds
    assert sorted(rebuilt) == sorted(
        [
            ("dwd.day", "2026-03-10"),
            ("dws.hourly", late),
            ("dws.cum", "2026-03-10"),
            ("ads.win7", "2026-03-10"),
            ("dws.cum", "2026-03-11"),  # held back, now built once on the repaired chain
            ("ads.win7", "2026-03-11"),
        ]
    )
    store.update()
    assert not any(s.tainted for s in store.all_states())
    engine.close()
    store.close()
