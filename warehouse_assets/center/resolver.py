"""The dependency center's resolver: from changes of partition state to the runs that became possible.

For each change the partition state store reports (a materialization, a check verdict, a run started or ended),
:meth:`Resolver.on_changes` finds the downstream partitions it can unblock through the reverse index, asks the gate
(:func:`warehouse_assets.materialize.gate.decide`) about each, and returns the ones that may run now as run plans
(:class:`warehouse_assets.center.plans.RunPlan`), coalesced per table into ranges of contiguous partitions. The cost
is the changes' fan-out: no catalog scan, no partition history read.

The semantics (what Dagster's eager automation condition would decide, with exact windows):

* within ``LOOKBACK`` of the latest partition (older history is a backfill), never a partition whose window has not
  ended (the reverse index lists none) nor one whose window reaches before an upstream's start (the gate);
* every upstream partition materialized and its blocking checks passed on its latest materialization (a verdict
  still to come waits, as in ``blocking_checks_passed``), unless the dependency says ``ignore_dq``;
* nothing upstream in progress, and not the partition itself queued or in progress: a partition skipped because its
  own run was is remembered (*deferred*) and looked at again when that run ends, as ``since_last_handled`` does;
* a partition already materialized is requested again only when an upstream was re-materialized, by another run,
  after the run that built it started (late data, ``any_deps_updated``);
* never on a tainted upstream partition (the gate), nor a tainted partition whose repair backfill is running (it
  rebuilds it); a check failing on late data taints what was built before it (:func:`.taint.late_verdict` plans a
  ``taint_repair`` run marking them, and holds them back until the marks are in the log); once fixed, they are
  rebuilt as late data, each once;
* exactly once per upstream state: a request is keyed by the partition and the storage ids of its upstream partitions'
  latest materializations (tables ``center_requests``, ``center_deferred`` of the ledger), so the same changes
  applied twice, or by a new resolver after a restart, request nothing new.

A self-dependent table catching up builds its chain in one run, as a backfill does, at most ``max_partitions_per_run``
partitions a run. A burst (a day's end makes thousands of daily partitions candidates at 10,000 tables) is resolved
in slices within a ``budget`` of seconds a call, the rest kept in a persisted *backlog*; new changes' candidates go
before the clock's, so an upstream completing during a burst is resolved in the next call.

:meth:`Resolver.step` updates the store and resolves its changes; the store's cursor it resolved through is kept with
its requests, so a crash between the store's commit and its own loses nothing. The engine
(:mod:`warehouse_assets.center.engine`) steps it every round and submits the plans, pending until their runs exist.
"""

from __future__ import annotations

import functools
import json
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from dagster import AssetKey, TimeWindowPartitionsDefinition

from warehouse_assets.catalog import (
    BY_PERIOD,
    DEADLINE,
    LATEST,
    WHOLE,
    Catalog,
    Dependency,
    DerivedTable,
    Table,
    UpstreamPartitions,
    partition_window,
    periods,
    regional_key,
    split_regional_key,
    upstream_partitions,
    weak_deadline,
)
from warehouse_assets.center.late_data import LOOKBACK, LateData
from warehouse_assets.center.latest_wait import LatestWait
from warehouse_assets.center.ledger import Ledger
from warehouse_assets.center.plans import (
    CLOCK,
    DEADLINE_PASSED,
    DECLARED,
    LATE_DUE,
    RunPlan,
    Trigger,
    run_priority,
)
from warehouse_assets.center.reverse_index import ReverseIndex
from warehouse_assets.center.snapshot import ResolverSnapshot
from warehouse_assets.center.state_store import Change, PartitionState, PartitionStateStore
from warehouse_assets.center.taint import late_verdict
from warehouse_assets.materialize.gate import Verdict, decide

# how often old requests are deleted: each time a scan of every request (keyed by their upstream states, often
# kilobytes each), which an hourly prune made a growing share of the center's time; kept a day longer, an old request
# is never read
PRUNE_EVERY = timedelta(days=1)


class Resolver:
    """Changes of partition state → the runs that became possible; requests remembered in ``store``'s file."""

    def __init__(
        self,
        catalog: Catalog,
        index: ReverseIndex,
        store: PartitionStateStore,
        max_partitions_per_run: Callable[[Table], int | None],
        lookback: timedelta = LOOKBACK,
        ledger: Ledger | None = None,
    ):
        """``max_partitions_per_run``: how many partitions of a table one run may build (None: any), the compiler's
        backfill policy; ``ledger``: where the resolver's decisions are kept (by default in the store's file)."""
        self.catalog, self.index, self.store = catalog, index, store
        self.lookback = lookback
        self.max_partitions_per_run = max_partitions_per_run
        self._fqn = {AssetKey(t.key).to_user_string(): t.fqn for t in catalog}  # the store's asset keys → tables
        self.ledger = ledger if ledger is not None else Ledger(store.path)
        # a new resolver starts where the store is: the partitions ready before it are a backfill's, or the automation's
        self.ledger.start_at(store.cursor)
        self.evaluated = 0  # partitions the last call asked the gate about: its cost
        # candidates not evaluated yet, in the order they came: new changes' first, then the clock's
        self._backlog = self._load_backlog()
        self._time_driven_tables: dict[str, list[str]] | None = None
        # readers of a partition reported before its window ended by the engine's clock, looked at when theirs ends
        self._not_ended: dict[tuple[str, str], float] = {}  # in memory: only a source clock ahead of it needs them
        self._deadline_deps: dict[str, list[tuple[Table, Dependency]]] = {}  # HH:MM → the deadline dependencies
        for table in catalog.derived():
            for dep in table.deps:
                if dep.mode == DEADLINE and dep.deadline is not None:
                    self._deadline_deps.setdefault(dep.deadline, []).append((table, dep))
        self._timezone = ZoneInfo(BY_PERIOD["daily"].timezone)
        self._late_data = LateData(catalog, self.ledger, self._timezone, self.index)
        self._latest = LatestWait(catalog)
        self._referencing: dict[str, list[DerivedTable]] = {}  # a static table → the tables that read it
        for table in catalog.derived():
            for ref in table.references:
                self._referencing.setdefault(ref.table, []).append(table)
        self._pruned_at: datetime | None = None
        self._floors: tuple[datetime | None, dict[str, float]] = (None, {})  # the lookback's floor per period

    def close(self) -> None:
        self.ledger.close()

    def _load_backlog(self):  # type: ignore[no-untyped-def]
        return self.ledger.backlog(Trigger.to_json, Trigger.from_json)

    @property
    def resolved_through(self) -> int:
        """The store's cursor when the resolver last recorded its requests: the changes up to it are resolved."""
        return self.ledger.resolved_through

    @property
    def backlog(self) -> int:
        """Candidates left for the next calls by a call's ``budget``: call again without waiting while there are."""
        return len(self._backlog)

    def step(self, now: datetime, budget: float | None = None) -> list[RunPlan]:
        """Update the store and resolve its changes, with those a crash between the store's commit and the
        resolver's left unresolved; ``budget`` as in :meth:`on_changes`."""
        missed = self.store.changes_since(self.resolved_through) if self.resolved_through < self.store.cursor else []
        return self.on_changes([*missed, *self.store.update()], now, budget)

    def on_changes(self, changes: Iterable[Change], now: datetime, budget: float | None = None) -> list[RunPlan]:
        """The runs ``changes`` (those of the store's latest update) made possible at ``now``, in the queue's order
        (:func:`run_priority`, then their first partition's time); each partition of them is remembered as requested
        for its current upstream state, and the store's cursor as resolved, in one transaction.

        With ``budget`` (seconds), candidates are evaluated until it is spent (at least one), the backlog's after the
        new changes' and the clock's last; the others stay in the backlog, persisted in the same transaction."""
        with self.ledger.reading():  # the call's view of the ledger's records, checked against its file once
            return self._on_changes(changes, now, budget)

    def _on_changes(self, changes: Iterable[Change], now: datetime, budget: float | None) -> list[RunPlan]:
        started = time.perf_counter()
        states = ResolverSnapshot(self.store, self.ledger)
        backlog = self._backlog
        taints: list[RunPlan] = []
        for change in changes:
            fqn = self._fqn.get(change.asset_key)
            if fqn is None:
                continue  # an asset outside the catalog (a freshness check's, a job's)
            trigger = Trigger(fqn, change.partition, change.state.storage_id, change.state.run_id, change.fields)
            if self.catalog[fqn].is_static:
                if "materialized" in change.fields:
                    for candidate in self._waiting_on_static(fqn, states, now):
                        backlog.add(candidate, trigger, by_clock=False)
                continue
            if change.partition == WHOLE:
                continue  # an event of a partitioned table that names no partition (a check run on none)
            if "missing" in change.fields and change.state.missing is not None and not self.catalog[fqn].is_source:
                backlog.add((fqn, change.partition), trigger, by_clock=False)  # its data is gone: build it again
            if "checks" in change.fields:
                taints.extend(
                    late_verdict(self.catalog, self.index, self.catalog[fqn], change.state, trigger, states, now)
                )
            for downstream, keys in self.index.downstream_of(fqn, change.partition, now).items():
                for key in keys:
                    backlog.add((downstream, key), trigger, by_clock=False)
            if (end := _bounds(self.catalog[fqn], change.partition)[1]) > now.timestamp():
                self._not_ended_readers(fqn, change.partition, end, now)
            run_ended = (
                ("in_progress" in change.fields or "queued" in change.fields)
                and not change.state.in_progress
                and not change.state.queued
            )
            if run_ended and self.ledger.deferred(fqn, change.partition):
                backlog.add((fqn, change.partition), trigger, by_clock=False)
        for candidate, trigger in self._clock_candidates(now).items():
            backlog.add(candidate, trigger, by_clock=True)
        for candidate, trigger in self._deadline_candidates(now).items():
            backlog.add(candidate, trigger, by_clock=True)
        for fqn, partition in self.ledger.due(now.timestamp()):
            backlog.add((fqn, partition), Trigger(fqn, partition, None, None, frozenset({LATE_DUE})), by_clock=True)
        self.evaluated = 0
        ready: dict[tuple[str, str], tuple[Trigger, str]] = {}
        deferred: list[tuple[str, str]] = []
        evaluated: list[tuple[str, str]] = []
        while backlog:
            if budget is not None and evaluated and time.perf_counter() - started > budget:
                break
            (fqn, partition), trigger = backlog.pop()
            evaluated.append((fqn, partition))
            table = self.catalog[fqn]
            if table.is_source or not self._in_lookback(table, partition, now):
                continue  # a source (ODS, external, a replica) is reported by whoever builds it, never requested
            outcome = self._resolve(table, partition, states, now)
            if outcome == _DEFER:
                # a change while its run waits or runs: look again at the run's end, when what the run read is known
                # (whatever the change: a verdict arriving after the data must not settle an earlier deferral)
                deferred.append((fqn, partition))
            elif outcome is not None:
                ready[(fqn, partition)] = (trigger, outcome)
        self._extend_chains(ready, states, now)
        coalesced = self._coalesce(ready, now, states)
        plans = [replace(plan, request_id=uuid.uuid4().hex) for plan in [*taints, *coalesced]]
        self._remember(ready, deferred, evaluated, plans, now, states)
        return plans

    # --- submission: a plan stays pending until the engine has submitted its run --------------------------------

    def pending(self) -> list[RunPlan]:
        """The plans recorded but not yet submitted (all of them after a crash), oldest first."""
        return [RunPlan.from_json(plan, request_id) for request_id, plan in self.ledger.pending()]

    def submitted(self, request_id: str) -> None:
        """The run of ``request_id`` exists in Dagster: the plan is done."""
        self.ledger.submitted(request_id)

    def add_pending(self, plan: RunPlan, now: datetime) -> bool:
        """Record ``plan`` (with its own request id) to be submitted, unless it is pending already."""
        return self.ledger.add_pending(plan.request_id, plan.to_json(), now.timestamp())

    # --- the clock: a partition whose upstream was complete before its own window ended --------------------------

    def _clock_candidates(self, now: datetime) -> dict[tuple[str, str], Trigger]:
        """The partitions whose windows ended since the last call after their last upstream change (a T-1 day is
        complete before day T ends; a source's clock ahead of the engine's): no change will name them."""
        ended = [c for c, end in self._not_ended.items() if end <= now.timestamp()]
        found = {c: Trigger(*c, None, None, frozenset({CLOCK})) for c in ended if self._not_ended.pop(c)}
        at = self.ledger.clock()
        if at is None:
            return found  # a new resolver: the windows ended before it are the backfill's or the first steps'
        since = max(datetime.fromtimestamp(at, UTC), now - self.lookback)
        for candidate in self._latest.ended(since, now, lambda period, a, b: _ended_between(BY_PERIOD[period], a, b)):
            found[candidate] = Trigger(*candidate, None, None, frozenset({CLOCK}))  # a latest or any wait is over
        # the windows that ended, once per period: per table, Dagster's partition arithmetic on every call cost
        # about a millisecond per table at 10,000 tables, while windows end only on the hour
        for period, tables in self._time_driven(now).items():
            for key in _ended_between(BY_PERIOD[period], since, now):
                for fqn in tables:
                    found[(fqn, key)] = Trigger(fqn, key, None, None, frozenset({CLOCK}))
        return found

    def _not_ended_readers(self, fqn: str, partition: str, end: float, now: datetime) -> None:
        """A partition reported before its window ended by the engine's clock (a source's clock ahead of it): its
        readers that end by then are looked at when they end, as nothing else may name them."""
        for downstream, keys in self.index.downstream_of(fqn, partition, datetime.fromtimestamp(end, UTC)).items():
            for key in keys:
                if (ends := _bounds(self.catalog[downstream], key)[1]) > now.timestamp():
                    self._not_ended[(downstream, key)] = ends

    def _deadline_candidates(self, now: datetime) -> dict[tuple[str, str], Trigger]:
        """The partitions one of whose deadline dependencies reached its deadline since the last call: past it they
        may run without that upstream, and nothing else happens at 09:00 to name them."""
        at = self.ledger.clock()
        if at is None or not self._deadline_deps:
            return {}
        since = max(datetime.fromtimestamp(at, UTC), now - self.lookback)
        found: dict[tuple[str, str], Trigger] = {}
        for hhmm, edges in self._deadline_deps.items():
            for instant in _local_times_between(hhmm, since, now, self._timezone):
                # a deadline is the first HH:MM at or after a window's end: those windows ended within the day before
                for table, dep in edges:
                    pdef = BY_PERIOD[table.period]
                    for key in _ended_between(pdef, instant - timedelta(days=1, hours=1), instant):
                        if weak_deadline(table, dep, key) == instant:
                            found[(table.fqn, key)] = Trigger(table.fqn, key, None, None, frozenset({DEADLINE_PASSED}))
        return found

    def consider_tables(self, fqns: Iterable[str], now: datetime) -> int:
        """Make every partition within the lookback of the tables ``fqns`` (added to the catalog, or changed) a
        candidate of the next step, as if their windows had just ended: nothing else would name the partitions of a
        table whose inputs were all there before it existed. The gate decides; only what was never built (or a later
        state) is requested. Returns how many candidates were added."""
        added = 0
        for fqn in fqns:
            table = self.catalog[fqn]
            if not isinstance(table, DerivedTable):
                continue
            for key in _ended_within(table, now, self.lookback):
                self._backlog.add((fqn, key), Trigger(fqn, key, None, None, frozenset({DECLARED})), by_clock=True)
                added += 1
        return added

    def prepare(self, now: datetime) -> None:
        """Find the time-driven tables (what the clock looks at) now, not in the first step that needs them: a
        call the engine makes before its first round (a second or so at 10,000 tables)."""
        self._time_driven(now)

    def _time_driven(self, now: datetime) -> dict[str, list[str]]:
        """Per period, the tables some partition of which can become ready by its window ending: every upstream
        partition it needs (a sample partition's, one lookback back) ends before its own window does, or is not
        one yet."""
        if self._time_driven_tables is not None:
            return self._time_driven_tables
        self._time_driven_tables = {}
        ends: dict[tuple[str, str], datetime] = {}  # Dagster's arithmetic costs about a millisecond a call

        def window_end(table: Table, key: str) -> datetime:
            cached = (table.fqn if table.is_regional else table.period, key)  # a period's keys are the same windows
            if cached not in ends:
                ends[cached] = partition_window(table, key).end
            return ends[cached]

        samples: dict[str, str] = {}
        for table in self.catalog.derived():
            if table.is_regional:
                continue  # a region's day reads its hours up to its own end: ready by their change, never the clock
            if table.period not in samples:
                pdef = BY_PERIOD[table.period]
                samples[table.period] = pdef.get_partition_key_for_timestamp((now - self.lookback).timestamp())
            key = samples[table.period]
            end = window_end(table, key)
            # a table with states is time-driven when one of its states is: an estimate on the previous day's data
            options = [state.deps for state in table.states] if isinstance(table, DerivedTable) else []
            for deps in options or [table.deps]:
                upstream_ends: list[datetime] = []
                for dep in deps:
                    upstream = self.catalog[dep.table]
                    # offset arithmetic, no mapping; a state's narrower window is not the index's
                    keys = None if options else self.index.upstream_of(table.fqn, dep.table, key, now)
                    if keys is not None:  # empty: the sample starts the period its dependency stays within
                        upstream_ends.extend(window_end(upstream, k) for k in keys[-1:])
                        continue
                    up = upstream_partitions(self.catalog, table, dep, key, current_time=now)
                    if up.nonexistent:
                        upstream_ends.append(end)
                    elif up.keys:  # none: a self-dependency's T-1 before the table's start
                        # a table with regions lists its days by region: the last to end is not the last listed
                        ends_of = [window_end(upstream, k) for k in (up.keys if upstream.is_regional else up.keys[-1:])]
                        upstream_ends.append(max(ends_of))
                if upstream_ends and max(upstream_ends) < end:
                    self._time_driven_tables.setdefault(table.period, []).append(table.fqn)
                    break
        return self._time_driven_tables

    # --- one partition ---------------------------------------------------------------------------------------

    def _resolve(self, table: Table, partition: str, states: ResolverSnapshot, now: datetime) -> str | None:
        """The request key (the upstream state) if ``partition`` should be requested now, ``_DEFER`` if its own
        run is in progress, None otherwise."""
        self.evaluated += 1
        own = states.state(table, partition)
        if own.in_progress or own.queued:
            return _DEFER  # a queued run reads what is there when it starts: no second run for the same partition
        if own.taint is not None and own.taint.repair and states.repairing(own.taint.repair):
            return None  # its repair backfill rebuilds it, in dependency order: building it here too would be twice
        windows = self._windows(table, partition, now)
        verdict = decide(self.catalog, table, partition, states, current_time=now, windows=windows)
        if not verdict.may_run:
            return None
        upstream = self._upstream_states(verdict, states)
        if any(s.in_progress or s.queued for s in self._upstream_states(verdict, states, used_only=True)):
            # an upstream is being rebuilt, or its rebuild waits in the queue: built now, this partition would be
            # built on the data that rebuild replaces, and again after it; the run's end is a change of its own
            return None
        if not self._checks_passed(verdict, states) or self._latest.waits(table, partition, verdict, states, now):
            return None  # a verdict still to come, an input of a latest or any window on its way: changes of their own
        key = json.dumps(sorted([s.asset_key, s.partition, s.storage_id] for s in upstream))
        if verdict.state is not None:
            key += f" {verdict.state}"  # the same inputs reached as a later state are a new request
        if own.missing is not None:
            key += f" gone {own.storage_id}"  # built from the same inputs, but its data left the lake: build it again
        key += self._late_data.read_states(upstream)
        if self.ledger.requested(table.fqn, partition, key):
            return None
        # a static table's new version is read by the partitions built from then on, not a rebuild of those before.
        # Newer than what the partition's build may have read: upstream data materialized after that build's run
        # started, by another run (its own run wrote its upstream before reading it), even if the build's
        # materialization came later and the center saw the run only once it had ended
        read_from = own.read_from if own.read_from is not None else own.storage_id
        late = any(
            s.storage_id is not None
            and s.storage_id > (read_from if read_from is not None else -1)
            and s.partition != WHOLE
            and not (s.run_id and s.run_id == own.run_id)
            for s in upstream
        )
        advances = _advances(table, own, verdict)
        if own.materialized and not late and not advances:
            states.fresh.add((table.fqn, partition))
            return None
        if (
            own.materialized
            and late
            and not advances
            and own.taint is None  # a repair, and a degraded build's missing input, are the build it waits for
            and not own.degraded
            and isinstance(table, DerivedTable)
            and not self._late_data.rebuild_due(table, partition, own, verdict, read_from, key, states, now)
        ):
            return None
        return key

    def _windows(self, table: Table, partition: str, now: datetime) -> list[tuple[Dependency, UpstreamPartitions]]:
        """Each dependency's exact upstream partitions: by the index's arithmetic, or through Dagster's mapping
        where a window reaches outside the existing partitions (the mapping costs milliseconds a partition)."""
        windows = []
        for dep in table.deps:
            keys = self.index.upstream_of(table.fqn, dep.table, partition, now)
            if keys is None:
                windows.append((dep, upstream_partitions(self.catalog, table, dep, partition, current_time=now)))
            else:
                windows.append((dep, UpstreamPartitions(dep.table, keys, [])))
        return windows

    def _upstream_states(
        self, verdict: Verdict, states: ResolverSnapshot, used_only: bool = False
    ) -> list[PartitionState]:
        """The states of every upstream partition of the verdict's windows (its request key: a waived partition that
        arrives later is new upstream data), or of those the partition reads (``used_only``). Of a latest dependency,
        always the one it reads: an older partition of its window changing is no new data for it."""
        return [
            s
            for edge in verdict.edges
            for s in states.states(
                self.catalog[edge.dep.table], edge.used if used_only or edge.dep.mode == LATEST else edge.upstream.keys
            ).values()
        ]

    def _checks_passed(self, verdict: Verdict, states: ResolverSnapshot) -> bool:
        """Every blocking check passed on each upstream partition's latest materialization, as the automation's
        ``blocking_checks_passed`` requires (the gate refuses a failed verdict only; here a missing one waits too),
        except through ``ignore_dq`` and on partitions planned earlier in the same run."""
        for edge in verdict.edges:
            upstream = self.catalog[edge.dep.table]
            blocking = [c.name for c in upstream.checks if c.blocking]
            if edge.dep.ignore_dq or not blocking:
                continue
            for key, state in states.states(upstream, edge.used).items():
                if (upstream.fqn, key) not in states.planned and not all(state.checks.get(n) for n in blocking):
                    return False
        return True

    def _extend_chains(
        self, ready: dict[tuple[str, str], tuple[Trigger, str]], states: ResolverSnapshot, now: datetime
    ) -> None:
        """Extend each ready partition of a self-dependent table to the next partitions that only waited for their
        T-1: they run after it in the same run (never materialized ones only; late data follows change by change)."""
        for (fqn, partition), (trigger, _) in sorted(
            ready.items(), key=lambda r: _start(self.catalog[r[0][0]], r[0][1])
        ):
            table = self.catalog[fqn]
            if not any(dep.table == fqn for dep in table.deps):
                continue
            current = partition
            while True:
                states.planned.add((fqn, current))
                following = self.index.downstream_of(fqn, current, now).get(fqn, [])
                if not following or (fqn, following[0]) in ready:
                    break
                current = following[0]
                if states.state(table, current).materialized or not self._in_lookback(table, current, now):
                    break
                key = self._resolve(table, current, states, now)
                if key is None or key == _DEFER:
                    break
                ready[(fqn, current)] = (trigger, key)

    def _waiting_on_static(self, fqn: str, states: ResolverSnapshot, now: datetime) -> list[tuple[str, str]]:
        """The partitions a static table's materialization may let run: those of the tables that read it not built
        yet, within the lookback (the ones built already read the version they read; a taint rebuilds them)."""
        candidates = []
        for table in self._referencing.get(fqn, []):
            keys = _ended_within(table, now, self.lookback)
            found = states.states(table, keys)
            candidates += [(table.fqn, k) for k in keys if not found[k].materialized]
        return candidates

    def _in_lookback(self, table: Table, partition: str, now: datetime) -> bool:
        if self._floors[0] != now:  # per period and time: Dagster hashes a partitions definition slowly
            self._floors = (now, {})
        floor = self._floors[1].get(table.period)
        if floor is None:
            floor = self._floors[1][table.period] = (
                _last_window_end(BY_PERIOD[table.period], now) - self.lookback
            ).timestamp()
        return _bounds(table, partition)[1] > floor

    # --- requests, persisted -----------------------------------------------------------------------------------

    def _remember(
        self,
        ready: dict[tuple[str, str], tuple[Trigger, str]],
        deferred: Sequence[tuple[str, str]],
        evaluated: Sequence[tuple[str, str]],
        plans: Sequence[RunPlan],
        now: datetime,
        states: ResolverSnapshot,
    ) -> None:
        """Record the requests, their plans as pending, the deferred partitions (a deferred partition looked at again
        is settled), the backlog, the store's cursor and the clock, in one transaction."""
        try:
            with self.ledger.batch():
                self.ledger.set_deferred([c for c in evaluated if c not in deferred], deferred)
                self._backlog.persist(evaluated)
                states.persist_holds()
                states.persist_late(evaluated, now.timestamp())
                self.ledger.record_requests(
                    [(fqn, partition, key) for (fqn, partition), (_, key) in ready.items()], now.timestamp()
                )
                self.ledger.add_pendings([(plan.request_id, plan.to_json()) for plan in plans], now.timestamp())
                self.ledger.set_resolved_through(self.store.cursor)
                if self._pruned_at is None or now - self._pruned_at > PRUNE_EVERY:
                    # a request older than twice the lookback is for a partition the center no longer looks at
                    self.ledger.forget_requests_before((now - 2 * self.lookback).timestamp())
                    self._pruned_at = now
                self.ledger.advance_clock(now.timestamp())
        except BaseException:
            self._backlog = self._load_backlog()  # what the failed call took from it is still to do
            raise

    # --- coalescing --------------------------------------------------------------------------------------------

    def _coalesce(
        self, ready: dict[tuple[str, str], tuple[Trigger, str]], now: datetime, states: ResolverSnapshot
    ) -> list[RunPlan]:
        """Per table, contiguous partitions in time order, at most ``max_partitions_per_run`` a run."""
        by_table: dict[str, list[str]] = {}
        for fqn, partition in ready:
            by_table.setdefault(fqn, []).append(partition)
        plans: list[RunPlan] = []
        for fqn, partitions in by_table.items():
            table = self.catalog[fqn]
            if table.is_regional:  # each region's day is a run of its own: regions' days overlap in time
                plans += [self._plan(fqn, [partition], ready, now, states) for partition in sorted(partitions)]
                continue
            pdef = BY_PERIOD[table.period]
            limit = self.max_partitions_per_run(table)
            windows = sorted((pdef.time_window_for_partition_key(p), p) for p in partitions)
            run: list[str] = []
            previous_end = None
            for window, partition in windows:
                if run and (window.start != previous_end or (limit is not None and len(run) >= limit)):
                    plans.append(self._plan(fqn, run, ready, now, states))
                    run = []
                run.append(partition)
                previous_end = window.end
            plans.append(self._plan(fqn, run, ready, now, states))
        # submitted in the queue's order: a run that fits is launched as it is submitted, so the first submitted
        # takes the free slots
        return sorted(
            plans, key=lambda p: (-(p.priority or 0), _start(self.catalog[p.table], p.partitions[0]), p.table)
        )

    def _plan(
        self,
        fqn: str,
        run: list[str],
        ready: dict[tuple[str, str], tuple[Trigger, str]],
        now: datetime,
        states: ResolverSnapshot,
    ) -> RunPlan:
        table = self.catalog[fqn]
        end = partition_window(table, run[0]).end
        rebuild = all(states.state(table, partition).materialized for partition in run)
        late = tuple((p, states.rebuilds[(fqn, p)].changes) for p in run if (fqn, p) in states.rebuilds)
        return RunPlan(
            fqn,
            tuple(run),
            ready[(fqn, run[0])][0],
            priority=run_priority(fqn, end, now, rebuild, hourly=table.period == "hourly"),
            rebuild=rebuild,
            late_changes=late,
        )


_DEFER = "defer"


def _ended_between(pdef: TimeWindowPartitionsDefinition, since: datetime, now: datetime) -> list[str]:
    """The partitions whose windows ended after ``since`` and by ``now``, in time order."""
    if now <= since:
        return []
    first = pdef.get_first_partition_window()
    if first is None:
        return []
    key: str | None = pdef.get_partition_key_for_timestamp(max(since, first.start).timestamp())
    keys: list[str] = []
    while key is not None and (window := pdef.time_window_for_partition_key(key)).end <= now:
        if window.end > since:
            keys.append(key)
        key = pdef.get_next_partition_key(key)
    return keys


def _local_times_between(hhmm: str, since: datetime, now: datetime, tz: ZoneInfo) -> list[datetime]:
    """The instants in (since, now] whose local time in ``tz`` is ``hhmm``: none in almost every call."""
    hour, minute = (int(part) for part in hhmm.split(":"))
    day = since.astimezone(tz).date()
    found = []
    while (at := datetime(day.year, day.month, day.day, hour, minute, tzinfo=tz)) <= now:
        if at > since:
            found.append(at)
        day += timedelta(days=1)
    return found


def _advances(table: Table, own: PartitionState, verdict: Verdict) -> bool:
    """Whether the partition can now reach a later state than the one it was built in (estimated → completed)."""
    names = table.state_names
    if verdict.state is None or not names:
        return False
    built = names.index(own.state) if own.state in names else len(names) - 1  # no state: built whole
    return names.index(verdict.state) > built


def _start(table: Table, partition: str) -> float:
    return _bounds(table, partition)[0]


def _bounds(table: Table, partition: str) -> tuple[float, float]:
    """A partition's window as timestamps: its period's, or its region's day."""
    if isinstance(table, DerivedTable) and table.is_regional:
        day, region = split_regional_key(partition)
        return _region_window(table.zone_of(region), day)
    return _window(table.period, partition)


@functools.lru_cache(maxsize=20_000)
def _region_window(zone: str, day: str) -> tuple[float, float]:
    window = periods().region_days(zone).time_window_for_partition_key(day)
    return window.start.timestamp(), window.end.timestamp()


def _ended_within(table: Table, now: datetime, lookback: timedelta) -> list[str]:
    """The partitions of ``table`` whose windows ended within ``lookback`` of the latest's end, by ``now``: of a table
    with regions, each region's days."""
    if not (isinstance(table, DerivedTable) and table.is_regional):
        pdef = BY_PERIOD[table.period]
        return _ended_between(pdef, _last_window_end(pdef, now) - lookback, now)
    keys = []
    for region, zone in table.regions:
        days = periods().region_days(zone)
        keys += [regional_key(day, region) for day in _ended_between(days, _last_window_end(days, now) - lookback, now)]
    return keys


@functools.lru_cache(maxsize=200_000)
def _window(period: str, partition: str) -> tuple[float, float]:
    """A partition's window as timestamps: asked for every candidate, and Dagster's calendar costs tens of
    microseconds a call (a year of hourly partitions fits the cache)."""
    window = BY_PERIOD[period].time_window_for_partition_key(partition)
    return window.start.timestamp(), window.end.timestamp()


@functools.lru_cache(maxsize=64)
def _last_window_end(pdef: TimeWindowPartitionsDefinition, now: datetime) -> datetime:
    """The end of the latest partition at ``now``: the start of the window ``now`` lies in."""
    return pdef.time_window_for_partition_key(pdef.get_partition_key_for_timestamp(now.timestamp())).start
