"""A derived table's dependencies as declared: which partitions of an upstream each partition reads (offsets,
ranges, sliding windows), how strictly (``mode``: all of them, a deadline, any or the latest of a window), what it
tolerates (``ignore_dq``, ``accept_tainted``) and the late-data policy of the changes arriving through it; and a
table's states (:class:`TableState`: the same partition built again as more of its inputs arrive).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass as plain_dataclass
from dataclasses import replace
from typing import Any

from warehouse_assets.catalog.calendars import PERIOD_ORDER
from warehouse_assets.catalog.policies import HH_MM, LateDataPolicy

STRICT, DEADLINE, ANY, LATEST = "strict", "deadline", "any", "latest"


DEPENDENCY_MODES = (STRICT, DEADLINE, ANY, LATEST)


# what ``latest: true`` looks back over without a range: the upstream period that holds the partition's start and the
# two before it (a month, a day), of which those ended by the partition's end are candidates
LATEST_LOOKBACK = (-2, 0)


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
            accepted = name_tuple(spec.pop("state"), f"dependency {dep}: state")
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
        if deadline is None or not HH_MM.match(str(deadline)):
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


def name_tuple(value: Any, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ValueError(f"{what} must be a list of column names")
