"""The partitions definitions, defined once and imported everywhere (tests included).

One business timezone for all of them (design AD-5): mapped time-window partitions must share it exactly.
Roll-ups (hour → day → week → month) use Dagster's default time-window mapping between these definitions.
"""

from __future__ import annotations

from dagster import (
    DailyPartitionsDefinition,
    HourlyPartitionsDefinition,
    MonthlyPartitionsDefinition,
    TimeWindowPartitionsDefinition,
    WeeklyPartitionsDefinition,
)

BUSINESS_TZ = "Asia/Shanghai"
START = "2026-01-01"

hourly = HourlyPartitionsDefinition(start_date=f"{START}-00:00", timezone=BUSINESS_TZ)
daily = DailyPartitionsDefinition(start_date=START, timezone=BUSINESS_TZ)
# ISO weeks: Monday 00:00 to Monday 00:00 (2025-12-29 is the Monday of the week holding START)
weekly = WeeklyPartitionsDefinition(start_date="2025-12-29", day_offset=1, timezone=BUSINESS_TZ)
monthly = MonthlyPartitionsDefinition(start_date=START, timezone=BUSINESS_TZ)

BY_PERIOD: dict[str, TimeWindowPartitionsDefinition] = {
    "hourly": hourly,
    "daily": daily,
    "weekly": weekly,
    "monthly": monthly,
}

# Delta partition columns of each period: string values derived from the partition's start, local time.
PARTITION_COLUMNS: dict[str, list[str]] = {
    "hourly": ["dt", "hh"],
    "daily": ["dt"],
    "weekly": ["dt"],
    "monthly": ["dt"],
}
