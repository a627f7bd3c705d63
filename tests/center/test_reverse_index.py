"""The reverse index is exactly the inverse of the exact upstream partitions.

Brute force: invert ``upstream_partitions`` over every downstream partition that exists at a pinned time and
compare with ``ReverseIndex.downstream_of`` for every upstream partition, on the example catalog from the
warehouse start over a month end and week boundaries, and on a small catalog of every pattern the catalog
supports, also in a zone with daylight saving time. Pure: no Spark, no Dagster instance.
"""

from __future__ import annotations

from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from dagster import TimeWindowPartitionMapping

from resources.settings import Settings, using
from tests.support.small_catalog import ODS
from warehouse_assets.catalog import BY_PERIOD, WHOLE, Catalog, DerivedTable, Table, load_catalog, upstream_partitions
from warehouse_assets.center.reverse_index import Calendar, EdgeMapping, ReverseIndex, calendar_of
from warehouse_assets.materialize.gate import table_partitions_in_range

LOS_ANGELES = Settings.from_env({"WAREHOUSE_TIMEZONE": "America/Los_Angeles"})


def partitions_at(table: Table, now: datetime) -> list[str]:
    """Every partition of ``table`` that exists at ``now``, in time order: its period's, or each region's days that
    ended (date by date)."""
    if table.is_static:
        return [WHOLE]
    if isinstance(table, DerivedTable) and table.is_regional:
        return table_partitions_in_range(table, datetime(2000, 1, 1, tzinfo=UTC), now)
    return list(BY_PERIOD[table.period].get_partition_keys(current_time=now))


def inverted(catalog: Catalog, now: datetime) -> dict[tuple[str, str], dict[str, list[str]]]:
    """(upstream table, partition) → downstream table → the partitions that need it, by brute force."""
    needed_by: dict[tuple[str, str], dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for table in catalog.derived():
        for key in partitions_at(table, now):  # in time order
            for dep in table.deps:
                upstream = upstream_partitions(catalog, table, dep, key, current_time=now)
                for needed in [*upstream.keys, *upstream.nonexistent]:
                    needed_by[(dep.table, needed)][table.fqn].append(key)
            for ref in table.references:  # a static table: its one partition, by every partition
                needed_by[(ref.table, WHOLE)][table.fqn].append(key)
    return needed_by


def assert_inverse(catalog: Catalog, now: datetime) -> int:
    """``downstream_of`` == the brute-force inversion for every partition of every table; the number compared."""
    index = ReverseIndex.build(catalog)
    expected = inverted(catalog, now)
    compared = 0
    for table in catalog:
        for key in partitions_at(table, now):
            want = {down: keys for down, keys in expected.get((table.fqn, key), {}).items()}
            got = index.downstream_of(table.fqn, key, current_time=now)
            # a table with regions: its days in the index's order, region by region (they overlap in time)
            assert _regions_sorted(catalog, got) == _regions_sorted(catalog, want), (table.fqn, key)
            compared += 1
    return compared


def _regions_sorted(catalog: Catalog, found: dict[str, list[str]]) -> dict[str, list[str]]:
    return {down: sorted(keys) if catalog[down].is_regional else keys for down, keys in found.items()}


def assert_forward(catalog: Catalog, now: datetime) -> tuple[int, int]:
    """``upstream_of`` == ``upstream_partitions``' keys wherever every upstream partition exists, None where some do
    not; (windows it answered, windows compared)."""
    index = ReverseIndex.build(catalog)
    answered = compared = 0
    for table in catalog.derived():
        for key in partitions_at(table, now):
            for dep in table.deps:
                want = upstream_partitions(catalog, table, dep, key, current_time=now)
                got = index.upstream_of(table.fqn, dep.table, key, current_time=now)
                assert got in (None, want.keys), (table.fqn, dep.table, key, got, want)
                assert got is None or not want.nonexistent, (table.fqn, dep.table, key, got, want)
                answered += got is not None
                compared += 1
    return answered, compared


def local(text: str, zone: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(zone))


# --- the example catalog --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "now",
    [
        "2026-02-03T00:00",  # from the start (a Thursday) over the month end and 4 week boundaries; 30-day windows
        "2026-02-02T13:30",  # mid-day: the hour and the day not yet ended are not partitions
    ],
)
def test_the_example_catalog_inverts_its_exact_upstream_partitions(now: str) -> None:
    catalog = load_catalog()
    assert assert_inverse(catalog, local(now, BY_PERIOD["daily"].timezone)) > 5 * 24 * 30


def test_an_event_finds_its_downstream_partitions_across_periods_offsets_and_windows() -> None:
    catalog = load_catalog()
    index = ReverseIndex.build(catalog)
    now = local("2026-03-01T00:00", "Asia/Shanghai")
    assert index.downstream_of("ods.order", "2026-01-31-23:00", current_time=now) == {
        "dwd.order_detail": ["2026-01-31"],
        "dws.order_hourly": ["2026-01-31-23:00"],
    }
    self_dependent = index.downstream_of("dws.user_learning_cumulative", "2026-01-01", current_time=now)
    assert self_dependent["dws.user_learning_cumulative"] == ["2026-01-02"]  # T needs T-1 of itself
    # a downstream partition in the future is not one yet
    assert index.downstream_of("dwd.order_detail", "2026-02-28", current_time=now)
    assert index.downstream_of("ods.order", "2026-02-28-23:00", current_time=now)["dws.order_hourly"]
    early = local("2026-02-28T23:30", "Asia/Shanghai")
    assert "dws.order_hourly" not in index.downstream_of("ods.order", "2026-02-28-23:00", current_time=early)
    assert index.downstream_of("ods.order", "2026-02-28-22:00", current_time=early)["dws.order_hourly"]
    # a day reads the latest month ended by its own end: January from its last day on, while it is one of the three
    # months that end a day may look back over
    january_on = ["2026-01-31", *(f"2026-02-{d:02d}" for d in range(1, 29))]
    assert index.downstream_of("ads.monthly_report", "2026-01-01", current_time=now) == {"ads.gmv_vs_month": january_on}
    assert index.downstream_of("ads.gmv_vs_month", "2026-01-31", current_time=now) == {}  # a sink
    assert index.downstream_of("ods.order", "2025-12-31-23:00", current_time=now) == {}  # before the start
    assert index.downstream_of("ods.order", "not a key", current_time=now) == {}


def test_the_calendars_extend_as_time_passes() -> None:
    catalog = load_catalog()
    index = ReverseIndex.build(catalog, current_time=local("2026-01-03T00:00", "Asia/Shanghai"))
    later = local("2026-09-01T00:00", "Asia/Shanghai")
    assert index.downstream_of("dwd.order_detail", "2026-08-30", current_time=later)["dws.user_order_daily"] == [
        "2026-08-30"
    ]


def test_every_index_of_the_process_shares_one_calendar_per_partitions_definition() -> None:
    # the calendar (Dagster's keys listed from the first partition) is what a `warehouse why` paid for per question
    catalog = load_catalog()
    now = local("2026-03-01T00:00", "Asia/Shanghai")
    first, second = ReverseIndex.build(catalog, current_time=now), ReverseIndex.build(catalog, current_time=now)
    hourly = BY_PERIOD["hourly"]
    assert first._calendar(hourly, now.timestamp()) is second._calendar(hourly, now.timestamp())
    assert calendar_of(hourly) is first._calendar(hourly, now.timestamp())


def test_a_calendar_extended_by_many_threads_at_once_lists_each_key_once_at_its_position() -> None:
    calendar = Calendar(BY_PERIOD["hourly"])
    horizons = [local(f"2026-{month:02d}-01T00:00", "UTC").timestamp() for month in range(1, 13)] * 4
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(calendar.cover, horizons))
    assert len(set(calendar.keys)) == len(calendar.keys) == len(calendar.starts) == len(calendar.ends)
    assert all(calendar.position[key] == i for i, key in enumerate(calendar.keys))
    assert calendar.starts == sorted(calendar.starts) and calendar.ends[-1] >= horizons[-1]


def test_the_example_catalogs_windows_by_arithmetic_are_its_exact_upstream_partitions() -> None:
    answered, compared = assert_forward(load_catalog(), local("2026-02-03T00:00", BY_PERIOD["daily"].timezone))
    assert answered > 0.9 * compared  # the rest reach before the start: the gate's mapping says what is missing


# --- every pattern the catalog supports ------------------------------------------------------------------------


EXTERNAL = """table: ext.feed
period: daily
external: {format: csv_files, location: feed}
columns: {id: bigint}
"""

# table → (period, {upstream: offsets or None for the default mapping})
PATTERNS: dict[str, tuple[str, dict[str, str | None]]] = {
    "dwd.day": ("daily", {"ods.src": "{range: [0, 23]}"}),  # hourly → daily
    "dwd.day_default": ("daily", {"ods.src": None}),  # the default roll-up
    "dwd.ext_day": ("daily", {"ext.feed": "{set: [0]}", "dwd.day": "{set: [0]}"}),  # an external upstream
    "dwd.t1": ("daily", {"dwd.day": "{set: [-1]}"}),
    "dwd.t7": ("daily", {"dwd.day": "{set: [-7]}"}),
    "dwd.last7": ("daily", {"dwd.day": "{range: [-6, 0]}"}),
    "dwd.last30": ("daily", {"dwd.day": "{range: [-29, 0]}"}),
    "dwd.acc": ("daily", {"dwd.acc": "{set: [-1]}", "dwd.day": "{set: [0]}"}),  # self-dependent
    "dws.hour": ("hourly", {"ods.src": None}),  # hourly → hourly
    "dws.hour_t1": ("hourly", {"ods.src": "{set: [-1]}"}),
    "dws.last24h": ("hourly", {"ods.src": "{range: [-23, 0]}"}),
    "dws.week": ("weekly", {"dwd.day": "{range: [0, 6]}"}),  # daily → weekly
    "dws.week_default": ("weekly", {"dwd.day": None}),
    "dws.week_hours": ("weekly", {"ods.src": None}),  # hourly → weekly
    "dws.week_t1": ("weekly", {"dws.week": "{set: [-1]}"}),
    "ads.month": ("monthly", {"dwd.day": None}),  # daily → monthly
    "ads.month_hours": ("monthly", {"ods.src": None}),  # hourly → monthly
    "ads.month_t1": ("monthly", {"ads.month": "{set: [-1]}"}),
    # a finer table on a coarser one: the month holding the day, the day's previous month, the latest month ended
    "dwd.on_month": ("daily", {"ads.month": None}),
    "dwd.prev_month": ("daily", {"ads.month": "{set: [-1]}"}),
    "dwd.latest_month": ("daily", {"ads.month": "{latest: true}"}),
    "dws.week_prev_month": ("weekly", {"ads.month": "{range: [-2, -1]}"}),
    "dws.week_latest_month": ("weekly", {"ads.month": "{range: [-1, 0], latest: true}"}),
    "dws.hour_yesterday": ("hourly", {"dwd.day": "{set: [-1]}"}),
    "dwd.latest7": ("daily", {"dwd.day": "{range: [-6, 0], latest: true}"}),
    # windows kept inside a coarser period: the week and the month to date, cumulative tables that start afresh
    "dwd.wtd": ("daily", {"dwd.day": "{range: [-6, 0], within: weekly}"}),
    "dwd.mtd": ("daily", {"dwd.day": "{range: [-30, 0], within: monthly}"}),
    "dwd.cum_week": ("daily", {"dwd.cum_week": "{set: [-1]}", "dwd.day": "{set: [0]}"}),
    "dws.cum_day": ("hourly", {"dws.cum_day": "{set: [-1]}", "ods.src": None}),
}
KINDS = {"dwd.cum_week": "kind: cumulative\nresets: weekly\n", "dws.cum_day": "kind: cumulative\nresets: daily\n"}


def write_patterns(root: Path) -> Catalog:
    for rel, text in {"ods/src.yaml": ODS, "ext/feed.yaml": EXTERNAL}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    for fqn, (period, deps) in PATTERNS.items():
        layer, name = fqn.split(".")
        declared = "".join(f"  {up}: {offsets}\n" for up, offsets in deps.items() if offsets)
        header = f"table: {fqn}\nperiod: {period}\n" + ("columns: {id: bigint}\n" if fqn in deps else "")
        header += KINDS.get(fqn, "")
        header += f"depends_on:\n{declared}" if declared else ""
        first, *others = deps
        body = f"SELECT id FROM {first} AS t0" + "".join(
            f" JOIN {up} AS t{i} USING (id)" for i, up in enumerate(others, 1)
        )
        (root / layer).mkdir(parents=True, exist_ok=True)
        (root / layer / f"{name}.sql").write_text(f"/* ---\n{header}--- */\n{body}\n")
    catalog = load_catalog(root)
    assert {t.fqn for t in catalog.derived()} == set(PATTERNS)
    return catalog


@pytest.mark.parametrize(
    ("env", "now"),
    [
        # starts on a Wednesday after a month's first day: the first week and month are rounded up
        ({"WAREHOUSE_START": "2026-02-25"}, "2026-04-02T00:00"),
        # the autumn change (2026-11-01, 25 hours) and a week boundary in a zone with daylight saving time
        ({"WAREHOUSE_TIMEZONE": "America/Los_Angeles", "WAREHOUSE_START": "2026-10-22"}, "2026-11-10T05:30"),
        # the spring change (2026-03-08, 23 hours) and the end of February
        ({"WAREHOUSE_TIMEZONE": "America/Los_Angeles", "WAREHOUSE_START": "2026-02-20"}, "2026-03-11T00:00"),
        # months that end under the finer tables reading them: February, a 23-hour day in March, a week across two
        ({"WAREHOUSE_TIMEZONE": "America/Los_Angeles", "WAREHOUSE_START": "2026-01-14"}, "2026-04-03T07:00"),
    ],
)
def test_every_pattern_inverts_its_exact_upstream_partitions(tmp_path: Path, env: dict[str, str], now: str) -> None:
    settings = Settings.from_env(env)
    with using(settings):
        catalog = write_patterns(tmp_path)
        assert assert_inverse(catalog, local(now, settings.timezone)) > 0


@pytest.mark.parametrize(
    ("env", "now"),
    [
        ({"WAREHOUSE_START": "2026-02-25"}, "2026-04-02T00:00"),
        ({"WAREHOUSE_TIMEZONE": "America/Los_Angeles", "WAREHOUSE_START": "2026-10-22"}, "2026-11-10T05:30"),
        ({"WAREHOUSE_TIMEZONE": "America/Los_Angeles", "WAREHOUSE_START": "2026-02-20"}, "2026-03-11T00:00"),
        ({"WAREHOUSE_TIMEZONE": "America/Los_Angeles", "WAREHOUSE_START": "2026-01-14"}, "2026-04-03T07:00"),
    ],
)
def test_every_patterns_windows_by_arithmetic_are_its_exact_upstream_partitions(
    tmp_path: Path, env: dict[str, str], now: str
) -> None:
    settings = Settings.from_env(env)
    with using(settings):
        answered, compared = assert_forward(write_patterns(tmp_path), local(now, settings.timezone))
    assert answered > 0.5 * compared


def test_the_autumn_days_25_hours_all_map_to_that_day() -> None:
    catalog = load_catalog()
    with using(LOS_ANGELES):
        index = ReverseIndex.build(catalog)
        hours = BY_PERIOD["hourly"].get_partition_keys_in_time_window(
            BY_PERIOD["daily"].time_window_for_partition_key("2026-11-01")
        )
    assert len(hours) == 25 and "2026-11-01-01:00-0800" in hours
    later = local("2026-12-01T00:00", "America/Los_Angeles")
    for hour in hours:
        assert index.downstream_of("ods.order", hour, current_time=later)["dwd.order_detail"] == ["2026-11-01"]


def test_offsets_across_periods_have_no_reverse_mapping() -> None:
    """The catalog refuses them (only the roll-up crosses periods); the index says so rather than guess."""
    with pytest.raises(ValueError, match="offsets across periods"):
        EdgeMapping(TimeWindowPartitionMapping(start_offset=-1, end_offset=-1), BY_PERIOD["hourly"], BY_PERIOD["daily"])
    EdgeMapping(TimeWindowPartitionMapping(), BY_PERIOD["hourly"], BY_PERIOD["daily"])  # the roll-up
