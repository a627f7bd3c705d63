"""The dependency center's resolver: changes of partition state in, the runs they made possible out, exactly once.

Events are written to a temp-dir instance as the product writes them (runless reports of ODS hours and of built
partitions, check verdicts, runs created and started), read by the partition state store, and handed to the
resolver: no Spark, no code location. The semantics of every dependency pattern against the engine are in
tests/test_semantics.py, the gates in tests/materialize/test_quality.py, test_ods_checks.py and test_external.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from dagster import (
    AssetKey,
    DagsterInstance,
)

from tests.center.test_state_store import create_run, end, materializations, materialize_in, report, start, verdict
from warehouse_assets.catalog import Catalog, load_catalog
from warehouse_assets.center.plans import RunPlan, Trigger, run_priority
from warehouse_assets.center.resolver import Resolver
from warehouse_assets.center.reverse_index import ReverseIndex
from warehouse_assets.center.state_store import PartitionStateStore
from warehouse_assets.materialize.compiler import max_partitions_per_run

TZ = ZoneInfo("Asia/Shanghai")
NOW = datetime(2026, 3, 6, 9, tzinfo=TZ)

ODS = """table: ods.src
period: hourly
source: {database: db, tables: "src"}
primary_key: [id]
partition_time: t
columns: {id: bigint, t: timestamp, v: bigint}
checks:
  not_null: [id]
"""
DERIVED = {  # table → (header, SQL)
    "dwd.day": ("period: daily\n", "SELECT id, v FROM ods.src"),  # a day on its 24 hours
    "dwd.lax": ("period: daily\ndepends_on:\n  ods.src: {range: [0, 23], ignore_dq: true}\n", "SELECT id FROM ods.src"),
    "ads.t1": ("period: daily\ndepends_on:\n  dwd.day: {set: [-1]}\n", "SELECT id, v FROM dwd.day"),
    "ads.t7": ("period: daily\ndepends_on:\n  dwd.day: {set: [-7]}\n", "SELECT id, v FROM dwd.day"),
    "ads.win7": ("period: daily\ndepends_on:\n  dwd.day: {range: [-6, 0]}\n", "SELECT id, v FROM dwd.day"),
    "ads.win30": ("period: daily\ndepends_on:\n  dwd.day: {range: [-29, 0]}\n", "SELECT id, v FROM dwd.day"),
    "dws.cum": (
        "period: daily\ncolumns: {id: bigint, v: bigint}\ndepends_on:\n  dws.cum: {set: [-1]}\n  dwd.day: {set: [0]}\n",
        "SELECT id, v FROM dwd.day UNION ALL SELECT id, v FROM dws.cum",
    ),
}
WINDOWS = ["ads.t1", "ads.t7", "ads.win7", "ads.win30"]


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    root = tmp_path_factory.mktemp("catalog")
    (root / "ods").mkdir()
    (root / "ods" / "src.yaml").write_text(ODS)
    for fqn, (header, sql) in DERIVED.items():
        layer, name = fqn.split(".")
        (root / layer).mkdir(exist_ok=True)
        # late data rebuilds at once here: the policies that delay it are tests/center/test_late_data.py's
        late = "late_data: {rebuild: at_once}\n"
        (root / layer / f"{name}.sql").write_text(f"/* ---\ntable: {fqn}\n{header}{late}--- */\n{sql}\n")
    return load_catalog(root)


@pytest.fixture
def instance(consolidated: DagsterInstance) -> DagsterInstance:
    return consolidated  # one SQLite event log (tests/conftest.py): quick to write to


class Center:
    """The state store and the resolver over one instance, stepped at pinned times."""

    def __init__(self, instance: DagsterInstance, catalog: Catalog):
        self.instance, self.catalog = instance, catalog
        self.index = ReverseIndex.build(catalog, current_time=NOW)
        self.open()

    def open(self) -> None:
        self.store = PartitionStateStore(self.instance)
        self.resolver = Resolver(self.catalog, self.index, self.store, max_partitions_per_run)

    def restart(self) -> None:
        self.resolver.close()
        self.store.close()
        self.open()

    def step(self, now: datetime = NOW) -> list[RunPlan]:
        return self.resolver.step(now)

    def report(self, table: str, keys: Sequence[str], checked: bool | None = True) -> None:
        """Report partitions materialized, each with a verdict of the table's blocking check if it has one."""
        key = AssetKey(self.catalog[table].key)
        for partition in keys:
            report(self.instance, key, partition)
            if checked is not None and self.catalog[table].checks:
                verdict(self.instance, key, partition, checked, materializations(self.instance, key, partition)[0])


def requested(plans: Sequence[RunPlan]) -> dict[str, list[list[str]]]:
    """Table → its runs' partitions."""
    found: dict[str, list[list[str]]] = {}
    for plan in plans:
        found.setdefault(plan.table, []).append(list(plan.partitions))
    return found


def days(first: str, last: str) -> list[str]:
    start, stop = datetime.fromisoformat(first), datetime.fromisoformat(last)
    return [(start + timedelta(days=n)).strftime("%Y-%m-%d") for n in range((stop - start).days + 1)]


def hours(day: str) -> list[str]:
    return [f"{day}-{h:02d}:00" for h in range(24)]


# --- the center ---------------------------------------------------------------------------------------------------


def test_a_day_is_requested_once_all_its_24_hours_are_in_not_before(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    center = Center(instance, catalog)
    center.report("ods.src", hours("2026-03-05")[:23])
    assert center.step() == []
    center.report("ods.src", hours("2026-03-05")[23:])
    [day, lax] = sorted(center.step(), key=lambda p: p.table)
    assert center.resolver.evaluated == 2  # the hour's fan-out: its day in each of its two downstream tables
    assert (day.table, day.partitions, lax.table, lax.partitions) == (
        "dwd.day",
        ("2026-03-05",),
        "dwd.lax",
        day.partitions,
    )
    last_hour = materializations(instance, AssetKey(["ods", "src"]), "2026-03-05-23:00")[0]
    assert day.trigger.storage_id == last_hour
    assert day.request_id and day.request_id != lax.request_id
    # few and short: what the Runs page shows of the run (the engine adds the sensor that launched it)
    assert day.tags == {
        "dagster/partition": "2026-03-05",
        "dagster/priority": "-99",  # a DWD day resolved the next morning (NOW): see the queue's order below
        "warehouse/request": day.request_id,
        "warehouse/trigger": "ods.src 2026-03-05-23:00 (checked, materialized)",
        "warehouse/lane": "first_build",  # its share of the run slots: a partition's first build
    }
    assert center.step() == []


def test_a_window_is_requested_only_when_all_of_it_exists(instance: DagsterInstance, catalog: Catalog) -> None:
    center = Center(instance, catalog)
    now = datetime(2026, 2, 2, 9, tzinfo=TZ)
    center.report("dwd.day", [d for d in days("2026-01-01", "2026-02-01") if d != "2026-01-20"])
    plans = requested(center.step(now))
    assert {t: plans.get(t) for t in WINDOWS} == {
        "ads.t1": [days("2026-01-02", "2026-01-20"), days("2026-01-22", "2026-02-01")],  # 01-01 needs 2025-12-31
        "ads.t7": [days("2026-01-08", "2026-01-26"), days("2026-01-28", "2026-02-01")],
        "ads.win7": [days("2026-01-07", "2026-01-19"), days("2026-01-27", "2026-02-01")],
        "ads.win30": None,  # 01-30 .. 02-01 all need 01-20
    }
    # the self-dependent chain starts at the first partition and stops before the missing day, in one run
    assert plans["dws.cum"] == [days("2026-01-01", "2026-01-19")]

    center.report("dwd.day", ["2026-01-20"])
    plans = requested(center.step(now))
    assert plans == {
        "ads.t1": [["2026-01-21"]],
        "ads.t7": [["2026-01-27"]],
        "ads.win7": [days("2026-01-20", "2026-01-26")],
        "ads.win30": [days("2026-01-30", "2026-02-01")],
        # dws.cum 01-20 waits for its T-1, requested but not built yet
    }
    center.report("dws.cum", days("2026-01-01", "2026-01-19"))
    assert requested(center.step(now)) == {"dws.cum": [days("2026-01-20", "2026-02-01")]}


def test_a_failed_blocking_check_holds_the_downstream_back_and_ignore_dq_does_not(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    center = Center(instance, catalog)
    center.report("ods.src", hours("2026-03-05"), checked=None)
    assert requested(center.step()) == {"dwd.lax": [["2026-03-05"]]}  # dwd.day waits for the verdicts
    src = AssetKey(["ods", "src"])
    for hour in hours("2026-03-05"):
        verdict(instance, src, hour, hour != "2026-03-05-13:00", materializations(instance, src, hour)[0])
    assert center.step() == []  # hour 13 failed
    center.report("ods.src", ["2026-03-05-13:00"])  # fixed and re-delivered, and it passes
    # the day runs; the lax day was requested on the hour's previous delivery and is requested again on the new one
    assert requested(center.step()) == {"dwd.day": [["2026-03-05"]], "dwd.lax": [["2026-03-05"]]}


def test_late_data_requests_the_downstream_day_again_once(instance: DagsterInstance, catalog: Catalog) -> None:
    center = Center(instance, catalog)
    center.report("ods.src", hours("2026-03-05"))
    assert requested(center.step())["dwd.day"] == [["2026-03-05"]]
    center.report("dwd.day", ["2026-03-05"])  # its run built it
    assert "dwd.day" not in requested(center.step())
    center.report("ods.src", ["2026-03-05-10:00"])  # late data for one hour
    changes = center.store.update()
    plans = center.resolver.on_changes(changes, NOW)
    assert requested(plans) == {
        "dwd.day": [["2026-03-05"]],
        "dwd.lax": [["2026-03-05"]],
    }
    # dwd.day is built again: its run queues after every first build (dwd.lax's day was never built)
    priority = {plan.table: plan.priority for plan in plans}
    assert priority == {"dwd.day": -199, "dwd.lax": -99}
    assert [plan.table for plan in plans] == ["dwd.lax", "dwd.day"]  # submitted in the queue's order
    assert run_priority("dwd.day", datetime(2026, 3, 6, tzinfo=TZ), NOW, rebuild=True) == -199
    assert center.resolver.on_changes(changes, NOW) == []  # the same changes again: nothing new
    center.report("dwd.day", ["2026-03-05"])  # rebuilt after the late hour: nothing more
    assert "dwd.day" not in requested(center.step())


def test_late_data_while_the_day_runs_requests_it_again_when_the_run_ends(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    center = Center(instance, catalog)
    center.report("ods.src", hours("2026-03-05"))
    assert requested(center.step())["dwd.day"] == [["2026-03-05"]]
    run = create_run(instance, ["2026-03-05"], AssetKey(["dwd", "day"]))
    start(instance, run)
    center.report("ods.src", ["2026-03-05-10:00"])  # late data while the day is being built
    assert "dwd.day" not in requested(center.step())
    materialize_in(instance, run, "2026-03-05", AssetKey(["dwd", "day"]))  # the run writes the day from the hours
    # it read before...
    end(instance, run, "success")
    assert requested(center.step())["dwd.day"] == [["2026-03-05"]]  # ...so it runs again, once
    assert center.step() == []


def test_a_self_dependent_chain_runs_once_in_one_run(instance: DagsterInstance, catalog: Catalog) -> None:
    center = Center(instance, catalog)
    center.report("dws.cum", days("2026-01-01", "2026-02-28"))
    center.report("dwd.day", days("2026-03-01", "2026-03-03"))
    assert requested(center.step())["dws.cum"] == [days("2026-03-01", "2026-03-03")]
    cum = AssetKey(["dws", "cum"])
    run = create_run(instance, days("2026-03-01", "2026-03-03"), cum)
    start(instance, run)
    materialize_in(instance, run, "2026-03-01", cum)
    # the run wrote 03-01 before 03-02 reads it: not late data for 03-02, which the same run builds next
    assert center.step() == []
    for day in ["2026-03-02", "2026-03-03"]:
        materialize_in(instance, run, day, cum)
    end(instance, run, "success")
    assert center.step() == []


def test_nothing_is_requested_twice_for_the_same_upstream_state_even_after_a_restart(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    center = Center(instance, catalog)
    center.report("ods.src", hours("2026-03-04") + hours("2026-03-05"))
    changes = center.store.update()
    assert requested(center.resolver.on_changes(changes, NOW))["dwd.day"] == [["2026-03-04", "2026-03-05"]]
    assert center.resolver.on_changes(changes, NOW) == []
    center.restart()
    assert center.resolver.on_changes(changes, NOW) == []
    assert center.store.update() == [] and center.step() == []


def test_changes_the_store_committed_before_a_crash_are_resolved_after_the_restart(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    center = Center(instance, catalog)
    center.report("ods.src", hours("2026-03-04"))
    assert requested(center.step())["dwd.day"] == [["2026-03-04"]]
    center.report("ods.src", hours("2026-03-05"))
    assert center.store.update()  # the store committed these changes; the resolver crashed before resolving them
    center.restart()
    assert requested(center.step()) == {"dwd.day": [["2026-03-05"]], "dwd.lax": [["2026-03-05"]]}
    center.restart()
    assert center.step() == []


def test_a_plan_stays_pending_until_its_run_is_submitted_also_across_a_restart(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    center = Center(instance, catalog)
    center.report("ods.src", hours("2026-03-05"))
    plans = center.step()
    assert center.resolver.pending() == plans and len(plans) == 2
    center.resolver.submitted(plans[0].request_id)
    center.restart()  # a crash before the second submission: the restarted engine submits it, and only it
    assert center.resolver.pending() == plans[1:]
    assert center.step() == []


def test_requests_older_than_twice_the_lookback_are_forgotten(instance: DagsterInstance, catalog: Catalog) -> None:
    center = Center(instance, catalog)
    center.report("ods.src", hours("2026-03-05"))
    assert center.step()
    assert center.resolver.ledger.request_count() == 2
    assert center.step(NOW + timedelta(days=69)) == [] and center.resolver.ledger.request_count() == 2
    center.restart()
    assert center.step(NOW + timedelta(days=71)) == [] and center.resolver.ledger.request_count() == 0


def test_a_partition_whose_upstream_was_complete_before_its_window_ended_is_requested_when_it_ends(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    center = Center(instance, catalog)
    evening = datetime(2026, 3, 5, 20, tzinfo=TZ)
    assert center.step(evening) == []
    center.report("dwd.day", ["2026-03-04"])  # ads.t1 2026-03-05 needs only this T-1 day, but its day is not over
    assert "ads.t1" not in requested(center.step(evening))
    [plan] = center.step(datetime(2026, 3, 6, 0, 0, 1, tzinfo=TZ))  # the day ended: no upstream event names it
    assert (plan.table, plan.partitions, plan.trigger.fields) == ("ads.t1", ("2026-03-05",), frozenset({"clock"}))
    assert center.step(datetime(2026, 3, 6, 0, 0, 2, tzinfo=TZ)) == []


def test_a_day_whose_hours_all_came_before_it_ended_by_the_engines_clock_is_requested_when_it_ends(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    # a source whose clock runs ahead of the engine's reports the day's last hour before the day is over for the
    # engine: the day cannot run yet, and no later change will name it
    center = Center(instance, catalog)
    evening = datetime(2026, 3, 5, 23, 50, tzinfo=TZ)
    assert center.step(evening) == []
    center.report("ods.src", hours("2026-03-05"))
    assert center.step(evening) == []
    assert center.step(datetime(2026, 3, 5, 23, 59, tzinfo=TZ)) == []
    plans = center.step(datetime(2026, 3, 6, 0, 0, 1, tzinfo=TZ))
    assert requested(plans) == {"dwd.day": [["2026-03-05"]], "dwd.lax": [["2026-03-05"]]}
    assert {p.trigger.fields for p in plans} == {frozenset({"clock"})}
    assert center.step(datetime(2026, 3, 6, 0, 0, 2, tzinfo=TZ)) == []


def test_partitions_before_the_lookback_or_in_the_future_are_never_requested(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    center = Center(instance, catalog)
    # 35 days back from the latest day (03-05): 01-30 is the oldest day automation looks at
    center.report("ods.src", hours("2026-01-29") + hours("2026-01-30") + hours("2026-03-06"))  # 03-06 not over
    assert requested(center.step()) == {"dwd.day": [["2026-01-30"]], "dwd.lax": [["2026-01-30"]]}
    # 03-06 is over: its hours, reported while it was not, make it a candidate when it ends (no event names it then)
    plans = requested(center.step(datetime(2026, 3, 7, 1, tzinfo=TZ)))
    assert plans == {"dwd.day": [["2026-03-06"]], "dwd.lax": [["2026-03-06"]]}
    assert center.step(datetime(2026, 3, 7, 1, 0, 1, tzinfo=TZ)) == []  # once


def test_the_center_starts_on_any_day_also_when_its_oldest_day_starts_the_week_a_table_stays_within(
    instance: DagsterInstance, tmp_path: Path
) -> None:
    # a week-to-date total reads its own yesterday only within the week: the week's first day needs none of it. The
    # center samples the oldest day it looks at, so every Monday (35 days after one) it failed to start at all.
    root = tmp_path / "catalog"
    (root / "ods").mkdir(parents=True)
    (root / "ods" / "src.yaml").write_text(ODS)
    (root / "dwd").mkdir()
    (root / "dwd" / "day.sql").write_text("/* ---\ntable: dwd.day\nperiod: daily\n--- */\nSELECT id, v FROM ods.src\n")
    (root / "ads").mkdir()
    header = "table: ads.wtd\nperiod: daily\ncolumns: {id: bigint, v: bigint}\n"
    deps = "depends_on:\n  ads.wtd: {set: [-1], within: weekly}\n  dwd.day: {set: [0]}\n"
    sql = "SELECT id, v FROM dwd.day UNION ALL SELECT id, v FROM ads.wtd"
    (root / "ads" / "wtd.sql").write_text(f"/* ---\n{header}{deps}--- */\n{sql}\n")
    week_catalog = load_catalog(root)
    monday_35_days_on = datetime(2026, 11, 30, 0, 43, tzinfo=TZ)  # 35 days back: Monday 2026-10-26, 00:43
    center = Center(instance, week_catalog)
    assert center.step(monday_35_days_on) == []
    center.report("ods.src", hours("2026-10-26"))
    assert requested(center.step(monday_35_days_on)) == {"dwd.day": [["2026-10-26"]]}
    center.report("dwd.day", ["2026-10-26"])
    assert requested(center.step(monday_35_days_on)) == {"ads.wtd": [["2026-10-26"]]}


def test_each_run_respects_the_tables_max_partitions_per_run(instance: DagsterInstance, catalog: Catalog) -> None:
    center = Center(instance, catalog)
    center.resolver.max_partitions_per_run = lambda table: 2
    center.report("ods.src", [h for d in days("2026-03-01", "2026-03-05") for h in hours(d)])
    assert requested(center.step())["dwd.day"] == [
        ["2026-03-01", "2026-03-02"],
        ["2026-03-03", "2026-03-04"],
        ["2026-03-05"],
    ]


def test_a_burst_is_resolved_in_slices_new_changes_first_and_a_restart_in_the_middle_loses_nothing(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    """With a budget, a call evaluates candidates until it is spent (at least one) and keeps the rest in a backlog
    persisted with its requests: a change during a burst is resolved in the next call, before the burst's clock
    candidates, and a restart in the middle resumes the backlog; in all, each partition is requested once."""
    center = Center(instance, catalog)
    evening, midnight = datetime(2026, 3, 5, 20, tzinfo=TZ), datetime(2026, 3, 6, 0, 0, 1, tzinfo=TZ)
    center.step(evening)
    center.report("dwd.day", days("2026-02-26", "2026-03-04"))
    center.step(evening)
    # the day's end: ads.t1 and ads.t7 of 03-05 (their T-1 and T-7 were complete before it ended) are the clock's
    plans = center.resolver.step(midnight, budget=0)  # a budget of 0: one candidate a call
    assert (center.resolver.evaluated, center.resolver.backlog) == (1, 1)
    assert [p.trigger.fields for p in plans] == [frozenset({"clock"})]
    center.report("ods.src", hours("2026-03-05"))  # the day's hours land during the burst
    during = center.resolver.step(midnight, budget=0)
    assert [(p.table, p.partitions) for p in during] in ([("dwd.day", ("2026-03-05",))], [("dwd.lax", ("2026-03-05",))])
    assert "clock" not in during[0].trigger.fields  # the new change went before the burst's rest
    plans += during
    assert center.resolver.backlog == 2  # the other day of the hours, and the clock's other partition
    center.restart()
    assert center.resolver.backlog == 2
    while center.resolver.backlog:
        plans += center.resolver.step(midnight, budget=0)
        assert center.resolver.evaluated == 1
    assert center.step(midnight) == []
    assert requested(plans) == {
        "ads.t1": [["2026-03-05"]],
        "ads.t7": [["2026-03-05"]],
        "dwd.day": [["2026-03-05"]],
        "dwd.lax": [["2026-03-05"]],
    }


def test_a_ranged_run_names_its_range() -> None:
    trigger = Trigger("dws.w", "2026-03-07", storage_id=7, run_id="r", fields=frozenset({"materialized"}))
    ranged = RunPlan("ads.a", ("2026-03-05", "2026-03-06", "2026-03-07"), trigger, request_id="q", priority=-77)
    assert ranged.tags == {
        "dagster/asset_partition_range_start": "2026-03-05",
        "dagster/asset_partition_range_end": "2026-03-07",
        "warehouse/partitions": "2026-03-05 … 2026-03-07 (3)",
        "dagster/priority": "-77",
        "warehouse/request": "q",
        "warehouse/trigger": "dws.w 2026-03-07 (materialized)",
        "warehouse/lane": "first_build",
    }


def test_a_rebuild_and_the_taint_job_go_in_the_rebuild_lane_with_the_background_tag() -> None:
    trigger = Trigger("dws.w", "2026-03-07", storage_id=7, run_id="r", fields=frozenset({"materialized"}))
    rebuild = RunPlan("ads.a", ("2026-03-07",), trigger, request_id="q", rebuild=True)
    taint = RunPlan("ads.a", ("2026-03-07",), trigger, request_id="t", job="taint_repair", run_config="{}")
    for plan in (rebuild, taint):
        assert plan.tags["warehouse/lane"] == "rebuild"
        assert plan.tags["warehouse/background"] == "rebuild"  # counted against the background lanes' sum


def test_the_queue_takes_older_days_first_and_within_a_day_deeper_layers_first() -> None:
    now = datetime(2026, 3, 8, 1, 0, tzinfo=TZ)
    day = {n: datetime(2026, 3, n + 1, tzinfo=TZ) for n in (5, 6, 7)}  # each day's end
    order = sorted(
        [(t, n) for t in ("dwd.a", "dws.b", "ads.c") for n in day], key=lambda r: -run_priority(r[0], day[r[1]], now)
    )
    assert order == [
        ("ads.c", 5), ("dws.b", 5), ("dwd.a", 5),
        ("ads.c", 6), ("dws.b", 6), ("dwd.a", 6),
        ("ads.c", 7), ("dws.b", 7), ("dwd.a", 7),
    ]  # fmt: skip
    # when a day closes, its last hour's runs go before the closed day's chain, which takes minutes anyway
    day_end = datetime(2026, 3, 8, tzinfo=TZ)
    last_hour = run_priority("dws.h", day_end, now, hourly=True)
    assert last_hour > max(run_priority(t, day_end, now) for t in ("dwd.a", "dws.b", "ads.c"))
    # all after what a user launches (priority 0), a month-old day included
    assert run_priority("ads.c", datetime(2026, 2, 1, tzinfo=TZ), now) < 0
    # a rebuild after every first build, a month-old one included
    rebuilds = [run_priority(t, day[n], now, rebuild=True) for t in ("dwd.a", "ads.c") for n in (5, 7)]
    rebuilds.append(run_priority("ads.c", datetime(2026, 2, 2, tzinfo=TZ), now, rebuild=True))
    assert max(rebuilds) < min(run_priority(t, day[n], now) for t in ("dwd.a", "ads.c") for n in (5, 7))


def test_late_data_during_a_run_the_center_sees_only_after_it_ended_requests_the_day_again(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    """The center's round may see a run's start, an upstream's late report, the run's materialization and its end
    all at once (a busy round; the soak found a day built before its hour's last change, never rebuilt): what the
    run may have read is told by where it started, not by when it wrote."""
    center = Center(instance, catalog)
    day = AssetKey(["dwd", "day"])
    center.report("ods.src", hours("2026-03-05"))
    assert requested(center.step())["dwd.day"] == [["2026-03-05"]]
    run = create_run(instance, ["2026-03-05"], day)
    start(instance, run)
    center.report("ods.src", ["2026-03-05-10:00"])  # committed while the run reads its hours
    materialize_in(instance, run, "2026-03-05", day)
    end(instance, run, "success")
    assert requested(center.step())["dwd.day"] == [["2026-03-05"]]
    rebuild = create_run(instance, ["2026-03-05"], day)  # the rebuild starts after that hour's report...
    start(instance, rebuild)
    materialize_in(instance, rebuild, "2026-03-05", day)
    end(instance, rebuild, "success")
    assert "dwd.day" not in requested(center.step())  # ...so it read it: nothing more


def test_late_data_while_the_days_run_is_queued_is_read_by_that_run_not_by_a_second_one(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    """A run waiting in the queue reads what is there when it starts, as Dagster's own automation counts a queued
    run as in progress: each late hour would otherwise queue one more run of the same day behind it."""
    center = Center(instance, catalog)
    day = AssetKey(["dwd", "day"])
    center.report("ods.src", hours("2026-03-05"))
    assert requested(center.step())["dwd.day"] == [["2026-03-05"]]
    run = create_run(instance, ["2026-03-05"], day)  # queued
    assert "dwd.day" not in requested(center.step())
    center.report("ods.src", ["2026-03-05-10:00"])  # late data while it waits
    center.report("ods.src", ["2026-03-05-11:00"])
    assert "dwd.day" not in requested(center.step())
    start(instance, run)
    materialize_in(instance, run, "2026-03-05", day)
    end(instance, run, "success")
    assert "dwd.day" not in requested(center.step())  # it started after the late hours: it read them


def test_a_queued_run_canceled_before_it_started_leaves_its_late_data_to_a_new_request(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    center = Center(instance, catalog)
    day = AssetKey(["dwd", "day"])
    center.report("ods.src", hours("2026-03-05"))
    assert requested(center.step())["dwd.day"] == [["2026-03-05"]]
    run = create_run(instance, ["2026-03-05"], day)
    center.step()
    center.report("ods.src", ["2026-03-05-10:00"])
    assert "dwd.day" not in requested(center.step())
    end(instance, run, "canceled")
    assert requested(center.step())["dwd.day"] == [["2026-03-05"]]
    assert center.step() == []


def test_a_verdict_arriving_while_the_day_runs_does_not_settle_the_late_data_before_it(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    """Late data and, a moment later, its checks' verdict, both while the day is built (the soak's hour one change
    behind: the verdict's look at the running day forgot that the data had asked for another look at its end)."""
    center = Center(instance, catalog)
    day, src = AssetKey(["dwd", "day"]), AssetKey(["ods", "src"])
    center.report("ods.src", hours("2026-03-05"))
    assert requested(center.step())["dwd.day"] == [["2026-03-05"]]
    run = create_run(instance, ["2026-03-05"], day)
    start(instance, run)
    center.report("ods.src", ["2026-03-05-10:00"], checked=None)  # late data, its verdict still to come
    assert "dwd.day" not in requested(center.step())
    verdict(instance, src, "2026-03-05-10:00", True, materializations(instance, src, "2026-03-05-10:00")[0])
    assert "dwd.day" not in requested(center.step())  # still running
    materialize_in(instance, run, "2026-03-05", day)
    end(instance, run, "success")
    assert requested(center.step())["dwd.day"] == [["2026-03-05"]]
    assert center.step() == []
