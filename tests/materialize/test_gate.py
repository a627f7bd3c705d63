"""The gate, on its own: may partition P run now, and if not why — judged per dependency on the exact upstream
partitions, from partition state read through the narrow ``PartitionStateReader`` (a fake one here: no Dagster
instance, no lake, no Spark)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from tests.support.small_catalog import ODS, sql_catalog, write
from warehouse_assets.catalog import Catalog, CatalogError, Table, load_catalog
from warehouse_assets.materialize.buildable import BuildableSearch, FirstBuildable, first_buildable
from warehouse_assets.materialize.gate import (
    CHECK_FAILED,
    IN_PROGRESS,
    MISSING,
    NONEXISTENT,
    OK,
    TAINTED,
    backfill_partitions,
    decide,
    nonexistent_upstream,
)
from warehouse_assets.materialize.validity import Taint

TZ = ZoneInfo("Asia/Shanghai")
NOW = datetime(2026, 3, 10, 12, tzinfo=TZ)

TABLES = {
    "dwd/day.sql": ("period: daily\n", "SELECT id, v FROM dwd.raw"),
    "dwd/raw.sql": ("period: daily\nchecks:\n  not_null: [id]\n", "SELECT 1 AS id, 2 AS v"),
    "dws/cum.sql": (
        "period: daily\ncolumns: {id: int, v: int}\ndepends_on:\n  dws.cum: {set: [-1]}\n  dwd.day: {set: [0]}\n",
        "SELECT id, v FROM dwd.day UNION ALL SELECT id, v FROM dws.cum",
    ),
    "ads/t7.sql": ("period: daily\ndepends_on:\n  dwd.day: {set: [-7]}\n", "SELECT id, v FROM dwd.day"),
    "ads/wk.sql": ("period: daily\ndepends_on:\n  dwd.raw: {range: [-2, 0]}\n", "SELECT id, v FROM dwd.raw"),
    "ads/on_t7.sql": ("period: daily\ndepends_on:\n  ads.t7: {set: [0]}\n", "SELECT id, v FROM ads.t7"),
}


class FakeStates:
    """The gate's reader over plain sets: what the dependency center's state store will stand in for."""

    def __init__(
        self,
        materialized: dict[str, set[str]] | None = None,
        running: dict[str, set[str]] | None = None,
        failed: dict[str, dict[str, list[str]]] | None = None,
        taints: dict[str, dict[str, Taint]] | None = None,
        repairs: set[str] | None = None,
    ):
        self.done, self.running, self.failed = materialized or {}, running or {}, failed or {}
        self.taints = taints or {}
        self.repairs = repairs or set()  # the repair backfills still running

    def materialized(self, table: Table, keys: Sequence[str]) -> set[str]:
        return self.done.get(table.fqn, set()) & set(keys)

    def in_progress(self, table: Table, keys: Sequence[str]) -> set[str]:
        return self.running.get(table.fqn, set()) & set(keys)

    def failed_blocking_checks(self, table: Table, keys: Sequence[str]) -> dict[str, list[str]]:
        return {k: v for k, v in self.failed.get(table.fqn, {}).items() if k in keys}

    def tainted(self, table: Table, keys: Sequence[str]) -> dict[str, Taint]:
        return {k: v for k, v in self.taints.get(table.fqn, {}).items() if k in keys}

    def repair_running(self, backfill_id: str) -> bool:
        return backfill_id in self.repairs


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    root = tmp_path_factory.mktemp("catalog")
    for rel, (header, sql) in TABLES.items():
        layer, name = rel[:-4].split("/")
        (root / layer).mkdir(exist_ok=True)
        (root / rel).write_text(f"/* ---\ntable: {layer}.{name}\n{header}--- */\n{sql}\n")
    return load_catalog(root)


def test_every_upstream_partition_ok_lets_the_partition_run(catalog: Catalog) -> None:
    states = FakeStates({"dwd.raw": {"2026-03-03", "2026-03-04", "2026-03-05"}})
    verdict = decide(catalog, catalog["ads.wk"], "2026-03-05", states, current_time=NOW)
    assert verdict.may_run and verdict.reasons == []
    [edge] = verdict.edges
    assert edge.upstream.keys == ["2026-03-03", "2026-03-04", "2026-03-05"]
    assert [edge.state(k) for k in edge.upstream.keys] == [OK, OK, OK]


def test_each_upstream_partition_gets_its_verdict(catalog: Catalog) -> None:
    states = FakeStates(
        materialized={"dwd.raw": {"2026-03-03", "2026-03-05"}},
        running={"dwd.raw": {"2026-03-04"}},
        failed={"dwd.raw": {"2026-03-05": ["not_null"]}},
    )
    verdict = decide(catalog, catalog["ads.wk"], "2026-03-05", states, current_time=NOW)
    [edge] = verdict.edges
    assert [edge.state(k) for k in edge.upstream.keys] == [OK, IN_PROGRESS, CHECK_FAILED]
    assert not verdict.may_run
    # the in-progress partition is not materialized: that is the first reason, as the run guard words it
    assert verdict.reasons == [
        "ads.wk 2026-03-05 waits for 1 partition(s) of dwd.raw that are not materialized: 2026-03-04"
    ]
    states.running = {}
    states.done["dwd.raw"].add("2026-03-04")
    verdict = decide(catalog, catalog["ads.wk"], "2026-03-05", states, current_time=NOW)
    assert verdict.reasons == [
        "ads.wk 2026-03-05 refuses to run: 1 partition(s) of dwd.raw failed a blocking data-quality check "
        "(2026-03-05; 2026-03-05: not_null). Fix and re-run dwd.raw, or declare `ignore_dq: true` on the "
        "dependency to proceed anyway."
    ]


def test_an_ignore_dq_dependency_sees_a_failed_check_but_is_not_held_back(catalog: Catalog) -> None:
    lenient = replace(catalog["ads.wk"], deps=tuple(replace(d, ignore_dq=True) for d in catalog["ads.wk"].deps))
    states = FakeStates(
        materialized={"dwd.raw": {"2026-03-03", "2026-03-04", "2026-03-05"}},
        failed={"dwd.raw": {"2026-03-05": ["not_null"]}},
    )
    verdict = decide(catalog, lenient, "2026-03-05", states, current_time=NOW)
    assert verdict.may_run
    assert verdict.edges[0].ignored_checks == {"2026-03-05": ["not_null"]}


BAD = Taint("amounts 100x too high", "ods.order 2026-03-04-13:00", "oncall", 0.0)


def test_a_tainted_upstream_partition_holds_the_partition_back_like_a_missing_one(catalog: Catalog) -> None:
    states = FakeStates(
        materialized={"dwd.raw": {"2026-03-03", "2026-03-04", "2026-03-05"}}, taints={"dwd.raw": {"2026-03-04": BAD}}
    )
    verdict = decide(catalog, catalog["ads.wk"], "2026-03-05", states, current_time=NOW)
    [edge] = verdict.edges
    assert [edge.state(k) for k in edge.upstream.keys] == [OK, TAINTED, OK]
    assert not verdict.may_run
    assert not verdict.waits_for_repair  # no repair rebuilds it now: a repair's run would not wait for it
    assert verdict.reasons == [
        "ads.wk 2026-03-05 waits for 1 partition(s) of dwd.raw that are tainted (2026-03-04; 2026-03-04: tainted: "
        "amounts 100x too high, from ods.order 2026-03-04-13:00): they are valid again once rebuilt: by the engine "
        "once their own upstream is valid, or by a repair of them; or declare `accept_tainted: true` on the dependency"
    ]
    # a window that does not contain it is not held back
    assert decide(catalog, catalog["dwd.day"], "2026-03-05", states, current_time=NOW).may_run


def test_a_tainted_upstream_that_a_running_repair_rebuilds_is_waited_for_not_refused(catalog: Catalog) -> None:
    repairing = replace(BAD, repair="bf-1")
    states = FakeStates(
        materialized={"dwd.raw": {"2026-03-03", "2026-03-04", "2026-03-05"}},
        taints={"dwd.raw": {"2026-03-04": repairing}},
        repairs={"bf-1"},
    )
    verdict = decide(catalog, catalog["ads.wk"], "2026-03-05", states, current_time=NOW)
    assert not verdict.may_run and verdict.waits_for_repair  # a repair's run waits for it (the run guard)
    assert verdict.reasons == [
        "ads.wk 2026-03-05 waits for 1 partition(s) of dwd.raw that are tainted (2026-03-04; 2026-03-04: tainted: "
        "amounts 100x too high, from ods.order 2026-03-04-13:00); the repair backfill bf-1 rebuilds them first"
    ]
    # a missing partition besides it is not the repair's to wait for
    states.done["dwd.raw"].discard("2026-03-03")
    assert not decide(catalog, catalog["ads.wk"], "2026-03-05", states, current_time=NOW).waits_for_repair
    # once the repair is over (done, failed or canceled), nothing is waited for: the run says why it cannot run
    states.done["dwd.raw"].add("2026-03-03")
    states.repairs.clear()
    assert not decide(catalog, catalog["ads.wk"], "2026-03-05", states, current_time=NOW).waits_for_repair


def test_a_tainted_ods_hour_names_the_ways_it_becomes_valid_never_the_taint_itself(tmp_path: Path) -> None:
    catalog = sql_catalog(tmp_path, {"dwd/day.sql": ("period: daily\n", "SELECT id FROM ods.src")})
    hours = {f"2026-03-05-{h:02d}:00" for h in range(24)}
    hour = Taint("amounts 100x too high", "ods.src 2026-03-05-13:00", "oncall", 0.0, repair="bf-2")
    states = FakeStates(
        materialized={"ods.src": hours}, taints={"ods.src": {"2026-03-05-13:00": hour}}, repairs={"bf-2"}
    )
    verdict = decide(catalog, catalog["dwd.day"], "2026-03-05", states, current_time=NOW)
    assert verdict.waits_for_repair
    [reason] = verdict.reasons
    assert reason.endswith(
        "the repair backfill bf-2 waits for it to be reported again by its source, re-ingested from its landing "
        "segments (`warehouse reingest ods.src 2026-03-05-13:00`) or released (`warehouse release ods.src "
        '2026-03-05-13:00 --reason "…"`: accepted as is)'
    )
    assert "warehouse taint" not in reason


def test_an_accept_tainted_dependency_sees_the_taint_but_is_not_held_back(catalog: Catalog) -> None:
    lenient = replace(catalog["ads.wk"], deps=tuple(replace(d, accept_tainted=True) for d in catalog["ads.wk"].deps))
    states = FakeStates(
        materialized={"dwd.raw": {"2026-03-03", "2026-03-04", "2026-03-05"}}, taints={"dwd.raw": {"2026-03-04": BAD}}
    )
    verdict = decide(catalog, lenient, "2026-03-05", states, current_time=NOW)
    assert verdict.may_run
    assert verdict.edges[0].accepted_taints == {"2026-03-04": BAD}
    # accepting taints is not ignoring failed checks
    states.failed = {"dwd.raw": {"2026-03-05": ["not_null"]}}
    assert not decide(catalog, lenient, "2026-03-05", states, current_time=NOW).may_run


def test_accept_tainted_is_declared_beside_the_offsets(tmp_path: Path) -> None:
    write(tmp_path, "ods/src.yaml", ODS)
    header = "period: daily\ndepends_on:\n  ods.src: {range: [0, 23], accept_tainted: true, ignore_dq: true}\n"
    write(tmp_path, "dwd/day.sql", f"/* ---\ntable: dwd.day\n{header}--- */\nSELECT id FROM ods.src\n")
    [dep] = load_catalog(tmp_path)["dwd.day"].deps
    assert (dep.start_offset, dep.end_offset, dep.accept_tainted, dep.ignore_dq) == (0, 23, True, True)
    write(
        tmp_path,
        "dwd/day.sql",
        f"/* ---\ntable: dwd.day\n{header.replace('accept_tainted: true', 'accept_tainted: 1')}--- */\n"
        "SELECT id FROM ods.src\n",
    )
    with pytest.raises(CatalogError, match="accept_tainted must be true or false"):
        load_catalog(tmp_path)


def test_a_window_before_the_start_or_in_the_future_does_not_exist(catalog: Catalog) -> None:
    everything = FakeStates({"dwd.day": {f"2026-03-{d:02d}" for d in range(1, 11)}})
    early = decide(catalog, catalog["ads.t7"], "2026-01-03", everything, current_time=NOW)
    assert early.edges[0].nonexistent == ["2025-12-27"] and early.edges[0].state("2025-12-27") == NONEXISTENT
    assert early.reasons == [
        "ads.t7 2026-01-03 needs 1 partition(s) of dwd.day that do not exist (in the future or before its first "
        "partition): 2025-12-27"
    ]
    assert nonexistent_upstream(catalog, catalog["ads.t7"], "2026-01-03", NOW) == ["dwd.day"]
    assert nonexistent_upstream(catalog, catalog["ads.t7"], "2026-03-09", NOW) == []
    # today's day has not ended at NOW: a partition reading it cannot run yet
    assert nonexistent_upstream(catalog, catalog["dws.cum"], "2026-03-10", NOW) == ["dwd.day"]


def test_a_self_dependency_starts_at_the_first_partition_and_then_needs_t_minus_1(catalog: Catalog) -> None:
    first = decide(catalog, catalog["dws.cum"], "2026-01-01", FakeStates({"dwd.day": {"2026-01-01"}}), NOW)
    assert first.may_run
    later = decide(catalog, catalog["dws.cum"], "2026-01-02", FakeStates({"dwd.day": {"2026-01-02"}}), NOW)
    assert [e.state("2026-01-01") for e in later.edges if e.dep.table == "dws.cum"] == [MISSING]
    assert later.reasons == [
        "dws.cum 2026-01-02 waits for 1 partition(s) of dws.cum that are not materialized: 2026-01-01"
    ]


def test_the_backfill_plan_keeps_the_partitions_whose_every_upstream_can_exist(catalog: Catalog) -> None:
    plan = backfill_partitions(catalog, datetime(2026, 1, 1, tzinfo=TZ), datetime(2026, 1, 10, tzinfo=TZ))
    assert plan["ads.t7"] == [f"2026-01-{d:02d}" for d in range(8, 10)]  # T-7 exists from the 8th
    assert plan["ads.wk"][0] == "2026-01-03"  # a 3-day window from the 3rd
    assert plan["dws.cum"][0] == "2026-01-01"  # the self-dependent chain starts at the first partition
    # a range reaching past now: only what can exist by now (today's day has not ended)
    plan = backfill_partitions(catalog, datetime(2026, 3, 8, tzinfo=TZ), datetime(2026, 3, 12, tzinfo=TZ), NOW)
    assert plan["dwd.day"] == ["2026-03-08", "2026-03-09"]


def test_the_first_buildable_partition_is_where_every_window_lies_after_the_start(catalog: Catalog) -> None:
    # the warehouse starts on 2026-01-01: a T-7 needs 2025-12-25 for its first day, so its first week never builds
    t7 = first_buildable(catalog, catalog["ads.t7"])
    assert t7.partition == "2026-01-08"
    assert t7.reason == "its window needs dwd.day back to 2025-12-25, before the warehouse start 2026-01-01"
    wk = first_buildable(catalog, catalog["ads.wk"])
    assert (wk.partition, wk.reason) == (
        "2026-01-03",
        "its window needs dwd.raw back to 2025-12-30, before the warehouse start 2026-01-01",
    )
    # a table reading those days of a table that never builds them never builds them either, and says through which
    on_t7 = first_buildable(catalog, catalog["ads.on_t7"])
    assert on_t7.partition == "2026-01-08"
    assert on_t7.reason == f"it needs ads.t7 2026-01-01, which can never be built ({t7.reason})"
    # from the start on: a plain day, and a self-dependent chain (its first T-1 is not needed)
    assert first_buildable(catalog, catalog["dwd.day"]) == FirstBuildable("2026-01-01", "")
    assert first_buildable(catalog, catalog["dws.cum"]) == FirstBuildable("2026-01-01", "")


def test_one_search_shared_by_every_table_finds_what_each_finds_alone(tmp_path: Path) -> None:
    # the compile shares one search across the catalog: what it keeps of one table (windows by shape, calendar steps)
    # must never answer for another. Here the same offsets on days and on weeks, looked at on the same key (a Monday
    # is a day and a week), and a chain that moves the days' first buildable partition past it
    catalog = sql_catalog(
        tmp_path,
        {
            "dwd/day.sql": ("period: daily\n", "SELECT id FROM ods.src"),
            "dws/wk.sql": ("period: weekly\n", "SELECT id FROM dwd.day"),
            "dws/t7.sql": ("period: daily\ndepends_on:\n  dwd.day: {set: [-7]}\n", "SELECT id FROM dwd.day"),
            "ads/d1.sql": ("period: daily\ndepends_on:\n  dws.t7: {set: [-1]}\n", "SELECT id FROM dws.t7"),
            "ads/w1.sql": ("period: weekly\ndepends_on:\n  dws.wk: {set: [-1]}\n", "SELECT id FROM dws.wk"),
        },
    )
    shared = BuildableSearch()
    for table in catalog.derived():
        assert first_buildable(catalog, table, shared) == first_buildable(catalog, table), table.fqn
    assert first_buildable(catalog, catalog["ads.d1"], shared).partition == "2026-01-09"
    assert first_buildable(catalog, catalog["ads.w1"], shared).partition == "2026-01-12"


def test_a_partition_that_can_never_be_built_is_explained_at_its_own_window_all_the_way_up(tmp_path: Path) -> None:
    """A 7-day window on a daily table, and a table on that window: a partition's reason names the dates its own
    window needs, and an upstream partition that can never be built is explained at that partition, not by the first
    partition of its table (whose window reaches back furthest)."""
    from warehouse_assets.materialize.buildable import never_buildable

    root = tmp_path / "tables"
    write(root, "ods/src.yaml", ODS)
    write(root, "dwd/day.sql", "/* ---\ntable: dwd.day\nperiod: daily\n--- */\nSELECT id FROM ods.src\n")
    week = "depends_on:\n  dwd.day: {range: [-6, 0]}\n"
    write(root, "dws/week.sql", f"/* ---\ntable: dws.week\nperiod: daily\n{week}--- */\nSELECT id FROM dwd.day\n")
    write(root, "ads/on_week.sql", "/* ---\ntable: ads.on_week\nperiod: daily\n--- */\nSELECT id FROM dws.week\n")
    catalog = load_catalog(root)
    known = BuildableSearch()
    assert never_buildable(catalog, catalog["dws.week"], "2026-01-03", known) == (
        "can never be built: its window needs dwd.day back to 2025-12-28, before the warehouse start 2026-01-01; "
        "the first one that can be is 2026-01-07"
    )
    assert never_buildable(catalog, catalog["ads.on_week"], "2026-01-05", known) == (
        "can never be built: it needs dws.week 2026-01-05, which can never be built (its window needs dwd.day back "
        "to 2025-12-30, before the warehouse start 2026-01-01); the first one that can be is 2026-01-07"
    )
    assert never_buildable(catalog, catalog["ads.on_week"], "2026-01-07", known) == ""
