"""A ``latest`` dependency waits, a bounded time, for a newer partition of its window that is on its way.

A partition reading the latest usable partition of a window (``latest: true``) may run on an older one while a newer
one, whose window has ended too, is being built: built now, it is built again minutes later, when that one lands
("rebuilt once when a more recent one arrives"), and every rebuild of the newer one for its own late data follows. The
data it is meant to read is the newer one, and it is coming: so the partition waits for it when the newer partition is

* queued or running (its run's end is a change of that partition, which looks at this one again), or
* requested in the same resolver call (its run is queued next; the partition is dropped from the call's requests).

A newer partition that is only missing is not waited for: nothing says it will come. The wait is bounded: it ends
:data:`LATEST_WAIT` after the partition's own window ends, or sooner when the table declares an SLA, at half the time
its SLA allows after that end, leaving the other half for the build; past it the partition runs on what is usable, as
before, and is rebuilt once when the newer one arrives. The resolver looks at a waiting partition again at that bound
(:meth:`LatestWait.look_again`), should the newer one's run still be going on.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from datetime import datetime, timedelta
from typing import Any, Protocol

from warehouse_assets.catalog import LATEST, Catalog, DerivedTable, Table, partition_window
from warehouse_assets.center.ledger import Rebuild
from warehouse_assets.center.state_store import PartitionState
from warehouse_assets.materialize.freshness import deadline
from warehouse_assets.materialize.gate import Verdict

# how long past its window's end a partition waits for a newer partition of a latest window that is being built
LATEST_WAIT = timedelta(hours=1)


class _States(Protocol):
    rebuilds: dict[tuple[str, str], Rebuild]

    def states(self, table: Table, keys: list[str]) -> dict[str, PartitionState]: ...


class LatestWait:
    """The wait of the tables with a ``latest`` dependency: asked by the resolver for each partition the gate lets
    run, and once per call for the partitions it requested."""

    def __init__(self, catalog: Catalog):
        self.catalog = catalog
        self.tables = {
            t.fqn
            for t in catalog.derived()
            if any(d.mode == LATEST for d in [*t.deps, *(d for s in t.states for d in s.deps)])
        }
        # of this call: a partition the gate let run → the newer partitions of its latest windows, not built
        self._newer: dict[tuple[str, str], list[tuple[str, str]]] = {}
        self._look_again: dict[tuple[str, str], float] = {}  # a waiting partition → when its wait ends

    def waits(self, table: Table, partition: str, verdict: Verdict, states: _States, now: datetime) -> bool:
        """Whether ``partition``, which the gate lets run, waits for a newer partition of a latest window that is
        queued or running; a newer one not built is remembered for :meth:`hold_back`."""
        if table.fqn not in self.tables:
            return False
        newer: list[tuple[str, PartitionState]] = []
        for edge in verdict.edges:
            if edge.dep.mode != LATEST or not edge.used:
                continue
            later = edge.upstream.keys[edge.upstream.keys.index(edge.used[-1]) + 1 :]
            found = states.states(self.catalog[edge.dep.table], later) if later else {}
            newer += [(edge.dep.table, s) for s in found.values() if not s.materialized or s.queued or s.in_progress]
        if not newer:
            return False
        until = self.until(table, partition)
        if now.timestamp() >= until:
            return False
        if any(s.queued or s.in_progress for _, s in newer):
            self._look_again[(table.fqn, partition)] = until
            return True
        self._newer[(table.fqn, partition)] = [(fqn, s.partition) for fqn, s in newer]
        return False

    def hold_back(self, ready: MutableMapping[tuple[str, str], Any], states: _States) -> None:
        """Drop from ``ready`` (the call's requests) each partition a newer partition of whose latest window is
        requested in the same call: it is looked at again when that one's run is queued. Forgets the call's notes."""
        for candidate, newer in self._newer.items():
            if candidate in ready and any(n in ready for n in newer):
                del ready[candidate]
                states.rebuilds.pop(candidate, None)  # a rebuild it would have been: not requested now either
        self._newer = {}

    def look_again(self, now: datetime) -> Iterable[tuple[str, str]]:
        """The waiting partitions whose wait ended by ``now``: looked at again, whatever their newer input does."""
        ended = [c for c, at in self._look_again.items() if at <= now.timestamp()]
        for candidate in ended:
            del self._look_again[candidate]
        return ended

    def until(self, table: Table, partition: str) -> float:
        """When the partition's wait for a newer input ends: :data:`LATEST_WAIT` after its window, or half its SLA's
        time after it when that is sooner."""
        end = partition_window(table, partition).end
        wait = LATEST_WAIT
        if isinstance(table, DerivedTable) and table.sla is not None:
            wait = min(wait, (deadline(table, partition) - end) / 2)
        return (end + wait).timestamp()
