"""Which partitions of a table can ever be built, decided once from the catalog: the first buildable partition of
each table (:func:`first_buildable`) and why one before it never can be (:func:`never_buildable`).

Every upstream partition a partition's window needs, through every dependency, must lie after the warehouse start
and be buildable itself: a 30-day window's first 29 days, a T-7's first week, and whatever depends on them, never are.
The compiler reads the first buildable partition for each asset; ``warehouse why`` and the taint's repair explain a
partition that can never be built. The run-time gate (:mod:`warehouse_assets.materialize.gate`) judges the
partitions that can.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, NamedTuple

from warehouse_assets.catalog import (
    ANY,
    BY_PERIOD,
    DEADLINE,
    LATEST,
    WHOLE,
    DerivedTable,
    UpstreamPartitions,
    periods,
    regional_key,
    split_regional_key,
    upstream_partitions,
)
from warehouse_assets.materialize.gate import span, too_few

if TYPE_CHECKING:
    from warehouse_assets.catalog import Catalog, Dependency, Table


@dataclass(frozen=True)
class FirstBuildable:
    """Where a table's buildable partitions begin: ``partition`` (None: not within ``BUILDABLE_SCAN`` periods of its
    start), and why the ones before it can never be built (empty when it is the table's first partition)."""

    partition: str | None
    reason: str = ""


BUILDABLE_SCAN = 1000  # periods looked at from a table's first partition: windows reach back days, not years
_NO_LATER_THAN = datetime(2200, 1, 1, tzinfo=UTC)  # existence judged by the start alone: the future is no reason


class Edge(NamedTuple):
    """One dependency of a table as the search for its first buildable partition reads it."""

    dep: Dependency
    upstream: Table
    shape: int  # tables whose windows have the same shape share them


@dataclass
class BuildableSearch:
    """What :func:`first_buildable` found so far, shared by the tables of one catalog: each table's answer, the
    upstream windows it judged by shape (periods, offsets, mode), which thousands of tables share, and the calendar
    steps it took (a partition's start, the partition after it). Dagster's mapping costs milliseconds a window and
    its calendar arithmetic tens of microseconds a step: without sharing, compiling 10,000 tables would take many
    minutes, and the scan's steps alone, hundreds of thousands of them, tens of seconds."""

    tables: dict[str, FirstBuildable] = field(default_factory=dict)
    windows: dict[tuple[int, str], UpstreamPartitions] = field(default_factory=dict)
    shapes: dict[tuple[object, ...], int] = field(default_factory=dict)
    edges: dict[tuple[str, int], list[Edge]] = field(default_factory=dict)
    starts: dict[tuple[str, str], datetime] = field(default_factory=dict)
    following: dict[tuple[str, str], str | None] = field(default_factory=dict)

    def edges_of(self, catalog: Catalog, table: Table, deps: Sequence[Dependency], state: int) -> list[Edge]:
        """The dependencies ``deps`` of ``table`` (its own, ``state`` -1, or those of its state ``state``), each with
        its upstream table and the number of its window's shape. Worked out once per table: the scan asks for them
        at every partition it tries, and hashing a dependency each time cost a third of the search."""
        found = self.edges.get((table.fqn, state))
        if found is None:
            found = self.edges[(table.fqn, state)] = []
            for dep in deps:
                upstream = catalog[dep.table]
                # a window's shape is that of the periods, or of the regions' days on either side
                shape_of = (
                    table.period,
                    upstream.period,
                    replace(dep, table=""),
                    dep.table == table.fqn,
                    _regions(table),
                    _regions(upstream),
                )
                shape = self.shapes.setdefault(shape_of, len(self.shapes))
                found.append(Edge(dep, upstream, shape))
        return found

    def window(self, catalog: Catalog, table: Table, edge: Edge, key: str) -> UpstreamPartitions:
        """``upstream_partitions`` of ``edge`` at ``key``, judged by the start alone (no current time)."""
        found = self.windows.get((edge.shape, key))
        if found is None:
            found = self.windows[(edge.shape, key)] = upstream_partitions(
                catalog, table, edge.dep, key, current_time=_NO_LATER_THAN
            )
        return found

    def start(self, period: str, key: str) -> datetime:
        """When partition ``key`` of ``period`` starts."""
        found = self.starts.get((period, key))
        if found is None:
            found = self.starts[(period, key)] = BY_PERIOD[period].time_window_for_partition_key(key).start
        return found

    def first_key(self, period: str) -> str | None:
        """The first partition of ``period``."""
        if (period, "") not in self.following:
            pdef = BY_PERIOD[period]
            self.following[(period, "")] = pdef.get_partition_key_for_timestamp(pdef.start.timestamp())
        return self.following[(period, "")]

    def next_key(self, period: str, key: str) -> str | None:
        """The partition of ``period`` after ``key``."""
        if (period, key) not in self.following:
            pdef = BY_PERIOD[period]
            self.following[(period, key)] = pdef.get_partition_key_for_timestamp(
                pdef.time_window_for_partition_key(key).end.timestamp()
            )
        return self.following[(period, key)]


def first_buildable(catalog: Catalog, table: Table, _known: BuildableSearch | None = None) -> FirstBuildable:
    """The first partition of ``table`` that can ever be built: every upstream partition its window needs, through
    every dependency, lies after the warehouse start, and was itself buildable. A 30-day window's first 29 days, a
    T-7's first week, and whatever depends on them, never are (Dagster shows them missing for good)."""
    known = BuildableSearch() if _known is None else _known
    if table.fqn in known.tables:
        return known.tables[table.fqn]
    if table.is_static:  # its one partition reads nothing
        return FirstBuildable(WHOLE)
    if isinstance(table, DerivedTable) and table.is_regional:
        found = _first_buildable_regional(catalog, table, known)
        known.tables[table.fqn] = found
        return found
    key = known.first_key(table.period)
    found = FirstBuildable(key)
    first_reason = ""
    for _ in range(BUILDABLE_SCAN):
        if key is None:
            break
        reason = _unbuildable_because(catalog, table, key, known)
        if reason is None:
            found = FirstBuildable(key, first_reason)
            break
        first_reason = first_reason or reason
        key = known.next_key(table.period, key)
    else:
        found = FirstBuildable(None, first_reason)
    known.tables[table.fqn] = found
    return found


def _regions(table: Table) -> tuple[tuple[str, str], ...]:
    return table.regions if isinstance(table, DerivedTable) else ()


def _first_buildable_regional(catalog: Catalog, table: DerivedTable, known: BuildableSearch) -> FirstBuildable:
    """Each region's first buildable day (kept as the table's ``table|region``); the table's: the first region's, or
    the first that can never be built."""
    found: list[FirstBuildable] = []
    for region, _ in table.regions:
        day = periods().start
        region_found = FirstBuildable(None)
        first_reason = ""
        for _ in range(BUILDABLE_SCAN):
            key = regional_key(day.isoformat(), region)
            reason = _unbuildable_because(catalog, table, key, known)
            if reason is None:
                region_found = FirstBuildable(key, first_reason)
                break
            first_reason = first_reason or reason
            day += timedelta(days=1)
        else:
            region_found = FirstBuildable(None, first_reason)
        known.tables[regional_key(table.fqn, region)] = region_found
        found.append(region_found)
    return next((f for f in found if f.partition is None), found[0])


def _first_day_of(catalog: Catalog, table: DerivedTable, region: str, known: BuildableSearch) -> FirstBuildable:
    """The first buildable day of ``region`` of a table with regions."""
    first_buildable(catalog, table, known)
    return known.tables[regional_key(table.fqn, region)]


def _unbuildable_because(
    catalog: Catalog, table: Table, key: str, known: BuildableSearch, precise: bool = False
) -> str | None:
    """Why partition ``key`` of ``table`` can never be built, or None if it can (in one of its states, if it has).

    ``precise``: an upstream partition that can never be built is explained at that partition, all the way up, not
    by its table's first partition's reason (what the scan for the first buildable partition, which asks at every
    step, makes do with)."""
    if isinstance(table, DerivedTable) and table.states:
        reasons = [
            _unbuildable_on(catalog, table, known.edges_of(catalog, table, state.deps, number), key, known, precise)
            for number, state in enumerate(table.states)
        ]
        return None if None in reasons else reasons[0]
    return _unbuildable_on(catalog, table, known.edges_of(catalog, table, table.deps, -1), key, known, precise)


def _unbuildable_on(
    catalog: Catalog, table: Table, edges: list[Edge], key: str, known: BuildableSearch, precise: bool = False
) -> str | None:
    for edge in edges:
        dep, upstream = edge.dep, edge.upstream
        if dep.table == table.fqn or dep.mode == DEADLINE:
            continue  # the chain starts at the first buildable partition: its T-1 is not needed; past a deadline
            # the partition runs without what is not there
        up = known.window(catalog, table, edge, key)
        if dep.mode in (ANY, LATEST):
            if too_few(dep, up):
                return (
                    f"its window of {dep.table} ({span([*up.nonexistent, *up.keys])}) holds fewer than {dep.min} "
                    f"partition(s) that can exist: {_existence(upstream, known)}"
                )
            continue
        if up.nonexistent:
            return f"its window needs {dep.table} back to {up.nonexistent[0]}, {_before_first(upstream, known)}"
        if isinstance(upstream, DerivedTable) and upstream.is_regional:  # each region's day from its own first
            for up_key in up.keys:
                day, region = split_regional_key(up_key)
                since = _first_day_of(catalog, upstream, region, known)
                if since.partition is None or day < split_regional_key(since.partition)[0]:
                    why = precise and _unbuildable_because(catalog, upstream, up_key, known, precise)
                    return f"it needs {dep.table} {up_key}, which can never be built ({why or since.reason})"
            continue
        since = first_buildable(catalog, upstream, known)
        if up.keys and (
            since.partition is None
            or known.start(upstream.period, up.keys[0]) < known.start(upstream.period, since.partition)
        ):
            why = precise and _unbuildable_because(catalog, upstream, up.keys[0], known, precise)
            return f"it needs {dep.table} {up.keys[0]}, which can never be built ({why or since.reason})"
    return None


def _before_first(upstream: Table, known: BuildableSearch) -> str:
    """``before the warehouse start 2026-01-01``, or where the upstream's partitions begin later than the start (a
    week or a month is a partition only once all of its days are after it), that first partition too."""
    start = periods().start
    first = known.first_key(upstream.period)
    if first is None or known.start(upstream.period, first).date() == start:
        return f"before the warehouse start {start:%Y-%m-%d}"
    return f"before {upstream.fqn}'s first partition {first} (the warehouse starts {start:%Y-%m-%d})"


def _existence(upstream: Table, known: BuildableSearch) -> str:
    """Which partitions of ``upstream`` can exist: from the warehouse start, or from its first partition on."""
    start = periods().start
    first = known.first_key(upstream.period)
    if first is None or known.start(upstream.period, first).date() == start:
        return f"those from the warehouse start {start:%Y-%m-%d} on"
    return f"{upstream.fqn}'s from its first partition {first} on (the warehouse starts {start:%Y-%m-%d})"


def never_buildable(catalog: Catalog, table: Table, partition: str, known: BuildableSearch | None = None) -> str:
    """Why ``partition`` of ``table`` can never be built (its window reaches before what can exist), or ''. The one
    answer ``warehouse why``, the taint plan and the asset descriptions give; ``known``: what a caller asking about
    many partitions found so far."""
    if table.is_static:  # it reads nothing: it can always be built
        return ""
    known = known if known is not None else BuildableSearch()
    since = first_buildable(catalog, table, known)
    if isinstance(table, DerivedTable) and table.is_regional:  # days are dates: ISO strings compare as they do
        day, region = split_regional_key(partition)
        since = _first_day_of(catalog, table, region, known)
        if since.partition is not None and day >= split_regional_key(since.partition)[0]:
            return ""
        first = f"the first one that can be is {since.partition}" if since.partition else "none can be"
        return f"can never be built: {_reason_at(catalog, table, partition, known, since)}; {first}"
    pdef = BY_PERIOD[table.period]
    start = pdef.time_window_for_partition_key(partition).start
    if since.partition is not None and start >= pdef.time_window_for_partition_key(since.partition).start:
        return ""
    first = f"the first one that can be is {since.partition}" if since.partition else "none of its first ones can be"
    return f"can never be built: {_reason_at(catalog, table, partition, known, since)}; {first}"


def _reason_at(catalog: Catalog, table: Table, partition: str, known: BuildableSearch, since: FirstBuildable) -> str:
    """Why ``partition`` itself can never be built: the dates of its own window (``since.reason`` is the table's
    first partition's, whose window reaches back further than a later partition's)."""
    return _unbuildable_because(catalog, table, partition, known, precise=True) or since.reason
