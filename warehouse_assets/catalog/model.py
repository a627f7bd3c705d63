"""The warehouse catalog: every table declared once, beside its body, so a table's columns, partitions,
checks and SQL are read and changed in one place.

Two kinds of declaration live under ``warehouse_assets/catalog/tables/<layer>/``:

* ``<name>.yaml`` for ODS tables fed by CDC: the source database and shard tables, the columns with their
  types, the primary key and the column whose local hour partitions the table;
* ``<name>.sql`` for everything else: a YAML header in a leading ``/* --- ... --- */`` comment, then the
  Spark SQL body. The SQL names its inputs as ``layer.table``; the compiler hands it exactly the mapped
  upstream partitions under those names.

* ``ext/<name>.yaml`` for external tables: data produced outside the platform (an ad partner's files, a
  finance system's Delta table). They are never computed here; a sensor per producer reports each
  partition that has truly arrived, and downstream SQL reads them like any other input.

Dependencies are found in the SQL itself (the tables it reads); a ``depends_on`` entry only adds offsets
to one of them: ``{set: [-1]}`` (T-1), ``{range: [0, 23]}`` (the 24 hours of a day; a set without
holes such as ``{set: [0, 1, 2, 3, 4, 5, 6]}`` is the same as its range),
``{range: [-29, 0]}`` (a 30-period sliding window). ``ignore_dq: true`` beside the offsets lets the table
run on that dependency even when the upstream partition failed a blocking data-quality check, and
``accept_tainted: true`` even when it is marked tainted (``warehouse taint``).

Data-quality checks sit beside the table, under ``checks:`` (SQL header or ODS yaml); each becomes one
per-partition Dagster asset check, blocking unless it says ``blocking: false``::

    checks:
      unique: [order_id]                  # or `true`: the primary key
      not_null: [order_id, user_id]
      range: {rate: [0, 1], amount: [0, null]}
      references: {user_id: dwd.order_detail.user_id}      # a dependency's mapped partitions
      row_count: {upstream: ods.order, min_ratio: 0.99, max_ratio: 1.0, min_rows: 1}
      anomaly: {metric: sum(gmv), max_deviation: 0.5, periods: 7, min_periods: 3}

Freshness SLAs (``sla:``) say by when a partition must be materialized, after its window ends:
``sla: {within: 1h, grace: 15m}`` (ODS hours) or ``sla: {deadline: "09:00"}`` (by 09:00 the next morning,
local time, for daily tables). Each becomes a non-blocking per-partition ``freshness`` check that the
``freshness_slas`` sensor evaluates once the partition's deadline passes
(:mod:`warehouse_assets.materialize.freshness`).
Late upstream data (changes to a partition already built from) rebuilds a derived partition as its late-data
policy says: ``late_data: {rebuild: every 60m, lookback: 3d}`` (the default), ``at_once``, ``daily 06:00`` or
``never``, per table or, beside a dependency's offsets, for the late data arriving through it
(:class:`LateDataPolicy`). ``incremental: false`` keeps those rebuilds whole even where the SQL proves each key's rows
local to that key (:mod:`warehouse_assets.catalog.key_locality`).
ODS tables also set the completeness threshold of their readiness:
``completeness: {threshold: 0.99995}``.
Each kind of table is its own typed model, validated by pydantic as it is built (also by
``dataclasses.replace``): :class:`OdsTable`, :class:`DerivedTable` and :class:`ExternalTable` on the common
:class:`Table`; a kind's own fields are required on it and absent from the others. Each check kind is one
class of :mod:`warehouse_assets.catalog.checks`.
A table that reads itself needs a negative offset (``{set: [-1]}``, self T-1) and declares its
output ``columns`` (its first partition reads an empty T-1 of that shape); any other cycle is an error.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass as plain_dataclass
from dataclasses import field, replace
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import InstanceOf, field_validator, model_validator
from pydantic.dataclasses import dataclass

from resources.column_types import is_spark_type
from warehouse_assets.catalog.calendars import MINUTE_PERIODS, PARTITION_COLUMNS
from warehouse_assets.catalog.checks import Check, parse_checks

LAYERS = ("ext", "ods", "dwd", "dws", "ads")
EXTERNAL_FORMATS = ("csv_files", "delta")
PERIOD_ORDER = {"5min": -3, "10min": -2, "15min": -1, "hourly": 0, "daily": 1, "weekly": 2, "monthly": 3}
PERIOD_NOUN = {"hourly": "hour", "daily": "day", "weekly": "week", "monthly": "month"}
PERIOD_NOUN |= {period: f"{minutes}-minute window" for period, minutes in MINUTE_PERIODS.items()}
DEFAULT_COMPLETENESS = 0.99995
_DURATION = re.compile(r"^(?P<n>\d+)\s*(?P<unit>[mhd])$")
_CLOCK = re.compile(r"^(?P<h>[01]?\d|2[0-3]):(?P<m>[0-5]\d)$")


class CatalogError(ValueError):
    """A table declaration is wrong; the message names the table and its file."""


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
        grace = _minutes(spec.get("grace", "0m"), "sla.grace")
        if "deadline" in spec:
            deadline = str(spec["deadline"])
            if not _CLOCK.match(deadline):
                raise ValueError(f"sla.deadline must be a local time HH:MM, got {deadline!r}")
            return cls(deadline=deadline, grace_minutes=grace)
        return cls(within_minutes=_minutes(spec["within"], "sla.within"), grace_minutes=grace)

    def describe(self) -> str:
        if self.deadline is not None:
            return f"by {self.deadline} the next morning" + (
                f" + {self.grace_minutes} min" if self.grace_minutes else ""
            )
        return f"within {self.within_minutes} min of the window end + {self.grace_minutes} min grace"


def _minutes(value: Any, what: str) -> int:
    match = _DURATION.match(str(value).strip()) if value is not None else None
    if not match:
        raise ValueError(f"{what} must be a duration like 90m, 1h or 2d, got {value!r}")
    return int(match.group("n")) * {"m": 1, "h": 60, "d": 1440}[match.group("unit")]


AT_ONCE, EVERY, DAILY_AT, NEVER = "at_once", "every", "daily", "never"
_EVERY = re.compile(r"^every\s+(?P<d>\S+)$")
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
    * ``never``: not automatically; the partition is reported stale and rebuilt by a repair (``warehouse taint``).

    ``whole``: the same choices, for a table whose rebuild recomputes the whole partition (one that cannot be proven
    key-local, :mod:`warehouse_assets.catalog.key_locality`); ``rebuild`` then applies to the key-local tables, whose
    rebuild replaces only the changed keys' rows and costs what the change touches. Unset: ``rebuild`` for both.

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
    every_minutes: int | None = 60
    at: str | None = None  # HH:MM, business time, for ``daily``
    lookback_minutes: int = 3 * 1440
    grace_minutes: int = 60
    whole: tuple[str, int | None, str | None] | None = None  # (rebuild, every_minutes, at) of whole rebuilds

    @classmethod
    def parse(cls, spec: Any, what: str = "late_data") -> LateDataPolicy:
        """``late_data: {rebuild: every 30m, whole: daily 06:00, lookback: 2d, grace: 1h}``; each field optional,
        defaulting to the default's."""
        if not isinstance(spec, Mapping) or not spec or set(spec) - {"rebuild", "whole", "lookback", "grace"}:
            raise ValueError(
                f"{what} takes rebuild and whole (at_once, every 30m, daily 06:00 or never), lookback (e.g. 3d) "
                f"and grace (e.g. 1h), got {spec!r}"
            )
        default = DEFAULT_LATE_DATA
        lookback = _minutes(spec["lookback"], f"{what}.lookback") if "lookback" in spec else default.lookback_minutes
        grace = _minutes(spec["grace"], f"{what}.grace") if "grace" in spec else default.grace_minutes
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
        """``every 60 min, lookback 3 d``: how the policy reads in messages."""
        whole = "" if self.whole is None else f" (whole rebuilds {_describe_rule(*self.whole)})"
        grace = f", grace {_duration(self.grace_minutes)}" if self.grace_minutes and self.rebuild != NEVER else ""
        return f"{_describe_rule(*self.rule)}{whole}, lookback {self.describe_lookback()}{grace}"

    def describe_lookback(self) -> str:
        return _duration(self.lookback_minutes)


def _rule(value: Any, what: str) -> tuple[str, int | None, str | None]:
    """``at_once``, ``every 30m``, ``daily 06:00`` or ``never`` as (rebuild, every_minutes, at)."""
    rule = str(value).strip()
    if rule in (AT_ONCE, NEVER):
        return rule, None, None
    if match := _EVERY.match(rule):
        every = _minutes(match["d"], f"{what} every")
        if every < 1:
            raise ValueError(f"{what} every needs a positive interval, got {rule!r}")
        return EVERY, every, None
    if (match := _DAILY_AT.match(rule)) and _CLOCK.match(match["at"]):
        return DAILY_AT, None, match["at"]
    raise ValueError(f"{what} must be at_once, every <interval> (e.g. every 30m), daily <HH:MM> or never, got {rule!r}")


def _describe_rule(rebuild: str, every_minutes: int | None, at: str | None) -> str:
    return {
        AT_ONCE: "at once",
        NEVER: "never automatically",
        EVERY: f"every {_duration(every_minutes or 0)}",
        DAILY_AT: f"daily at {at}",
    }[rebuild]


def _duration(minutes: int) -> str:
    if minutes and minutes % 1440 == 0:
        return f"{minutes // 1440} d"
    if minutes and minutes % 60 == 0:
        return f"{minutes // 60} h"
    return f"{minutes} min"


# what serves most tables: late changes to a closed partition wait for the hour's interval, and a change to a
# partition three days behind the newest is a correction, rebuilt by a repair
DEFAULT_LATE_DATA = LateDataPolicy()


STRICT, DEADLINE, ANY, LATEST = "strict", "deadline", "any", "latest"
DEPENDENCY_MODES = (STRICT, DEADLINE, ANY, LATEST)
# what ``latest: true`` looks back over without a range: the upstream period that holds the partition's start and the
# two before it (a month, a day), of which those ended by the partition's end are candidates
LATEST_LOOKBACK = (-2, 0)
# the data kinds a table built from SQL may declare (its period of data against its period of processing)
TIME_SERIES, CUMULATIVE, SNAPSHOT, STATIC = "time_series", "cumulative", "snapshot", "static"
DERIVED_KINDS = (TIME_SERIES, CUMULATIVE, SNAPSHOT)
ODS_KINDS = (TIME_SERIES, SNAPSHOT)
# a snapshot ODS table's partition time: the binlog time of the change the row is (its source has no time column)
CHANGED_AT = "_changed_at"
# what the ingestion stores beside an ODS table's declared columns: each row's binlog time and position, the shard
# stream it came from and whether it is a DELETE's tombstone (SQL may read them: a snapshot orders changes by them)
ODS_CHANGE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("_es", "bigint"),
    ("_pos", "bigint"),
    ("_stream", "string"),
    ("_deleted", "boolean"),
)
# the one partition of a static table, as the dependency center, the gate and ``why`` name it: Dagster's asset is
# unpartitioned (its events carry no partition)
WHOLE = "whole"


@plain_dataclass(frozen=True)
class Dependency:
    """One upstream table with the offsets that refine the default mapping (None = default), and how strictly the
    downstream waits for the partitions they name.

    ``mode``: ``strict`` (every partition, the default); ``deadline`` (strict until the local time ``deadline``
    first reached at or after the downstream partition's window ends, e.g. 09:00 on D+1 for day D; after it the
    partition runs without what is missing, marked degraded, and is rebuilt when it arrives); ``any`` (ready when at
    least ``min`` partitions of the window exist and are usable); ``latest`` (reads only the most recent usable
    partition of its window that ended by the partition's own end: a month's figures for each day after it, whichever
    month is the last one built; ready when there is one, rebuilt once when a more recent one arrives).

    On a coarser upstream (a daily table on a monthly one), offsets count the upstream's periods from the one that
    holds the partition's start: ``{set: [-1]}`` is the previous month of every day of a month."""

    table: str
    start_offset: int | None = None
    end_offset: int | None = None
    ignore_dq: bool = False  # run even when the upstream partition failed a blocking check
    accept_tainted: bool = False  # run even when the upstream partition is marked tainted
    mode: str = STRICT
    deadline: str | None = None  # "HH:MM", business time, for mode deadline
    min: int = 1  # for mode any: how many partitions of the window suffice
    # the states of an upstream that declares states this dependency accepts; None: its last state only
    states: tuple[str, ...] | None = None
    # a coarser period the window does not reach back over: ``weekly`` keeps a day's window within its own week (the
    # week to date; a cumulative table's T-1, which starts afresh each Monday)
    within: str | None = None
    # how late data arriving through this dependency rebuilds the partition; None: the table's policy
    late_data: LateDataPolicy | None = None

    @property
    def key(self) -> list[str]:
        return self.table.split(".")

    @property
    def weak(self) -> bool:
        return self.mode != STRICT

    def describe_mode(self) -> str:
        """The dependency's mode in words, for messages: ``strict``, ``until 09:00`` or ``any 1 of the window``."""
        if self.mode == DEADLINE:
            return f"deadline {self.deadline}"
        if self.mode == ANY:
            return f"any {self.min} of the window"
        if self.mode == LATEST:
            return "the latest usable of the window"
        return STRICT

    @classmethod
    def parse(cls, dep: str, spec: Any) -> Dependency:
        """``depends_on`` entry: ``{set: [...]}`` or ``{range: [a, b]}``, with the flags ``ignore_dq`` and
        ``accept_tainted`` beside them, and a weak ``mode`` (``mode: deadline, deadline: "09:00"``; ``mode: any``
        with an optional ``min: k``; ``min: k`` alone is ``mode: any``; ``latest: true``, over the window of its offsets
        or by default the upstream period holding the partition's start and the two before)."""
        flags: dict[str, Any] = {"ignore_dq": False, "accept_tainted": False}
        weak: dict[str, Any] = {}
        accepted: tuple[str, ...] | None = None
        if isinstance(spec, Mapping) and "state" in spec:
            spec = dict(spec)
            accepted = _names(spec.pop("state"), f"dependency {dep}: state")
            if not accepted:
                raise ValueError(f"dependency {dep}: state names the upstream states it accepts, e.g. [estimated]")
        late_data = None
        if isinstance(spec, Mapping) and "late_data" in spec:
            spec = dict(spec)
            late_data = LateDataPolicy.parse(spec.pop("late_data"), f"dependency {dep}: late_data")
        within = None
        if isinstance(spec, Mapping) and "within" in spec:
            spec = dict(spec)
            within = spec.pop("within")
            if within not in PERIOD_ORDER or within == "hourly":
                raise ValueError(f"dependency {dep}: within names a period (daily, weekly or monthly), got {within!r}")
        if isinstance(spec, Mapping) and (set(flags) | {"mode", "deadline", "min", "latest"}) & set(spec):
            spec = dict(spec)
            for name in list(flags):
                if name in spec:
                    flag = spec.pop(name)
                    if not isinstance(flag, bool):
                        raise ValueError(f"dependency {dep}: {name} must be true or false, got {flag!r}")
                    flags[name] = flag
            weak = {name: spec.pop(name) for name in ("mode", "deadline", "min", "latest") if name in spec}
        start, end = _parse_offsets(spec, dep)
        if weak.get("latest") is not None:
            if not isinstance(weak["latest"], bool):
                raise ValueError(f"dependency {dep}: latest must be true or false, got {weak['latest']!r}")
            if weak.pop("latest"):
                if set(weak) - {"mode"} or weak.get("mode", LATEST) != LATEST:
                    raise ValueError(f"dependency {dep}: latest: true is a mode of its own (no mode, deadline or min)")
                weak["mode"] = LATEST
        if weak.get("mode") == LATEST and start is None:
            start, end = LATEST_LOOKBACK
        mode = _parse_mode(dep, weak, start, end)
        return cls(
            dep,
            start,
            end,
            flags["ignore_dq"],
            flags["accept_tainted"],
            **mode,
            states=accepted,
            within=within,
            late_data=late_data,
        )


def _parse_mode(dep: str, weak: Mapping[str, Any], start: int | None, end: int | None) -> dict[str, Any]:
    """The weak mode of a dependency, validated: its fields for :class:`Dependency`."""
    mode = weak.get("mode", ANY if "min" in weak else STRICT)
    if mode not in DEPENDENCY_MODES:
        raise ValueError(f"dependency {dep}: mode must be one of {', '.join(DEPENDENCY_MODES)}, got {mode!r}")
    if mode == DEADLINE:
        deadline = weak.get("deadline")
        if deadline is None or not _CLOCK.match(str(deadline)):
            raise ValueError(
                f'dependency {dep}: mode deadline needs deadline: a local time HH:MM (e.g. "09:00": the morning '
                f"after a daily partition's day), got {deadline!r}"
            )
        if "min" in weak:
            raise ValueError(f"dependency {dep}: min is for mode any, not deadline")
        return {"mode": DEADLINE, "deadline": str(deadline)}
    if "deadline" in weak:
        raise ValueError(f"dependency {dep}: deadline needs mode: deadline")
    if mode == LATEST:
        if start is None or end is None or end > 0 or start == end:
            raise ValueError(
                f"dependency {dep}: latest looks back over a window of several periods ending at or before the "
                f"partition's own (e.g. {{range: [-6, 0], latest: true}}), got {{range: [{start}, {end}]}}"
            )
        return {"mode": LATEST}
    if mode == ANY:
        size = None if start is None or end is None else end - start + 1
        if size is None or size < 2:
            raise ValueError(
                f"dependency {dep}: mode any needs a window of several partitions, e.g. {{range: [-6, 0], mode: any}}"
            )
        least = weak.get("min", 1)
        if isinstance(least, bool) or not isinstance(least, int) or not 1 <= least <= size:
            raise ValueError(f"dependency {dep}: min must be an integer from 1 to the window's {size} partitions")
        return {"mode": ANY, "min": least}
    return {}


def _parse_offsets(spec: Any, dep: str) -> tuple[int | None, int | None]:
    if spec is None or spec == {}:
        return None, None
    if not isinstance(spec, Mapping) or len(spec) != 1:
        raise ValueError(f"dependency {dep}: expected one of {{set: [n, ...]}}, {{range: [a, b]}}, got {spec!r}")
    kind, values = next(iter(spec.items()))
    if not isinstance(values, list) or not all(isinstance(v, int) for v in values):
        raise ValueError(f"dependency {dep}: {kind} needs a list of integers, got {values!r}")
    if kind == "set":
        return _contiguous_set(values, dep)
    if kind == "range":
        if len(values) != 2 or values[0] > values[1]:
            raise ValueError(f"dependency {dep}: a range is [start, end] with start <= end, got {values}")
        return values[0], values[1]
    raise ValueError(f"dependency {dep}: unknown offset kind {kind!r} (use set or range)")


def _contiguous_set(values: list[int], dep: str) -> tuple[int, int]:
    """A week may be written as its days, ``set: [0, 1, 2, 3, 4, 5, 6]``: a set without holes is that range.

    A set with holes (``[-7, -1]``) has no Dagster partition mapping: a time-window mapping is one window.
    """
    offsets = sorted(set(values))
    if not offsets:
        raise ValueError(f"dependency {dep}: a set needs at least one offset, got []")
    holes = sorted(set(range(offsets[0], offsets[-1] + 1)) - set(offsets))
    if holes:
        raise ValueError(
            f"dependency {dep}: set {values} has holes (missing {holes}); a dependency maps one contiguous"
            f" window of periods, so use a set without holes, a range [{offsets[0]}, {offsets[-1]}], or"
            f" read the periods you need from a table that has them"
        )
    return offsets[0], offsets[-1]


@plain_dataclass(frozen=True)
class External:
    """Where and how an external producer delivers a table.

    ``csv_files``: ``<location>/dt=YYYY-MM-DD/part-*.csv`` (with a header) and a ``marker`` file written
    last; ``delta``: a Delta table partitioned by ``dt``. ``location`` is relative to the external root
    (``WAREHOUSE_EXTERNAL_ROOT``) or an absolute path.
    """

    format: str
    location: str
    producer: str = ""
    marker: str = "_SUCCESS"

    @classmethod
    def parse(cls, spec: Any) -> External:
        if not isinstance(spec, Mapping) or spec.get("format") not in EXTERNAL_FORMATS or not spec.get("location"):
            raise ValueError(f"external needs format ({' or '.join(EXTERNAL_FORMATS)}) and location")
        return cls(
            format=str(spec["format"]),
            location=str(spec["location"]),
            producer=str(spec.get("producer", "")),
            marker=str(spec.get("marker", "_SUCCESS")),
        )


@plain_dataclass(frozen=True)
class TableState:
    """A named state a table's partitions pass through, in the order declared (``estimated`` then ``completed``),
    and what a partition needs to reach it: each of the table's dependencies as declared, a narrower window of one
    (same period, within the declared offsets), or none of it (read as empty)."""

    name: str
    deps: tuple[Dependency, ...]


def parse_states(spec: Any, deps: tuple[Dependency, ...]) -> tuple[TableState, ...]:
    """``states: {estimated: {ext.fx_rate: {set: [-1]}}, completed: {}}``: at least two, each naming only declared
    dependencies; a state's window of a dependency lies within the declared one (the reverse index and the taint
    closure follow the declared window, so every state's inputs are in it)."""
    if spec is None:
        return ()
    if not isinstance(spec, Mapping) or len(spec) < 2:
        raise ValueError(
            "states lists at least two states in order, each with what it needs, e.g. "
            "{estimated: {ext.fx_rate: {set: [-1]}}, completed: {}}"
        )
    declared = {dep.table: dep for dep in deps}
    states = []
    for name, overrides in spec.items():
        if not re.fullmatch(r"[a-z][a-z0-9_]*", str(name)):
            raise ValueError(f"state {name!r}: a state is named in lower case, e.g. estimated")
        overrides = overrides or {}
        if not isinstance(overrides, Mapping):
            raise ValueError(f"state {name}: map each dependency it needs differently to its window, or to none")
        unknown = sorted(set(overrides) - set(declared))
        if unknown:
            raise ValueError(f"state {name}: {', '.join(unknown)} is not a dependency of the table")
        needs = []
        for dep in deps:
            if dep.table not in overrides:
                needs.append(dep)
            elif overrides[dep.table] not in (None, "none"):
                needs.append(_narrowed(name, dep, overrides[dep.table]))
        states.append(TableState(str(name), tuple(needs)))
    return tuple(states)


def _narrowed(state: str, dep: Dependency, spec: Any) -> Dependency:
    start, end = _parse_offsets(spec, dep.table)
    low, high = (0, 0) if dep.start_offset is None else (dep.start_offset, dep.end_offset)
    if start is None or end is None or high is None or not low <= start <= end <= high:
        raise ValueError(
            f"state {state}: the window of {dep.table} must lie within the declared one ({{range: [{low}, {high}]}}), "
            f"got {spec!r}"
        )
    return replace(dep, start_offset=start, end_offset=end)


_REGION_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
# the years over which a region's zone must keep whole-hour offsets: its day must be a run of whole hours
_REGION_YEARS = range(2000, 2101)


def parse_regions(spec: Any) -> tuple[tuple[str, str], ...]:
    """``regions: {shanghai: Asia/Shanghai, los_angeles: America/Los_Angeles}``: each region's name and the IANA
    time zone whose midnights start its days, validated; none when ``spec`` is None."""
    if spec is None or spec == ():
        return ()
    if isinstance(spec, tuple):
        spec = dict(spec)
    if not isinstance(spec, Mapping) or not spec:
        raise ValueError(
            "regions maps each region's name to its IANA time zone, e.g. {los_angeles: America/Los_Angeles}"
        )
    regions = []
    for name, zone in spec.items():
        if not isinstance(name, str) or not _REGION_NAME.match(name):
            raise ValueError(f"region {name!r}: a region is named in lower case, e.g. los_angeles")
        try:
            tz = ZoneInfo(str(zone))
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"region {name}: {zone!r} is not an IANA time zone (e.g. America/Los_Angeles)") from None
        odd = next(
            (
                at
                for year in _REGION_YEARS
                for month in (1, 4, 7, 10)
                if (offset := (at := datetime(year, month, 1, tzinfo=UTC)).astimezone(tz).utcoffset()) is not None
                and offset.total_seconds() % 3600
            ),
            None,
        )
        if odd is not None:
            raise ValueError(
                f"region {name}: {zone} is {odd.astimezone(tz):%z} on {odd:%Y-%m-%d}, not a whole number of hours from "
                "UTC: its days would not be whole hours of the hourly tables it reads"
            )
        regions.append((name, str(zone)))
    return tuple(regions)


# --- the tables: one typed model per kind, validated by pydantic ------------------------------------------------


_SIZE = re.compile(r"^(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>[KMG]i?B)$", re.IGNORECASE)
_UNITS = {"k": 2**10, "m": 2**20, "g": 2**30}
MIN_FILE_SIZE, MAX_FILE_SIZE = 2**20, 2**31  # 1 MiB .. 2 GiB


def byte_size(value: Any, what: str) -> int:
    """``64MB`` / ``512KB`` / ``1GB`` (binary units) or a number of bytes, between 1 MiB and 2 GiB."""
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a size such as 64MB, got {value!r}")
    if isinstance(value, int):
        size = value
    else:
        match = _SIZE.match(str(value).strip())
        if not match:
            raise ValueError(f"{what} must be a size such as 64MB or 512KB, got {value!r}")
        size = int(float(match["n"]) * _UNITS[match["unit"][0].lower()])
    if not MIN_FILE_SIZE <= size <= MAX_FILE_SIZE:
        raise ValueError(f"{what} must be between 1MB and 2GB, got {value!r}")
    return size


def _names(value: Any, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ValueError(f"{what} must be a list of column names")


_TAG_WORD = re.compile(r"[A-Za-z0-9_.-]{1,50}")


@dataclass(frozen=True, kw_only=True)
class Table:
    """What every table has, whatever builds it. The kinds: :class:`OdsTable`, :class:`DerivedTable`,
    :class:`ExternalTable`."""

    layer: str
    name: str
    period: str
    path: Path
    primary_key: tuple[str, ...] = ()
    description: str = ""
    owner: str = "warehouse-team"
    zorder: tuple[str, ...] = ()  # the columns a partition's files are Z-ordered by, in order
    # the size of the files Z-order writes (Delta's default when None): what a lookup can skip is bounded by the
    # number of files of its partition, so a table sets it from its partitions' size
    zorder_file_size: int | None = None
    deps: tuple[InstanceOf[Dependency], ...] = ()
    # ODS: source columns; external: delivered columns; derived: output (required if self-dependent)
    columns: tuple[tuple[str, str], ...] = ()
    checks: tuple[InstanceOf[Check], ...] = ()
    sla: InstanceOf[Sla] | None = None
    # the labels the Spark pool that builds it must have (``compute: {region: eu}``), in label order
    compute: tuple[tuple[str, str], ...] = ()

    @field_validator("primary_key", "zorder", mode="before")
    @classmethod
    def _column_names(cls, value: Any, info: Any) -> tuple[str, ...]:
        return _names(value, info.field_name)

    @field_validator("zorder_file_size", mode="before")
    @classmethod
    def _file_size(cls, value: Any) -> int | None:
        return None if value is None else byte_size(value, "zorder.file_size")

    @model_validator(mode="after")
    def _file_size_needs_columns(self) -> Table:
        if self.zorder_file_size is not None and not self.zorder:
            raise ValueError("zorder.file_size needs zorder.by: the columns the files are Z-ordered by")
        return self

    @field_validator("compute", mode="before")
    @classmethod
    def _compute(cls, value: Any) -> tuple[tuple[str, str], ...]:
        if value is None or isinstance(value, tuple):
            return value or ()
        scalar = (str, int, float)
        if not isinstance(value, Mapping) or not all(isinstance(v, scalar) and str(v) for v in value.values()):
            raise ValueError(f"compute must map compute pool labels to values, e.g. {{region: eu}}, got {value!r}")
        labels = tuple(sorted((str(k), str(v)) for k, v in value.items()))
        for label, setting in labels:  # each becomes an asset tag: Dagster's tags allow these characters only
            if not (_TAG_WORD.fullmatch(label) and _TAG_WORD.fullmatch(setting)):
                raise ValueError(
                    f"compute: {label}: {setting}: labels and values are letters, digits, '-', '_' and '.' (at most 50)"
                )
        return labels

    @field_validator("description", mode="before")
    @classmethod
    def _text(cls, value: Any) -> str:
        return "" if value is None else str(value).strip()

    @field_validator("owner", mode="before")
    @classmethod
    def _owner(cls, value: Any) -> str:
        return str(value)

    @field_validator("columns", mode="before")
    @classmethod
    def _columns(cls, value: Any) -> Any:
        """``columns: {name: spark type}``, validated."""
        if value is None or isinstance(value, tuple):
            return value or ()
        if not isinstance(value, Mapping) or not value:
            raise ValueError("columns must map each column to a Spark type")
        for column, ctype in value.items():
            if not is_spark_type(ctype):
                raise ValueError(f"column {column}: unsupported type {ctype!r}")
        return tuple((str(k), str(v)) for k, v in value.items())

    @field_validator("checks", mode="before")
    @classmethod
    def _checks(cls, value: Any) -> Any:
        return value if isinstance(value, tuple) else parse_checks(value)

    @field_validator("sla", mode="before")
    @classmethod
    def _sla(cls, value: Any) -> Any:
        return value if value is None or isinstance(value, Sla) else Sla.parse(value)

    @model_validator(mode="after")
    def _deadline_is_daily(self) -> Table:
        if self.sla is not None and self.sla.deadline is not None and self.period != "daily":
            raise ValueError("sla.deadline (next morning) is for daily tables; use within for other periods")
        return self

    @cached_property  # read millions of times a day by the dependency center
    def fqn(self) -> str:
        return f"{self.layer}.{self.name}"

    @property
    def key(self) -> list[str]:
        return [self.layer, self.name]

    @property
    def partition_by(self) -> list[str]:
        return PARTITION_COLUMNS[self.period]

    @property
    def state_names(self) -> tuple[str, ...]:
        """The states its partitions pass through, in order (none: a partition is built once, whole)."""
        return ()

    @property
    def is_regional(self) -> bool:
        """Whether each day is one partition per region (:attr:`DerivedTable.regions`)."""
        return False

    @property
    def row_key(self) -> tuple[str, ...]:
        """The columns that identify one row of a partition: the primary key, unless the table keeps each change."""
        return self.primary_key

    @property
    def is_ods(self) -> bool:
        return isinstance(self, OdsTable)

    @property
    def is_external(self) -> bool:
        return isinstance(self, ExternalTable)

    @property
    def is_windows(self) -> bool:
        """An ODS table's completeness windows of a mini-batch period (no data of its own)."""
        return isinstance(self, OdsWindows)

    @property
    def is_source(self) -> bool:
        """Built outside the compiler: ODS (ingestion, and its completeness windows) and external tables (their
        producers)."""
        return not isinstance(self, DerivedTable | StaticTable)

    @property
    def is_static(self) -> bool:
        return isinstance(self, StaticTable)


@dataclass(frozen=True, kw_only=True)
class OdsTable(Table):
    """An hourly ODS table fed by CDC from ``source_database``'s shard tables (``source_tables``, a regular
    expression), partitioned by the local hour of ``partition_time``.

    ``kind: time_series`` (the default) mirrors the source: one live row per key, in the hour of its
    ``partition_time``. ``kind: snapshot`` is for a source without a time column (a product catalogue, a config
    table): each change is kept as a row of its own, ``_changed_at`` (its binlog time) its partition time, a
    DELETE as a row flagged ``_deleted``; a daily snapshot table consolidates the hours into the picture of each
    day (yesterday's picture, then the day's changes, the newest per key)."""

    source_database: str
    source_tables: str
    partition_time: str
    kind: str = TIME_SERIES
    heartbeat_idle_grace_minutes: int | None = None  # heartbeats may prove an idle shard (see readiness)
    completeness_threshold: float = DEFAULT_COMPLETENESS  # ingested rows / source rows for a ready hour

    @property
    def changelog(self) -> bool:
        """Each change is a row of its own (a DELETE too, flagged ``_deleted``): a snapshot's change stream."""
        return self.kind == SNAPSHOT

    @property
    def row_key(self) -> tuple[str, ...]:
        # a snapshot's changelog holds each change of a key: one row per key and binlog time
        return (*self.primary_key, CHANGED_AT) if self.changelog else self.primary_key

    @field_validator("heartbeat_idle_grace_minutes", mode="before")
    @classmethod
    def _grace(cls, value: Any) -> Any:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"idle_proof.heartbeat_grace_minutes must be a non-negative integer, got {value!r}")
        return value

    @field_validator("completeness_threshold", mode="before")
    @classmethod
    def _threshold(cls, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            raise ValueError(f"completeness.threshold must be a fraction in [0, 1] (e.g. 0.99995), got {value!r}")
        return float(value)

    @model_validator(mode="after")
    def _hourly_on_declared_columns(self) -> OdsTable:
        if self.layer != "ods" or self.period != "hourly":
            raise ValueError("YAML declarations are for hourly ODS tables fed by CDC")
        if self.kind not in ODS_KINDS:
            raise ValueError(f"kind must be one of {', '.join(ODS_KINDS)} for an ODS table, got {self.kind!r}")
        if (self.kind == SNAPSHOT) != (self.partition_time == CHANGED_AT):
            raise ValueError(f"{CHANGED_AT} is the partition time of a snapshot ODS table, and only of one")
        if not self.primary_key:
            raise ValueError("primary_key is required: the columns that identify a source row")
        columns = dict(self.columns)
        if not columns:
            raise ValueError("columns must map each column to a Spark type")
        for col in [*self.primary_key, self.partition_time]:
            if col not in columns:
                raise ValueError(f"{col!r} is not a declared column")
        if columns[self.partition_time] != "timestamp":
            raise ValueError(f"partition_time {self.partition_time!r} must be a timestamp column")
        return self


@dataclass(frozen=True, kw_only=True)
class DerivedTable(Table):
    """A table the compiler builds from its Spark SQL (``sql``), on the mapped partitions of ``deps``."""

    sql: str
    states: tuple[InstanceOf[TableState], ...] = ()  # in order; empty: a partition is built once, whole
    # the static tables it reads, whole, in every partition (no offsets: a static table has no partitions)
    references: tuple[InstanceOf[Dependency], ...] = ()
    # time_series: each partition from its inputs; cumulative: each adds its own data to the previous partition's,
    # starting afresh at the start of each ``resets`` period (Monday, Monday + Tuesday, ...)
    kind: str = TIME_SERIES
    resets: str | None = None
    late_data: InstanceOf[LateDataPolicy] = DEFAULT_LATE_DATA
    # false: late data rebuilds whole partitions even where the SQL proves a key's rows local to that key
    # (:mod:`warehouse_assets.catalog.key_locality`), e.g. while a key-scoped rebuild of the table is distrusted
    incremental: bool = True
    # regional days: each day is one partition per region, [its zone's midnight, the next one), built as soon as that
    # region's day is complete; (region, IANA zone) in declared order
    regions: tuple[tuple[str, str], ...] = ()

    @field_validator("regions", mode="before")
    @classmethod
    def _regions(cls, value: Any) -> tuple[tuple[str, str], ...]:
        return parse_regions(value)

    @property
    def is_regional(self) -> bool:
        return bool(self.regions)

    @property
    def partition_by(self) -> list[str]:
        return [*PARTITION_COLUMNS[self.period], "region"] if self.regions else PARTITION_COLUMNS[self.period]

    def zone_of(self, region: str) -> str:
        """The IANA zone of ``region``; ValueError naming the table's regions when it has no such region."""
        for name, zone in self.regions:
            if name == region:
                return zone
        known = ", ".join(name for name, _ in self.regions) or "none: it is not regional"
        raise ValueError(f"{self.fqn} has no region {region!r} (its regions: {known})")

    @model_validator(mode="after")
    def _regional_days(self) -> DerivedTable:
        if not self.regions:
            return self
        if self.period != "daily":
            raise ValueError(
                f"regions split a day into one partition per region: period must be daily, got {self.period}"
            )
        if self.kind != TIME_SERIES or self.states:
            raise ValueError("a table with regions is a time series without states: each region's day from its hours")
        if self.sla is not None:
            raise ValueError("a table with regions declares no sla: its deadline is a business day's, not a region's")
        if any(check.kind == "anomaly" for check in self.checks):
            raise ValueError(
                "a table with regions declares no anomaly check: its trailing periods are business days, not a region's"
            )
        for dep in self.deps:
            if dep.table == self.fqn or dep.start_offset is not None or dep.weak or dep.within is not None:
                raise ValueError(
                    f"a table with regions reads each region's day from exactly the hours in it: {dep.table} takes no "
                    "offsets, mode or within"
                )
        return self

    @field_validator("incremental", mode="before")
    @classmethod
    def _incremental(cls, value: Any) -> bool:
        if not isinstance(value, bool):  # pydantic would take "no" or 0 for false: a typo must not pass as one
            raise ValueError(
                f"incremental must be true or false (false: late data rebuilds whole partitions), got {value!r}"
            )
        return value

    @field_validator("late_data", mode="before")
    @classmethod
    def _late_data(cls, value: Any) -> Any:
        return (
            DEFAULT_LATE_DATA
            if value is None
            else value
            if isinstance(value, LateDataPolicy)
            else (LateDataPolicy.parse(value))
        )

    @property
    def state_names(self) -> tuple[str, ...]:
        return tuple(state.name for state in self.states)

    def late_data_policy(self, dep: Dependency) -> LateDataPolicy:
        """The policy of late data arriving through ``dep``: its own, or the table's."""
        return dep.late_data if dep.late_data is not None else self.late_data

    @model_validator(mode="after")
    def _kind(self) -> DerivedTable:
        if self.kind not in DERIVED_KINDS:
            raise ValueError(
                f"kind must be one of {', '.join(DERIVED_KINDS)} for a table built from SQL, got {self.kind!r}"
            )
        if self.kind == SNAPSHOT:
            own = [dep for dep in self.deps if dep.table == self.fqn]
            if [(d.start_offset, d.end_offset, d.within) for d in own] != [(-1, -1, None)] or not self.primary_key:
                raise ValueError(
                    f"kind snapshot is the whole picture each {PERIOD_NOUN[self.period]}: the previous "
                    f"partition's ({self.fqn}: {{set: [-1]}}) with the period's changes applied, the newest per "
                    "primary_key (declare it)"
                )
        if self.kind != CUMULATIVE:
            if self.resets is not None:
                raise ValueError("resets is for kind: cumulative (the period its accumulation starts afresh)")
            return self
        coarser = [p for p, order in PERIOD_ORDER.items() if order > PERIOD_ORDER[self.period]]
        if self.resets not in coarser:
            raise ValueError(
                f"kind cumulative needs resets: the period whose start begins a new accumulation, one of "
                f"{', '.join(coarser) or '(none: nothing is coarser than ' + self.period + ')'}; got {self.resets!r}"
            )
        own = [dep for dep in self.deps if dep.table == self.fqn]
        if [(d.start_offset, d.end_offset) for d in own] != [(-1, -1)]:
            raise ValueError(
                f"kind cumulative adds each {self.period} partition to the previous one: the table reads itself at "
                f"T-1 ({self.fqn}: {{set: [-1]}})"
            )
        if own[0].within not in (None, self.resets):
            raise ValueError(f"{self.fqn} resets {self.resets}: its T-1 cannot be within {own[0].within}")
        return self

    @model_validator(mode="after")
    def _self_dependency(self) -> DerivedTable:
        own = [dep for dep in self.deps if dep.table == self.fqn]
        for dep in own:
            if dep.end_offset is None or dep.end_offset >= 0:
                raise ValueError(
                    f"{self.fqn} reads itself: a self-dependency needs a negative offset, e.g. {{set: [-1]}} for T-1"
                )
            if dep.weak:
                raise ValueError(
                    f"{self.fqn} reads itself: a self-dependency is strict (mode {dep.mode} would build a partition "
                    "on a T-1 that is not there)"
                )
        if own and self.states:
            raise ValueError(f"{self.fqn} reads itself: a self-dependent table has no states (each day builds on T-1)")
        if own and not self.columns:
            raise ValueError(
                f"{self.fqn} depends on itself: declare its output columns (columns: {{name: type}}), "
                "the first partition reads an empty T-1 of that shape"
            )
        return self


@dataclass(frozen=True, kw_only=True)
class StaticTable(Table):
    """The static kind: one unpartitioned reference table (country codes, a city's tier), whose SQL spells
    out its rows (``SELECT * FROM VALUES ...``). Dagster's asset has no partitions; it is built when it has never
    been, and again when its SQL changes (the ``static_tables`` sensor). Every partition of a table that reads it
    needs it built and valid (the gate: its one partition, :data:`WHOLE`); a new version is read by the partitions
    built from then on, and the ones built before are rebuilt only when it is marked tainted (the taint closure
    holds every partition of the tables that read it)."""

    sql: str

    @property
    def kind(self) -> str:
        return STATIC

    @property
    def partition_by(self) -> list[str]:
        return []

    @model_validator(mode="after")
    def _reference_data(self) -> StaticTable:
        if self.period != STATIC:
            raise ValueError("a static table has no period: its one partition is the whole table (drop period)")
        if self.deps:
            raise ValueError(
                "a static table holds reference data its SQL spells out (SELECT * FROM VALUES ...): it reads no "
                f"table, got {', '.join(d.table for d in self.deps)}"
            )
        for what, value in (("sla", self.sla), ("zorder", self.zorder), ("checks", self.checks)):
            if value:
                raise ValueError(f"{what} is for partitioned tables; a static table is one small whole table")
        if not self.columns:
            raise ValueError("a static table declares its columns (columns: {name: type}), which its SQL must produce")
        return self


@dataclass(frozen=True, kw_only=True)
class ExternalTable(Table):
    """A daily table produced outside the platform, reported by its producer's sensor as it arrives."""

    external: InstanceOf[External]

    @field_validator("external", mode="before")
    @classmethod
    def _external(cls, value: Any) -> Any:
        return value if isinstance(value, External) else External.parse(value)

    @model_validator(mode="after")
    def _daily_with_columns(self) -> ExternalTable:
        if self.period != "daily":
            raise ValueError(f"external tables are delivered per day: period must be daily, got {self.period!r}")
        if not self.columns:
            raise ValueError("columns must map each column to a Spark type")
        if any(column == "dt" for column, _ in self.columns):
            raise ValueError("dt is the partition column of every external table; do not declare it")
        return self


@dataclass(frozen=True, kw_only=True)
class OdsWindows(Table):
    """The completeness of an ODS table per window of a mini-batch period (``5min``, ``10min``, ``15min``): a partition
    is reported once every 5-minute window in it is complete (ingested >= the ODS table's threshold of the source's
    count). It holds no data of its own: a mini-batch table's reads of ``source`` (the ODS table) wait for it. The
    catalog adds one for each ODS table and mini-batch period some table reads it at (:func:`windows_name`)."""

    source: str  # the ODS table, layer.name

    @model_validator(mode="after")
    def _minute_period(self) -> OdsWindows:
        if self.period not in MINUTE_PERIODS:
            raise ValueError(f"completeness windows are of a mini-batch period ({', '.join(MINUTE_PERIODS)})")
        return self


def windows_name(ods: str, period: str) -> str:
    """The completeness windows of the ODS table ``ods`` at ``period``: ``ods.order`` at 5min is ``ods.order_5min``."""
    return f"{ods}_{period}"


@plain_dataclass
class Catalog:
    tables: dict[str, Table] = field(default_factory=dict)

    def __getitem__(self, fqn: str) -> Table:
        return self.tables[fqn]

    def __iter__(self) -> Iterator[Table]:
        return iter(self.tables.values())

    def ods(self) -> list[OdsTable]:
        return [t for t in self.tables.values() if isinstance(t, OdsTable)]

    def externals(self) -> list[ExternalTable]:
        return [t for t in self.tables.values() if isinstance(t, ExternalTable)]

    def windows(self, ods: str | None = None) -> list[OdsWindows]:
        """The completeness windows (of the ODS table ``ods`` only, if given)."""
        return [t for t in self.tables.values() if isinstance(t, OdsWindows) and ods in (None, t.source)]

    def derived(self) -> list[DerivedTable]:
        return [t for t in self.tables.values() if isinstance(t, DerivedTable)]

    def statics(self) -> list[StaticTable]:
        return [t for t in self.tables.values() if isinstance(t, StaticTable)]

    def referencing(self, fqn: str) -> list[DerivedTable]:
        """The tables that read the static table ``fqn``."""
        return [t for t in self.derived() if any(ref.table == fqn for ref in t.references)]

    def lookup(self, name: str) -> Table:
        """The table named ``name`` (``layer.table``); :class:`UnknownTable` suggesting the closest names if none is."""
        if name in self.tables:
            return self.tables[name]
        raise UnknownTable(name, self.closest(name), sorted(self.tables))

    def closest(self, name: str, n: int = 3) -> list[str]:
        """The table names closest to ``name``: those whose table part is ``name`` (the layer left out), then the
        nearest spellings of either the whole name or its table part."""
        wanted = name.strip().lower()
        exact = [fqn for fqn, t in self.tables.items() if t.name.lower() == wanted.rsplit(".", 1)[-1]]
        by_name: dict[str, str] = {t.name: fqn for fqn, t in self.tables.items()}
        near = difflib.get_close_matches(wanted, list(self.tables), n=n, cutoff=0.6)
        bare = wanted.rsplit(".", 1)[-1]
        near += [by_name[m] for m in difflib.get_close_matches(bare, list(by_name), n=n, cutoff=0.6)]
        return list(dict.fromkeys([*exact, *near]))[:n]


class UnknownTable(ValueError):
    """A table name the catalog does not know, with the closest names it does."""

    def __init__(self, name: str, suggestions: list[str], known: list[str]):
        self.name, self.suggestions = name, suggestions
        layered = "" if "." in name else " (tables are named layer.table)"
        hint = f"did you mean {' or '.join(suggestions)}?" if suggestions else f"known tables: {', '.join(known)}"
        super().__init__(f"unknown table {name!r}{layered}: {hint}")
