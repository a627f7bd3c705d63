"""The partitions definitions, defined once and imported everywhere (tests included).

One business timezone for all of them (design AD-5): mapped time-window partitions must share it exactly.
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
T-1 does not exist and is not required (the gate, :func:`warehouse_assets.gate.nonexistent_upstream`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from dagster import (
    DailyPartitionsDefinition,
    HourlyPartitionsDefinition,
    MonthlyPartitionsDefinition,
    PartitionMapping,
    TimeWindowPartitionMapping,
    TimeWindowPartitionsDefinition,
    WeeklyPartitionsDefinition,
)

if TYPE_CHECKING:  # the catalog imports this module
    from resources.settings import Settings
    from warehouse_assets.catalog import Catalog, Dependency, Table


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

    @property
    def timezone(self) -> str:
        return self.daily.timezone

    @property
    def by_period(self) -> dict[str, TimeWindowPartitionsDefinition]:
        return {"hourly": self.hourly, "daily": self.daily, "weekly": self.weekly, "monthly": self.monthly}


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
    )


def business_zone() -> ZoneInfo:
    """The current process's business timezone."""
    return ZoneInfo(periods().timezone)


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
    "hourly": ["dt", "hh"],
    "daily": ["dt"],
    "weekly": ["dt"],
    "monthly": ["dt"],
}


# --- exact upstream partitions ------------------------------------------------------------------------------
#
# Dagster's TimeWindowPartitionMapping clamps offsets to the upstream's existing partitions and leaves out
# what lies before its start or in the future (design §6.2): at the third day, a 30-day window maps to three
# days and T-7 maps to nothing, and ``required_but_nonexistent_subset`` stays empty. So the mapping is applied
# to copies of the two partitions definitions without bounds, which yields every partition the window needs;
# the ones outside the real upstream's range are reported as nonexistent.

_UNBOUNDED_FROM = "2000-01-01"
_FAR_FUTURE = datetime(2200, 1, 1, tzinfo=UTC)


@functools.cache
def _unbounded(pdef: TimeWindowPartitionsDefinition) -> TimeWindowPartitionsDefinition:
    return TimeWindowPartitionsDefinition(
        start=datetime.strptime(_UNBOUNDED_FROM, "%Y-%m-%d"),
        cron_schedule=pdef.cron_schedule,
        timezone=pdef.timezone,
        fmt=pdef.fmt,
    )


@dataclass(frozen=True)
class MappedPartitions:
    """The upstream partitions some downstream partitions need through one edge."""

    keys: list[str]  # every needed upstream partition that exists, in time order
    nonexistent: list[str]  # needed but not a partition (yet): before the upstream's start, or in the future


def mapped_upstream(
    mapping: PartitionMapping,
    own_def: TimeWindowPartitionsDefinition,
    up_def: TimeWindowPartitionsDefinition,
    partition_keys: Sequence[str],
    current_time: datetime | None = None,
    self_dependency: bool = False,
) -> MappedPartitions:
    """Every upstream partition ``partition_keys`` need through ``mapping``, split by existence at ``current_time``.

    A self-dependency never needs a partition before the table's own first one: the first partition of a
    self-dependent table starts the chain (its T-1 can never exist).
    """
    now = current_time or datetime.now(UTC)
    own_u, up_u = _unbounded(own_def), _unbounded(up_def)
    result = mapping.get_upstream_mapped_partitions_result_for_partitions(
        own_u.empty_subset().with_partition_keys(partition_keys), own_u, up_u, current_time=_FAR_FUTURE
    )
    first = up_def.get_first_partition_window()
    keys: list[str] = []
    nonexistent: list[str] = []
    for key in result.partitions_subset.get_partition_keys():
        window = up_def.time_window_for_partition_key(key)
        before_start = first is None or window.start < first.start
        if before_start and self_dependency:
            continue
        if before_start or window.end > now:
            nonexistent.append(key)
        else:
            keys.append(key)
    order = {k: up_def.time_window_for_partition_key(k).start for k in [*keys, *nonexistent]}
    return MappedPartitions(sorted(keys, key=order.__getitem__), sorted(nonexistent, key=order.__getitem__))


def partition_mapping(table: Table, dep: Dependency, upstream_period: str) -> TimeWindowPartitionMapping:
    """The mapping of one edge: offsets in the upstream's periods, or the default roll-up."""
    if dep.start_offset is None or dep.end_offset is None:
        return TimeWindowPartitionMapping()
    if dep.start_offset == dep.end_offset == 0:
        return TimeWindowPartitionMapping()  # Set 0: the same period, or the default roll-up
    if upstream_period != table.period and dep.start_offset == 0 and dep.end_offset in (23, 6):
        return TimeWindowPartitionMapping()  # Range 0–23 hours of a day / 0–6 days of a week: the roll-up
    return TimeWindowPartitionMapping(start_offset=dep.start_offset, end_offset=dep.end_offset)


@dataclass(frozen=True)
class UpstreamPartitions:
    table: str
    keys: list[str]  # existing upstream partitions, in time order
    nonexistent: list[str]  # needed but not partitions (yet): before the upstream's start or in the future


def upstream_partitions(
    catalog: Catalog, table: Table, dep: Dependency, partition_key: str, current_time: datetime | None = None
) -> UpstreamPartitions:
    """The exact upstream partition keys one partition of ``table`` needs through ``dep``.

    Unlike Dagster's mapping, windows are not clamped to the upstream's existing partitions: what lies
    before its start or in the future is listed in ``nonexistent`` (except a self-dependency's partitions
    before the table's first one, which the first partition does not need).
    """
    mapped = mapped_upstream(
        partition_mapping(table, dep, catalog[dep.table].period),
        BY_PERIOD[table.period],
        BY_PERIOD[catalog[dep.table].period],
        [partition_key],
        current_time=current_time,
        self_dependency=dep.table == table.fqn,
    )
    return UpstreamPartitions(table=dep.table, keys=mapped.keys, nonexistent=mapped.nonexistent)
