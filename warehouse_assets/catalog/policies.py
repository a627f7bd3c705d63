"""A table's time rules as declared: its freshness SLA (``sla:``, :class:`Sla`) and its late-data policy
(``late_data:``, :class:`LateDataPolicy`: when a partition whose inputs changed after its build is rebuilt, and how
far back), with the durations and clock times they are written in.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass as plain_dataclass
from dataclasses import replace
from typing import Any

_DURATION = re.compile(r"^(?P<n>\d+)\s*(?P<unit>[mhd])$")


HH_MM = re.compile(r"^(?P<h>[01]?\d|2[0-3]):(?P<m>[0-5]\d)$")


@plain_dataclass(frozen=True)
class Sla:
    """A freshness SLA: a partition is due ``within`` after its window ends (plus ``grace``), or by a local
    ``deadline`` (HH:MM) the day after its window ends."""

    within_minutes: int | None = None
    grace_minutes: int = 0
    deadline: str | None = None  # "HH:MM"

    @classmethod
    def parse(cls, spec: Any) -> Sla:
        """``sla: {within: 1h, grace: 15m}`` or ``sla: {deadline: "09:00"}``."""
        if not isinstance(spec, Mapping) or ("within" in spec) == ("deadline" in spec):
            raise ValueError("sla needs exactly one of within (e.g. 1h) or deadline (HH:MM the next morning)")
        grace = minutes_of(spec.get("grace", "0m"), "sla.grace")
        if "deadline" in spec:
            deadline = str(spec["deadline"])
            if not HH_MM.match(deadline):
                raise ValueError(f"sla.deadline must be a local time HH:MM, got {deadline!r}")
            return cls(deadline=deadline, grace_minutes=grace)
        return cls(within_minutes=minutes_of(spec["within"], "sla.within"), grace_minutes=grace)

    def describe(self) -> str:
        if self.deadline is not None:
            return f"by {self.deadline} the next morning" + (
                f" + {self.grace_minutes} min" if self.grace_minutes else ""
            )
        return f"within {self.within_minutes} min of the window end + {self.grace_minutes} min grace"


def minutes_of(value: Any, what: str) -> int:
    """A duration as written in the catalog (``90m``, ``1h``, ``2d``) in minutes; ``what`` names it in the error."""
    match = _DURATION.match(str(value).strip()) if value is not None else None
    if not match:
        raise ValueError(f"{what} must be a duration like 90m, 1h or 2d, got {value!r}")
    return int(match.group("n")) * {"m": 1, "h": 60, "d": 1440}[match.group("unit")]


def usual_delay(spec: Any, name: str = "usual_delay") -> tuple[int, ...]:
    """``usual_delay: [5h, 9h]`` (from, to after the window ends) or one duration; absent: unknown. ``name``: the
    declaration's wording, for the error."""
    if spec is None:
        return ()
    if isinstance(spec, tuple):  # already parsed (a table built in code)
        return spec
    bounds = spec if isinstance(spec, list) else [spec]
    if not 1 <= len(bounds) <= 2:
        raise ValueError(f"{name} must be a duration or [earliest, latest], got {spec!r}")
    minutes = tuple(minutes_of(b, name) for b in bounds)
    if minutes != tuple(sorted(minutes)):
        raise ValueError(f"{name}'s earliest must come before its latest, got {spec!r}")
    return minutes


AT_ONCE, EVERY, DAILY_AT, AFTER, NEVER = "at_once", "every", "daily", "after", "never"


_EVERY = re.compile(r"^every\s+(?P<d>\S+)$")


_AFTER = re.compile(r"^after\s+(?P<d>\S+)$")


_DAILY_AT = re.compile(r"^daily\s+(?P<at>\S+)$")


@plain_dataclass(frozen=True)
class LateDataPolicy:
    """When a partition already built is built again because upstream data it read changed afterwards (late CDC
    changes to a closed hour, a re-delivered file, an upstream rebuilt), and how far back that is followed.

    Rebuilding at every late change is what makes late data expensive: a day read by many tables, changed all the
    next day, is built again every hour by each of them. A policy trades the freshness of closed partitions against
    that compute. ``rebuild``:

    * ``at_once``: as soon as the late data is there and valid;
    * ``every 30m``: at most one rebuild per interval: the first late change starts the interval, every change that
      arrives in it is absorbed by the one rebuild at its end;
    * ``daily 06:00``: once a day at that local time, whatever arrived since the last rebuild;
    * ``after 48h``: once the partition's window has been closed that long (its late data has arrived: the sources'
      own correction window) and a grace more (for the last changes to come through its inputs), absorbing
      everything since its last build; changes later still, at most once per that interval. For tables whose
      rebuild is expensive and whose readers can wait for the settled figure;
    * ``never``: not automatically; the partition is reported stale and rebuilt by a repair (``warehouse taint``).

    ``whole``: the same choices, for a table whose rebuild recomputes the whole partition (one that cannot be proven
    key-local, :mod:`warehouse_assets.catalog.key_locality`, nor a total maintained from its changed rows,
    :mod:`warehouse_assets.catalog.additive`); ``rebuild`` then applies to the others, whose rebuild costs what the
    change touches. A table that declares ``rebuild`` alone has it for both; one that declares neither has the
    default's.

    The default, ``{rebuild: every 15m, whole: after 48h}``: a late change is absorbed within 15 minutes where that
    costs the rows it changed, and a partition whose rebuild recomputes it all is rebuilt once its window has settled
    (the sources' corrections come for up to 48 hours), instead of once an hour for two days.

    ``grace``: a change that arrives this soon after the partition's window ended is the period that just closed
    settling, not a correction: the partition's first rebuild for it is due at once, whatever ``rebuild`` says (not
    ``never``); later rebuilds keep to the policy. Default 1 h: an hour's or a day's last rows land within minutes of
    its end, and its readers should not wait an interval for them.

    ``lookback``: a partition whose window ended this long before the table's newest built partition's did is not
    rebuilt for late data; it is reported stale (``warehouse why``/``status``), as a change that far back is usually a
    correction that deserves a repair. Counted from the newest partition, not the clock, so that a catch-up of past
    days follows late data as the live stream does.

    A partition's first build never waits for the policy, nor a rebuild for a later state, a taint's repair or a
    deadline dependency's late arrival: those are the build the partition is waiting for, not late data."""

    rebuild: str = EVERY
    every_minutes: int | None = 15
    at: str | None = None  # HH:MM, business time, for ``daily``
    lookback_minutes: int = 3 * 1440
    grace_minutes: int = 60
    # (rebuild, every_minutes, at) of whole rebuilds; None: ``rebuild``'s
    whole: tuple[str, int | None, str | None] | None = (AFTER, 48 * 60, None)

    @classmethod
    def parse(cls, spec: Any, what: str = "late_data") -> LateDataPolicy:
        """``late_data: {rebuild: every 30m, whole: daily 06:00, lookback: 2d, grace: 1h}``; each field optional,
        defaulting to the default's."""
        if not isinstance(spec, Mapping) or not spec or set(spec) - {"rebuild", "whole", "lookback", "grace"}:
            raise ValueError(
                f"{what} takes rebuild and whole (at_once, every 30m, daily 06:00, after 48h or never), lookback "
                f"(e.g. 3d) "
                f"and grace (e.g. 1h), got {spec!r}"
            )
        default = DEFAULT_LATE_DATA
        lookback = minutes_of(spec["lookback"], f"{what}.lookback") if "lookback" in spec else default.lookback_minutes
        grace = minutes_of(spec["grace"], f"{what}.grace") if "grace" in spec else default.grace_minutes
        rule = _rule(spec["rebuild"], f"{what}.rebuild") if "rebuild" in spec else default.rule
        if "whole" in spec:
            whole: tuple[str, int | None, str | None] | None = _rule(spec["whole"], f"{what}.whole")
        else:  # a declared rebuild rule alone is the table's rule for both; the default's own split otherwise
            whole = None if "rebuild" in spec else default.whole
        return cls(*rule, lookback, grace, whole)

    @property
    def rule(self) -> tuple[str, int | None, str | None]:
        return self.rebuild, self.every_minutes, self.at

    def for_whole_rebuilds(self) -> LateDataPolicy:
        """The policy of a table whose rebuild recomputes whole partitions."""
        return (
            self
            if self.whole is None
            else replace(self, rebuild=self.whole[0], every_minutes=self.whole[1], at=self.whole[2], whole=None)
        )

    def describe(self) -> str:
        """``every 15 min (whole rebuilds 2 d after the window closed), lookback 3 d, grace 1 h``: how the policy
        reads in messages."""
        whole = "" if self.whole is None else f" (whole rebuilds {_describe_rule(*self.whole)})"
        grace = f", grace {_duration(self.grace_minutes)}" if self.grace_minutes and self.rebuild != NEVER else ""
        return f"{_describe_rule(*self.rule)}{whole}, lookback {self.describe_lookback()}{grace}"

    def describe_lookback(self) -> str:
        return _duration(self.lookback_minutes)


def _rule(value: Any, what: str) -> tuple[str, int | None, str | None]:
    """``at_once``, ``every 30m``, ``daily 06:00``, ``after 48h`` or ``never`` as (rebuild, every_minutes, at)."""
    rule = str(value).strip()
    if rule in (AT_ONCE, NEVER):
        return rule, None, None
    if match := _EVERY.match(rule):
        every = minutes_of(match["d"], f"{what} every")
        if every < 1:
            raise ValueError(f"{what} every needs a positive interval, got {rule!r}")
        return EVERY, every, None
    if (match := _DAILY_AT.match(rule)) and HH_MM.match(match["at"]):
        return DAILY_AT, None, match["at"]
    if match := _AFTER.match(rule):
        after = minutes_of(match["d"], f"{what} after")
        if after < 1:
            raise ValueError(f"{what} after needs a positive duration, got {rule!r}")
        return AFTER, after, None
    raise ValueError(
        f"{what} must be at_once, every <interval> (e.g. every 30m), daily <HH:MM>, after <duration> (e.g. after "
        f"48h) or never, got {rule!r}"
    )


def _describe_rule(rebuild: str, every_minutes: int | None, at: str | None) -> str:
    return {
        AT_ONCE: "at once",
        NEVER: "never automatically",
        EVERY: f"every {_duration(every_minutes or 0)}",
        DAILY_AT: f"daily at {at}",
        AFTER: f"{_duration(every_minutes or 0)} after the window closed",
    }[rebuild]


def _duration(minutes: int) -> str:
    if minutes and minutes % 1440 == 0:
        return f"{minutes // 1440} d"
    if minutes and minutes % 60 == 0:
        return f"{minutes // 60} h"
    return f"{minutes} min"


# what serves most tables (chosen from bench/late_horizon.py's curve of work against lag): late changes absorbed within
# 15 minutes where the rebuild costs what they touch, whole rebuilds once the window settled; a change to a partition
# three days behind the newest is a correction, rebuilt by a repair
DEFAULT_LATE_DATA = LateDataPolicy()
