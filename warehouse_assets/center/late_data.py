"""When late data rebuilds a partition: the rule of a table's late-data policy.

A partition already built is *stale* once upstream data it read changed after its build started. Its late-data
policy (:class:`warehouse_assets.catalog.LateDataPolicy`, declared per table or per dependency) says when it is built
again: :class:`LateData` finds the late changes, the policy that applies (the ``whole`` rule for a table that cannot
be rebuilt by key, :class:`RebuildKinds`), and asks :func:`due_time`, a pure function of times, for the moment from
when the first late change it has not absorbed appeared (``since``) and when its last rebuild was requested. The
resolver calls it for every built partition behind its inputs and keeps the answer in its ledger, looking at the
partition again at that moment; ``warehouse why`` and ``warehouse status`` print it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Protocol
from zoneinfo import ZoneInfo

from dagster import AssetKey

from warehouse_assets.catalog import BY_PERIOD, WHOLE, Catalog, DerivedTable, LateDataPolicy, Table, partition_window
from warehouse_assets.catalog.additive import MAX_CHANGED_ROWS, WarehouseTypes
from warehouse_assets.catalog.dependencies import LATEST
from warehouse_assets.catalog.key_locality import MAX_KEYS, MAX_SHARE, SMALL_PARTITION, key_locality
from warehouse_assets.catalog.lineage import WarehouseLineage
from warehouse_assets.catalog.policies import AFTER, AT_ONCE, DAILY_AT, EVERY, NEVER
from warehouse_assets.center.ledger import Ledger, Rebuild, Stale
from warehouse_assets.center.state_store import PartitionState
from warehouse_assets.materialize.gate import Verdict

if TYPE_CHECKING:
    from warehouse_assets.center.reverse_index import ReverseIndex

# Automatic runs look this far back from the latest partition; older history is a backfill's: deploying a table must
# not start runs for all of its past. Late data reaches back no further than each table's own, shorter, lookback.
LOOKBACK = timedelta(days=35)

# the lane of a run whose partitions were all built before (late data, a later state, a repair): the instance's run
# coordinator holds such runs to a share of the run slots (dagster_home/dagster.yaml, tag_concurrency_limits), so a
# first build, and what a user launches, always find a slot free
LANE_TAG = "warehouse/lane"
# how soon a partition waiting for an input's rebuild that is coming now is looked at again, should that rebuild not
# land (it failed, or was canceled)
LOOK_AGAIN = timedelta(minutes=15)
REBUILD_LANE = "rebuild"
# how a request key records the states of the upstream partitions it read that pass through states
READ_STATES = " read-states="


def due_time(
    policy: LateDataPolicy,
    *,
    window_end: datetime,
    newest_end: datetime,
    since: datetime,
    last_rebuild: datetime | None,
    now: datetime,
    timezone: ZoneInfo,
) -> tuple[datetime | None, str]:
    """When the rebuild of a partition (window ending ``window_end``; the table's newest built partition's ending
    ``newest_end``) with late data since ``since`` is due; or None, with the reason, when the policy never rebuilds
    it automatically."""
    # the lookback counts back from the table's newest partition, not from the clock (as SQLMesh's and dbt's count
    # intervals back from the latest one): a catch-up of past days, or a replay, follows late data as the live
    # stream does, and a partition the table has moved far beyond is left to a repair
    if window_end < newest_end - timedelta(minutes=policy.lookback_minutes):
        return None, (
            f"beyond the late-data lookback ({policy.describe_lookback()} behind the table's newest partition): "
            "rebuilt only by a repair (warehouse taint)"
        )
    if policy.rebuild == NEVER:
        return None, "the policy rebuilds it only by a repair (warehouse taint)"
    if policy.rebuild == AT_ONCE:
        return since, ""
    if last_rebuild is None and since < window_end + timedelta(minutes=policy.grace_minutes):
        # the period that just closed is still settling: its last rows are the build it waits for, not a correction
        return since, ""
    if policy.rebuild == EVERY:
        interval = timedelta(minutes=policy.every_minutes or 0)
        due = since + interval
        # at most one rebuild per interval, also for a change older than the last rebuild that it did not absorb (one
        # that reached an input after that input's read, and comes through the input's own rebuild later)
        if last_rebuild is not None:
            due = max(due, last_rebuild + interval)
        return due, ""
    if policy.rebuild == AFTER:
        interval = timedelta(minutes=policy.every_minutes or 0)
        settled = window_end + interval
        # the settled rebuild waits a grace more: what reached the sources just before the window settled reaches
        # this partition through its inputs' rebuilds in that time, and one rebuild takes it all
        due = max(since, settled + timedelta(minutes=policy.grace_minutes))
        # a change later still (it reached the sources after the window settled): once per interval. One that came
        # before (``since`` is when the change first appeared, however far up) and reached the partition after the
        # settled rebuild (a longer chain) is the rest of the settling: a grace after that rebuild
        if last_rebuild is not None and last_rebuild >= settled:
            later = interval if since >= settled else timedelta(minutes=policy.grace_minutes)
            due = max(due, last_rebuild + later)
        return due, ""
    assert policy.rebuild == DAILY_AT and policy.at is not None
    hour, minute = (int(part) for part in policy.at.split(":"))
    after = max(since, last_rebuild) if last_rebuild is not None else since
    local = after.astimezone(timezone)
    day = local.date()
    while (at := datetime(day.year, day.month, day.day, hour, minute, tzinfo=timezone)) <= after:
        day += timedelta(days=1)
    return at, ""


class RebuildKinds:
    """Which policy rule a table's late-data rebuild follows: a key-local table's rebuild replaces only the changed
    keys' rows, an additive total's only the changed groups' rows, from the changed input rows (``rebuild``); any
    other's recomputes whole partitions (``whole``). Proven from each table's SQL the first time it matters (a
    warehouse of 10,000 tables pays for the ones late data reaches), and kept."""

    def __init__(self, catalog: Catalog):
        self.catalog = catalog
        self._lineage: WarehouseLineage | None = None
        self._types: WarehouseTypes | None = None
        self._key_local: dict[str, bool] = {}

    def rebuilt_whole(
        self, table: DerivedTable, own: PartitionState, late_upstream: Sequence[PartitionState]
    ) -> tuple[bool, str]:
        """Whether the rebuild will recompute whole partitions, and why when its size decides it: a table that is not
        key-local always does; a key-local one when its late changes, as the upstream materializations recorded them,
        are more keys than a key-scoped rebuild takes (the runner's limits). An upstream that recorded no count is
        taken as few: the runner decides for certain when it runs. An additive total's likewise past the changed input
        rows its maintenance reads (:data:`MAX_CHANGED_ROWS`)."""
        changed = sum(s.changed or 0 for s in late_upstream)
        if not self.key_local(table):
            if not self.additive(table):
                return True, ""
            if changed > MAX_CHANGED_ROWS:
                return True, f"{changed:,} rows changed upstream: rebuilt whole, so by the whole rule"
            return False, ""
        rows = own.rows
        if changed > MAX_KEYS or (rows is not None and rows >= SMALL_PARTITION and changed > MAX_SHARE * rows):
            return True, f"{changed:,} rows changed upstream: rebuilt whole, so by the whole rule"
        return False, ""

    def additive(self, table: DerivedTable) -> bool:
        """Whether the table is a total maintained from its input's changed rows (proven once; kept by the types)."""
        if self._types is None:
            self._types = WarehouseTypes(self.catalog, self._lineage)
        return self._types.verdict(table).additive

    def key_local(self, table: DerivedTable) -> bool:
        found = self._key_local.get(table.fqn)
        if found is None:
            if self._lineage is None:
                self._lineage = WarehouseLineage(self.catalog)
            try:
                found = key_locality(table, self._lineage.input_columns(table)).key_local
            except Exception:  # a proof that cannot be followed is no proof: rebuilt whole, as the runner does
                found = False
            self._key_local[table.fqn] = found
        return found


class LateSnapshot(Protocol):
    """What the late-data rule reads of the resolver's snapshot of the store and the ledger, and records in it."""

    rebuilds: dict[tuple[str, str], Rebuild]

    def states(self, table: Table, keys: Sequence[str]) -> dict[str, PartitionState]: ...

    def stale(self, fqn: str, partition: str) -> Stale | None: ...

    def stale_due(self, fqn: str, partition: str) -> float | None: ...

    def rebuilt(self, fqn: str, partition: str) -> Rebuild | None: ...

    def newest_built(self, table: Table) -> str | None: ...

    def mark_stale(self, entry: Stale) -> None: ...

    def read_stale(self, fqn: str, partitions: Iterable[str]) -> None: ...

    def read_rebuilds(self, fqn: str, partitions: Iterable[str]) -> None: ...


class LateData:
    """The late-data rule: whether a built partition whose inputs changed after its build is rebuilt now, under the
    policy of each dependency the change came through, or recorded stale with the time its rebuild is due."""

    def __init__(self, catalog: Catalog, ledger: Ledger, timezone: ZoneInfo, index: ReverseIndex | None = None):
        self.catalog, self.ledger, self._timezone, self.index = catalog, ledger, timezone, index
        # per snapshot (held, so that a later one is never taken for it): the partitions found with no rebuild coming
        # anywhere upstream of them
        self._quiet: tuple[LateSnapshot | None, set[tuple[str, str]]] = (None, set())
        self.kinds = RebuildKinds(catalog)
        self._fqn = {AssetKey(t.key).to_user_string(): t.fqn for t in catalog}  # the store's asset keys → tables
        self._stateful = {AssetKey(t.key).to_user_string() for t in catalog if t.state_names}

    def read_states(self, upstream: Sequence[PartitionState]) -> str:
        """What a request key adds for the upstream partitions that pass through states: the state each was in, so
        that a later change of one tells its next state (planned, built at once) from late data within a state the
        build read."""
        stated = sorted([s.asset_key, s.partition, s.state] for s in upstream if s.asset_key in self._stateful)
        return f"{READ_STATES}{json.dumps(stated)}" if stated else ""

    def rebuild_due(
        self,
        table: DerivedTable,
        partition: str,
        own: PartitionState,
        verdict: Verdict,
        read_from: int | None,
        key: str,
        states: LateSnapshot,
        now: datetime,
    ) -> bool:
        """Whether the late data of a built partition rebuilds it now, under the late-data policy of each dependency
        it came through (the most urgent one counts). If not, the partition is recorded stale with the time its
        rebuild is due (or none), and the late changes its rebuild will absorb."""
        inputs = self._late_inputs(table, partition, own, verdict, read_from, states)
        if inputs is None:
            return True
        late_policies, late_upstream, used = inputs
        previous = states.stale(table.fqn, partition)
        for fqn, keys in self._by_table(late_upstream).items():
            states.read_rebuilds(fqn, keys)
        # as late as the change itself: through an upstream rebuilt for late data, the change that rebuild absorbed
        origins = [now.timestamp()]
        for up in late_upstream:
            rebuilt = states.rebuilt(self._fqn[up.asset_key], up.partition)
            if rebuilt is not None:
                origins.append(rebuilt.origin)
        since = min([*origins, *([previous.since] if previous else [])])
        changes = _late_changes(previous, key, late_upstream)
        declared = late_policies or [table.late_data]
        whole, why_whole = self.kinds.rebuilt_whole(table, own, late_upstream)
        # a rebuild that recomputes whole partitions follows the ``whole`` rule, where one is declared
        policies = [p.for_whole_rebuilds() if whole else p for p in declared]
        due, policy, note = self._due(table, partition, policies, since, states, now)
        if not note and any(p.whole for p in declared):
            note = why_whole
        if due is not None and due <= now:
            waiting = self._waiting(late_upstream, used, states, now) or (
                self._upstream_rebuilding(table, partition, states, now, due + timedelta(minutes=policy.grace_minutes))
                if whole
                else None
            )
            if waiting is None:
                states.rebuilds[(table.fqn, partition)] = Rebuild(since, changes, now.timestamp())
                return True
            # an input's own rebuild is coming: rebuilt now, the partition would be rebuilt again after it
            due, note = waiting
        states.mark_stale(
            Stale(
                table.fqn,
                partition,
                since,
                None if due is None else due.timestamp(),
                changes,
                key,
                policy.describe(),
                note,
            )
        )
        return False

    def _late_inputs(
        self,
        table: DerivedTable,
        partition: str,
        own: PartitionState,
        verdict: Verdict,
        read_from: int | None,
        states: LateSnapshot,
    ) -> tuple[list[LateDataPolicy], list[PartitionState], list[PartitionState]] | None:
        """The policies of the dependencies late data came through, the upstream partitions that changed after the
        build read them, and every upstream partition the build uses; None when what arrived is not late data but
        the rest the partition was planned to receive, built at once."""
        late_policies: list[LateDataPolicy] = []
        late_upstream: list[PartitionState] = []
        used: list[PartitionState] = []
        for edge in verdict.edges:
            keys = edge.used if edge.dep.mode == LATEST else edge.upstream.keys
            upstream = states.states(self.catalog[edge.dep.table], keys).values()
            used.extend(upstream)
            found = [
                s
                for s in upstream
                if s.storage_id is not None
                and s.storage_id > (read_from if read_from is not None else -1)
                and s.partition != WHOLE
                and not (s.run_id and s.run_id == own.run_id)
            ]
            if found and self.catalog[edge.dep.table].state_names and self._state_moved(table.fqn, partition, found):
                # an upstream that passes through states reached one the build did not read: its next state,
                # planned: at once. A change within a state it had read (a late-data rebuild of it) is late data
                return None
            if found and edge.dep.weak and not self._read_before(table.fqn, partition, found):
                # a dependency that builds before its window is whole (a deadline, any of a window, the latest): an
                # upstream partition its build did not have is the rest it was built to receive, planned: at once.
                # A change to one it had read is late data, as through any dependency
                return None
            if found:
                late_policies.append(table.late_data_policy(edge.dep))
                late_upstream.extend(found)
        return late_policies, late_upstream, used

    def _due(
        self,
        table: DerivedTable,
        partition: str,
        policies: Sequence[LateDataPolicy],
        since: float,
        states: LateSnapshot,
        now: datetime,
    ) -> tuple[datetime | None, LateDataPolicy, str]:
        """The most urgent of ``policies``' due times for late data since ``since``, that policy, and the reason when
        none rebuilds it automatically."""
        own_rebuild = states.rebuilt(table.fqn, partition)
        window_end = _window_end(table, partition)
        newest = states.newest_built(table)
        newest_end = max(window_end, _window_end(table, newest) if newest else window_end)
        last = None if own_rebuild is None else datetime.fromtimestamp(own_rebuild.planned_at, UTC)
        dues = [
            due_time(
                policy,
                window_end=window_end,
                newest_end=newest_end,
                since=datetime.fromtimestamp(since, UTC),
                last_rebuild=last,
                now=now,
                timezone=self._timezone,
            )
            for policy in policies
        ]
        timed = [(due, policy) for (due, _), policy in zip(dues, policies, strict=True) if due]
        if not timed:
            return None, policies[0], dues[0][1]
        due, policy = min(timed, key=lambda d: d[0])
        return due, policy, ""

    def _waiting(
        self,
        late_upstream: Sequence[PartitionState],
        used: Sequence[PartitionState],
        states: LateSnapshot,
        now: datetime,
    ) -> tuple[datetime | None, str] | None:
        """None when no input's own rebuild is coming; else when to look at the partition again and why it waits."""
        for fqn, keys in self._by_table(s for s in used if s.storage_id is not None).items():
            states.read_stale(fqn, keys)
        waiting = [u for u in late_upstream if states.stale_due(self._fqn[u.asset_key], u.partition) is not None]
        if waiting:
            first = waiting[0]
            first_due = states.stale_due(self._fqn[first.asset_key], first.partition) or now.timestamp()
            when = datetime.fromtimestamp(first_due, self._timezone)
            # looked at again when that rebuild is due, not only when it lands: should the input be left to a repair
            # then (its lookback passed), this partition still absorbs the changes that did reach it
            return (
                max(when, now + LOOK_AGAIN),
                f"waits for {self._fqn[first.asset_key]} {first.partition}'s rebuild, due {when:%Y-%m-%d %H:%M}",
            )
        # an input whose own rebuild comes now (due, requested in this pass, or running) brings a change this rebuild
        # would miss; under a daily rule the partition would then wait a day for it, and a chain of such tables a day
        # per layer: it waits for that rebuild instead. Its landing looks at the partition again; should it not land
        # (failed, canceled), the timer does
        late_keys = {(u.asset_key, u.partition) for u in late_upstream}
        coming = [u for u in used if (u.asset_key, u.partition) not in late_keys and self._rebuilding(u, states, now)]
        if coming:
            first = coming[0]
            return now + LOOK_AGAIN, f"waits for {self._fqn[first.asset_key]} {first.partition}'s rebuild, coming now"
        return None

    def _upstream_rebuilding(
        self, table: DerivedTable, partition: str, states: LateSnapshot, now: datetime, until: datetime
    ) -> tuple[datetime | None, str] | None:
        """A whole rebuild also waits for a rebuild coming further up (an input's input, rebuilt whole when its
        window settles, makes the input rebuild at once after it): built before it, the partition would be rebuilt
        whole again a grace later, a day's figures recomputed twice or three times for one settling. None when no
        rebuild is coming anywhere upstream, within the lookback the index knows. A rebuild due before the wait ends
        counts as coming: an input whose last rebuild (by key, minutes after its window settled) keeps its whole one
        a grace after it, is due after the look-again and still well within the grace. So does an upstream partition
        behind its own inputs and not yet judged (an input of it rebuilt since its build, and no stale entry): the
        resolver has not looked at it yet in this pass, and will rebuild it, or record when. The wait ends a grace
        past the partition's own due time, whatever is still coming, so a stream of corrections upstream never
        starves it."""
        if self.index is None or now >= until:
            return None
        soon = until.timestamp()
        if self._quiet[0] is not states:
            self._quiet = (states, set())
        quiet = self._quiet[1]
        seen: set[tuple[str, str]] = set()
        # each partition to look above, with its build's storage id when it is one to judge as behind (not the
        # partition itself, which is behind by definition, nor one already recorded stale)
        frontier: list[tuple[DerivedTable, str, int | None]] = [(table, partition, None)]
        while frontier:
            below, key, built = frontier.pop()
            for dep in below.deps:
                upstream = self.catalog[dep.table]
                if upstream.is_source or upstream.is_static or dep.table == below.fqn:
                    continue  # a source is reported, not rebuilt; a T-1 of itself is its own history
                keys = self.index.upstream_of(below.fqn, dep.table, key, now) or []
                fresh = [k for k in keys if (dep.table, k) not in seen and (dep.table, k) not in quiet]
                seen.update((dep.table, k) for k in fresh)
                states.read_stale(dep.table, fresh)
                found = states.states(upstream, keys if built is not None else fresh)
                if built is not None and any(s.storage_id is not None and s.storage_id > built for s in found.values()):
                    return now + LOOK_AGAIN, f"waits for {below.fqn} {key}, behind its input {dep.table}"
                for k in fresh:
                    state = found[k]
                    due = states.stale_due(dep.table, k) if state.storage_id is not None else None
                    if self._rebuilding(state, states, now) or (due is not None and due <= soon):
                        return now + LOOK_AGAIN, f"waits for {dep.table} {k}'s rebuild upstream, coming now"
                    if isinstance(upstream, DerivedTable):
                        judged = state.storage_id is None or states.stale(dep.table, k) is not None
                        frontier.append((upstream, k, None if judged else state.storage_id))
        quiet.update(seen)
        return None

    def _by_table(self, upstream: Iterable[PartitionState]) -> dict[str, list[str]]:
        """Upstream partitions by table: what one ledger query reads."""
        found: dict[str, list[str]] = {}
        for state in upstream:
            found.setdefault(self._fqn[state.asset_key], []).append(state.partition)
        return found

    def _rebuilding(self, upstream: PartitionState, states: LateSnapshot, now: datetime) -> bool:
        """Whether a built input partition is being rebuilt for late data now, or will be in this pass."""
        if upstream.storage_id is None:
            return False
        if upstream.queued or upstream.in_progress:
            return True
        fqn = self._fqn[upstream.asset_key]
        due = states.stale_due(fqn, upstream.partition)
        if due is not None and due <= now.timestamp():
            return True
        requested = states.rebuilds.get((fqn, upstream.partition))
        return requested is not None and requested.planned_at >= now.timestamp()

    def _state_moved(self, fqn: str, partition: str, upstream: Sequence[PartitionState]) -> bool:
        """Whether one of ``upstream`` is in another state than the partition's latest build read (its request key
        records the states read; a key from before it did: moved, as it was always taken to be)."""
        key = self.ledger.last_request(fqn, partition)
        at = -1 if key is None else key.rfind(READ_STATES)
        if key is None or at < 0:
            return True
        read = {(a, p): state for a, p, state in json.loads(key[at + len(READ_STATES) :])}
        return any(read.get((s.asset_key, s.partition)) != s.state for s in upstream)

    def _read_before(self, fqn: str, partition: str, upstream: Sequence[PartitionState]) -> bool:
        """Whether every one of ``upstream`` was materialized when the partition's latest build was requested (its
        request key lists each upstream partition with its storage id then)."""
        key = self.ledger.last_request(fqn, partition)
        if key is None:
            return False
        listed, _ = json.JSONDecoder().raw_decode(key)  # the key's upstream list; a state or note may follow it
        had = {(a, p) for a, p, storage_id in listed if storage_id is not None}
        return all((s.asset_key, s.partition) in had for s in upstream)


def _window_end(table: Table, partition: str) -> datetime:
    """The end of a partition's window, as :func:`partition_window` gives it (asked for every late partition, and
    Dagster's calendar keeps only its last hundred windows)."""
    if isinstance(table, DerivedTable) and table.is_regional:
        return partition_window(table, partition).end
    pdef = BY_PERIOD[table.period]
    return _period_end(pdef.timezone, table.period, partition)


@functools.lru_cache(maxsize=200_000)
def _period_end(timezone: str, period: str, partition: str) -> datetime:
    """Cached by the timezone too: a key's window is its period's in the business timezone, whatever the start."""
    return BY_PERIOD[period].time_window_for_partition_key(partition).end


def _late_changes(previous: Stale | None, key: str, late: Sequence[PartitionState]) -> int:
    """The late changes a stale partition's rebuild absorbs: each upstream materialization newer than its build, as
    the center saw them (several reports of one hour between two looks count once)."""
    if previous is None:
        return len(late)
    seen, _ = json.JSONDecoder().raw_decode(previous.upstream)
    before = {(asset, partition): storage_id for asset, partition, storage_id in seen}
    return previous.changes + sum(1 for s in late if before.get((s.asset_key, s.partition)) != s.storage_id)
