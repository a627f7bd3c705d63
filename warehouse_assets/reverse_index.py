"""The reverse index of the exact mappings: which downstream partitions need one upstream partition.

The inverse of :func:`warehouse_assets.partitions.upstream_partitions`: given an event on an upstream
(table, partition), :meth:`ReverseIndex.downstream_of` lists the partitions of each direct downstream table
whose exact upstream partitions include it, across periods (hour → day → week → month roll-ups), offsets
(T-1, T-7), sliding windows and self-dependencies, limited to partitions that exist (not before the
downstream's first partition, not in the future).

The index is built once from the catalog: per upstream table, its outgoing edges grouped by their mapping
(mapping, upstream period, downstream period). A lookup maps the partition once per group, with Dagster's own
inverse (``get_downstream_partitions_for_partitions``) on the unbounded copies of the partitions definitions
that :func:`~warehouse_assets.partitions.mapped_upstream` uses, so a window is never clamped; its cost is
proportional to the fan-out, never to the catalog or to the partitions' history. The groups matter at scale:
a warehouse has thousands of edges but a few dozen distinct mappings.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime

from dagster import PartitionMapping, TimeWindow, TimeWindowPartitionsDefinition

from warehouse_assets.catalog import Catalog, Dependency

# the unbounded copies are mapped_upstream's own, so that both directions map the same definitions
from warehouse_assets.partitions import _FAR_FUTURE, Periods, _unbounded, partition_mapping, periods


@dataclass(frozen=True)
class Edge:
    """One dependency seen from its upstream: ``downstream`` reads the upstream through ``dep``."""

    downstream: str  # the downstream table's fqn
    dep: Dependency


@dataclass(frozen=True)
class EdgeMapping:
    """What maps an upstream partition to downstream partitions: shared by every edge that has it."""

    mapping: PartitionMapping
    upstream: TimeWindowPartitionsDefinition
    downstream: TimeWindowPartitionsDefinition


class ReverseIndex:
    """Per upstream table, its outgoing edges grouped by mapping; built once by :meth:`build`."""

    def __init__(self, outgoing: dict[str, dict[EdgeMapping, list[Edge]]]):
        self._outgoing = outgoing

    @classmethod
    def build(cls, catalog: Catalog, periods_: Periods | None = None) -> ReverseIndex:
        """The index of ``catalog`` under ``periods_`` (default: the current process's partitions definitions)."""
        by_period = (periods_ or periods()).by_period
        outgoing: dict[str, dict[EdgeMapping, list[Edge]]] = defaultdict(lambda: defaultdict(list))
        for table in catalog.derived():
            for dep in table.deps:
                up_period = catalog[dep.table].period
                key = EdgeMapping(
                    partition_mapping(table, dep, up_period), by_period[up_period], by_period[table.period]
                )
                outgoing[dep.table][key].append(Edge(table.fqn, dep))
        return cls({table: dict(groups) for table, groups in outgoing.items()})

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
        now = current_time or datetime.now(UTC)
        found: dict[str, list[str]] = {}
        for edge_mapping, edges in self._outgoing.get(table_fqn, {}).items():
            keys = _downstream_keys(edge_mapping, partition_key, now)
            if keys:
                for edge in edges:
                    found[edge.downstream] = list(keys)
        return found


def _downstream_keys(edge_mapping: EdgeMapping, partition_key: str, now: datetime) -> list[str]:
    """The existing downstream partitions one upstream partition maps to through ``edge_mapping``, in time order."""
    up_u, down_u = _unbounded(edge_mapping.upstream), _unbounded(edge_mapping.downstream)
    mapped = edge_mapping.mapping.get_downstream_partitions_for_partitions(
        up_u.empty_subset().with_partition_keys([partition_key]), up_u, down_u, current_time=_FAR_FUTURE
    )
    first = edge_mapping.downstream.get_first_partition_window()
    if first is None:
        return []
    # timestamps, never datetimes: two datetimes of one zone compare by wall clock, and the autumn hour repeats
    keys: list[str] = []
    for window in mapped.included_time_windows:  # type: ignore[attr-defined]  # a time-window subset
        start = window.start if window.start.timestamp() >= first.start.timestamp() else first.start
        if start.timestamp() < window.end.timestamp():
            keys += down_u.get_partition_keys_in_time_window(TimeWindow(start, window.end))
    # the newest partitions may not have ended yet: drop them, from the end
    while keys and edge_mapping.downstream.time_window_for_partition_key(keys[-1]).end.timestamp() > now.timestamp():
        keys.pop()
    return keys
