"""Weak dependencies: a deadline after which a partition runs without a late upstream (degraded, rebuilt when it
arrives), and ``any`` windows ready on the first (or ``min``-th) usable partition.

The gate is asked on plain sets; the dependency center (state store + resolver) is stepped at pinned times on a
temp-dir instance, as tests/center/test_center.py does: no Spark, no code location.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from dagster import AssetKey, AssetMaterialization, DagsterInstance, MetadataValue

from resources.delta_lake import DeltaStore
from resources.landing import Landing
from tests.center.test_center import Center, days, hours, requested
from tests.center.test_state_store import create_run, end, materialize_in, report, start
from tests.materialize.test_gate import FakeStates
from tests.support.small_catalog import assert_refused, sql_catalog
from warehouse_assets.catalog import ANY, DEADLINE, LATEST, Catalog, upstream_partitions
from warehouse_assets.center.latest_wait import LATEST_WAIT, LatestWait
from warehouse_assets.center.plans import DEADLINE_PASSED
from warehouse_assets.center.reverse_index import ReverseIndex
from warehouse_assets.explain.upstream import READY, UpstreamState, _waived
from warehouse_assets.explain.why import _weak_notes, explain
from warehouse_assets.materialize.gate import DEGRADED, MISSING, NONEXISTENT, OK, WAIVED, decide

TZ = ZoneInfo("Asia/Shanghai")

TABLES = {  # path → (header, SQL)
    "dwd/day.sql": ("period: daily\n", "SELECT id FROM ods.src"),
    "dwd/rate.sql": ("period: daily\n", "SELECT 1 AS id"),  # the late one: a finance system's rate, say
    "dws/usd.sql": (
        'period: daily\ndepends_on:\n  dwd.rate: {set: [0], mode: deadline, deadline: "09:00"}\n',
        "SELECT d.id FROM dwd.day d LEFT JOIN dwd.rate r ON d.id = r.id",
    ),
    "dws/usd_strict.sql": ("period: daily\n", "SELECT d.id FROM dwd.day d LEFT JOIN dwd.rate r ON d.id = r.id"),
    "ads/any7.sql": ("period: daily\ndepends_on:\n  dwd.day: {range: [-6, 0], mode: any}\n", "SELECT id FROM dwd.day"),
    "ads/min3.sql": ("period: daily\ndepends_on:\n  dwd.day: {range: [-6, 0], min: 3}\n", "SELECT id FROM dwd.day"),
}


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    return sql_catalog(tmp_path_factory.mktemp("weak"), TABLES)


def at(day: str, clock: str) -> datetime:
    return datetime.fromisoformat(f"{day}T{clock}").replace(tzinfo=TZ)


# --- the declaration ------------------------------------------------------------------------------------------


def test_the_declared_modes_are_parsed(catalog: Catalog) -> None:
    [rate] = [d for d in catalog["dws.usd"].deps if d.table == "dwd.rate"]
    assert (rate.mode, rate.deadline, rate.weak) == (DEADLINE, "09:00", True)
    [window] = catalog["ads.any7"].deps
    assert (window.mode, window.min, window.start_offset, window.end_offset) == (ANY, 1, -6, 0)
    [three] = catalog["ads.min3"].deps
    assert (three.mode, three.min) == (ANY, 3)  # min alone says any
    assert not any(d.weak for d in catalog["dws.usd_strict"].deps)  # strict stays the default


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("{set: [0], mode: deadline}", "mode deadline needs deadline: a local time HH:MM"),
        ('{set: [0], mode: deadline, deadline: "9am"}', "mode deadline needs deadline: a local time HH:MM"),
        ('{set: [0], deadline: "09:00"}', "deadline needs mode: deadline"),
        ("{set: [0], mode: any}", "mode any needs a window of several partitions"),
        ("{range: [-6, 0], min: 8}", "min must be an integer from 1 to the window's 7 partitions"),
        ("{range: [-6, 0], mode: some}", "mode must be one of strict, deadline, any"),
        ('{range: [-6, 0], mode: deadline, deadline: "09:00", min: 2}', "min is for mode any, not deadline"),
    ],
)
def test_a_wrong_weak_dependency_is_refused_naming_what_is_wrong(tmp_path: Path, spec: str, message: str) -> None:
    sql = f"/* ---\ntable: dwd.x\nperiod: daily\ndepends_on:\n  ods.src: {spec}\n--- */\nSELECT id FROM ods.src\n"
    assert_refused(tmp_path, {"dwd/x.sql": sql}, message)


def test_a_self_dependency_cannot_be_weak(tmp_path: Path) -> None:
    header = (
        'period: daily\ncolumns: {id: bigint}\ndepends_on:\n  dws.cum: {set: [-1], mode: deadline, deadline: "09:00"}\n'
    )
    sql = f"/* ---\ntable: dws.cum\n{header}--- */\nSELECT id FROM dws.cum UNION ALL SELECT id FROM ods.src\n"
    assert_refused(tmp_path, {"dws/cum.sql": sql}, "a self-dependency is strict")


# --- the gate ---------------------------------------------------------------------------------------------------


def test_a_deadline_dependency_is_strict_before_its_deadline_and_waived_after(catalog: Catalog) -> None:
    usd, strict = catalog["dws.usd"], catalog["dws.usd_strict"]
    states = FakeStates({"dwd.day": {"2026-03-05"}})
    before = decide(catalog, usd, "2026-03-05", states, current_time=at("2026-03-06", "08:59"))
    assert not before.may_run and before.degraded == {}
    assert before.reasons == [
        "dws.usd 2026-03-05 waits for 1 partition(s) of dwd.rate that are not materialized: 2026-03-05 until "
        "2026-03-06 09:00 (then it runs without them, degraded)"
    ]
    after = decide(catalog, usd, "2026-03-05", states, current_time=at("2026-03-06", "09:00"))
    assert after.may_run and after.reasons == []
    assert after.degraded == {"dwd.rate": {"2026-03-05": MISSING}}
    rate = next(e for e in after.edges if e.dep.table == "dwd.rate")
    assert rate.used == [] and rate.state("2026-03-05") == WAIVED
    # a strict dependency on the same data never proceeds, however late
    late = decide(catalog, strict, "2026-03-05", states, current_time=at("2026-04-30", "12:00"))
    assert not late.may_run
    # once the rate is there, nothing is waived: the partition is whole
    states.done["dwd.rate"] = {"2026-03-05"}
    whole = decide(catalog, usd, "2026-03-05", states, current_time=at("2026-03-06", "10:00"))
    assert whole.may_run and whole.degraded == {}


def test_past_its_deadline_a_failed_or_running_upstream_is_waived_too(catalog: Catalog) -> None:
    usd = catalog["dws.usd"]
    states = FakeStates(
        {"dwd.day": {"2026-03-05"}, "dwd.rate": {"2026-03-05"}}, failed={"dwd.rate": {"2026-03-05": ["not_null"]}}
    )
    verdict = decide(catalog, usd, "2026-03-05", states, current_time=at("2026-03-06", "09:30"))
    assert verdict.may_run and verdict.degraded == {"dwd.rate": {"2026-03-05": "check failed"}}
    # the strict dependency is still strict: a missing day holds it back past any deadline
    states.done["dwd.day"] = set()
    assert not decide(catalog, usd, "2026-03-05", states, current_time=at("2026-03-06", "09:30")).may_run


def test_an_any_window_runs_on_its_first_usable_partition(catalog: Catalog) -> None:
    now = at("2026-03-10", "12:00")
    any7, min3 = catalog["ads.any7"], catalog["ads.min3"]
    states = FakeStates({"dwd.day": {"2026-03-02"}}, failed={"dwd.day": {"2026-03-03": ["not_null"]}})
    states.done["dwd.day"].add("2026-03-03")
    verdict = decide(catalog, any7, "2026-03-05", states, current_time=now)
    assert verdict.may_run and verdict.degraded == {}  # any is satisfied by design, not degraded
    [edge] = verdict.edges
    assert edge.used == ["2026-03-02"]
    assert edge.waived == {
        "2026-02-27": MISSING,
        "2026-02-28": MISSING,
        "2026-03-01": MISSING,
        "2026-03-03": "check failed",  # a failed check is not usable
        "2026-03-04": MISSING,
        "2026-03-05": MISSING,
    }
    refused = decide(catalog, min3, "2026-03-05", states, current_time=now)
    assert not refused.may_run
    assert refused.reasons == [
        "ads.min3 2026-03-05 waits for 3 usable partition(s) of dwd.day in its window "
        "(2026-02-27 .. 2026-03-05 (7)); 1 are"
    ]
    states.done["dwd.day"] |= {"2026-03-04", "2026-03-05"}
    assert decide(catalog, min3, "2026-03-05", states, current_time=now).may_run
    # nothing usable: the window waits, and says what it waits for
    empty = decide(catalog, any7, "2026-03-20", FakeStates(), current_time=at("2026-03-25", "12:00"))
    assert not empty.may_run and [e.state("2026-03-20") for e in empty.edges] == [MISSING]


def test_an_any_window_reaching_before_the_start_waives_what_cannot_exist(catalog: Catalog) -> None:
    """On the warehouse's first day a 7-day any window has 6 days that can never exist: one usable day suffices."""
    states = FakeStates({"dwd.day": {"2026-01-01"}})
    verdict = decide(catalog, catalog["ads.any7"], "2026-01-01", states, current_time=at("2026-01-05", "00:00"))
    assert verdict.may_run
    [edge] = verdict.edges
    assert edge.used == ["2026-01-01"] and set(edge.waived.values()) == {NONEXISTENT}
    assert edge.nonexistent == []


# --- the dependency center: acting on the deadline by itself, rebuilding on arrival, exactly once ---------------


@pytest.fixture
def instance(consolidated: DagsterInstance) -> DagsterInstance:
    return consolidated


def test_the_engine_acts_at_the_deadline_and_rebuilds_once_the_late_upstream_arrives(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    center = Center(instance, catalog)
    day = "2026-03-05"
    center.step(at("2026-03-06", "06:00"))  # the engine runs from the early morning
    center.report("ods.src", hours(day))
    center.report("dwd.day", [day])
    # the day is in, the rate is not: both wait until the deadline, and nothing else happens meanwhile
    assert "dws.usd" not in requested(center.step(at("2026-03-06", "08:00")))
    assert center.step(at("2026-03-06", "08:59")) == []
    # at 09:00 nothing changes upstream: the deadline alone makes the partition ready, and only the weak one
    [plan] = center.step(at("2026-03-06", "09:00"))
    assert (plan.table, plan.partitions) == ("dws.usd", (day,))
    assert plan.trigger.fields == frozenset({DEADLINE_PASSED})
    assert plan.tags["warehouse/trigger"] == "dws.usd 2026-03-05 (deadline passed)"
    assert center.step(at("2026-03-06", "09:01")) == []  # once
    center.report("dws.usd", [day])  # built degraded
    assert center.step(at("2026-03-06", "09:30")) == []
    # the rate arrives at 10:00: the degraded partition is built again, and the strict one for the first time
    center.report("dwd.rate", [day])
    assert requested(center.step(at("2026-03-06", "10:00"))) == {"dws.usd": [[day]], "dws.usd_strict": [[day]]}
    center.report("dws.usd", [day])
    center.report("dws.usd_strict", [day])
    assert center.step(at("2026-03-06", "10:01")) == []  # whole now: no further rebuild


def test_a_deadline_passed_while_the_engine_was_down_is_acted_on_after_its_restart(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    center = Center(instance, catalog)
    center.step(at("2026-03-06", "06:00"))
    center.report("ods.src", hours("2026-03-05"))
    center.report("dwd.day", ["2026-03-05"])
    assert "dws.usd" not in requested(center.step(at("2026-03-06", "08:30")))
    center.restart()  # down over 09:00
    assert requested(center.step(at("2026-03-06", "11:15"))) == {"dws.usd": [["2026-03-05"]]}
    center.restart()
    assert center.step(at("2026-03-06", "11:16")) == []  # and only once


def test_an_any_window_is_requested_on_the_first_arrival_and_again_as_its_window_fills(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    center = Center(instance, catalog)
    now = at("2026-03-06", "12:00")
    center.report("dwd.day", ["2026-03-02"])
    # every partition whose window holds 03-02 and has ended: 03-02 .. 03-05 (03-06 has not ended yet); and the day's
    # dws.usd, whose rate's deadline (03-03 09:00) is long past
    assert requested(center.step(now)) == {"ads.any7": [days("2026-03-02", "2026-03-05")], "dws.usd": [["2026-03-02"]]}
    center.report("ads.any7", days("2026-03-02", "2026-03-05"))
    center.report("dwd.day", ["2026-03-03", "2026-03-04"])
    plans = requested(center.step(now))
    # min 3 reached for the windows holding all three days; the any windows holding a new day read more now
    assert plans == {
        "ads.min3": [days("2026-03-04", "2026-03-05")],
        "ads.any7": [days("2026-03-03", "2026-03-05")],
        "dws.usd": [days("2026-03-03", "2026-03-04")],
    }


# --- what is kept and shown -------------------------------------------------------------------------------------


def test_the_state_store_keeps_what_a_partition_was_built_without_until_it_is_built_whole(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    center = Center(instance, catalog)
    key = AssetKey(["dws", "usd"])
    lacking = "dwd.rate 2026-03-05 (missing; deadline 2026-03-06 09:00)"
    # a ranged run's materializations share one metadata: each partition finds its own entry
    metadata = {DEGRADED: MetadataValue.json({"2026-03-05": lacking})}
    for partition in ["2026-03-04", "2026-03-05"]:
        instance.report_runless_asset_event(AssetMaterialization(key, partition=partition, metadata=metadata))
    center.store.update()
    states = center.store.states(key, ["2026-03-04", "2026-03-05"])
    assert (states["2026-03-04"].degraded, states["2026-03-05"].degraded) == (None, lacking)
    center.store.rebuild()  # the log is the source of truth: a store rebuilt from it knows the same
    assert center.store.states(key, ["2026-03-05"])["2026-03-05"].degraded == lacking
    instance.report_runless_asset_event(AssetMaterialization(key, partition="2026-03-05"))  # rebuilt whole
    center.store.update()
    assert center.store.states(key, ["2026-03-05"])["2026-03-05"].degraded is None


def _ok(states: Sequence[str]) -> bool:
    return all(s == OK for s in states)


def test_a_strict_catalog_is_unchanged(catalog: Catalog) -> None:
    """The default is strict: a table without modes judges exactly as before (no waiver, no degradation)."""
    strict = catalog["dws.usd_strict"]
    states = FakeStates({"dwd.day": {"2026-03-05"}, "dwd.rate": {"2026-03-05"}})
    verdict = decide(catalog, strict, "2026-03-05", states, current_time=at("2026-03-06", "12:00"))
    assert verdict.may_run and verdict.degraded == {}
    assert _ok([e.state(k) for e in verdict.edges for k in e.upstream.keys])
    assert all(e.waived == {} for e in verdict.edges)


# --- latest, and a finer table on a coarser one -------------------------------------------------------------------

COARSE = {  # path → (header, SQL): days reading a month
    "dwd/day.sql": ("period: daily\n", "SELECT id FROM ods.src"),
    "ads/month.sql": ("period: monthly\n", "SELECT id FROM dwd.day"),
    "ads/vs_month.sql": (  # the day against whichever month was last built
        "period: daily\ndepends_on:\n  ads.month: {latest: true}\n",
        "SELECT d.id FROM dwd.day d JOIN ads.month m USING (id)",
    ),
    "ads/prev_month.sql": (
        "period: daily\ndepends_on:\n  ads.month: {set: [-1]}\n",
        "SELECT d.id FROM dwd.day d JOIN ads.month m USING (id)",
    ),
}


@pytest.fixture(scope="module")
def coarse(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    return sql_catalog(tmp_path_factory.mktemp("coarse"), COARSE)


def test_latest_is_a_mode_over_a_window_looking_back(coarse: Catalog) -> None:
    [month] = [d for d in coarse["ads.vs_month"].deps if d.table == "ads.month"]
    assert (month.mode, month.start_offset, month.end_offset, month.weak) == (LATEST, -2, 0, True)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("{set: [0], latest: true}", "latest looks back over a window of several periods"),
        ("{range: [-2, 1], latest: true}", "latest looks back over a window of several periods"),
        ("{range: [-2, 0], latest: true, mode: any}", "latest: true is a mode of its own"),
        ("{latest: yes please}", "latest must be true or false"),
    ],
)
def test_a_wrong_latest_dependency_is_refused_naming_what_is_wrong(tmp_path: Path, spec: str, message: str) -> None:
    sql = f"/* ---\ntable: dwd.x\nperiod: daily\ndepends_on:\n  dwd.y: {spec}\n--- */\nSELECT id FROM dwd.y\n"
    y = "/* ---\ntable: dwd.y\nperiod: daily\n--- */\nSELECT id FROM ods.src\n"
    assert_refused(tmp_path, {"dwd/x.sql": sql, "dwd/y.sql": y}, message)


def test_offsets_on_a_coarser_upstream_look_back_from_the_period_holding_the_partition(tmp_path: Path) -> None:
    month = "/* ---\ntable: ads.m\nperiod: monthly\n--- */\nSELECT id FROM ods.src\n"
    ahead = "/* ---\ntable: dwd.x\nperiod: daily\ndepends_on:\n  ads.m: {set: [1]}\n--- */\nSELECT id FROM ads.m\n"
    assert_refused(tmp_path, {"ads/m.sql": month, "dwd/x.sql": ahead}, "so they end at 0 at the latest")


def test_a_day_needs_exactly_its_previous_month_or_the_latest_ended_months(coarse: Catalog) -> None:
    now = at("2026-06-01", "00:00")

    def needs(table: str, day: str) -> tuple[list[str], list[str]]:
        dep = next(d for d in coarse[table].deps if d.table == "ads.month")
        up = upstream_partitions(coarse, coarse[table], dep, day, current_time=now)
        return up.keys, up.nonexistent

    assert needs("ads.prev_month", "2026-03-01") == (["2026-02-01"], [])
    assert needs("ads.prev_month", "2026-03-31") == (["2026-02-01"], [])
    assert needs("ads.prev_month", "2026-01-20") == ([], ["2025-12-01"])  # before the warehouse's first month
    # latest: the month holding the day and the two before, of which those ended by the day's end
    assert needs("ads.vs_month", "2026-03-15") == (["2026-01-01", "2026-02-01"], [])
    assert needs("ads.vs_month", "2026-03-31") == (["2026-01-01", "2026-02-01", "2026-03-01"], [])
    assert needs("ads.vs_month", "2026-02-10") == (["2026-01-01"], ["2025-12-01"])
    # the month holding a day ends after it: the default mapping waits for the whole month
    assert needs("ads.vs_month", "2026-01-10") == ([], ["2025-11-01", "2025-12-01"])


def test_latest_reads_the_most_recent_usable_month_and_waits_when_there_is_none(coarse: Catalog) -> None:
    now = at("2026-03-20", "12:00")
    vs_month = coarse["ads.vs_month"]
    states = FakeStates({"dwd.day": {"2026-03-15"}})
    waiting = decide(coarse, vs_month, "2026-03-15", states, current_time=now)
    assert not waiting.may_run
    assert waiting.reasons == [
        "ads.vs_month 2026-03-15 waits for 1 usable partition(s) of ads.month in its window "
        "(2026-01-01 .. 2026-02-01 (2)); 0 are"
    ]
    states.done["ads.month"] = {"2026-01-01"}
    january = decide(coarse, vs_month, "2026-03-15", states, current_time=now)
    month = next(e for e in january.edges if e.dep.table == "ads.month")
    assert january.may_run and january.degraded == {}  # the latest there is, by design: not degraded
    assert month.used == ["2026-01-01"] and month.waived == {"2026-02-01": MISSING}
    states.done["ads.month"].add("2026-02-01")
    february = decide(coarse, vs_month, "2026-03-15", states, current_time=now)
    month = next(e for e in february.edges if e.dep.table == "ads.month")
    assert month.used == ["2026-02-01"] and month.waived == {"2026-01-01": OK}  # usable, but not the latest
    # why says which month is read and why the other is not
    waived = next(e for e in february.edges if e.dep.table == "ads.month")
    entry = UpstreamState("ads.month", "2026-01-01", READY, "")
    assert _waived(waived, entry) == "not read: 2026-02-01 is the latest usable of the window (latest): materialized"
    assert _weak_notes(waiting) == [
        "ads.month needs one usable partition of its window; the latest one is read (latest)"
    ]
    # a month whose check failed is not usable: the one before it is read
    states.failed["ads.month"] = {"2026-02-01": ["not_null"]}
    month = next(
        e for e in decide(coarse, vs_month, "2026-03-15", states, current_time=now).edges if e.dep.table == "ads.month"
    )
    assert month.used == ["2026-01-01"]


def test_the_engine_builds_days_on_the_latest_month_and_again_once_when_a_more_recent_one_arrives(
    instance: DagsterInstance, coarse: Catalog
) -> None:
    center = Center(instance, coarse)
    now = at("2026-03-04", "12:00")
    march = days("2026-03-01", "2026-03-03")
    center.report("dwd.day", march)
    center.report("ads.month", ["2026-01-01"])
    # the days read January, the latest month there is; the previous month (February) is not there yet
    assert requested(center.step(now)) == {"ads.vs_month": [march]}
    center.report("ads.vs_month", march)
    assert center.step(now) == []
    center.report("ads.month", ["2026-02-01"])  # a more recent month: each day once more, and the previous-month days
    assert requested(center.step(now)) == {"ads.vs_month": [march], "ads.prev_month": [march]}
    center.report("ads.vs_month", march)
    center.report("ads.prev_month", march)
    assert center.step(now) == []
    center.report("ads.month", ["2026-01-01"])  # an older month rebuilt: no day reads it any more
    assert center.step(now) == []


def _march_built_but_its_last_day(instance: DagsterInstance, coarse: Catalog) -> Center:
    """January and February built, March's days but the last, and every day's figures of them; then the center."""
    for table, keys in [
        ("ads.month", ["2026-01-01", "2026-02-01"]),
        ("dwd.day", days("2026-03-01", "2026-03-30")),
        ("ads.vs_month", days("2026-03-01", "2026-03-30")),
        ("ads.prev_month", days("2026-03-01", "2026-03-30")),
    ]:
        for key in keys:
            report(instance, AssetKey(coarse[table].key), key)
    return Center(instance, coarse)


def test_a_day_waits_for_the_newer_month_requested_with_it_and_is_built_once(
    instance: DagsterInstance, coarse: Catalog
) -> None:
    """March's last day lets March run: the day's latest month is then March, requested in the same call. Built on
    February at once, the day would be built again as soon as March lands."""
    center = _march_built_but_its_last_day(instance, coarse)
    now = at("2026-04-01", "00:10")
    center.report("dwd.day", ["2026-03-31"])
    assert requested(center.step(now)) == {"ads.month": [["2026-03-01"]], "ads.prev_month": [["2026-03-31"]]}
    center.report("ads.prev_month", ["2026-03-31"])
    center.report("ads.month", ["2026-03-01"])
    assert requested(center.step(now)) == {"ads.vs_month": [["2026-03-31"]]}  # on March, its one build
    center.report("ads.vs_month", ["2026-03-31"])
    assert center.step(now) == []


def test_a_day_waits_for_a_newer_month_being_built_at_most_an_hour_past_its_own_end(
    instance: DagsterInstance, coarse: Catalog
) -> None:
    center = _march_built_but_its_last_day(instance, coarse)
    run = create_run(instance, ["2026-03-01"], AssetKey(coarse["ads.month"].key))  # March queued
    center.report("dwd.day", ["2026-03-31"])
    assert requested(center.step(at("2026-04-01", "00:10"))) == {"ads.prev_month": [["2026-03-31"]]}
    start(instance, run)
    assert center.step(at("2026-04-01", "00:40")) == []  # running: the day still waits for it
    # an hour past the day's end, March's run still going: the day reads February, the latest usable, and is built
    # again once March lands
    assert requested(center.step(at("2026-04-01", "01:00"))) == {"ads.vs_month": [["2026-03-31"]]}
    center.report("ads.vs_month", ["2026-03-31"])
    materialize_in(instance, run, "2026-03-01", AssetKey(coarse["ads.month"].key))
    end(instance, run, "success")
    assert requested(center.step(at("2026-04-01", "01:20"))) == {"ads.vs_month": [["2026-03-31"]]}


def test_a_month_whose_run_failed_is_not_waited_for(instance: DagsterInstance, coarse: Catalog) -> None:
    center = _march_built_but_its_last_day(instance, coarse)
    center.report("dwd.day", ["2026-03-31"])
    assert requested(center.step(at("2026-04-01", "00:10"))) == {
        "ads.month": [["2026-03-01"]],
        "ads.prev_month": [["2026-03-31"]],
    }
    run = create_run(instance, ["2026-03-01"], AssetKey(coarse["ads.month"].key))  # the engine submits March's run
    start(instance, run)
    assert center.step(at("2026-04-01", "00:15")) == []
    end(instance, run, "failure")  # its end looks at the day again: no newer month is coming now
    assert requested(center.step(at("2026-04-01", "00:20"))) == {"ads.vs_month": [["2026-03-31"]]}


CHAIN = {  # path → (header, SQL): a day reading the latest of a table three layers up, and one layer up strictly
    "dwd/near.sql": ("period: daily\n", "SELECT id FROM ods.src"),
    "dwd/first.sql": ("period: daily\n", "SELECT id FROM ods.src"),
    "dws/second.sql": ("period: daily\n", "SELECT id FROM dwd.first"),
    "dws/third.sql": ("period: daily\n", "SELECT id FROM dws.second"),
    "ads/latest.sql": (
        "period: daily\ndepends_on:\n  dws.third: {range: [-2, 0], latest: true}\n",
        "SELECT n.id FROM dwd.near n JOIN dws.third t USING (id)",
    ),
}


def chain_under_way(instance: DagsterInstance, catalog: Catalog, reader: str) -> tuple[Center, datetime]:
    """Up to 03-04 built; 03-05 landed and built a layer up, ``dws.second`` requested (its day, not ``reader``'s on
    the days before: the day of ``dws.third`` it waits for is on its way)."""
    for table in ["ods.src", "dwd.near", "dwd.first", "dws.second", "dws.third", reader]:
        for key in hours("2026-03-04") if table == "ods.src" else ["2026-03-03", "2026-03-04"]:
            report(instance, AssetKey(catalog[table].key), key)
    center = Center(instance, catalog)
    now = at("2026-03-06", "00:10")
    center.report("ods.src", hours("2026-03-05"))
    assert requested(center.step(now)) == {"dwd.near": [["2026-03-05"]], "dwd.first": [["2026-03-05"]]}
    center.report("dwd.near", ["2026-03-05"])
    center.report("dwd.first", ["2026-03-05"])
    assert requested(center.step(now)) == {"dws.second": [["2026-03-05"]]}  # not the reader's day on 03-04
    return center, now


def test_a_day_waits_for_the_newer_input_whose_chain_is_under_way_and_is_built_once(
    instance: DagsterInstance, tmp_path: Path
) -> None:
    """The day's own input lands a layer up; the newer partition of its latest window is two layers further, its
    chain requested now: the day waits for it instead of reading the day before and again two calls later."""
    catalog = sql_catalog(tmp_path, CHAIN)
    center, now = chain_under_way(instance, catalog, "ads.latest")
    center.report("dws.second", ["2026-03-05"])
    assert requested(center.step(now)) == {"dws.third": [["2026-03-05"]]}
    center.report("dws.third", ["2026-03-05"])
    assert requested(center.step(now)) == {"ads.latest": [["2026-03-05"]]}
    center.report("ads.latest", ["2026-03-05"])
    assert center.step(now) == []


ANY_CHAIN = {  # the chain's day reading any of a window of the table three layers up instead of the latest
    **{path: spec for path, spec in CHAIN.items() if path != "ads/latest.sql"},
    "ads/any.sql": (
        "period: daily\ndepends_on:\n  dws.third: {range: [-2, 0], mode: any}\n",
        "SELECT n.id FROM dwd.near n JOIN dws.third t USING (id)",
    ),
}


def test_an_any_window_waits_for_its_newest_partition_whose_chain_is_under_way_and_is_built_once(
    instance: DagsterInstance, tmp_path: Path
) -> None:
    """An any window may run on the days before its newest: built so the moment its own input lands, the day would
    be built again, whole, when the newest partition of its window lands two layers later. It waits for it, as a
    latest window does; and why says so."""
    catalog = sql_catalog(tmp_path, ANY_CHAIN)
    center, now = chain_under_way(instance, catalog, "ads.any")
    lake, landing = DeltaStore(str(tmp_path / "lake")), Landing(tmp_path / "landing")
    why = explain(instance, catalog, lake, landing, "ads.any", "2026-03-05", current_time=now)
    assert why.verdict.endswith(
        "; the engine waits until 2026-03-06 01:00 for dws.third 2026-03-05, a partition of its any window, which is "
        "on its way: built now it would read the window without it and be built again when it lands"
    ), why.verdict
    center.report("dws.second", ["2026-03-05"])
    assert requested(center.step(now)) == {"dws.third": [["2026-03-05"]]}
    center.report("dws.third", ["2026-03-05"])
    assert requested(center.step(now)) == {"ads.any": [["2026-03-05"]]}
    center.report("ads.any", ["2026-03-05"])
    assert center.step(now) == []


def test_an_any_window_whose_newest_partition_does_not_come_runs_on_the_rest_at_its_bound(
    instance: DagsterInstance, tmp_path: Path
) -> None:
    """The wait is bounded as a latest window's: an hour past the day's end it runs on the days it has."""
    catalog = sql_catalog(tmp_path, ANY_CHAIN)
    for table in ["dwd.first", "dws.second", "dws.third", "ads.any"]:
        report(instance, AssetKey(catalog[table].key), "2026-03-04")
    center = Center(instance, catalog)
    center.report("dwd.near", ["2026-03-05"])
    assert center.step(at("2026-03-06", "00:00")) == []
    assert center.step(at("2026-03-06", "00:30")) == []
    assert requested(center.step(at("2026-03-06", "01:00"))) == {"ads.any": [["2026-03-05"]]}


def _newest_input_not_in(instance: DagsterInstance, tmp_path: Path) -> Catalog:
    """The chain built through 2026-03-04 and nothing of 03-05: ``dws.third`` 03-05, the newest partition of
    ``ads.latest``'s latest window, is not there."""
    catalog = sql_catalog(tmp_path, CHAIN)
    for table in ["dwd.first", "dws.second", "dws.third", "ads.latest"]:
        report(instance, AssetKey(catalog[table].key), "2026-03-04")
    return catalog


def test_a_day_waits_for_the_newer_input_ended_with_it_while_its_source_is_not_in_at_most_an_hour(
    instance: DagsterInstance, tmp_path: Path
) -> None:
    """The day's own input is there the moment the day ends; the newest partition of its latest window ended with it
    and waits for its source's last hour: the day waits for it, an hour at most, then reads the day before."""
    catalog = _newest_input_not_in(instance, tmp_path)
    center = Center(instance, catalog)
    center.report("dwd.near", ["2026-03-05"])
    assert center.step(at("2026-03-06", "00:00")) == []
    assert center.step(at("2026-03-06", "00:30")) == []
    assert requested(center.step(at("2026-03-06", "01:00"))) == {"ads.latest": [["2026-03-05"]]}


def test_a_day_waiting_for_a_newer_input_is_built_at_its_bound_by_an_engine_restarted_meanwhile(
    instance: DagsterInstance, tmp_path: Path
) -> None:
    """The wait's end is the engine's clock, not a memory of the waiting partitions: an engine restarted during the
    wait still builds the day once the bound has passed, though the newer input never comes and nothing changes."""
    catalog = _newest_input_not_in(instance, tmp_path)
    center = Center(instance, catalog)
    center.report("dwd.near", ["2026-03-05"])
    assert center.step(at("2026-03-06", "00:00")) == []
    assert center.step(at("2026-03-06", "00:30")) == []
    center.restart()
    assert center.step(at("2026-03-06", "00:45")) == []
    assert requested(center.step(at("2026-03-06", "01:05"))) == {"ads.latest": [["2026-03-05"]]}


def test_why_says_the_day_waits_for_the_newer_input_until_when_and_what_it_would_read_now(
    instance: DagsterInstance, tmp_path: Path
) -> None:
    catalog = _newest_input_not_in(instance, tmp_path)
    report(instance, AssetKey(catalog["dwd.near"].key), "2026-03-05")
    lake, landing = DeltaStore(str(tmp_path / "lake")), Landing(tmp_path / "landing")
    why = explain(instance, catalog, lake, landing, "ads.latest", "2026-03-05", current_time=at("2026-03-06", "00:30"))
    assert why.verdict.endswith(
        "; the engine waits until 2026-03-06 01:00 for dws.third 2026-03-05, the newer partition of its latest "
        "window, which is on its way: built now it would read 2026-03-04 and be built again when 2026-03-05 lands"
    ), why.verdict
    # past the bound the engine builds it on what is there: why no longer speaks of a wait
    why = explain(instance, catalog, lake, landing, "ads.latest", "2026-03-05", current_time=at("2026-03-06", "01:05"))
    assert "waits until" not in why.verdict


def test_the_wait_for_a_newer_input_ends_within_half_of_what_the_sla_allows(tmp_path: Path) -> None:
    tables = {
        **COARSE,
        "ads/vs_month_sla.sql": (
            "period: daily\nsla: {within: 40m}\ndepends_on:\n  ads.month: {latest: true}\n",
            "SELECT d.id FROM dwd.day d JOIN ads.month m USING (id)",
        ),
    }
    catalog = sql_catalog(tmp_path, tables)
    wait = LatestWait(catalog)
    end_of_day = at("2026-04-01", "00:00")
    assert wait.until(catalog["ads.vs_month"], "2026-03-31") == (end_of_day + LATEST_WAIT).timestamp()
    assert wait.until(catalog["ads.vs_month_sla"], "2026-03-31") == (end_of_day + timedelta(minutes=20)).timestamp()
    assert wait.tables == {"ads.vs_month", "ads.vs_month_sla"}


def test_a_taint_of_a_month_reaches_exactly_the_days_that_may_have_read_it(coarse: Catalog) -> None:
    """The taint closure follows the coarser edges: February condemns March's days (their previous month) and every
    day whose latest window holds it, from its last day (it has ended by then) to the days of April."""
    now = at("2026-04-10", "00:00")
    closure = ReverseIndex.build(coarse, current_time=now).closure({"ads.month": ["2026-02-01"]}, now)
    assert closure == {
        "ads.month": ["2026-02-01"],
        "ads.prev_month": days("2026-03-01", "2026-03-31"),
        "ads.vs_month": days("2026-02-28", "2026-04-09"),
    }
