"""Partition keys as a user types them: what is wrong with one, said exactly.

A key can be wrong in five ways, each with its own message (``warehouse why``, the ``why_waiting`` job):

* ``malformed``    — not a date (or hour) at all: ``2026-13-45``, ``yesterday``;
* ``wrong_period`` — a date of another period: an hour for a daily table, a day for an hourly one, a Wednesday
  for a weekly table (weeks are named by their Monday), the 15th for a monthly one;
* ``before_start`` — a partition before the table's first one (the warehouse start): it can never exist;
* ``unfinished``   — the current period: its partition exists once the period ends;
* ``future``       — a period that has not begun.

The first two are mistakes in the key; the last three are keys of the right shape for partitions that do not
exist (:attr:`PartitionKeyError.exists_later` tells which of those may exist one day).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from warehouse_assets.catalog.calendars import BY_PERIOD, MINUTE_PERIODS, REGION_DELIMITER, periods, regional_key
from warehouse_assets.catalog.model import PERIOD_NOUN, WHOLE, DerivedTable, Table

if TYPE_CHECKING:
    from dagster import TimeWindow

HOUR_FORMAT = "%Y-%m-%d-%H:%M"
DAY_FORMAT = "%Y-%m-%d"
# how each period's partitions are written, as a user would read it
SHAPES = {
    "hourly": "hours written YYYY-MM-DD-HH:00",
    "daily": "days written YYYY-MM-DD",
    "weekly": "ISO weeks named by their Monday, YYYY-MM-DD",
    "monthly": "months named by their first day, YYYY-MM-01",
}
SHAPES |= {period: f"windows written YYYY-MM-DD-HH:MM, every {n} minutes" for period, n in MINUTE_PERIODS.items()}


def _timed(period: str) -> bool:
    """Whether the period's keys carry a time of day (hours and mini-batch windows)."""
    return period == "hourly" or period in MINUTE_PERIODS


class PartitionKeyError(ValueError):
    """What is wrong with a partition key: ``kind`` is one of the module's five, ``message`` says it exactly."""

    def __init__(self, kind: str, message: str):
        self.kind, self.message = kind, message
        super().__init__(message)

    @property
    def exists_later(self) -> bool:
        return self.kind in ("unfinished", "future")


@dataclass(frozen=True)
class _Parsed:
    at: datetime  # naive, business-local
    hourly: bool  # written as an hour (YYYY-MM-DD-HH:MM)


def _parse(key: str) -> _Parsed | None:
    for fmt, hourly in ((HOUR_FORMAT, True), (DAY_FORMAT, False)):
        try:
            parsed = datetime.strptime(key.strip(), fmt)
        except ValueError:
            continue
        if key.strip() == parsed.strftime(fmt):  # strptime accepts 2026-3-4; keys are zero-padded
            return _Parsed(parsed, hourly)
    return None


def example_key(table: Table, now: datetime) -> str:
    """The table's latest finished partition at ``now`` (else its first): a key of the right shape."""
    pdef = BY_PERIOD[table.period]
    current = pdef.time_window_for_partition_key(pdef.get_partition_key_for_timestamp(now.timestamp())).start
    if current - timedelta(seconds=1) < pdef.start:  # nothing has finished yet: the first partition
        return pdef.start.strftime(HOUR_FORMAT if _timed(table.period) else DAY_FORMAT)
    return pdef.get_partition_key_for_timestamp((current - timedelta(seconds=1)).timestamp())


def check_partition_key(table: Table, key: str, now: datetime | None = None) -> None:
    """Raise :class:`PartitionKeyError` saying what is wrong with ``key`` as a partition of ``table`` at ``now``
    (default: the current time); return if it names one of its partitions that exist."""
    now = now or datetime.now(UTC)
    if table.is_static:
        if key.strip() == WHOLE:
            return
        raise PartitionKeyError(
            "wrong_period", f"{table.fqn} is a static table: it has no partitions; its one partition is {WHOLE!r}"
        )
    if isinstance(table, DerivedTable) and table.is_regional:
        _check_regional_key(table, key, now)
        return
    pdef = BY_PERIOD[table.period]
    zone = ZoneInfo(pdef.timezone)
    period, noun = table.period, PERIOD_NOUN[table.period]
    example = example_key(table, now)
    shape = f"{table.fqn} is {period}: its partitions are {SHAPES[period]}, e.g. {example}"
    parsed = _parse(key)
    if parsed is None:
        raise PartitionKeyError("malformed", f"{key!r} is not a partition key: {shape}")
    at = parsed.at
    if period == "hourly" and not parsed.hourly:
        raise PartitionKeyError("wrong_period", f"{key!r} is a day, but {shape} (the day's 24 hours, from {key}-00:00)")
    if period in MINUTE_PERIODS and not parsed.hourly:
        raise PartitionKeyError("wrong_period", f"{key!r} is a day, but {shape} (the day's first, {key}-00:00)")
    if not _timed(period) and parsed.hourly:
        raise PartitionKeyError("wrong_period", f"{key!r} is an hour, but {shape}")
    if period == "hourly" and at.minute != 0:
        raise PartitionKeyError("wrong_period", f"{key!r} does not start on the hour, but {shape}")
    if period in MINUTE_PERIODS and at.minute % MINUTE_PERIODS[period]:
        raise PartitionKeyError("wrong_period", f"{key!r} does not start a window, but {shape}")
    if period == "weekly" and at.weekday() != 0:
        monday = at - timedelta(days=at.weekday())
        raise PartitionKeyError("wrong_period", f"{key!r} is a {at:%A}, but {shape} (its week is {monday:%Y-%m-%d})")
    if period == "monthly" and at.day != 1:
        raise PartitionKeyError(
            "wrong_period", f"{key!r} is not the first of a month, but {shape} (its month is {at:%Y-%m-01})"
        )
    start = at.replace(tzinfo=zone)
    if start < pdef.start:  # the first partition's start, whether or not it has ended yet
        first = pdef.start.strftime(HOUR_FORMAT if _timed(period) else DAY_FORMAT)
        raise PartitionKeyError(
            "before_start",
            f"{table.fqn} {key} can never exist: it is before the table's first partition {first} (the warehouse "
            f"starts {periods().start:%Y-%m-%d}, WAREHOUSE_START); nothing before it is ever ingested or built",
        )
    window = pdef.time_window_for_partition_key(key)
    _check_finished(f"{table.fqn} {key}", f"the {noun}", window, zone, now, f". The latest finished one is {example}")


def _check_regional_key(table: DerivedTable, key: str, now: datetime) -> None:
    """A partition of a table with regions is one region's day, ``2026-03-06|utc``: the day in that region's zone."""
    names = [name for name, _ in table.regions]
    day, delimiter, region = key.strip().partition(REGION_DELIMITER)
    example = regional_key(example_key(table, now), names[-1])
    shape = (
        f"{table.fqn} has regions: its partitions are each region's day, written YYYY-MM-DD{REGION_DELIMITER}region "
        f"with a region of {', '.join(names)}, e.g. {example}"
    )
    parsed = _parse(day)
    if parsed is None or parsed.hourly:
        raise PartitionKeyError("malformed", f"{key!r} is not a partition key: {shape}")
    if not delimiter:
        raise PartitionKeyError("wrong_period", f"{key!r} is a day, but {shape}")
    if region not in names:
        raise PartitionKeyError("wrong_period", f"{key!r} names no region of the table: {shape}")
    zone = ZoneInfo(table.zone_of(region))
    if parsed.at.date() < periods().start:
        raise PartitionKeyError(
            "before_start",
            f"{table.fqn} {key} can never exist: its regions' days begin on the warehouse start "
            f"{periods().start:%Y-%m-%d} (WAREHOUSE_START); nothing before it is ever ingested or built",
        )
    window = periods().region_days(zone.key).time_window_for_partition_key(day)
    _check_finished(f"{table.fqn} {key}", "that day", window, zone, now)


def _check_finished(
    partition: str, period: str, window: TimeWindow, zone: ZoneInfo, now: datetime, latest: str = ""
) -> None:
    """A partition exists once its ``window`` has ended: refused if it has not begun or not ended at ``now``."""
    if window.start > now:
        raise PartitionKeyError(
            "future",
            f"{partition} is in the future: {period} begins at {_local(window.start, zone)} and its partition "
            f"exists once it ends, at {_local(window.end, zone)}",
        )
    if window.end > now:
        raise PartitionKeyError(
            "unfinished",
            f"{partition} has not finished yet: {period} ends at {_local(window.end, zone)} "
            f"(in {_duration(window.end - now)}); its partition exists from then{latest}",
        )


def _local(at: datetime, zone: ZoneInfo) -> str:
    return f"{at.astimezone(zone):%Y-%m-%d %H:%M} {zone.key}"


def _duration(delta: timedelta) -> str:
    minutes = max(1, int(delta.total_seconds() // 60))
    days, rest = divmod(minutes, 24 * 60)
    hours, minutes = divmod(rest, 60)
    parts = [f"{days} d" if days else "", f"{hours} h" if hours else "", f"{minutes} min" if minutes else ""]
    return " ".join(p for p in parts if p)


def regional_keys_between(table: DerivedTable, start: str, end: str) -> list[str]:
    """Each region's day of the dates START … END of a table with regions, date by date in declared region order;
    either end may name one region's day (``2026-03-06|utc``) to start or stop there, a date names all of them.
    ValueError naming the key and the table's regions when an end names none of its partitions."""
    names = [name for name, _ in table.regions]
    bounds: list[tuple[datetime, str]] = []
    for key in (start, end):
        day, _, region = key.strip().partition(REGION_DELIMITER)
        parsed = _parse(day)
        if parsed is None or parsed.hourly or (region and region not in names):
            raise ValueError(
                f"{key!r} is not a partition of {table.fqn}: it has one per region and day, a date names all of them "
                f"(2026-03-06) and a region's day one (2026-03-06{REGION_DELIMITER}{names[-1]}); its regions: "
                f"{', '.join(names)}"
            )
        bounds.append((parsed.at, region))
    (first_day, first_region), (last_day, last_region) = bounds
    dates = [(first_day + timedelta(days=n)).strftime(DAY_FORMAT) for n in range((last_day - first_day).days + 1)]
    keys = [regional_key(day, region) for day in dates for region in names]
    first = keys.index(regional_key(dates[0], first_region or names[0])) if keys else 0
    last = keys.index(regional_key(dates[-1], last_region or names[-1])) if keys else -1
    if first > last:
        raise ValueError(f"{start} .. {end} is empty: START must not come after END")
    return keys[first : last + 1]
