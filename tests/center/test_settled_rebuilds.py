"""A closed day under ``{rebuild: every 15m, whole: after 48h}``: the whole rebuild of its settling comes once, after
every rebuild it would otherwise be followed by.

The dependency center is stepped at pinned times on a temp-dir instance, as tests/center/test_late_data.py does: no
Spark, no code location.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

from dagster import AssetKey, AssetMaterialization, DagsterInstance

from tests.center.test_center import Center, hours, requested
from tests.support.small_catalog import VALUED_ODS, sql_catalog
from warehouse_assets.catalog.key_locality import MAX_KEYS

TZ = ZoneInfo("Asia/Shanghai")
DAY = "2026-03-05"
POLICY = "late_data: {rebuild: every 15m, whole: after 48h}\n"
SETTLED = datetime(2026, 3, 8, 1, tzinfo=TZ)  # the day's end + 48 h + the grace (1 h): the whole rule's due time

TABLES = {  # whole, key-local, key-local, whole: dwd.ranked → dws.by_key → dws.by_key_too → ads.ranked
    "dwd/ranked.sql": (
        f"period: daily\nprimary_key: [id]\n{POLICY}",
        "SELECT id, v, row_number() OVER (ORDER BY v) AS r FROM ods.src",
    ),
    "dws/by_key.sql": (
        f"period: daily\nprimary_key: [id]\n{POLICY}",
        "SELECT s.id, sum(s.v + d.r) AS v FROM ods.src s JOIN dwd.ranked d ON s.id = d.id GROUP BY s.id",
    ),
    "dws/by_key_too.sql": (
        f"period: daily\nprimary_key: [id]\n{POLICY}",
        "SELECT id, sum(v) AS v FROM dws.by_key GROUP BY id",
    ),
    "ads/ranked.sql": (
        f"period: daily\nprimary_key: [id]\n{POLICY}",
        "SELECT id, v, rank() OVER (ORDER BY v) AS r FROM dws.by_key_too",
    ),
}


def builds_after_settling(center: Center) -> dict[str, list[datetime]]:
    """Table → when the engine requested its day, looking every 5 minutes for 3 hours after :data:`SETTLED`, each
    request reported built at once."""
    builds: dict[str, list[datetime]] = {}
    at = SETTLED
    while at < SETTLED + timedelta(hours=3):
        at += timedelta(minutes=5)
        for table in requested(center.step(at)):
            builds.setdefault(table, []).append(at)
            center.report(table, [DAY], checked=None)
    return builds


def test_a_settled_whole_rebuild_waits_for_an_input_whose_whole_rebuild_is_due_a_grace_after_its_last(
    consolidated: DagsterInstance, tmp_path: Path
) -> None:
    """``dws.by_key`` and ``dws.by_key_too`` are rebuilt by key 40 minutes after the day settled (a change that came
    just then). When ``dwd.ranked`` is rebuilt whole at the settled time, every key of ``dws.by_key`` changed, so its
    next rebuild is whole, by the whole rule: a grace after its last rebuild (01:40), past the 15 minutes ``ads.ranked``
    (two layers down, due at the settled time) looks again in. ``ads.ranked`` waits for it, and for ``dws.by_key_too``
    after it, and is built whole once; built at 01:15, it was built again a grace later."""
    catalog = sql_catalog(tmp_path, TABLES, ods=VALUED_ODS)
    center = Center(consolidated, catalog)
    center.report("ods.src", hours(DAY), checked=None)
    built = datetime(2026, 3, 6, 1, tzinfo=TZ)
    for table in ("dwd.ranked", "dws.by_key", "dws.by_key_too", "ads.ranked"):
        assert requested(center.step(built)).get(table) == [[DAY]], table
        center.report(table, [DAY], checked=None)
    assert center.step(built) == []

    def rebuilt(at: datetime) -> None:  # by key, the key-local tables in turn
        for table in ("dws.by_key", "dws.by_key_too"):
            assert requested(center.step(at)) == {table: [[DAY]]}
            center.report(table, [DAY], checked=None)

    def late(hour: int, seen: datetime) -> None:  # a late change to an hour of the day, one key
        center.report("ods.src", [f"{DAY}-{hour:02d}:00"], checked=None)
        assert "ads.ranked" not in requested(center.step(seen))

    late(10, datetime(2026, 3, 6, 5, tzinfo=TZ))
    rebuilt(datetime(2026, 3, 6, 5, 15, tzinfo=TZ))
    late(23, SETTLED - timedelta(minutes=35))  # after the day settled (00:00), before its whole rebuilds are due
    rebuilt(SETTLED - timedelta(minutes=20))

    assert requested(center.step(SETTLED)) == {"dwd.ranked": [[DAY]]}  # ads.ranked waits for it
    # a whole write: every row of the day rewritten, as its materialization says
    rows = {"rows": 2 * MAX_KEYS + 1, "changed_rows": 2 * MAX_KEYS + 1}
    consolidated.report_runless_asset_event(
        AssetMaterialization(AssetKey(["dwd", "ranked"]), partition=DAY, metadata=rows)
    )
    whole = builds_after_settling(center)
    by_key_rebuilt = SETTLED + timedelta(minutes=40)  # its last rebuild (00:40) and the grace
    # then the tables below it, each at the first look after its input's rebuild landed: ads.ranked once
    after = by_key_rebuilt + timedelta(minutes=5)
    assert whole == {
        "dws.by_key": [by_key_rebuilt],
        "dws.by_key_too": [after],
        "ads.ranked": [after + timedelta(minutes=5)],
    }


BESIDE = {  # ads.both reads a key-local table over one whole table, and another whole table: all settle together
    "dwd/ranked.sql": TABLES["dwd/ranked.sql"],
    "dwd/other.sql": (
        f"period: daily\nprimary_key: [id]\n{POLICY}",
        "SELECT id, v, dense_rank() OVER (ORDER BY v) AS r FROM ods.src",
    ),
    "dws/by_key.sql": (
        f"period: daily\nprimary_key: [id]\n{POLICY}",
        "SELECT id, sum(r) AS v FROM dwd.ranked GROUP BY id",
    ),
    "ads/both.sql": (
        f"period: daily\nprimary_key: [id]\n{POLICY}",
        "SELECT k.id, rank() OVER (ORDER BY k.v + o.r) AS r FROM dws.by_key k JOIN dwd.other o ON k.id = o.id",
    ),
}


def test_a_settled_whole_rebuild_waits_for_an_input_behind_its_own_input_not_looked_at_yet(
    consolidated: DagsterInstance, tmp_path: Path
) -> None:
    """``dwd.ranked`` and ``dwd.other`` settle together; both land before the resolver looks again. ``ads.both`` (a
    reader of ``dwd.other``) is looked at in the same pass as ``dws.by_key`` (the reader of ``dwd.ranked``), which is
    behind its input but has no stale entry yet: ``ads.both`` waits for it and is built whole once, after it; built
    first, it was built again a grace later."""
    catalog = sql_catalog(tmp_path, BESIDE, ods=VALUED_ODS)
    center = Center(consolidated, catalog)
    center.report("ods.src", hours(DAY), checked=None)
    built = datetime(2026, 3, 6, 1, tzinfo=TZ)
    for tables in (["dwd.other", "dwd.ranked"], ["dws.by_key"], ["ads.both"]):
        assert sorted(requested(center.step(built))) == tables
        for table in tables:
            center.report(table, [DAY], checked=None)
    assert center.step(built) == []
    center.report("ods.src", [f"{DAY}-10:00"], checked=None)  # a late change, long before the day settles
    assert center.step(datetime(2026, 3, 6, 5, tzinfo=TZ)) == []
    assert requested(center.step(SETTLED)) == {"dwd.other": [[DAY]], "dwd.ranked": [[DAY]]}
    center.report("dwd.other", [DAY], checked=None)
    center.report("dwd.ranked", [DAY], checked=None)
    whole = builds_after_settling(center)
    first = SETTLED + timedelta(minutes=5)
    assert whole == {"dws.by_key": [first], "ads.both": [first + timedelta(minutes=5)]}
