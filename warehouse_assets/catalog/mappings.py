"""Exact upstream partitions: which partitions of each upstream one partition needs, never clamped.

Dagster's TimeWindowPartitionMapping clamps offsets to the upstream's existing partitions and silently leaves
out what lies before its start or in the future, and so does its automation: at the third day, a 30-day window
maps to three days and T-7 maps to nothing, and ``required_but_nonexistent_subset`` stays empty. So the mapping
is applied to copies of the two partitions definitions without bounds, which yields every partition the window
needs; the ones outside the real upstream's range are reported as nonexistent.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from dagster import (
    MultiPartitionsDefinition,
    PartitionMapping,
    TimeWindow,
    TimeWindowPartitionMapping,
    TimeWindowPartitionsDefinition,
    partition_loading_context,
)

from warehouse_assets.catalog.calendars import (
    BY_PERIOD,
    MINUTE_PERIODS,
    PERIOD_ORDER,
    partition_key_of,
    partition_values,
    periods,
    regional_key,
    split_regional_key,
)
from warehouse_assets.catalog.dependencies import LATEST
from warehouse_assets.catalog.model import DerivedTable

if TYPE_CHECKING:
    from warehouse_assets.catalog.dependencies import Dependency
    from warehouse_assets.catalog.model import Catalog, Table

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


def first_window(pdef: TimeWindowPartitionsDefinition) -> TimeWindow | None:
    """The first partition's window of ``pdef``, whether or not it has ended: Dagster's own answer is None until it
    has (a month starting after today's), which would make every partition of a window "before the start"."""
    with partition_loading_context(_FAR_FUTURE):
        return pdef.get_first_partition_window()


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
    with partition_loading_context(_FAR_FUTURE):  # a key after now is a key too: the subset would drop it
        downstream = own_u.empty_subset().with_partition_keys(partition_keys)
    result = mapping.get_upstream_mapped_partitions_result_for_partitions(
        downstream, own_u, up_u, current_time=_FAR_FUTURE
    )
    first = first_window(up_def)
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


def anchored(table: Table, dep: Dependency, upstream_period: str) -> bool:
    """Whether ``dep`` counts offsets on a coarser upstream: from the upstream period holding the partition's start
    (a day's previous month). Dagster's time-window mapping cannot say it: across periods it shifts the downstream's
    own window by downstream periods, so the exact partitions are this module's and the reverse index's arithmetic."""
    return dep.start_offset is not None and PERIOD_ORDER[upstream_period] > PERIOD_ORDER[table.period]


# downstream partitions one upstream partition spans at most (a 31-day month, a 25-hour autumn day)
_MOST_PER = {("daily", "hourly"): 25, ("weekly", "hourly"): 169, ("monthly", "hourly"): 745}
_MOST_PER |= {("weekly", "daily"): 7, ("monthly", "daily"): 31, ("monthly", "weekly"): 6}
_MOST_PER |= {
    (coarse, period): hours * 60 // minutes
    for period, minutes in MINUTE_PERIODS.items()
    for coarse, hours in (("hourly", 1), ("daily", 25), ("weekly", 169), ("monthly", 745))
}
_MOST_PER |= {("15min", "5min"): 3, ("10min", "5min"): 2}


def partition_mapping(table: Table, dep: Dependency, upstream_period: str) -> TimeWindowPartitionMapping:
    """The mapping of one edge: offsets in the upstream's periods, or the default roll-up.

    Dagster's mapping of an edge with offsets on a coarser upstream is a superset of the exact partitions (what the
    UI shows and what Dagster's backfills order by): every upstream period from the first the offsets reach to the one
    holding the partition; the gate decides on the exact ones (:func:`upstream_partitions`)."""
    if anchored(table, dep, upstream_period):
        assert dep.start_offset is not None
        return TimeWindowPartitionMapping(
            start_offset=dep.start_offset * _MOST_PER[(upstream_period, table.period)], end_offset=0
        )
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
    upstream_period = catalog[dep.table].period
    if isinstance(table, DerivedTable) and table.is_regional:
        mapped = regional_hours(table, BY_PERIOD[upstream_period], partition_key, current_time=current_time)
        return UpstreamPartitions(table=dep.table, keys=mapped.keys, nonexistent=mapped.nonexistent)
    upstream = catalog[dep.table]
    if isinstance(upstream, DerivedTable) and upstream.is_regional:
        mapped = regional_days(upstream, partition_key, current_time=current_time)
        return UpstreamPartitions(table=dep.table, keys=mapped.keys, nonexistent=mapped.nonexistent)
    if anchored(table, dep, upstream_period):
        mapped = anchored_upstream(
            BY_PERIOD[table.period], BY_PERIOD[upstream_period], dep, partition_key, current_time=current_time
        )
        return UpstreamPartitions(table=dep.table, keys=mapped.keys, nonexistent=mapped.nonexistent)
    mapped = mapped_upstream(
        partition_mapping(table, dep, upstream_period),
        BY_PERIOD[table.period],
        BY_PERIOD[catalog[dep.table].period],
        [partition_key],
        current_time=current_time,
        self_dependency=dep.table == table.fqn,
    )
    if dep.within is not None:  # nothing before the start of the coarser period holding the partition
        since = within_start(BY_PERIOD[table.period], BY_PERIOD[dep.within], partition_key)
        up_def = BY_PERIOD[upstream_period]

        def inside(keys: list[str]) -> list[str]:
            return [k for k in keys if up_def.time_window_for_partition_key(k).start.timestamp() >= since]

        return UpstreamPartitions(table=dep.table, keys=inside(mapped.keys), nonexistent=inside(mapped.nonexistent))
    return UpstreamPartitions(table=dep.table, keys=mapped.keys, nonexistent=mapped.nonexistent)


def partition_window(table: Table, partition_key: str) -> TimeWindow:
    """The window of one partition of ``table``: its period's, or for a table with regions its region's day,
    [that zone's midnight, the next one): 23 or 25 hours on a daylight-saving day."""
    if isinstance(table, DerivedTable) and table.is_regional:
        day, region = split_regional_key(partition_key)
        return periods().region_days(table.zone_of(region)).time_window_for_partition_key(day)
    return BY_PERIOD[table.period].time_window_for_partition_key(partition_key)


def partitions_def_of(table: Table) -> TimeWindowPartitionsDefinition | MultiPartitionsDefinition:
    """Dagster's partitions of ``table``: its period's, or for a table with regions its dates × regions."""
    if isinstance(table, DerivedTable) and table.is_regional:
        return periods().regional(table.regions)
    return BY_PERIOD[table.period]


def partition_values_of(table: Table, partition_key: str) -> dict[str, str]:
    """The Delta partition values of one partition of ``table``: its period's, or for a table with regions the date and
    the region (``{"dt": "2026-03-08", "region": "los_angeles"}``), so that each region's day is a partition of its
    own, written and read alone."""
    if isinstance(table, DerivedTable) and table.is_regional:
        day, region = split_regional_key(partition_key)
        table.zone_of(region)  # a region the table does not declare: the error names its regions
        return {"dt": day, "region": region}
    return partition_values(table.period, partition_key)


def partition_key_from_values(table: Table, values: dict[str, str]) -> str | None:
    """The partition of ``table`` that Delta partition values name (:func:`partition_values_of` read backwards), None
    when they name none of its partitions."""
    if not (isinstance(table, DerivedTable) and table.is_regional):
        return partition_key_of(table.period, values)
    day, region = values.get("dt"), values.get("region")
    if day is None or region is None or region not in dict(table.regions) or set(values) != {"dt", "region"}:
        return None
    try:
        known = BY_PERIOD["daily"].has_partition_key(day)
    except ValueError:  # Dagster parses the key: a malformed value raises
        return None
    return regional_key(day, region) if known else None


def regional_hours(
    table: DerivedTable,
    hourly: TimeWindowPartitionsDefinition,
    partition_key: str,
    current_time: datetime | None = None,
) -> MappedPartitions:
    """The hours one region's day of ``table`` reads: exactly those of ``hourly`` in [the region's midnight, the next
    one), split by existence at ``current_time``."""
    now = (current_time or datetime.now(UTC)).timestamp()
    window = partition_window(table, partition_key)
    hours = _unbounded(hourly)
    first = first_window(hourly)
    keys: list[str] = []
    nonexistent: list[str] = []
    at, end = window.start.timestamp(), window.end.timestamp()
    while at < end:
        key = hours.get_partition_key_for_timestamp(at)
        hour = hours.time_window_for_partition_key(key)
        if hour.start.timestamp() != at:
            raise ValueError(
                f"{table.fqn} {partition_key}: the region's day starts at {window.start.isoformat()}, within the hour "
                f"{key} of the hourly tables ({hourly.timezone}): a region's midnight must be a whole hour of theirs"
            )
        before_start = first is None or at < first.start.timestamp()
        (nonexistent if before_start or hour.end.timestamp() > now else keys).append(key)
        at = hour.end.timestamp()
    return MappedPartitions(keys, nonexistent)


def regional_days(upstream: DerivedTable, day: str, current_time: datetime | None = None) -> MappedPartitions:
    """What a day of a table without regions reads of ``upstream``, which has regions: every region's day of that
    date, each existing once that region's day has ended."""
    now = current_time or datetime.now(UTC)
    keys: list[str] = []
    nonexistent: list[str] = []
    for region, zone in upstream.regions:
        key = regional_key(day, region)
        window = partition_window(upstream, key)
        first = first_window(periods().region_days(zone))
        before_start = first is None or window.start < first.start
        (nonexistent if before_start or window.end > now else keys).append(key)
    return MappedPartitions(keys, nonexistent)


def within_start(
    own_def: TimeWindowPartitionsDefinition, within_def: TimeWindowPartitionsDefinition, partition_key: str
) -> float:
    """When the ``within_def`` period holding ``partition_key`` starts (a timestamp): a ``within`` dependency reads
    nothing before it."""
    start = own_def.time_window_for_partition_key(partition_key).start.timestamp()
    within = _unbounded(within_def)
    return within.time_window_for_partition_key(within.get_partition_key_for_timestamp(start)).start.timestamp()


def anchored_upstream(
    own_def: TimeWindowPartitionsDefinition,
    up_def: TimeWindowPartitionsDefinition,
    dep: Dependency,
    partition_key: str,
    current_time: datetime | None = None,
) -> MappedPartitions:
    """The partitions of a coarser upstream ``partition_key`` needs through ``dep``: the upstream periods ``start`` ..
    ``end`` counted from the one holding the partition's start, split by existence at ``current_time``; of a
    ``latest`` dependency only those that ended by the partition's own end (nothing after the partition is read)."""
    assert dep.start_offset is not None and dep.end_offset is not None
    now = current_time or datetime.now(UTC)
    up_u = _unbounded(up_def)
    window = own_def.time_window_for_partition_key(partition_key)
    anchor = up_u.time_window_for_partition_key(up_u.get_partition_key_for_timestamp(window.start.timestamp()))
    windows = [anchor]
    while len(windows) <= -dep.start_offset:
        previous = up_u.get_prev_partition_window(windows[0].start, respect_bounds=False)
        assert previous is not None
        windows.insert(0, previous)
    del windows[len(windows) + dep.end_offset :]  # offsets end at or before the anchor (the catalog's rule)
    if dep.mode == LATEST:
        windows = [w for w in windows if w.end.timestamp() <= window.end.timestamp()]
    first = first_window(up_def)
    keys: list[str] = []
    nonexistent: list[str] = []
    for w in windows:
        key = up_u.get_partition_key_for_timestamp(w.start.timestamp())
        before_start = first is None or w.start.timestamp() < first.start.timestamp()
        (nonexistent if before_start or w.end > now else keys).append(key)
    return MappedPartitions(keys, nonexistent)


def weak_deadline(table: Table, dep: Dependency, partition_key: str) -> datetime | None:
    """When ``dep`` of ``partition_key`` stops being waited for (mode ``deadline``): the first local ``HH:MM`` at or
    after the partition's window ends (09:00 on D+1 for day D), in the business timezone; None for other modes."""
    if dep.deadline is None:
        return None
    end = BY_PERIOD[table.period].time_window_for_partition_key(partition_key).end
    hour, minute = (int(part) for part in dep.deadline.split(":"))
    at = end.replace(hour=hour, minute=minute, second=0, microsecond=0)
    if at < end:
        at = (end + timedelta(days=1)).replace(hour=hour, minute=minute, second=0, microsecond=0)
    return at  # aware arithmetic on a ZoneInfo time is wall-clock: 09:00 stays 09:00 across a daylight-saving change
