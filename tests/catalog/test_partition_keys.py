"""A partition key as a user types it (``warehouse why``, the ``why_waiting`` job): each way it can be wrong has a
message saying exactly that, and a table named without its layer gets the closest names suggested."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, date, datetime

import pytest

from resources.settings import Settings, using
from warehouse_assets.catalog import Catalog, PartitionKeyError, UnknownTable, check_partition_key, load_catalog

# the warehouse starts on Sunday 2026-11-22; it is now Wednesday 2026-11-25 10:00 in Shanghai
START = date(2026, 11, 22)
NOW = datetime(2026, 11, 25, 2, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def catalog() -> Iterator[Catalog]:
    with using(Settings(start=START)):
        yield load_catalog()


def _problem(catalog: Catalog, fqn: str, key: str) -> PartitionKeyError:
    with using(Settings(start=START)), pytest.raises(PartitionKeyError) as raised:
        check_partition_key(catalog[fqn], key, NOW)
    return raised.value


def test_a_malformed_key_says_what_a_partition_of_the_table_looks_like(catalog: Catalog) -> None:
    problem = _problem(catalog, "ads.daily_gmv", "2026-13-45")
    assert problem.kind == "malformed"
    assert str(problem) == (
        "'2026-13-45' is not a partition key: ads.daily_gmv is daily: its partitions are days written YYYY-MM-DD, "
        "e.g. 2026-11-24"
    )


def test_an_hour_for_a_daily_table_is_the_wrong_period(catalog: Catalog) -> None:
    problem = _problem(catalog, "ads.daily_gmv", "2026-11-24-13:00")
    assert problem.kind == "wrong_period"
    assert str(problem).startswith("'2026-11-24-13:00' is an hour, but ads.daily_gmv is daily")


def test_a_day_for_an_hourly_table_is_the_wrong_period(catalog: Catalog) -> None:
    problem = _problem(catalog, "ods.order", "2026-11-24")
    assert problem.kind == "wrong_period"
    assert "'2026-11-24' is a day, but ods.order is hourly: its partitions are hours written YYYY-MM-DD-HH:00" in str(
        problem
    )


def test_a_weekday_for_a_weekly_table_names_its_monday(catalog: Catalog) -> None:
    problem = _problem(catalog, "dws.course_attendance_weekly", "2026-11-25")
    assert problem.kind == "wrong_period"
    assert "'2026-11-25' is a Wednesday" in str(problem) and "(its week is 2026-11-23)" in str(problem)


def test_a_day_in_the_future_is_in_the_future(catalog: Catalog) -> None:
    problem = _problem(catalog, "ads.daily_gmv", "2026-11-30")
    assert problem.kind == "future" and problem.exists_later
    assert str(problem) == (
        "ads.daily_gmv 2026-11-30 is in the future: the day begins at 2026-11-30 00:00 Asia/Shanghai and its "
        "partition exists once it ends, at 2026-12-01 00:00 Asia/Shanghai"
    )


def test_today_has_not_finished_yet(catalog: Catalog) -> None:
    problem = _problem(catalog, "ads.daily_gmv", "2026-11-25")
    assert problem.kind == "unfinished" and problem.exists_later
    assert str(problem) == (
        "ads.daily_gmv 2026-11-25 has not finished yet: the day ends at 2026-11-26 00:00 Asia/Shanghai (in 14 h); "
        "its partition exists from then. The latest finished one is 2026-11-24"
    )


def test_a_day_before_the_start_can_never_exist(catalog: Catalog) -> None:
    problem = _problem(catalog, "ads.daily_gmv", "2026-11-21")
    assert problem.kind == "before_start" and not problem.exists_later
    assert str(problem).startswith(
        "ads.daily_gmv 2026-11-21 can never exist: it is before the table's first partition 2026-11-22 (the "
        "warehouse starts 2026-11-22, WAREHOUSE_START)"
    )


def test_a_partition_that_exists_passes(catalog: Catalog) -> None:
    with using(Settings(start=START)):
        check_partition_key(catalog["ads.daily_gmv"], "2026-11-24", NOW)
        check_partition_key(catalog["ods.order"], "2026-11-25-09:00", NOW)
        check_partition_key(catalog["ads.monthly_report"], "2026-12-01", datetime(2027, 1, 2, tzinfo=UTC))


def test_a_table_named_without_its_layer_gets_the_closest_names(catalog: Catalog) -> None:
    with pytest.raises(UnknownTable) as raised:
        catalog.lookup("daily_gmv")
    assert str(raised.value) == "unknown table 'daily_gmv' (tables are named layer.table): did you mean ads.daily_gmv?"
    with pytest.raises(UnknownTable, match=r"did you mean ads\.daily_gmv or ads\.dau_by_region\?$"):
        catalog.lookup("ads.dayly_gmv")
    assert catalog.lookup("ads.daily_gmv").fqn == "ads.daily_gmv"
