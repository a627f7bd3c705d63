"""The reverse index of the exact mappings: which downstream partitions need one upstream partition.

The inverse of :func:`warehouse_assets.catalog.upstream_partitions`: given an event on an upstream
(table, partition), :meth:`ReverseIndex.downstream_of` lists the partitions of each direct downstream table
whose exact upstream partitions include it, across periods (hour → day → week → month roll-ups), offsets
(T-1, T-7), sliding windows and self-dependencies, limited to partitions that exist (not before the
downstream's first partition, not in the future).

The index is built once from the catalog: per upstream table, its outgoing edges grouped by their mapping
(mapping, upstream definition, downstream definition); a warehouse has thousands of edges but a few dozen
distinct mappings. A lookup maps the partition once per group by arithmetic on partition positions, never by
scanning the catalog or the partitions' history:

* same period, offsets ``[a, b]`` (T-1, T-7, sliding windows, the identity): downstream partition ``i`` needs
  upstream ``i + a`` … ``i + b``, so upstream ``j`` is needed by downstream ``j - b`` … ``j - a``;
* a roll-up (the default mapping from a finer period, or to a coarser one): the downstream partitions whose window
  overlaps the upstream's window, found by bisection on window starts;
* offsets on a coarser upstream ``[a, b]`` (a day's previous month): downstream partition ``i`` needs the upstream
  periods ``a`` … ``b`` from the one holding its start; of a ``latest`` dependency only those ended by its end.

Positions and windows come from a :class:`Calendar` per partitions definition: Dagster's own keys and window
bounds (so daylight saving time is Dagster's: 23- and 25-hour days, the repeated autumn hour), enumerated once
up to a horizon and extended as time passes. The same arithmetic answers the forward question for the resolver
(:meth:`ReverseIndex.upstream_of`: a dependency's window of existing partitions), where Dagster's mapping costs
milliseconds a partition.

:meth:`ReverseIndex.closure` follows the edges transitively: every partition built, directly or not, from some
partitions (what a taint condemns). Every mapping is monotone and maps a run of consecutive partitions to a run of
consecutive partitions, so the closure is computed on runs of positions, table by table in dependency order, never
partition by partition: a 10-day taint of an ODS table at 10,000 tables costs milliseconds, not the partitions'
count of lookups.

A table with regions is one node per region inside the index (``table|region``), each on the days of its region's
zone (Dagster's daily definition of that zone): an hour maps to the region's days whose windows overlap it, by the same
timestamp arithmetic as any roll-up, and a region's day to the day of that date of the tables that read every region
(all daily definitions from one start date share their positions, so that edge is the identity on positions).
"""

from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right
from collections import defaultdict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from dagster import TimeWindowPartitionMapping, TimeWindowPartitionsDefinition

from warehouse_assets.catalog import (
    LATEST,
    Catalog,
    Dependency,
    DerivedTable,
    Periods,
    anchored,
    partition_mapping,
    periods,
    regional_key,
    split_regional_key,
)

_EXTEND_BY = timedelta(days=62)  # how far past what is asked a calendar enumerates, so that it extends rarely


@dataclass(frozen=True)
class Edge:
    """One dependency seen from its upstream: ``downstream`` reads the upstream through ``dep``."""

    downstream: str  # the downstream table's fqn
    dep: Dependency


@dataclass(frozen=True)
class EdgeMapping:
    """What maps an upstream partition to downstream partitions: shared by every edge that has it."""

    mapping: TimeWindowPartitionMapping
    upstream: TimeWindowPartitionsDefinition
    downstream: TimeWindowPartitionsDefinition
    # offsets on a coarser upstream, in its periods from the one holding the downstream partition's start (the
    # mapping is then Dagster's superset, not used here)
    anchor: tuple[int, int] | None = None
    ends_within: bool = False  # a latest dependency: only upstream partitions ended by the downstream's end
    # same period, kept inside the coarser period holding the downstream partition (a week to date, a cumulative T-1)
    within: TimeWindowPartitionsDefinition | None = None
    # the downstream has regions: this edge maps to its days of ``region`` (``downstream`` is that region's days)
    region: str | None = None
    # the upstream has regions: a region's day maps by its date (``upstream`` is the downstream's own days)
    by_date: bool = False

    def __post_init__(self) -> None:
        # across periods the catalog allows no offsets but the roll-up's and those on a coarser upstream (anchored)
        offsets = (self.mapping.start_offset, self.mapping.end_offset)
        if self.upstream != self.downstream and offsets != (0, 0) and self.anchor is None:
            raise ValueError(f"no reverse mapping for offsets across periods: {self.mapping}")


class Calendar:
    """Every partition of one definition from its first up to a horizon: keys and window bounds (timestamps).

    Timestamps, never datetimes: two datetimes of one zone compare by wall clock, and the autumn hour repeats.

    One calendar per definition serves every index of the process (:func:`calendar_of`): listing an hourly
    definition's years of keys through Dagster is most of what building an index costs, and ``warehouse why`` and
    the forecast build one per question. A calendar only grows, under its lock, bounds before keys, so that a
    reader in another thread never finds a key whose window is not listed yet.
    """

    def __init__(self, pdef: TimeWindowPartitionsDefinition):
        self.pdef = pdef
        self.keys: list[str] = []
        self.position: dict[str, int] = {}
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.horizon = float("-inf")  # every partition whose window ends by then is listed
        self._lock = threading.Lock()

    def cover(self, timestamp: float) -> None:
        """List every partition whose window ends by ``timestamp``."""
        if timestamp <= self.horizon:
            return
        with self._lock:
            if timestamp <= self.horizon:  # another thread extended it meanwhile
                return
            horizon = datetime.fromtimestamp(timestamp, UTC) + _EXTEND_BY
            keys = list(self.pdef.get_partition_keys(current_time=horizon))
            new = keys[len(self.keys) :]  # the earlier ones are already listed, in the same order
            if new:
                windows = self.pdef.time_windows_for_partition_keys(frozenset(new), validate=False)  # in time order
                self.starts += [window.start.timestamp() for window in windows]
                self.ends += [window.end.timestamp() for window in windows]
                self.keys += new
                self.position.update((key, len(self.keys) - len(new) + i) for i, key in enumerate(new))
            self.horizon = horizon.timestamp()

    def locate(self, key: str) -> int | None:
        """The position of ``key``, or None if the calendar does not list it: before the first partition, beyond
        the horizon (not ended yet: with the catalog's offsets no partition that exists needs it), malformed."""
        return self.position.get(key)


_CALENDARS: dict[TimeWindowPartitionsDefinition, Calendar] = {}
_CALENDARS_LOCK = threading.Lock()


def calendar_of(pdef: TimeWindowPartitionsDefinition) -> Calendar:
    """The process's calendar of ``pdef`` (equal definitions share one)."""
    with _CALENDARS_LOCK:
        found = _CALENDARS.get(pdef)
        if found is None:
            found = _CALENDARS[pdef] = Calendar(pdef)
        return found


class ReverseIndex:
    """Per upstream table, its outgoing edges grouped by mapping; built once by :meth:`build`.

    A lookup may extend the (shared, locked) calendars; the index's own tables are read-only once built.
    """

    def __init__(
        self,
        outgoing: dict[str, dict[EdgeMapping, list[Edge]]],
        incoming: dict[tuple[str, str], EdgeMapping] | None = None,
        references: dict[str, dict[str, TimeWindowPartitionsDefinition]] | None = None,
    ):
        self._outgoing = outgoing
        self._incoming = incoming or {}  # (downstream, upstream) → the edge's mapping, for upstream_of
        # a static table → each table that reads it whole, with its partitions: every partition of it needs it
        self._references = references or {}
        self._by_id: dict[int, tuple[TimeWindowPartitionsDefinition, Calendar]] = {}  # the same, by id(pdef)
        self._pdefs: dict[str, TimeWindowPartitionsDefinition] = {}  # table → its partitions, for closures
        for readers in self._references.values():
            self._pdefs.update(readers)
        for table, groups in outgoing.items():
            for em, edges in groups.items():
                if not em.by_date:  # the upstream with regions: its nodes are listed by the edges into them
                    self._pdefs.setdefault(table, em.upstream)
                for edge in edges:
                    self._pdefs.setdefault(_target(em, edge), em.downstream)
        # the tables with regions: their partitions are their regions' nodes' (``table|region``)
        self._regional = {_split_node(node)[0] for node in self._pdefs if _split_node(node)[1] is not None}

    @classmethod
    def build(
        cls, catalog: Catalog, periods_: Periods | None = None, current_time: datetime | None = None
    ) -> ReverseIndex:
        """The index of ``catalog`` under ``periods_`` (default: the current process's partitions definitions),
        its calendars enumerated up to ``current_time`` (default: now; later lookups extend them)."""
        by_period = (periods_ or periods()).by_period
        outgoing: dict[str, dict[EdgeMapping, list[Edge]]] = defaultdict(lambda: defaultdict(list))
        incoming: dict[tuple[str, str], EdgeMapping] = {}
        references: dict[str, dict[str, TimeWindowPartitionsDefinition]] = defaultdict(dict)
        # a replica reads its source partition for partition: its edge carries a taint's closure to the site
        for table in [*catalog.derived(), *catalog.replicas()]:
            if isinstance(table, DerivedTable):
                for ref in table.references:
                    for node, pdef in _nodes(table, periods_ or periods()):
                        references[ref.table][node] = pdef
            for dep in table.deps:
                up_period = catalog[dep.table].period
                # one edge per region, onto the days of its zone (from the hours, a roll-up)
                if isinstance(table, DerivedTable) and table.is_regional:
                    for region, zone in table.regions:
                        days = (periods_ or periods()).region_days(zone)
                        regional = EdgeMapping(TimeWindowPartitionMapping(), by_period[up_period], days, region=region)
                        outgoing[dep.table][regional].append(Edge(table.fqn, dep))
                    continue  # upstream_of: the catalog's mapping answers
                upstream = catalog[dep.table]
                if isinstance(upstream, DerivedTable) and upstream.is_regional:  # every region's day of the date
                    own = by_period[table.period]
                    outgoing[dep.table][EdgeMapping(TimeWindowPartitionMapping(), own, own, by_date=True)].append(
                        Edge(table.fqn, dep)
                    )
                    continue
                anchor = None
                if anchored(table, dep, up_period):
                    assert dep.start_offset is not None and dep.end_offset is not None
                    anchor = (dep.start_offset, dep.end_offset)
                key = EdgeMapping(
                    partition_mapping(table, dep, up_period),
                    by_period[up_period],
                    by_period[table.period],
                    anchor,
                    ends_within=anchor is not None and dep.mode == LATEST,
                    within=by_period[dep.within] if dep.within is not None else None,
                )
                outgoing[dep.table][key].append(Edge(table.fqn, dep))
                incoming[(table.fqn, dep.table)] = key
        index = cls({table: dict(groups) for table, groups in outgoing.items()}, incoming, dict(references))
        now = (current_time or datetime.now(UTC)).timestamp()
        for pdef in {pdef for groups in outgoing.values() for em in groups for pdef in (em.upstream, em.downstream)}:
            index._calendar(pdef, now)  # enumerated once here rather than on the first events
        return index

    def edges(self, table_fqn: str) -> list[Edge]:
        """The outgoing edges of ``table_fqn`` (its direct downstream tables, self included if self-dependent)."""
        return [edge for group in self._outgoing.get(table_fqn, {}).values() for edge in group]

    def downstream_of(
        self, table_fqn: str, partition_key: str, current_time: datetime | None = None
    ) -> dict[str, list[str]]:
        """Downstream table → the partitions (in time order) that need ``partition_key`` of ``table_fqn``.

        Only partitions that exist at ``current_time`` (default: now) are listed: none before the downstream's
        first partition, none whose window has not ended. A table whose partitions all fall outside is left out.
        """
        now = (current_time or datetime.now(UTC)).timestamp()
        found: dict[str, list[str]] = {}
        for reader, pdef in self._references.get(table_fqn, {}).items():  # a static table: every partition
            keys = _keys_of(reader, self._ended(pdef, now))
            if keys:
                table, _ = _split_node(reader)
                found[table] = [*found.get(table, []), *keys]
        for edge_mapping, edges in self._outgoing.get(table_fqn, {}).items():
            keys = self._downstream_keys(edge_mapping, partition_key, now)
            if keys:
                for edge in edges:
                    found[edge.downstream] = [*found.get(edge.downstream, []), *keys]
        return found

    def upstream_of(
        self, table_fqn: str, upstream_fqn: str, partition_key: str, current_time: datetime | None = None
    ) -> list[str] | None:
        """The partitions of ``upstream_fqn`` that ``partition_key`` of ``table_fqn`` needs, in time order, when all of
        them exist at ``current_time`` (default: now): ``upstream_partitions``' keys by the calendars' arithmetic,
        without Dagster's mapping. None when some do not exist (a window reaching before the upstream's first
        partition or into the future) or the partition is not listed: ``upstream_partitions`` says which.
        """
        edge_mapping = self._incoming.get((table_fqn, upstream_fqn))
        if edge_mapping is None:
            return None
        now = (current_time or datetime.now(UTC)).timestamp()
        up = self._calendar(edge_mapping.upstream, now)
        down = self._calendar(edge_mapping.downstream, now)
        i = down.locate(partition_key)
        if i is None:
            return None
        mapping = edge_mapping.mapping
        if edge_mapping.anchor is not None:  # from the coarser period holding the partition's start
            holding = bisect_right(up.starts, down.starts[i]) - 1
            if holding < 0:
                return None  # it starts before the upstream's first partition
            first, last = holding + edge_mapping.anchor[0], holding + edge_mapping.anchor[1]
            if edge_mapping.ends_within:
                last = min(last, bisect_right(up.ends, down.ends[i]) - 1)
        elif edge_mapping.upstream == edge_mapping.downstream:  # offsets in the one period: positions shift
            first, last = i + mapping.start_offset, i + mapping.end_offset
            if edge_mapping.within is not None:  # not before the coarser period holding the partition
                first = max(first, self._period_bounds(edge_mapping, i, now)[0])
                if last < first:
                    return []  # it starts the period: nothing of this dependency is needed
        else:  # a roll-up: the upstream windows overlapping the downstream's
            first = bisect_right(up.ends, down.starts[i])
            last = bisect_left(up.starts, down.ends[i]) - 1
            if first < len(up.starts) and up.starts[first] > down.starts[i]:
                return None  # the window begins before the upstream's first partition
        if first < 0 or last < first or last >= len(up.keys) or up.ends[last] > now:
            return None
        return up.keys[first : last + 1]

    def closure(
        self,
        roots: Mapping[str, Sequence[str]],
        current_time: datetime | None = None,
        follows: Callable[[str, str], bool] | None = None,
    ) -> dict[str, list[str]]:
        """Table → every partition (in time order) built, directly or through other partitions, from the ``roots``
        (table → partitions), the roots included: across periods, offsets, sliding windows and self-dependencies (a
        partition of a self-dependent table taints every later one). Only partitions that exist at ``current_time``
        (default: now) are listed, as :meth:`downstream_of` lists them. ``follows(upstream, downstream)``: whether
        the closure goes along that edge (default: every edge; a column taint goes only where its columns are read)."""
        now = (current_time or datetime.now(UTC)).timestamp()
        follow = follows or (lambda upstream, downstream: True)
        runs: dict[str, list[tuple[int, int]]] = defaultdict(list)  # table → runs of positions (first, last)
        for table in roots:  # a static table: every partition of each table that reads it
            for reader, reader_pdef in self._references.get(table, {}).items():
                ended = len(self._ended(reader_pdef, now))
                if ended and follow(table, _split_node(reader)[0]):
                    runs[reader].append((0, ended - 1))
        for table, keys in roots.items():
            for node, node_keys in self._root_nodes(table, keys).items():
                pdef = self._pdefs.get(node)
                if pdef is None:  # a table no other reads and that reads nothing: its partitions are the closure
                    continue
                calendar = self._calendar(pdef, now)
                positions = sorted(i for k in node_keys if (i := calendar.locate(k)) is not None)
                runs[node].extend((i, i) for i in positions)
        for node in self._order(list(runs)):
            table = _split_node(node)[0]
            merged = _merge(runs[node])
            if not merged:
                continue  # reached by no edge it follows
            for edge_mapping, edges in self._outgoing.get(table, {}).items():
                # its self-dependency (and its T-1 readers)
                if any(edge.downstream == table for edge in edges) and follow(table, table):
                    merged = self._self_closure(edge_mapping, merged, now)
            runs[node] = merged
            for edge_mapping, edges in self._outgoing.get(table, {}).items():
                spans = [
                    span for first, last in merged for span in self._downstream_spans(edge_mapping, first, last, now)
                ]
                for edge in edges:
                    if edge.downstream != table and spans and follow(table, edge.downstream):
                        runs[_target(edge_mapping, edge)].extend(spans)
        closure: dict[str, list[str]] = {}
        starts: dict[str, float] = {}  # a key of a table with regions → its window's start, to order its regions' days
        for node, found in runs.items():
            calendar = self._calendar(self._pdefs[node], now)
            table, region = _split_node(node)
            for first, last in _merge(found):
                for i in range(first, last + 1):
                    key = calendar.keys[i] if region is None else regional_key(calendar.keys[i], region)
                    closure.setdefault(table, []).append(key)
                    starts[key] = calendar.starts[i]
            if region is not None:
                closure[table].sort(key=lambda k: (starts[k], k))
        for table, keys in roots.items():  # the roots of a table outside every edge, as they are
            closure.setdefault(table, list(keys))
        return {t: k for t, k in closure.items() if k}

    def _root_nodes(self, table: str, keys: Sequence[str]) -> dict[str, list[str]]:
        """``keys`` of ``table`` by node: a table with regions has one per region, keyed by its days."""
        if table not in self._regional:
            return {table: list(keys)}
        nodes: dict[str, list[str]] = defaultdict(list)
        for key in keys:
            day, region = split_regional_key(key)
            nodes[regional_key(table, region)].append(day)
        return dict(nodes)

    def is_static(self, table_fqn: str) -> bool:
        """Whether ``table_fqn`` is a static table some table reads."""
        return table_fqn in self._references

    def _ended(self, pdef: TimeWindowPartitionsDefinition, now: float) -> list[str]:
        """Every partition of ``pdef`` whose window has ended by ``now``, in time order."""
        calendar = self._calendar(pdef, now)
        return calendar.keys[: bisect_right(calendar.ends, now)]

    def runs(self, table_fqn: str, keys: Sequence[str], current_time: datetime | None = None) -> list[list[str]]:
        """``keys`` of ``table_fqn`` (in time order) cut into runs of consecutive partitions."""
        pdef = self._pdefs.get(table_fqn)
        if table_fqn in self._regional:
            return [[key] for key in keys]  # a table with regions: each region's day is a run of its own
        if pdef is None or not keys:
            return [list(keys)] if keys else []
        calendar = self._calendar(pdef, (current_time or datetime.now(UTC)).timestamp())
        out: list[list[str]] = []
        previous = None
        for key in keys:
            i = calendar.locate(key)
            if out and i is not None and previous is not None and i == previous + 1:
                out[-1].append(key)
            else:
                out.append([key])
            previous = i
        return out

    def _order(self, start: list[str]) -> list[str]:
        """The nodes (tables, a table's regions) reachable from ``start``, each after every reachable one it reads
        (self-dependencies aside)."""
        reachable = set(start)
        queue = deque(start)
        while queue:
            for downstream in self._next_nodes(queue.popleft()):
                if downstream not in reachable:
                    reachable.add(downstream)
                    queue.append(downstream)
        waiting = dict.fromkeys(reachable, 0)
        for node in reachable:
            for downstream in self._next_nodes(node) - {node}:
                waiting[downstream] += 1
        ready = deque(sorted(t for t, n in waiting.items() if n == 0))
        order: list[str] = []
        while ready:
            node = ready.popleft()
            order.append(node)
            for downstream in sorted(self._next_nodes(node) - {node}):
                waiting[downstream] -= 1
                if waiting[downstream] == 0:
                    ready.append(downstream)
        return order

    def _next_nodes(self, node: str) -> set[str]:
        """The nodes that read ``node`` directly."""
        table = _split_node(node)[0]
        return {_target(em, edge) for em, edges in self._outgoing.get(table, {}).items() for edge in edges}

    def _self_closure(
        self, edge_mapping: EdgeMapping, runs: list[tuple[int, int]], now: float
    ) -> list[tuple[int, int]]:
        """``runs`` of a self-dependent table with every later partition built from them through the self edge."""
        found = _merge(runs)
        frontier = found
        end = self._last_position(edge_mapping.downstream, now)
        while frontier:
            added = []
            for first, last in frontier:
                if edge_mapping.within is not None:  # hop by hop: the chain stops at each period's end
                    added += self._downstream_spans(edge_mapping, first, last, now)
                    continue
                [(a, b)] = self._downstream_spans(edge_mapping, first, last, now) or [(1, 0)]
                if a > b:
                    continue
                # a run that reaches its own next partition (T-1) goes on to the last one; a longer offset (T-7)
                # skips: follow it hop by hop
                added.append((first, end) if a <= last + 1 else (a, b))
            merged = _merge([*found, *added])
            frontier = [r for r in merged if r not in found]
            found = merged
        return found

    def _last_position(self, pdef: TimeWindowPartitionsDefinition, now: float) -> int:
        calendar = self._calendar(pdef, now)
        return bisect_right(calendar.ends, now) - 1

    def _downstream_spans(self, edge_mapping: EdgeMapping, first: int, last: int, now: float) -> list[tuple[int, int]]:
        """The runs of positions of the existing downstream partitions upstream positions ``first`` … ``last`` map to:
        one run, or one per coarser period of a ``within`` edge (a Sunday's T-1 is read by no Monday)."""
        if edge_mapping.within is None:
            a, b = self._downstream_span(edge_mapping, first, last, now)
            return [(a, b)] if a <= b else []
        spans = []
        j = first
        while j <= last:  # the upstream positions in one coarser period at a time
            _, period_last = self._period_bounds(edge_mapping, j, now)
            upto = min(last, period_last)
            a, b = self._downstream_span(edge_mapping, j, upto, now)
            if min(b, period_last) >= a:
                spans.append((a, min(b, period_last)))
            j = upto + 1
        return spans

    def _period_bounds(self, edge_mapping: EdgeMapping, i: int, now: float) -> tuple[int, int]:
        """The first and last positions of the partitions in the ``within`` period holding position ``i`` (first -1: the
        period began before the first partition)."""
        assert edge_mapping.within is not None
        down = self._calendar(edge_mapping.downstream, now)
        periods = self._calendar(edge_mapping.within, now)
        k = bisect_right(periods.starts, down.starts[i]) - 1
        if k < 0:  # before the first whole period (the warehouse started mid-week): it began before the first partition
            return -1, bisect_left(down.starts, periods.starts[0]) - 1 if periods.starts else len(down.starts) - 1
        first = bisect_left(down.starts, periods.starts[k])
        last = bisect_left(down.starts, periods.ends[k]) - 1 if k < len(periods.ends) else len(down.starts) - 1
        return first, last

    def _downstream_span(self, edge_mapping: EdgeMapping, first: int, last: int, now: float) -> tuple[int, int]:
        """The positions of the existing downstream partitions upstream positions ``first`` … ``last`` map to."""
        up = self._calendar(edge_mapping.upstream, now)
        down = self._calendar(edge_mapping.downstream, now)
        mapping = edge_mapping.mapping
        if edge_mapping.anchor is not None:  # the downstream partitions whose start lies in the periods that map
            low, high = first - edge_mapping.anchor[1], last - edge_mapping.anchor[0]  # offsets end at 0 at most
            a = bisect_left(down.starts, up.starts[low])
            b = bisect_left(down.starts, up.ends[high]) - 1 if high < len(up.ends) else len(down.starts) - 1
            if edge_mapping.ends_within:  # and that end after it
                a = max(a, bisect_left(down.ends, up.ends[first]))
        elif edge_mapping.upstream == edge_mapping.downstream:  # offsets in the one period: positions shift
            a, b = first - mapping.end_offset, last - mapping.start_offset
        else:  # a roll-up: the downstream windows overlapping the upstream's
            a = bisect_right(down.starts, up.starts[first]) - 1
            b = bisect_left(down.starts, up.ends[last]) - 1
        return max(a, 0), min(b, bisect_right(down.ends, now) - 1)

    def _calendar(self, pdef: TimeWindowPartitionsDefinition, now: float) -> Calendar:
        # looked up by the definition's identity first: Dagster hashes one by hashing its repr, which cost more than
        # the lookup's arithmetic. The entry holds the definition, so its id is not reused while it is listed
        entry = self._by_id.get(id(pdef))
        if entry is not None and entry[0] is pdef:
            calendar = entry[1]
        else:
            calendar = calendar_of(pdef)
            self._by_id[id(pdef)] = (pdef, calendar)
        if now > calendar.horizon:
            calendar.cover(now)
        return calendar

    def _downstream_keys(self, edge_mapping: EdgeMapping, partition_key: str, now: float) -> list[str]:
        """The existing downstream partitions one upstream partition maps to, in time order."""
        up = self._calendar(edge_mapping.upstream, now)
        down = self._calendar(edge_mapping.downstream, now)
        if edge_mapping.by_date:  # a region's day: the day of its date
            partition_key = split_regional_key(partition_key)[0]
        j = up.locate(partition_key)
        if j is None:
            return []
        spans = self._downstream_spans(edge_mapping, j, j, now)  # none whose window has not ended yet
        keys = [key for first, last in spans for key in down.keys[first : last + 1]]
        return keys if edge_mapping.region is None else [regional_key(key, edge_mapping.region) for key in keys]


def _nodes(table: DerivedTable, periods_: Periods) -> list[tuple[str, TimeWindowPartitionsDefinition]]:
    """The index's nodes of ``table`` with their partitions: the table, or one per region on its zone's days."""
    if not table.is_regional:
        return [(table.fqn, periods_.by_period[table.period])]
    return [(regional_key(table.fqn, region), periods_.region_days(zone)) for region, zone in table.regions]


def _target(edge_mapping: EdgeMapping, edge: Edge) -> str:
    """The node an edge leads to: its downstream table, or the table's region the edge maps to."""
    return edge.downstream if edge_mapping.region is None else regional_key(edge.downstream, edge_mapping.region)


def _split_node(node: str) -> tuple[str, str | None]:
    """(table, region or None) of a node."""
    table, _, region = node.partition("|")
    return table, region or None


def _keys_of(node: str, keys: list[str]) -> list[str]:
    """Partition keys of a node's calendar keys: a region's days carry the region."""
    region = _split_node(node)[1]
    return keys if region is None else [regional_key(key, region) for key in keys]


def _merge(runs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Runs of positions sorted, overlapping and adjacent ones joined."""
    merged: list[tuple[int, int]] = []
    for first, last in sorted(runs):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return merged
