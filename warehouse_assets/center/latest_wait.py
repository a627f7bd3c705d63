"""A ``latest`` or ``any`` dependency waits, a bounded time, for the partition of its window that has just ended.

A partition reading the latest usable partition of a window (``latest: true``) may be able to run the moment its own
window ends, on an older partition, while the newest one of the window ended at the same moment (or shortly before)
and is still being built, or waits for its source's last hour a few minutes longer. Built then, it is built again
minutes later, when that one lands ("rebuilt once when a more recent one arrives"), and its readers twice with it. The
data it is meant to read is that newer partition: so, for a while after its own window ended, the partition waits for
every newer partition of its window that is not usable yet, unless that one is not coming:

* its latest run failed (and nothing runs it again yet), or
* it is built but unusable (a failed blocking check, a taint) and no run is rebuilding it.

The wait is bounded: it ends :data:`LATEST_WAIT` after the partition's own window ends, or sooner when the table
declares an SLA, at half the time its SLA allows after that end, leaving the other half for the build. Past it the
partition runs on what is usable, as before, and is rebuilt once when the newer one arrives; a partition whose window
ended longer ago (a catch-up of past days, a rebuild for late data) never waits. The newer partition's arrival, or its
run's end, is a change that looks at the waiting partition again; the resolver's clock also looks at it again once
the bound has passed (:meth:`LatestWait.ended`), should the newer one not have come: counted from the ledger's clock,
like a window's end, so an engine restarted meanwhile loses no waiting partition.

An ``any`` window is the same case: it may run on the first usable partitions of its window, while the newest one,
ended with the partition's own window, is on its way; built then, it is rebuilt at once when that one lands, a second
whole build of the day. It waits likewise, within the same bound, for every partition of its window not usable yet
that may still come (not one that cannot exist, before the upstream's first partition).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Protocol

from warehouse_assets.catalog import ANY, LATEST, Catalog, DerivedTable, Table, partition_window
from warehouse_assets.center.state_store import PartitionState
from warehouse_assets.materialize.freshness import deadline
from warehouse_assets.materialize.gate import NONEXISTENT, Verdict

# how long past its window's end a partition waits for a newer partition of a latest window, or the rest of an any one
LATEST_WAIT = timedelta(hours=1)
# the modes whose windows wait: each may run before its window is whole, and is rebuilt when the rest arrives
WAITING_MODES = (LATEST, ANY)
UNTIL_KEPT = 200_000  # partitions whose wait's end is kept (a few days of every waiting table's partitions)


class _States(Protocol):
    def states(self, table: Table, keys: Sequence[str]) -> dict[str, PartitionState]: ...


class LatestWait:
    """The wait of the tables with a ``latest`` or ``any`` dependency, asked by the resolver for each partition the
    gate lets run, and the partitions whose wait has ended, for its clock."""

    def __init__(self, catalog: Catalog):
        self.catalog = catalog
        self.tables = {
            t.fqn
            for t in catalog.derived()
            if any(d.mode in WAITING_MODES for d in [*t.deps, *(d for s in t.states for d in s.deps)])
        }
        self._until: dict[tuple[str, str], float] = {}

    def waits(self, table: Table, partition: str, verdict: Verdict, states: _States, now: datetime) -> bool:
        """Whether ``partition``, which the gate lets run, waits for a newer partition of one of its latest windows
        or the rest of an any window (within its bound, for one that may still come)."""
        return self.waiting_for(table, partition, verdict, states, now) is not None

    def waiting_for(
        self, table: Table, partition: str, verdict: Verdict, states: _States, now: datetime
    ) -> tuple[str, str, str] | None:
        """The upstream partition ``partition`` waits for (its table, key, and the one it would read now: the latest
        usable, or for an any window the last of those it would read), or None when it does not wait."""
        if table.fqn not in self.tables or now.timestamp() >= self.until(table, partition):
            return None
        for edge in verdict.edges:
            if edge.dep.mode not in WAITING_MODES or not edge.used:
                continue
            if edge.dep.mode == LATEST:
                newer = edge.upstream.keys[edge.upstream.keys.index(edge.used[-1]) + 1 :]
            else:  # any: whatever of the window it would run without, but what cannot exist
                newer = [k for k in edge.upstream.keys if edge.waived.get(k, NONEXISTENT) != NONEXISTENT]
            found = states.states(self.catalog[edge.dep.table], newer) if newer else {}
            coming = [k for k in newer if _coming(found[k])]
            if coming:
                return edge.dep.table, coming[-1], edge.used[-1]
        return None

    def ended(
        self, since: datetime, now: datetime, ended_between: Callable[[str, datetime, datetime], list[str]]
    ) -> list[tuple[str, str]]:
        """The partitions of these tables whose wait's bound passed after ``since`` and by ``now`` (whether or not
        they waited: the gate decides again), looked at again whatever their newer input does. ``ended_between``
        gives a period's partitions whose windows ended in a span."""
        if since >= now:
            return []  # no time passed since the last call (a round's many calls share its moment): no bound passed
        found = []
        ended: dict[str, list[str]] = {}  # per period: Dagster's partition arithmetic costs about a millisecond a call
        for fqn in self.tables:
            table = self.catalog[fqn]
            if table.is_regional:
                continue  # a region's day is looked at by its hours' changes, never by the clock
            if table.period not in ended:
                ended[table.period] = ended_between(table.period, since - LATEST_WAIT, now)
            for key in ended[table.period]:
                if since.timestamp() < self.until(table, key) <= now.timestamp():
                    found.append((fqn, key))
        return found

    def until(self, table: Table, partition: str) -> float:
        """When the partition's wait for a newer input ends: :data:`LATEST_WAIT` after its window, or half its SLA's
        time after it when that is sooner. Kept per partition: the clock's look at every waiting table's ended
        windows asks again on each call, and the window and deadline arithmetic costs about a millisecond."""
        known = self._until.get((table.fqn, partition))
        if known is not None:
            return known
        end = partition_window(table, partition).end
        wait = LATEST_WAIT
        if isinstance(table, DerivedTable) and table.sla is not None:
            wait = min(wait, (deadline(table, partition) - end) / 2)
        if len(self._until) >= UNTIL_KEPT:
            self._until.clear()
        self._until[(table.fqn, partition)] = until = (end + wait).timestamp()
        return until


def _coming(state: PartitionState) -> bool:
    """Whether a newer upstream partition the gate did not let the partition read may still come: being built, or
    not built and its last run did not fail."""
    return state.queued or state.in_progress or not (state.materialized or state.failed)
