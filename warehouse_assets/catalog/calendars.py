"""The calendars: the partitions definitions of each period, defined once and imported everywhere (tests included).

One business timezone for all of them: Dagster maps time-window partitions only between definitions of the same
timezone.
It is the settings' ``WAREHOUSE_TIMEZONE`` (``resources.settings``); :func:`periods` builds the definitions
of a configuration, and the module-level names (``hourly``, ``daily``, ``BY_PERIOD``, ``START`` ...) are the
current process's. Roll-ups (hour → day → week → month) use Dagster's default time-window mapping between
these definitions.

The warehouse starts on ``WAREHOUSE_START`` (YYYY-MM-DD, business timezone; default 2026-01-01): the day the
earliest data exists. Hourly and daily partitions start that day. A week or a month is a partition only when
all of its days can exist, so weekly partitions start on the first Monday on or after the start and monthly
ones on the first first-of-month on or after it (Dagster itself rounds an unaligned start up the same way; a
week reaching back before the start could never be complete, and a self-dependent weekly table would wait
on it forever). The first partition of a self-dependent table is therefore its period's first partition: its
T-1 does not exist and is not required (the gate, :func:`warehouse_assets.materialize.gate.nonexistent_upstream`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from dagster import (
    DailyPartitionsDefinition,
    HourlyPartitionsDefinition,
    MonthlyPartitionsDefinition,
    MultiPartitionsDefinition,
    StaticPartitionsDefinition,
    TimeWindowPartitionsDefinition,
    WeeklyPartitionsDefinition,
)

if TYPE_CHECKING:
    from resources.settings import Settings


# The mini-batch periods a table may declare, in minutes: each divides the hour, so its windows roll up to hours, and is
# a multiple of the 5-minute windows the sources count by (a window of such a table is complete when its windows are).
MINUTE_PERIODS = {"5min": 5, "10min": 10, "15min": 15}
MINUTES_FORMAT = "%Y-%m-%d-%H:%M"
# the periods from the finest to the coarsest: a dependency on a coarser period reads whole windows of the finer one
PERIOD_ORDER = {"5min": -3, "10min": -2, "15min": -1, "hourly": 0, "daily": 1, "weekly": 2, "monthly": 3}


def first_monday(start: date) -> date:
    """The Monday on or after ``start``: the first ISO week all of whose days exist."""
    return start + timedelta(days=-start.weekday() % 7)


def first_month(start: date) -> date:
    """The first day of the first month all of whose days exist."""
    if start.day == 1:
        return start
    return (start.replace(day=28) + timedelta(days=4)).replace(day=1)


@dataclass(frozen=True)
class Periods:
    """The partitions definitions of one configuration: business timezone and warehouse start."""

    start: date
    hourly: HourlyPartitionsDefinition
    daily: DailyPartitionsDefinition
    weekly: WeeklyPartitionsDefinition
    monthly: MonthlyPartitionsDefinition
    minutes: dict[str, TimeWindowPartitionsDefinition] = field(hash=False)  # mini-batch periods: "5min", "10min" …

    @property
    def timezone(self) -> str:
        return self.daily.timezone

    def region_days(self, zone: str) -> DailyPartitionsDefinition:
        """The days of a region whose midnight is that of ``zone``: [local midnight, next local midnight), 23 or 25
        hours on a daylight-saving day, from the warehouse's start date."""
        return _region_days(zone, self.start)

    def regional(self, regions: tuple[tuple[str, str], ...]) -> MultiPartitionsDefinition:
        """The partitions of a table with ``regions`` ((name, IANA zone) pairs): Dagster's partitions by business date
        and region, whose keys are the dependency center's own (``2026-03-08|los_angeles``, :func:`regional_key`)."""
        return _regional(self.timezone, self.start, regions)

    @property
    def by_period(self) -> dict[str, TimeWindowPartitionsDefinition]:
        coarse = {"hourly": self.hourly, "daily": self.daily, "weekly": self.weekly, "monthly": self.monthly}
        return {**self.minutes, **coarse}


def periods(settings: Settings | None = None) -> Periods:
    """The partitions definitions of ``settings`` (default: the current process's)."""
    # imported here: `resources` imports the catalog (resources/external.py), which imports this module
    from resources.settings import current

    settings = settings or current()
    return _periods(settings.timezone, settings.start)


@functools.cache  # one object per configuration: Dagster compares mapped definitions, and sensors look them up
def _periods(timezone: str, start: date) -> Periods:
    first = start.isoformat()
    return Periods(
        start=start,
        hourly=HourlyPartitionsDefinition(start_date=f"{first}-00:00", timezone=timezone),
        daily=DailyPartitionsDefinition(start_date=first, timezone=timezone),
        # ISO weeks: Monday 00:00 to Monday 00:00
        weekly=WeeklyPartitionsDefinition(start_date=first_monday(start).isoformat(), day_offset=1, timezone=timezone),
        monthly=MonthlyPartitionsDefinition(start_date=first_month(start).isoformat(), timezone=timezone),
        minutes={
            period: TimeWindowPartitionsDefinition(
                start=f"{first}-00:00",
                fmt=MINUTES_FORMAT,
                cron_schedule=f"*/{length} * * * *",
                timezone=timezone,
            )
            for period, length in MINUTE_PERIODS.items()
        },
    )


@functools.cache
def _region_days(zone: str, start: date) -> DailyPartitionsDefinition:
    return DailyPartitionsDefinition(start_date=start.isoformat(), timezone=zone)


# A regional table's partition key is Dagster's multi-partition key of its two dimensions, named so that the date comes
# first (Dagster orders dimensions by name): ``2026-03-08|los_angeles``.
DATE_DIMENSION, REGION_DIMENSION = "date", "region"
REGION_DELIMITER = "|"


@functools.cache  # one object per table's regions: Dagster compares the definitions of mapped assets
def _regional(timezone: str, start: date, regions: tuple[tuple[str, str], ...]) -> MultiPartitionsDefinition:
    # Dagster's own two-dimensional partitions rather than dynamic partitions keyed ``date|region``: the same keys with
    # no code to add each day's keys to the instance, and the UI shows a date × region grid. The date dimension is the
    # business day's (that of the tables reading every region's day, so Dagster maps them by date exactly); a region's
    # own window is the catalog's (:func:`warehouse_assets.catalog.partition_window`), and the dependency center, not
    # Dagster's mapping, decides when it may run: Dagster maps an hour to a region's day by business date only.
    dates: DailyPartitionsDefinition = _periods(timezone, start).daily
    if any(_ahead(zone, timezone, start.year) for _, zone in regions):
        # a region ahead of the business time zone (Asia/Tokyo beside Asia/Shanghai) ends its day before the business
        # day ends, when Dagster does not list that date yet and refuses a run of it: list each date from its start
        dates = DailyPartitionsDefinition(start_date=start.isoformat(), timezone=timezone, end_offset=1)
    return MultiPartitionsDefinition(
        {DATE_DIMENSION: dates, REGION_DIMENSION: StaticPartitionsDefinition([name for name, _ in regions])}
    )


def _ahead(zone: str, business: str, year: int) -> bool:
    """Whether ``zone``'s clocks are ahead of the business time zone's in winter or in summer."""
    return any(
        datetime(year, month, 15, tzinfo=ZoneInfo(zone)).utcoffset()  # type: ignore[operator]
        > datetime(year, month, 15, tzinfo=ZoneInfo(business)).utcoffset()
        for month in (1, 7)
    )


def regional_key(day: str, region: str) -> str:
    """The partition key of ``region``'s day ``day`` (YYYY-MM-DD)."""
    return f"{day}{REGION_DELIMITER}{region}"


def split_regional_key(key: str) -> tuple[str, str]:
    """(day, region) of a regional partition key; ValueError naming the key when it is not one."""
    day, delimiter, region = key.partition(REGION_DELIMITER)
    if not delimiter or not day or not region:
        raise ValueError(f"{key!r} is not a regional partition key (day{REGION_DELIMITER}region, e.g. 2026-03-08|utc)")
    return day, region


def business_zone() -> ZoneInfo:
    """The current process's business timezone."""
    return ZoneInfo(periods().timezone)


def business_time(at: float | datetime, timespec: str = "minutes") -> str:
    """An instant in the business timezone, the partition keys' own, with its offset named (``2026-03-06 01:05+08:00``),
    as ``warehouse sql`` and the dev stack's logs print them: the UI shows Dagster's own times in the zone of its user
    settings, so a time printed without its zone could be read as that one."""
    moment = datetime.fromtimestamp(at, UTC) if isinstance(at, int | float) else at
    return moment.astimezone(business_zone()).isoformat(sep=" ", timespec=timespec)


class _CurrentPeriods(dict[str, TimeWindowPartitionsDefinition]):
    """``BY_PERIOD``: period name → the current process's definition, looked up at each use (read-only)."""

    def _now(self) -> dict[str, TimeWindowPartitionsDefinition]:
        return periods().by_period

    def __getitem__(self, period: str) -> TimeWindowPartitionsDefinition:
        return self._now()[period]

    def __contains__(self, period: object) -> bool:
        return period in self._now()

    def __iter__(self) -> Iterator[str]:
        return iter(self._now())

    def __len__(self) -> int:
        return len(self._now())

    def __repr__(self) -> str:
        return repr(self._now())

    def get(self, period: str, default: Any = None) -> Any:
        return self._now().get(period, default)

    def keys(self) -> Any:
        return self._now().keys()

    def values(self) -> Any:
        return self._now().values()

    def items(self) -> Any:
        return self._now().items()

    def __setitem__(self, period: str, value: TimeWindowPartitionsDefinition) -> None:
        raise TypeError("BY_PERIOD follows the settings: build other periods with periods(settings)")


BY_PERIOD: dict[str, TimeWindowPartitionsDefinition] = _CurrentPeriods()

if TYPE_CHECKING:  # resolved by __getattr__ from the current settings when used, never at import
    hourly: HourlyPartitionsDefinition
    daily: DailyPartitionsDefinition
    weekly: WeeklyPartitionsDefinition
    monthly: MonthlyPartitionsDefinition
    START_DATE: date
    START: str


def __getattr__(name: str) -> Any:
    if name in ("hourly", "daily", "weekly", "monthly"):
        return getattr(periods(), name)
    if name == "START_DATE":
        return periods().start
    if name == "START":
        return periods().start.isoformat()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Delta partition columns of each period: string values derived from the partition's start, local time.
PARTITION_COLUMNS: dict[str, list[str]] = {
    **{period: ["dt", "hh", "mi"] for period in MINUTE_PERIODS},
    "hourly": ["dt", "hh"],
    "daily": ["dt"],
    "weekly": ["dt"],
    "monthly": ["dt"],
}


def partition_values(period: str, partition_key: str) -> dict[str, str]:
    """The Delta partition values of a Dagster partition key (local time of the window start)."""
    start = BY_PERIOD[period].time_window_for_partition_key(partition_key).start
    if period in MINUTE_PERIODS:
        return {"dt": start.strftime("%Y-%m-%d"), "hh": start.strftime("%H"), "mi": start.strftime("%M")}
    if period == "hourly":
        return {"dt": start.strftime("%Y-%m-%d"), "hh": start.strftime("%H")}
    return {"dt": start.strftime("%Y-%m-%d")}


def spelled_partition_key(period: str, values: dict[str, str]) -> str | None:
    """The partition key Delta partition values spell for ``period``, whether or not Dagster lists that partition yet
    (it lists one from the warehouse start on, once its window has ended); None when they spell none."""
    dt, hh, mi = values.get("dt"), values.get("hh"), values.get("mi")
    sub_daily = period == "hourly" or period in MINUTE_PERIODS
    if dt is None or (sub_daily and hh is None) or (period in MINUTE_PERIODS and mi is None):
        return None
    key = f"{dt}-{hh}:{mi}" if period in MINUTE_PERIODS else f"{dt}-{hh}:00" if period == "hourly" else dt
    try:
        return key if partition_values(period, key) == values else None
    except ValueError:  # Dagster parses the key: a malformed value raises
        return None


def partition_key_of(period: str, values: dict[str, str]) -> str | None:
    """The Dagster partition key of Delta partition values, None when they name no partition of the period."""
    key = spelled_partition_key(period, values)
    return key if key is not None and BY_PERIOD[period].has_partition_key(key) else None
