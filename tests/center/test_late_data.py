"""Late data without rebuild storms: each built partition is rebuilt for late upstream data as its late-data policy
says (at once, at most every N minutes, at a daily time, never), within its lookback, once however many late changes
arrive meanwhile, never on an input whose own rebuild is coming, and in the rebuild lane.

The events are written as the product writes them and the resolver is stepped at pinned times, as in
tests/center/test_center.py (whose catalog rebuilds at once, to test the mechanics under the policies).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from dagster import AssetKey, AssetMaterialization, DagsterInstance

from resources.delta_lake import DeltaStore
from resources.landing import Landing
from tests.center.test_center import Center, hours, requested
from tests.center.test_state_store import create_run, end, materialize_in, start
from tests.support.small_catalog import VALUED_ODS, sql_catalog, write
from warehouse_assets.catalog import Catalog, DerivedTable, load_catalog
from warehouse_assets.catalog.additive import MAX_CHANGED_ROWS
from warehouse_assets.catalog.key_locality import MAX_KEYS
from warehouse_assets.catalog.policies import DEFAULT_LATE_DATA, LateDataPolicy
from warehouse_assets.center.late_data import LANE_TAG, REBUILD_LANE, RebuildKinds, due_time
from warehouse_assets.center.ledger import open_readonly
from warehouse_assets.center.state_store import PartitionState
from warehouse_assets.explain.status import status_lines
from warehouse_assets.explain.why import _rebuild_kind as rebuild_kind
from warehouse_assets.explain.why import explain
from warehouse_assets.materialize.gate import LATE_CHANGES_TAG

TZ = ZoneInfo("Asia/Shanghai")
DAY = "2026-03-05"
BUILT = datetime(2026, 3, 6, 1, tzinfo=TZ)  # the day's first build, an hour after it ended

DERIVED = {  # table → (header, SQL)
    # the interval rule under test, declared: the default rebuilds a whole partition only once its day settled
    "dwd.day": ("period: daily\nlate_data: {rebuild: every 60m}\n", "SELECT id, v FROM ods.src"),
    "dws.sum": ("period: daily\nlate_data: {rebuild: every 30m}\n", "SELECT sum(v) AS v FROM dwd.day"),
    "ads.nightly": ("period: daily\nlate_data: {rebuild: daily 06:00}\n", "SELECT v FROM dws.sum"),
    "ads.manual": ("period: daily\nlate_data: {rebuild: never}\n", "SELECT v FROM dws.sum"),
    "ads.fresh": ("period: daily\nlate_data: {rebuild: at_once, lookback: 1d}\n", "SELECT v FROM dws.sum"),
    # the table's policy is never, but late data through this dependency rebuilds at once
    "ads.through": (
        "period: daily\nlate_data: {rebuild: never}\n"
        "depends_on:\n  dws.sum: {set: [0], late_data: {rebuild: at_once}}\n",
        "SELECT v FROM dws.sum",
    ),
}


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    tables = {f"{fqn.replace('.', '/')}.sql": declaration for fqn, declaration in DERIVED.items()}
    return sql_catalog(tmp_path_factory.mktemp("catalog"), tables, ods=VALUED_ODS)


@pytest.fixture
def instance(consolidated: DagsterInstance) -> DagsterInstance:
    return consolidated


def built(center: Center, *tables: str, at: datetime = BUILT) -> None:
    """Build the day of each table in turn as the engine requests it (each request checked), reported as built."""
    for table in tables:
        assert [DAY] in requested(center.step(at)).get(table, []), table
        center.report(table, [DAY], checked=None)
    center.step(at)


def built_together(center: Center, *tables: str) -> None:
    """Build the day of ``tables``, all requested by one step (exactly those), reported as built."""
    assert requested(center.step(BUILT)) == {table: [[DAY]] for table in tables}
    for table in tables:
        center.report(table, [DAY], checked=None)
    center.step(BUILT)


def built_chain(center: Center) -> None:
    center.report("ods.src", hours(DAY), checked=None)
    built(center, "dwd.day", "dws.sum")
    for table in ("ads.nightly", "ads.manual", "ads.fresh", "ads.through"):
        center.report(table, [DAY], checked=None)
    assert center.step(BUILT) == []


def late_hour(center: Center, hour: int = 10, seen: datetime | None = None) -> None:
    """A late change to one hour of the built day, seen by the center at ``seen`` (the engine looks every moment)."""
    center.report("ods.src", [f"{DAY}-{hour:02d}:00"], checked=None)
    if seen is not None:
        assert "dwd.day" not in requested(center.step(seen))


def test_late_data_waits_for_the_interval_and_one_rebuild_absorbs_every_change_in_it(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    center = Center(instance, catalog)
    built_chain(center)
    late_hour(center, 10, seen=BUILT + timedelta(minutes=1))  # every 60 min: not yet
    for minute, hour in ((10, 11), (20, 12), (59, 13)):
        late_hour(center, hour)
        assert "dwd.day" not in requested(center.step(BUILT + timedelta(minutes=minute)))
    plans = center.step(BUILT + timedelta(minutes=61))  # the interval since the first late change passed
    [plan] = [p for p in plans if p.table == "dwd.day"]
    assert plan.partitions == (DAY,)
    assert plan.tags[LANE_TAG] == REBUILD_LANE
    assert json.loads(plan.tags[LATE_CHANGES_TAG]) == {DAY: 4}  # hours 10, 11, 12 and 13
    assert center.step(BUILT + timedelta(minutes=62)) == []  # requested once


def test_a_second_late_change_after_the_rebuild_waits_a_whole_interval_again(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    center = Center(instance, catalog)
    built_chain(center)
    late_hour(center, seen=BUILT)
    assert requested(center.step(BUILT + timedelta(minutes=61)))["dwd.day"] == [[DAY]]
    rebuilt_at = BUILT + timedelta(minutes=61)
    run = create_run(instance, [DAY], AssetKey(["dwd", "day"]))
    start(instance, run)
    materialize_in(instance, run, DAY, AssetKey(["dwd", "day"]))
    end(instance, run, "success")
    late_hour(center, 14, seen=rebuilt_at + timedelta(minutes=1))  # a late change after the rebuild started
    assert "dwd.day" not in requested(center.step(rebuilt_at + timedelta(minutes=30)))
    assert "dwd.day" not in requested(center.step(rebuilt_at + timedelta(minutes=59)))
    assert requested(center.step(rebuilt_at + timedelta(minutes=91)))["dwd.day"] == [[DAY]]


def test_ten_late_changes_during_a_rebuild_make_exactly_one_more_rebuild(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    center = Center(instance, catalog)
    built_chain(center)
    late_hour(center, seen=BUILT)
    at = BUILT + timedelta(minutes=61)
    assert requested(center.step(at))["dwd.day"] == [[DAY]]
    day = AssetKey(["dwd", "day"])
    run = create_run(instance, [DAY], day)
    start(instance, run)
    for hour in range(12, 22):  # ten late changes while the rebuild runs
        late_hour(center, hour)
        assert "dwd.day" not in requested(center.step(at + timedelta(minutes=hour - 11)))
    materialize_in(instance, run, DAY, day)
    end(instance, run, "success")
    at += timedelta(minutes=15)
    assert "dwd.day" not in requested(center.step(at))  # the next rebuild waits for its interval
    later = [p for t in range(20, 200, 10) for p in center.step(at + timedelta(minutes=t)) if p.table == "dwd.day"]
    assert [p.partitions for p in later] == [(DAY,)]  # exactly one more rebuild
    assert json.loads(later[0].tags[LATE_CHANGES_TAG]) == {DAY: 10}


def test_a_rebuild_of_an_input_reaches_its_downstream_within_the_same_window(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    """The late change's age counts, not its rebuilt input's: dws.sum (every 30 min) follows dwd.day's rebuild (every
    60 min) at once, as both intervals began with the change."""
    center = Center(instance, catalog)
    built_chain(center)
    late_hour(center, seen=BUILT)
    at = BUILT + timedelta(minutes=61)
    assert requested(center.step(at))["dwd.day"] == [[DAY]]
    center.report("dwd.day", [DAY], checked=None)  # rebuilt
    plans = requested(center.step(at + timedelta(minutes=2)))
    assert plans["dws.sum"] == [[DAY]]


def test_nothing_is_built_on_an_input_whose_rebuild_is_queued(instance: DagsterInstance, catalog: Catalog) -> None:
    center = Center(instance, catalog)
    center.report("ods.src", hours(DAY), checked=None)
    assert requested(center.step(BUILT))["dwd.day"] == [[DAY]]
    center.report("dwd.day", [DAY], checked=None)
    # a rebuild of dwd.day waits in the queue (launched from the UI, say) as dws.sum's first build becomes possible
    run = create_run(instance, [DAY], AssetKey(["dwd", "day"]))
    assert "dws.sum" not in requested(center.step(BUILT))
    start(instance, run)
    assert "dws.sum" not in requested(center.step(BUILT))
    materialize_in(instance, run, DAY, AssetKey(["dwd", "day"]))
    end(instance, run, "success")
    assert requested(center.step(BUILT))["dws.sum"] == [[DAY]]  # built once, on the rebuilt day


def test_a_daily_policy_rebuilds_at_its_local_time_and_never_waits_for_a_repair(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    center = Center(instance, catalog)
    built_chain(center)
    center.report("dws.sum", [DAY], checked=None)  # dws.sum rebuilt (by hand): late data for the ADS tables
    plans = requested(center.step(BUILT + timedelta(minutes=1)))
    assert plans.get("ads.fresh") == [[DAY]] and plans.get("ads.through") == [[DAY]]  # at once
    assert "ads.nightly" not in plans and "ads.manual" not in plans
    assert "ads.nightly" not in requested(center.step(datetime(2026, 3, 6, 5, 59, tzinfo=TZ)))
    six = requested(center.step(datetime(2026, 3, 6, 6, 0, tzinfo=TZ)))
    assert six.get("ads.nightly") == [[DAY]]
    assert "ads.manual" not in six
    assert "ads.manual" not in requested(center.step(datetime(2026, 3, 9, tzinfo=TZ)))
    ledger = open_readonly(center.store.path)
    assert ledger is not None
    [manual] = ledger.stale("ads.manual", [DAY]).values()
    assert manual.due is None and "only by a repair" in manual.note and manual.changes == 1


def test_a_partition_beyond_the_lookback_is_reported_stale_not_rebuilt(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    center = Center(instance, catalog)
    built_chain(center)
    two_days_later = BUILT + timedelta(days=2)
    # the lookback counts from the table's newest partition, not the clock: two days on, with nothing newer built,
    # a late change to the day still rebuilds a table whose lookback is one day
    center.report("dws.sum", [DAY], checked=None)
    plans = requested(center.step(two_days_later))
    assert plans.get("ads.fresh") == [[DAY]] and plans.get("ads.through") == [[DAY]]
    for table in ("ads.fresh", "ads.through"):
        center.report(table, [DAY], checked=None)
    # once each table has built the day two days later, the day is two days behind its newest partition
    later_day = "2026-03-07"
    for table in ("ads.fresh", "ads.through"):
        center.report(table, [later_day], checked=None)
    center.step(two_days_later)
    center.report("dws.sum", [DAY], checked=None)
    plans = requested(center.step(two_days_later + timedelta(minutes=1)))
    assert "ads.fresh" not in plans  # at once, but its lookback is one day
    assert plans.get("ads.through") == [[DAY]]  # its lookback is the default's 3 days
    ledger = open_readonly(center.store.path)
    assert ledger is not None
    [fresh] = ledger.stale("ads.fresh", [DAY]).values()
    assert fresh.due is None and "1 d behind the table's newest partition" in fresh.note


def test_the_late_data_declarations_are_validated_naming_the_file(tmp_path: Path) -> None:
    root = tmp_path / "catalog"
    write(root, "ods/src.yaml", VALUED_ODS)
    (root / "dwd").mkdir()
    bad = root / "dwd" / "day.sql"
    for header, message in (
        ("late_data: {rebuild: sometimes}\n", "late_data.rebuild must be at_once, every <interval>"),
        ("late_data: {rebuild: daily 25:00}\n", "daily <HH:MM>"),
        ("late_data: {rebuild: every 30m, lookback: soon}\n", "late_data.lookback must be a duration"),
        ("late_data: {when: later}\n", "late_data takes rebuild"),
        ("late_data: {grace: a while}\n", "late_data.grace must be a duration"),
        (
            "depends_on:\n  ods.src: {range: [0, 23], late_data: {rebuild: hourly}}\n",
            "dependency ods.src: late_data.rebuild must be",
        ),
    ):
        bad.write_text(f"/* ---\ntable: dwd.day\nperiod: daily\n{header}--- */\nSELECT id FROM ods.src\n")
        with pytest.raises(ValueError, match=str(bad)) as error:
            load_catalog(root)
        assert message in str(error.value)


def test_why_and_status_say_a_partition_is_stale_since_when_and_when_its_rebuild_is_due(
    instance: DagsterInstance, catalog: Catalog, tmp_path: Path
) -> None:
    center = Center(instance, catalog)
    built_chain(center)
    late_hour(center, 10, seen=BUILT + timedelta(minutes=5))
    late_hour(center, 11, seen=BUILT + timedelta(minutes=7))
    report = explain(
        instance,
        catalog,
        DeltaStore(str(tmp_path / "lake")),
        Landing(tmp_path / "landing"),
        "dwd.day",
        DAY,
        current_time=BUILT + timedelta(minutes=8),
    )
    expected = (
        "stale: late data since 2026-03-06 01:05+08:00 (2 late changes), rebuild due 2026-03-06 02:05+08:00 "
        "(policy every 1 h, lookback 3 d, grace 1 h)"
    )
    assert expected in report.lines()[0]
    # and how its rebuild goes: dwd.day declares no key, so it cannot be rebuilt by key
    assert "whole-partition rebuilds: declares no primary_key" in report.lines()[0]
    assert "not additive: id reads id outside an aggregate" in report.lines()[0]
    # a total of dwd.day's rows, were it stale, would be maintained from dwd.day's changed rows
    assert (
        rebuild_kind(catalog, catalog["dws.sum"]) == "additive: sum/count maintained from the changed rows of dwd.day"
    )
    ledger = open_readonly(center.store.path)
    assert ledger is not None
    lines = status_lines(catalog, center.store.view(), "dwd.day", [DAY, "2026-03-04"], ledger)
    assert lines[0].endswith("1 stale")
    assert expected in lines[1] and "stale" not in lines[2]
    # rebuilt: no longer stale, for either
    assert requested(center.step(BUILT + timedelta(minutes=66)))["dwd.day"] == [[DAY]]
    center.report("dwd.day", [DAY], checked=None)
    center.step(BUILT + timedelta(minutes=67))
    assert "stale" not in status_lines(catalog, center.store.view(), "dwd.day", [DAY], ledger)[1]


JUST_CLOSED = datetime(2026, 3, 6, 0, 10, tzinfo=TZ)  # ten minutes after the day ended


def test_the_day_that_just_closed_takes_its_last_rows_at_once_then_keeps_to_its_interval(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    """Within the grace (1 h by default) of the window's end, a change is the period settling: the first rebuild is
    due at once, not after the policy's interval; the next keeps to the interval from that rebuild."""
    center = Center(instance, catalog)
    center.report("ods.src", hours(DAY), checked=None)
    built(center, "dwd.day", at=JUST_CLOSED)
    late_hour(center, 23)  # the day's last hour, changed 15 minutes after the day ended
    settled = JUST_CLOSED + timedelta(minutes=5)
    assert requested(center.step(settled))["dwd.day"] == [[DAY]]  # at once, under `every 60m`
    center.report("dwd.day", [DAY], checked=None)
    late_hour(center, 22, seen=settled + timedelta(minutes=5))  # still in the grace, but the first rebuild was done
    assert "dwd.day" not in requested(center.step(settled + timedelta(minutes=59)))
    assert requested(center.step(settled + timedelta(minutes=66)))["dwd.day"] == [[DAY]]


def test_a_late_change_after_the_grace_waits_for_the_interval(instance: DagsterInstance, catalog: Catalog) -> None:
    center = Center(instance, catalog)
    center.report("ods.src", hours(DAY), checked=None)
    built(center, "dwd.day", at=JUST_CLOSED)
    past_grace = datetime(2026, 3, 6, 1, 5, tzinfo=TZ)  # 65 minutes after the day ended
    late_hour(center, 23, seen=past_grace)
    assert "dwd.day" not in requested(center.step(past_grace + timedelta(minutes=59)))
    assert requested(center.step(past_grace + timedelta(minutes=61)))["dwd.day"] == [[DAY]]


def test_the_grace_is_declared_and_never_applies_to_a_never_policy() -> None:
    end = datetime(2026, 3, 6, tzinfo=TZ)
    soon = end + timedelta(minutes=10)

    def due(policy: LateDataPolicy, last: datetime | None = None) -> datetime | None:
        when, _ = due_time(policy, window_end=end, newest_end=end, since=soon, last_rebuild=last, now=soon, timezone=TZ)
        return when

    assert due(LateDataPolicy.parse({"rebuild": "every 2h"})) == soon
    assert due(LateDataPolicy.parse({"rebuild": "daily 06:00"})) == soon
    assert due(LateDataPolicy.parse({"rebuild": "every 2h", "grace": "5m"})) == soon + timedelta(hours=2)
    assert due(LateDataPolicy.parse({"rebuild": "every 2h", "grace": "0m"})) == soon + timedelta(hours=2)
    assert due(LateDataPolicy.parse({"rebuild": "never"})) is None
    # the default's two rules, kept beside a declared grace
    assert LateDataPolicy.parse({"grace": "30m"}).describe() == (
        "every 15 min (whole rebuilds 2 d after the window closed), lookback 3 d, grace 30 min"
    )


def test_rebuilds_of_a_partition_are_at_least_an_interval_apart() -> None:
    """A change older than the partition's last rebuild that the rebuild did not absorb (it reached an input after
    the input was read, and comes through that input's own rebuild) is due an interval after the last rebuild, not
    an interval after the change: two rebuilds never come closer together than the policy says."""
    end = datetime(2026, 3, 5, tzinfo=TZ)
    last = end + timedelta(hours=5)
    since = last - timedelta(minutes=40)
    when, _ = due_time(
        LateDataPolicy.parse({"rebuild": "every 60m"}),
        window_end=end,
        newest_end=end,
        since=since,
        last_rebuild=last,
        now=last + timedelta(minutes=1),
        timezone=TZ,
    )
    assert when == last + timedelta(minutes=60)  # not since + 60 min, 40 minutes after the last rebuild


def test_an_after_rule_rebuilds_once_the_window_has_settled_then_at_most_once_per_interval() -> None:
    """``after 48h``: the late changes of a closed day wait until it has been closed 48 hours (the sources' own
    correction window) and one rebuild absorbs them all; a change later still waits 48 hours after that rebuild.
    The period that just closed still takes its last rows at once (the grace)."""
    end = datetime(2026, 3, 6, tzinfo=TZ)
    policy = LateDataPolicy.parse({"rebuild": "after 48h"})

    def due(since: datetime, last: datetime | None = None) -> datetime | None:
        window = {"window_end": end, "newest_end": end}
        when, _ = due_time(policy, **window, since=since, last_rebuild=last, now=since, timezone=TZ)
        return when

    settled = end + timedelta(hours=48)
    grace = timedelta(hours=1)  # the settled rebuild waits for what the last changes bring through the inputs
    assert due(end + timedelta(minutes=10)) == end + timedelta(minutes=10)  # within the grace: at once
    assert due(end + timedelta(hours=3), last=end + timedelta(minutes=10)) == settled + grace
    assert due(end + timedelta(hours=40), last=end + timedelta(minutes=10)) == settled + grace
    assert due(settled + timedelta(hours=2), last=settled + grace) == settled + grace + timedelta(hours=48)
    # a change that reached the sources before the window settled but this partition only after its settled rebuild
    # (through a longer chain of inputs rebuilt every 15 minutes) is part of the settling: a grace after that
    # rebuild, not 48 hours on, past the lookback, left to a repair
    assert due(settled - timedelta(minutes=5), last=settled + grace) == settled + 2 * grace
    assert policy.describe() == "2 d after the window closed, lookback 3 d, grace 1 h"
    with pytest.raises(ValueError, match="after <duration>"):
        LateDataPolicy.parse({"whole": "after"})


SPLIT = "late_data: {rebuild: at_once, whole: every 60m}\n"


def test_a_key_local_table_absorbs_late_data_at_once_while_a_whole_rebuild_keeps_its_interval(
    instance: DagsterInstance, tmp_path: Path
) -> None:
    """One policy, two rules: the table whose rebuild replaces only the changed keys' rows (key-local: grouped by its
    key) follows late data at once; the median over the whole day, whose rebuild recomputes it all, waits its hour."""
    catalog = sql_catalog(
        tmp_path / "split",
        {
            "dwd/by_key.sql": (
                f"period: daily\nprimary_key: [id]\n{SPLIT}",
                "SELECT id, sum(v) AS v FROM ods.src GROUP BY id",
            ),
            "dwd/total.sql": (
                f"period: daily\nprimary_key: [v]\n{SPLIT}",
                "SELECT percentile_approx(v, 0.5) AS v FROM ods.src",
            ),
        },
        ods=VALUED_ODS,
    )
    center = Center(instance, catalog)
    center.report("ods.src", hours(DAY), checked=None)
    built_together(center, "dwd.by_key", "dwd.total")
    late_hour(center, 10)  # past the grace: the day ended an hour before BUILT
    plans = requested(center.step(BUILT + timedelta(minutes=1)))
    assert plans.get("dwd.by_key") == [[DAY]] and "dwd.total" not in plans
    assert "dwd.total" not in requested(center.step(BUILT + timedelta(minutes=59)))
    assert requested(center.step(BUILT + timedelta(minutes=62))).get("dwd.total") == [[DAY]]
    assert LateDataPolicy.parse({"rebuild": "at_once", "whole": "every 60m"}).describe() == (
        "at once (whole rebuilds every 1 h), lookback 3 d, grace 1 h"
    )


def test_by_default_a_key_local_table_takes_late_data_within_15_minutes_and_a_whole_one_once_its_day_settled(
    instance: DagsterInstance, tmp_path: Path
) -> None:
    """The default policy, declared nowhere: a rebuild that replaces the changed keys' rows is cheap and comes 15
    minutes after the late change; a rebuild of the whole day (a rank over the day, neither key-local nor a total)
    waits until the day has been closed 48 hours, when the sources' corrections are in, and a grace more."""
    assert DEFAULT_LATE_DATA.describe() == (
        "every 15 min (whole rebuilds 2 d after the window closed), lookback 3 d, grace 1 h"
    )
    catalog = sql_catalog(
        tmp_path / "default",
        {
            "dwd/by_key.sql": ("period: daily\nprimary_key: [id]\n", "SELECT id, sum(v) AS v FROM ods.src GROUP BY id"),
            "dwd/ranked.sql": (
                "period: daily\nprimary_key: [id]\n",
                "SELECT id, v, row_number() OVER (ORDER BY v) AS r FROM ods.src",
            ),
        },
        ods=VALUED_ODS,
    )
    center = Center(instance, catalog)
    center.report("ods.src", hours(DAY), checked=None)
    built_together(center, "dwd.by_key", "dwd.ranked")
    late_hour(center, 10)  # past the grace: the day ended an hour before BUILT
    assert center.step(BUILT + timedelta(minutes=1)) == []  # seen: the interval starts
    assert center.step(BUILT + timedelta(minutes=15)) == []
    assert requested(center.step(BUILT + timedelta(minutes=16))) == {"dwd.by_key": [[DAY]]}
    center.report("dwd.by_key", [DAY], checked=None)
    settled = datetime(2026, 3, 8, 1, tzinfo=TZ)  # the day's end + 48 h + the grace
    assert center.step(settled - timedelta(minutes=1)) == []
    assert requested(center.step(settled)) == {"dwd.ranked": [[DAY]]}


def test_an_additive_total_absorbs_late_data_at_once_unless_its_changed_rows_make_it_whole(
    instance: DagsterInstance, tmp_path: Path
) -> None:
    """A sum over the whole day is maintained from its input's changed rows: its rebuild follows the ``rebuild`` rule,
    at once, as a key-local one does, while a median of the same day waits for the whole rule's hour. A late report of
    more changed rows than a maintained rebuild takes makes it whole, and it keeps the whole rule."""
    catalog = sql_catalog(
        tmp_path / "additive",
        {
            "dwd/total.sql": (f"period: daily\n{SPLIT}", "SELECT sum(v) AS v, count(*) AS n FROM ods.src"),
            "dwd/top.sql": (f"period: daily\n{SPLIT}", "SELECT percentile_approx(v, 0.5) AS v FROM ods.src"),
        },
        ods=VALUED_ODS,
    )
    center = Center(instance, catalog)
    src = AssetKey(["ods", "src"])
    center.report("ods.src", hours(DAY), checked=None)
    built_together(center, "dwd.total", "dwd.top")

    def late_report(hour: int, changed: int) -> None:  # as the readiness sensor reports an hour's late changes
        metadata = {"rows": 5_000, "late_changes": True, "changed_rows": changed}
        instance.report_runless_asset_event(
            AssetMaterialization(src, partition=f"{DAY}-{hour:02d}:00", metadata=metadata)
        )

    late_report(10, changed=40)
    assert requested(center.step(BUILT + timedelta(minutes=1))) == {"dwd.total": [[DAY]]}
    center.report("dwd.total", [DAY], checked=None)
    center.step(BUILT + timedelta(minutes=2))
    late_report(11, changed=2 * MAX_KEYS + 1)  # a replay: more images than the maintenance reads
    assert "dwd.total" not in requested(center.step(BUILT + timedelta(minutes=3)))
    stale = center.resolver.ledger.stale("dwd.total", [DAY])[DAY]
    assert stale.note == f"{2 * MAX_KEYS + 1:,} rows changed upstream: rebuilt whole, so by the whole rule"
    assert requested(center.step(BUILT + timedelta(minutes=63))).get("dwd.total") == [[DAY]]


def test_a_key_local_rebuild_that_will_be_whole_follows_the_whole_rule(
    instance: DagsterInstance, tmp_path: Path
) -> None:
    """The rule follows the rebuild it will be: a late report of a few changes is a key-scoped rebuild, due at once;
    one of more changes than a key-scoped rebuild takes (a fifth of the partition's rows) recomputes the partition,
    and keeps the whole rebuilds' interval, as a table that cannot be rebuilt by key does."""
    catalog = sql_catalog(
        tmp_path / "sized",
        {
            "dwd/by_key.sql": (
                f"period: daily\nprimary_key: [id]\n{SPLIT}",
                "SELECT id, sum(v) AS v FROM ods.src GROUP BY id",
            )
        },
        ods=VALUED_ODS,
    )
    center = Center(instance, catalog)
    src, by_key = AssetKey(["ods", "src"]), AssetKey(["dwd", "by_key"])
    center.report("ods.src", hours(DAY), checked=None)
    assert requested(center.step(BUILT)) == {"dwd.by_key": [[DAY]]}
    built_rows = {"partitions": [{"partition": DAY, "rows": 50_000}]}  # as the runner lists what it wrote
    instance.report_runless_asset_event(AssetMaterialization(by_key, partition=DAY, metadata=built_rows))
    center.step(BUILT)

    def late_report(hour: int, changed: int) -> None:  # as the readiness sensor reports an hour's late changes
        metadata = {"rows": 5_000, "late_changes": True, "changed_rows": changed}
        instance.report_runless_asset_event(
            AssetMaterialization(src, partition=f"{DAY}-{hour:02d}:00", metadata=metadata)
        )

    late_report(10, changed=40)  # a few keys: by key, at once
    assert requested(center.step(BUILT + timedelta(minutes=1))) == {"dwd.by_key": [[DAY]]}
    instance.report_runless_asset_event(
        AssetMaterialization(
            by_key, partition=DAY, metadata={"partitions": [{"partition": DAY, "rows": 50_000, "keys_rebuilt": 40}]}
        )
    )
    center.step(BUILT + timedelta(minutes=2))
    late_report(11, changed=12_000)  # a replayed hour: more than a fifth of the day's 50,000 rows
    assert "dwd.by_key" not in requested(center.step(BUILT + timedelta(minutes=3)))
    stale = center.resolver.ledger.stale("dwd.by_key", [DAY])[DAY]
    assert stale.policy == "every 1 h, lookback 3 d, grace 1 h"
    assert stale.note == "12,000 rows changed upstream: rebuilt whole, so by the whole rule"  # what `why` prints
    assert requested(center.step(BUILT + timedelta(minutes=63))).get("dwd.by_key") == [[DAY]]


def test_a_window_of_any_takes_a_day_that_arrives_at_once_and_a_change_to_a_day_it_read_by_its_policy(
    instance: DagsterInstance, tmp_path: Path
) -> None:
    """``mode: any`` builds on the days of its window that exist: a day arriving later is the rest it was built to
    receive (at once); a late change to a day it read is late data like any other (its policy's interval)."""
    catalog = sql_catalog(
        tmp_path / "any",
        {
            "dwd/day.sql": ("period: daily\n", "SELECT id, v FROM ods.src"),
            "dws/week.sql": (
                "period: daily\ndepends_on:\n  dwd.day: {range: [-6, 0], mode: any}\n",
                "SELECT id, v FROM dwd.day",
            ),
        },
        ods=VALUED_ODS,
    )
    center = Center(instance, catalog)
    center.report("ods.src", hours(DAY), checked=None)
    built(center, "dwd.day", "dws.week")
    later = BUILT + timedelta(hours=2)  # past the grace
    center.report("dwd.day", [DAY], checked=None)  # the day it read, rebuilt for a late change
    assert "dws.week" not in requested(center.step(later))
    center.report("dwd.day", ["2026-03-04"], checked=None)  # a day of its window it did not have
    # with its own first build of that day, in one run
    assert requested(center.step(later + timedelta(minutes=1))).get("dws.week") == [["2026-03-04", DAY]]


NIGHTLY_CHAIN = {  # both rebuilt at 06:00; ads.both reads the source directly as well as through dwd.early
    "dwd.early": ("period: daily\nlate_data: {rebuild: daily 06:00}\n", "SELECT id, v FROM ods.src"),
    "ads.both": (
        "period: daily\nlate_data: {rebuild: daily 06:00}\n",
        "SELECT e.id, e.v + s.v AS v FROM dwd.early e JOIN ods.src s ON e.id = s.id",
    ),
}


def test_a_table_due_with_its_input_waits_for_that_rebuild_not_a_day(instance: DagsterInstance, tmp_path: Path) -> None:
    """ads.both and its input dwd.early come due at 06:00 for the same late change. Rebuilt at 06:00 beside its
    input, ads.both would miss the input's rebuild and, under a daily rule, wait until the next 06:00 for it (a day
    per layer down a chain): it waits for that rebuild and follows it at once."""
    tables = {f"{fqn.replace('.', '/')}.sql": declaration for fqn, declaration in NIGHTLY_CHAIN.items()}
    center = Center(instance, sql_catalog(tmp_path, tables, ods=VALUED_ODS))
    center.report("ods.src", hours(DAY), checked=None)
    built(center, "dwd.early", "ads.both")
    late_hour(center, 10)
    center.step(datetime(2026, 3, 6, 2, 0, tzinfo=TZ))  # seen at night, after the grace
    six = datetime(2026, 3, 6, 6, 0, tzinfo=TZ)
    plans = requested(center.step(six))
    assert plans.get("dwd.early") == [[DAY]]
    assert "ads.both" not in plans  # its input's rebuild is coming now
    run = create_run(instance, [DAY], AssetKey(["dwd", "early"]))  # the input's rebuild runs for half an hour
    start(instance, run)
    assert "ads.both" not in requested(center.step(six + timedelta(minutes=30)))
    materialize_in(instance, run, DAY, AssetKey(["dwd", "early"]))
    end(instance, run, "success")
    assert requested(center.step(six + timedelta(minutes=31))).get("ads.both") == [[DAY]]  # at once, not tomorrow
    assert center.step(six + timedelta(minutes=32)) == []


SETTLING_CHAIN = {  # dwd.a and ads.c settle together; dws.b, between them, follows dwd.a at once
    "dwd.a": ("period: daily\nlate_data: {rebuild: after 48h}\n", "SELECT id, v FROM ods.src"),
    "dws.b": ("period: daily\nprimary_key: [id]\nlate_data: {rebuild: at_once}\n", "SELECT id, v FROM dwd.a"),
    "ads.c": (
        "period: daily\nlate_data: {rebuild: after 48h}\n",
        "SELECT b.id, b.v + s.v AS v FROM dws.b b JOIN ods.src s ON b.id = s.id",
    ),
}


def test_a_settled_whole_rebuild_waits_for_a_rebuild_coming_further_up_and_is_built_once(
    instance: DagsterInstance, tmp_path: Path
) -> None:
    """ads.c reads the source directly and through dws.b, which follows dwd.a at once. A late change makes dwd.a and
    ads.c stale, both due when the day has settled. Built beside dwd.a, ads.c would be built whole again a grace
    later, once dwd.a's rebuild has come through dws.b: it waits for the rebuild two tables up and is built once."""
    tables = {f"{fqn.replace('.', '/')}.sql": declaration for fqn, declaration in SETTLING_CHAIN.items()}
    center = Center(instance, sql_catalog(tmp_path, tables, ods=VALUED_ODS))
    center.report("ods.src", hours(DAY), checked=None)
    built(center, "dwd.a", "dws.b", "ads.c")
    late_hour(center, 10)
    assert center.step(datetime(2026, 3, 6, 12, 0, tzinfo=TZ)) == []  # seen after the grace: both wait to settle
    settled = datetime(2026, 3, 8, 1, 0, tzinfo=TZ)  # the day closed 48 h ago, and a grace more
    plans = requested(center.step(settled))
    assert plans.get("dwd.a") == [[DAY]]
    assert "ads.c" not in plans  # dwd.a's rebuild comes to it through dws.b
    center.report("dwd.a", [DAY], checked=None)
    assert requested(center.step(settled + timedelta(minutes=5))).get("dws.b") == [[DAY]]
    center.report("dws.b", [DAY], checked=None)
    assert requested(center.step(settled + timedelta(minutes=10))).get("ads.c") == [[DAY]]
    center.report("ads.c", [DAY], checked=None)
    for later in (timedelta(hours=2), timedelta(hours=3)):  # nothing left to absorb: no second whole rebuild
        assert "ads.c" not in requested(center.step(settled + later))


def test_an_input_a_run_waited_for_before_reading_is_not_late_data_to_it(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    """A repair's run waits in its guard for a re-ingested hour, then reads it: that hour's report came after the run
    started, yet the run read it. Its materialization says so (``read_after``), and the day is not stale."""
    from dagster import AssetMaterialization, DagsterEvent, DagsterEventType, MetadataValue
    from dagster._core.events import StepMaterializationData

    from tests.center.test_state_store import materializations
    from warehouse_assets.materialize.gate import READ_AFTER

    center = Center(instance, catalog)
    built_chain(center)
    run = create_run(instance, [DAY], AssetKey(["dwd", "day"]))
    start(instance, run)
    late_hour(center, 10)  # the re-ingested hour, reported while the run waits for it
    [hour_id, *_] = materializations(instance, AssetKey(["ods", "src"]), f"{DAY}-10:00")
    metadata = {"delta_version": 2, READ_AFTER: MetadataValue.json({DAY: hour_id})}
    data = StepMaterializationData(AssetMaterialization(AssetKey(["dwd", "day"]), partition=DAY, metadata=metadata))
    event = DagsterEvent(DagsterEventType.ASSET_MATERIALIZATION.value, run.job_name, event_specific_data=data)
    instance.report_dagster_event(event, run.run_id)
    end(instance, run, "success")
    later = BUILT + timedelta(hours=3)
    assert "dwd.day" not in requested(center.step(later))
    ledger = open_readonly(center.store.path)
    assert ledger is not None and ledger.stale("dwd.day", [DAY]) == {}


SHORT_INPUT = {  # the input is rebuilt nightly and looks back one day; its reader every 6 hours, three days
    "dwd.short": ("period: daily\nlate_data: {rebuild: daily 06:00, lookback: 1d}\n", "SELECT id, v FROM ods.src"),
    "ads.reader": ("period: daily\nlate_data: {rebuild: every 6h}\n", "SELECT id, v FROM dwd.short"),
}


def test_a_table_waiting_for_an_input_left_to_a_repair_still_absorbs_what_reached_it(
    instance: DagsterInstance, tmp_path: Path
) -> None:
    """ads.reader waits for dwd.short's coming rebuild rather than be rebuilt twice. When that rebuild's time comes
    and dwd.short is past its lookback (left to a repair), ads.reader is looked at again and rebuilt with the change
    that did reach it, instead of waiting for a rebuild that never comes."""
    tables = {f"{fqn.replace('.', '/')}.sql": declaration for fqn, declaration in SHORT_INPUT.items()}
    center = Center(instance, sql_catalog(tmp_path, tables, ods=VALUED_ODS))
    center.report("ods.src", hours(DAY), checked=None)
    built(center, "dwd.short", "ads.reader")
    six = datetime(2026, 3, 6, 6, 0, tzinfo=TZ)
    late_hour(center, 10, seen=six - timedelta(hours=3))
    assert requested(center.step(six)).get("dwd.short") == [[DAY]]
    center.report("dwd.short", [DAY], checked=None)  # rebuilt: a change ads.reader has not read
    late_hour(center, 11, seen=six + timedelta(minutes=5))  # and a second late change: dwd.short stale again
    plans = requested(center.step(six + timedelta(hours=4)))  # ads.reader's 6 hours have passed: it waits instead
    ledger = open_readonly(center.store.path)
    assert ledger is not None
    assert "ads.reader" not in plans
    assert "waits for dwd.short 2026-03-05's rebuild" in ledger.stale("ads.reader", [DAY])[DAY].note
    # dwd.short moves on two days: its 03-05 falls out of its one-day lookback before its 06:00 rebuild
    center.report("dwd.short", ["2026-03-06", "2026-03-07"], checked=None)
    assert "dwd.short" not in requested(center.step(six + timedelta(days=1)))
    later = requested(center.step(six + timedelta(days=1, minutes=16)))  # the look again after the input's turn
    assert [DAY] in later.get("ads.reader", [])  # the first change, absorbed
    assert ledger.stale("dwd.short", [DAY])[DAY].due is None  # the second is left to a repair, and said


def test_a_total_over_a_join_follows_the_rebuild_rule_by_the_changed_rows_of_all_its_inputs(tmp_path: Path) -> None:
    """A sum over ``ods.src`` joined with a table derived from it is maintained from both inputs' changed rows: its
    rebuild is not whole while the late rows its inputs' materializations recorded, together, are what a maintained
    rebuild takes; past that, counted over both inputs, it is whole (as the runner's one budget of images)."""
    catalog = sql_catalog(
        tmp_path / "joined",
        {
            "dwd/dim.sql": ("period: daily\nprimary_key: [id]\n", "SELECT id, max(v) AS w FROM ods.src GROUP BY id"),
            "dws/joined.sql": (
                f"period: daily\n{SPLIT}",
                "SELECT count(*) AS n, sum(s.v + coalesce(d.w, 0)) AS v "
                "FROM ods.src s LEFT JOIN dwd.dim d ON s.id = d.id",
            ),
        },
        ods=VALUED_ODS,
    )
    kinds = RebuildKinds(catalog)
    joined = catalog["dws.joined"]
    assert isinstance(joined, DerivedTable) and kinds.additive(joined) and not kinds.key_local(joined)
    own = PartitionState("dws/joined", DAY, rows=1)
    half = MAX_CHANGED_ROWS // 2
    src, dim = PartitionState("ods/src", f"{DAY}-10:00", changed=half), PartitionState("dwd/dim", DAY, changed=half)
    assert kinds.rebuilt_whole(joined, own, [src, dim]) == (False, "")
    more = PartitionState("dwd/dim", DAY, changed=half + 1)
    assert kinds.rebuilt_whole(joined, own, [src, more]) == (
        True,
        f"{MAX_CHANGED_ROWS + 1:,} rows changed upstream: rebuilt whole, so by the whole rule",
    )
