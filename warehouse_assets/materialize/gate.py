"""The one gate: may partition P of a table run now, and if not, why?

Built on the exact upstream partitions (:func:`warehouse_assets.catalog.upstream_partitions`, never Dagster's
clamped mappings): for each dependency of P, every upstream partition P needs is judged

* ``does not exist`` — before the upstream's first partition or in the future: P cannot run now (and a window
  reaching before the warehouse start never can);
* ``missing`` — exists but is not materialized;
* ``in progress`` — not materialized, a run is building it;
* ``tainted`` — materialized, but marked tainted (its data is known bad, :mod:`warehouse_assets.materialize.validity`)
  and not rebuilt since, unless the dependency says ``accept_tainted``: a tainted upstream is as good as missing, and
  P waits for it to be valid again: rebuilt by its repair while that repair runs (a tainted ODS hour or delivery is
  made valid by its source, a re-ingest or a release), else by the engine once its own upstream is valid;
* ``check failed`` — materialized, but a blocking data-quality check failed on its latest materialization
  (unless the dependency says ``ignore_dq``);
* ``ok`` otherwise.

P may run when every upstream partition is ``ok``, except through a weak dependency: past its ``deadline`` (mode
``deadline``), or with at least ``min`` usable partitions of its window (mode ``any``), the partitions that are not
usable are *waived*: P runs without them; through a ``latest`` dependency P reads only the most recent usable partition
of its window and waives the others. A partition built past a deadline without some upstream is *degraded*
(:attr:`Verdict.degraded`); when what it lacked arrives, it is new upstream data and P is built again.

The gate reads partition state through
:class:`PartitionStateReader` only; callers supply the state they trust: the run guard
(:mod:`warehouse_assets.materialize.runner`) the instance's materializations plus what its own run wrote,
``warehouse why`` (:mod:`warehouse_assets.explain.why`) the instance's partition statuses, the headless path
(:mod:`warehouse_assets.cli.headless`) the instance, the dependency center (:mod:`warehouse_assets.center.resolver`)
its partition state store; the backfill plan (:func:`backfill_partitions`) asks it over a range. Which partitions
can ever be built at all is decided once, from the catalog (:mod:`warehouse_assets.materialize.buildable`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from dagster import AssetKey, DagsterInstance

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
    upstream_partitions,
    weak_deadline,
)
from warehouse_assets.materialize.quality import failed_blocking_checks, latest_materialization
from warehouse_assets.materialize.validity import Taint, gone_in_instance, tainted_in_instance

if TYPE_CHECKING:
    from warehouse_assets.catalog import Catalog, Dependency, Table

OK = "ok"
MISSING = "missing"
NONEXISTENT = "does not exist"
IN_PROGRESS = "in progress"
CHECK_FAILED = "check failed"
TAINTED = "tainted"
EARLIER_STATE = "earlier state"  # materialized, in a state the dependency does not accept yet (estimated)
WAIVED = "waived"  # not usable, not waited for: past a deadline, or an any window has enough without it


class PartitionStateReader(Protocol):
    """What the gate needs to know about partitions: deliberately narrow, so that another state store (the
    dependency center's) can stand behind it."""

    def materialized(self, table: Table, keys: Sequence[str]) -> set[str]:
        """Which of ``keys`` of ``table`` are materialized."""
        ...

    def in_progress(self, table: Table, keys: Sequence[str]) -> set[str]:
        """Which of ``keys`` of ``table`` a run is building now."""
        ...

    def failed_blocking_checks(self, table: Table, keys: Sequence[str]) -> dict[str, list[str]]:
        """Partition → its blocking checks that failed on its latest materialization."""
        ...

    def tainted(self, table: Table, keys: Sequence[str]) -> dict[str, Taint]:
        """Partition → its taint, for those of ``keys`` marked tainted on their latest materialization."""
        ...

    def reached_states(self, table: Table, keys: Sequence[str]) -> dict[str, str | None]:
        """Partition → the state its latest materialization reached, for materialized ``keys`` of a table that
        declares states (None: built before it declared them, taken as its last state)."""
        ...

    def repair_running(self, backfill_id: str) -> bool:
        """Whether the repair backfill ``backfill_id`` is still running (it rebuilds, or waits for, its partitions)."""
        ...


def backfill_running(instance: DagsterInstance, backfill_id: str) -> bool:
    """Whether the backfill ``backfill_id`` exists and is still requested (the daemon still launches its runs)."""
    backfill = instance.get_backfill(backfill_id) if backfill_id else None
    return backfill is not None and backfill.status.value == "REQUESTED"


class InstanceStates:
    """Partition state from the Dagster instance: a partition ever materialized counts as materialized, and
    nothing as in progress — the run guard's view, whose own run is the one in progress."""

    def __init__(self, instance: DagsterInstance):
        self.instance = instance
        self._materialized: dict[str, set[str]] = {}
        self.written: dict[str, set[str]] = {}  # partitions a run wrote itself, not yet visible in the instance
        # partition → the newest upstream materialization a run waited for before reading its inputs
        self.read_after: dict[str, int] = {}

    def refresh(self) -> None:
        """Forget what was read: the next questions read the instance again (a run waiting for a repair)."""
        self._materialized.clear()

    def materialized(self, table: Table, keys: Sequence[str]) -> set[str]:
        if table.fqn not in self._materialized and table.is_static:  # unpartitioned: materialized at all
            built = self.instance.get_latest_materialization_event(AssetKey(table.key)) is not None
            self._materialized[table.fqn] = {WHOLE} if built else set()
        if table.fqn not in self._materialized:
            self._materialized[table.fqn] = set(self.instance.get_materialized_partitions(AssetKey(table.key)))
        found = self._materialized[table.fqn] & set(keys)
        # a partition whose data left the lake (marked by the reconciliation) is not there to read, until rebuilt
        gone = gone_in_instance(self.instance, table, sorted(found - self.written.get(table.fqn, set())))
        return ((found - set(gone)) | self.written.get(table.fqn, set())) & set(keys)

    def in_progress(self, table: Table, keys: Sequence[str]) -> set[str]:
        return set()

    def failed_blocking_checks(self, table: Table, keys: Sequence[str]) -> dict[str, list[str]]:
        # a partition this run rewrote is judged by this run's checks, not by its previous materialization's
        fresh = self.written.get(table.fqn, set())
        return failed_blocking_checks(self.instance, table, [k for k in keys if k not in fresh])

    def tainted(self, table: Table, keys: Sequence[str]) -> dict[str, Taint]:
        # a partition this run rewrote is new data: its taint was on the previous materialization
        fresh = self.written.get(table.fqn, set())
        return tainted_in_instance(self.instance, table, [k for k in keys if k not in fresh])

    def repair_running(self, backfill_id: str) -> bool:
        return backfill_running(self.instance, backfill_id)

    def reached_states(self, table: Table, keys: Sequence[str]) -> dict[str, str | None]:
        found: dict[str, str | None] = {}
        for key in keys:  # a run reads few partitions of a table with states: one lookup each
            record = latest_materialization(self.instance, table, key)
            found[key] = state_in(record.asset_materialization, key) if record is not None else None
        return found


@dataclass(frozen=True)
class EdgeVerdict:
    """The gate's verdict on one dependency of a partition: each upstream partition it needs, judged."""

    dep: Dependency
    upstream: UpstreamPartitions
    missing: list[str] = field(default_factory=list)
    in_progress: list[str] = field(default_factory=list)
    failed_checks: dict[str, list[str]] = field(default_factory=dict)  # partition → blocking checks failed
    ignored_checks: dict[str, list[str]] = field(default_factory=dict)  # failed, but the dependency says ignore_dq
    tainted: dict[str, Taint] = field(default_factory=dict)  # partition → its taint
    repairing: frozenset[str] = frozenset()  # of the tainted ones, those whose repair backfill is still running
    upstream_kind: str = ""  # "ods", "external", "static" or "derived": how a tainted upstream gets valid again
    accepted_taints: dict[str, Taint] = field(default_factory=dict)  # tainted, but the dependency says accept_tainted
    # a weak dependency's partitions that are not usable and not waited for: past its deadline, or enough of an any
    # window usable without them; they are in none of the lists above
    waived: dict[str, str] = field(default_factory=dict)  # partition → what it was (missing, in progress, ...)
    early: dict[str, str] = field(default_factory=dict)  # partition → its state, one the dependency does not accept
    accepted: tuple[str, ...] = ()  # the upstream's states the dependency accepts, if it declares states
    deadline: datetime | None = None  # mode deadline: when the dependency stops being waited for

    @property
    def nonexistent(self) -> list[str]:
        return [k for k in self.upstream.nonexistent if k not in self.waived]

    @property
    def ok(self) -> bool:
        return not (
            self.nonexistent or self.missing or self.in_progress or self.tainted or self.failed_checks or self.early
        )

    @property
    def used(self) -> list[str]:
        """The upstream partitions the partition reads: its window but the waived ones."""
        return [k for k in self.upstream.keys if k not in self.waived]

    @property
    def waits_for_repair(self) -> bool:
        """Held back only by tainted partitions that a running repair rebuilds (or, for an ODS hour or a delivery,
        waits for): the partition will be buildable once that repair has got that far."""
        return (
            bool(self.tainted)
            and set(self.tainted) <= self.repairing
            and not (self.nonexistent or self.missing or self.in_progress or self.failed_checks or self.early)
        )

    @property
    def degraded(self) -> bool:
        """Built without partitions it waits for until a deadline: not the data it should be, until they arrive."""
        return self.dep.mode == DEADLINE and bool(self.waived)

    def state(self, key: str) -> str:
        """The verdict on one upstream partition of this edge."""
        if key in self.waived:
            return WAIVED
        if key in self.nonexistent:
            return NONEXISTENT
        if key in self.in_progress:
            return IN_PROGRESS
        if key in self.missing:
            return MISSING
        if key in self.tainted:
            return TAINTED
        if key in self.failed_checks:
            return CHECK_FAILED
        return EARLIER_STATE if key in self.early else OK

    def reason(self, table: Table, partition: str) -> str | None:
        """Why this edge holds ``partition`` of ``table`` back (the run guard's message), or None."""
        if self.ok:
            return None
        if self.dep.mode in (ANY, LATEST):
            usable = sum(1 for k in self.upstream.keys if self.state(k) == OK)
            return (
                f"{table.fqn} {partition} waits for {self.dep.min} usable partition(s) of {self.dep.table} in its "
                f"window ({span([*self.upstream.nonexistent, *self.upstream.keys])}); {usable} are"
            )
        until = (
            f" until {self.deadline:%Y-%m-%d %H:%M} (then it runs without them, degraded)"
            if self.deadline is not None
            else ""
        )
        if self.nonexistent:
            return (
                f"{table.fqn} {partition} needs {len(self.nonexistent)} partition(s) of {self.dep.table} that do not "
                f"exist (in the future or before its first partition): {names(self.nonexistent)}{until}"
            )
        waiting = [k for k in self.upstream.keys if k in self.missing or k in self.in_progress]
        if waiting == [WHOLE]:
            return f"{table.fqn} {partition} waits for the static table {self.dep.table}, which is not built yet"
        if waiting:
            return (
                f"{table.fqn} {partition} waits for {len(waiting)} partition(s) of {self.dep.table} that are not "
                f"materialized: {names(waiting)}{until}"
            )
        if self.early:
            wanted = " or ".join(self.accepted)
            first, reached = next(iter(self.early.items()))
            return (
                f"{table.fqn} {partition} waits for {len(self.early)} partition(s) of {self.dep.table} to reach "
                f"{wanted} ({span(list(self.early))}; {first} is {reached}){until}"
            )
        if self.tainted:
            return self._taint_reason(table, partition) + until
        first, checks = next(iter(self.failed_checks.items()))
        return (
            f"{table.fqn} {partition} refuses to run: {len(self.failed_checks)} partition(s) of {self.dep.table} "
            f"failed a blocking data-quality check ({span(list(self.failed_checks))}; {first}: "
            f"{', '.join(checks)}). Fix and re-run {self.dep.table}, or declare `ignore_dq: true` on the "
            "dependency to proceed anyway." + until
        )

    def _taint_reason(self, table: Table, partition: str) -> str:
        """Why a tainted upstream holds the partition back, and what makes it valid again (never the command that
        marked it: that one is done)."""
        first, taint = next(iter(self.tainted.items()))
        keys = list(self.tainted)
        head = (
            f"{table.fqn} {partition} waits for {len(keys)} partition(s) of {self.dep.table} that are tainted "
            f"({span(keys)}; {first}: {taint.describe()})"
        )
        bounds = "" if keys == [WHOLE] else keys[0] if len(keys) == 1 else f"{keys[0]} {keys[-1]}"
        named = f"{self.dep.table} {bounds}".strip()
        release = f'released (`warehouse release {named} --reason "…"`: accepted as is)'
        if self.upstream_kind == "ods":
            reingest = f"re-ingested from its landing segments (`warehouse reingest {named}`)"
            how = f"reported again by its source, {reingest} or {release}"
        elif self.upstream_kind == "external":
            how = f"delivered again by its producer or {release}"
        elif self.upstream_kind == "static":
            how = "built again from its corrected SQL (the static_tables sensor)"
        else:
            how = "rebuilt: by the engine once their own upstream is valid, or by a repair of them"
        repairs = sorted({t.repair for k, t in self.tainted.items() if k in self.repairing})
        if self.waits_for_repair and self.upstream_kind in ("ods", "external"):
            return f"{head}; the repair backfill {', '.join(repairs)} waits for it to be {how}"
        if self.waits_for_repair:
            return f"{head}; the repair backfill {', '.join(repairs)} rebuilds them first"
        return f"{head}: they are valid again once {how}; or declare `accept_tainted: true` on the dependency"


@dataclass(frozen=True)
class Verdict:
    """May ``partition`` of ``table`` run now, and if not, why: one verdict per dependency."""

    table: Table
    partition: str
    edges: list[EdgeVerdict]
    state: str | None = None  # of a table with states: the latest one the partition can reach now (None: none)
    # of a table with states, built in an earlier one: what its last state waits for
    later: list[str] = field(default_factory=list)

    @property
    def may_run(self) -> bool:
        return all(edge.ok for edge in self.edges)

    @property
    def reasons(self) -> list[str]:
        return [r for edge in self.edges if (r := edge.reason(self.table, self.partition)) is not None]

    @property
    def waits_for_repair(self) -> bool:
        """Not runnable yet only because of tainted upstream partitions that running repairs make valid: a run of a
        repair waits for them instead of failing."""
        blocked = [edge for edge in self.edges if not edge.ok]
        return bool(blocked) and all(edge.waits_for_repair for edge in blocked)

    @property
    def degraded(self) -> dict[str, dict[str, str]]:
        """Upstream table → its partitions the partition runs without past their deadline, and what they were."""
        return {edge.dep.table: edge.waived for edge in self.edges if edge.degraded}


def decide(
    catalog: Catalog,
    table: Table,
    partition: str,
    states: PartitionStateReader,
    current_time: datetime | None = None,
    windows: Sequence[tuple[Dependency, UpstreamPartitions]] | None = None,
) -> Verdict:
    """The gate: judge every upstream partition ``partition`` of ``table`` needs, dependency by dependency.

    ``windows`` are the exact upstream partitions of each dependency when the caller has them already (a table with
    states is judged on each state's own windows).
    """
    now = current_time or datetime.now(UTC)
    if table.state_names:
        return _decide_state(catalog, table, partition, states, now)
    if windows is None:
        windows = [(dep, upstream_partitions(catalog, table, dep, partition, current_time=now)) for dep in table.deps]
    windows = [*windows, *reference_windows(table)]
    return Verdict(
        table,
        partition,
        [judge(catalog, dep, up, states, weak_deadline(table, dep, partition), now) for dep, up in windows],
    )


def _decide_state(
    catalog: Catalog, table: Table, partition: str, states: PartitionStateReader, now: datetime
) -> Verdict:
    """A table with states: the latest state ``partition`` can reach now, judged on that state's dependencies; when it
    can reach none, the verdict of the first state whose inputs can all exist (what it waits for at all: on a
    warehouse's first day a state reading the day before never can)."""
    assert isinstance(table, DerivedTable)
    verdicts = []
    for state in table.states:
        edges = [
            judge(
                catalog,
                dep,
                upstream_partitions(catalog, table, dep, partition, current_time=now),
                states,
                weak_deadline(table, dep, partition),
                now,
            )
            for dep in state.deps
        ]
        edges += [judge(catalog, ref, whole, states) for ref, whole in reference_windows(table)]
        verdicts.append(Verdict(table, partition, edges, state=state.name))
    reachable = [v for v in verdicts if v.may_run]
    if not reachable:
        possible = [v for v in verdicts if not any(edge.nonexistent for edge in v.edges)]
        first = (possible or verdicts)[0]
        return replace(first, state=None, later=[] if first is verdicts[-1] else verdicts[-1].reasons)
    best = reachable[-1]
    return best if best is verdicts[-1] else replace(best, later=verdicts[-1].reasons)


def reference_windows(table: Table) -> list[tuple[Dependency, UpstreamPartitions]]:
    """The static tables ``table`` reads: each needs its one partition, the whole table, in every partition."""
    references = table.references if isinstance(table, DerivedTable) else ()
    return [(ref, UpstreamPartitions(ref.table, [WHOLE], [])) for ref in references]


def judge(
    catalog: Catalog,
    dep: Dependency,
    up: UpstreamPartitions,
    states: PartitionStateReader,
    deadline: datetime | None = None,
    now: datetime | None = None,
) -> EdgeVerdict:
    """The verdict on one dependency whose exact upstream partitions are ``up`` (and, for a deadline dependency, whose
    ``deadline`` is judged at ``now``)."""
    upstream = catalog[dep.table]
    done = states.materialized(upstream, up.keys)
    building = states.in_progress(upstream, [k for k in up.keys if k not in done])
    failed = states.failed_blocking_checks(upstream, [k for k in up.keys if k in done])
    tainted = states.tainted(upstream, [k for k in up.keys if k in done])
    repairs = {t.repair for t in tainted.values() if t.repair}
    running = {r for r in repairs if states.repair_running(r)} if repairs and not dep.accept_tainted else set()
    repairing = frozenset(k for k, t in tainted.items() if t.repair in running)
    kind = "ods" if upstream.is_ods else "external" if upstream.is_external else "static" if upstream.is_static else ""
    early: dict[str, str] = {}
    accepted = (dep.states or upstream.state_names[-1:]) if upstream.state_names else ()
    if accepted:  # a partition in a state the dependency does not accept is not there yet for it
        reached = states.reached_states(upstream, [k for k in up.keys if k in done])
        early = {k: r for k, r in reached.items() if r is not None and r not in accepted}
    strict = EdgeVerdict(
        dep,
        up,
        missing=[k for k in up.keys if k not in done and k not in building],
        in_progress=[k for k in up.keys if k in building],
        failed_checks={} if dep.ignore_dq else failed,
        ignored_checks=failed if dep.ignore_dq else {},
        tainted={} if dep.accept_tainted else tainted,
        repairing=repairing,
        upstream_kind=kind or "derived",
        accepted_taints=tainted if dep.accept_tainted else {},
        early=early,
        accepted=accepted,
        deadline=deadline,
    )
    if not dep.weak or (strict.ok and dep.mode != LATEST):
        return strict
    if dep.mode == DEADLINE:
        past = deadline is not None and (now or datetime.now(UTC)) >= deadline
        return _waive(strict) if past else strict
    usable = [k for k in up.keys if strict.state(k) == OK]
    if len(usable) < dep.min:
        return strict
    return _waive(strict, keep=usable[-1] if dep.mode == LATEST else None)


def _waive(edge: EdgeVerdict, keep: str | None = None) -> EdgeVerdict:
    """``edge`` with every partition that is not usable waived, and every other one but ``keep`` when given (a latest
    dependency's most recent usable partition): the partition runs without them."""
    waived = {
        k: edge.state(k)
        for k in [*edge.upstream.nonexistent, *edge.upstream.keys]
        if edge.state(k) != OK or (keep is not None and k != keep)
    }
    return replace(
        edge,
        missing=[],
        in_progress=[],
        failed_checks={},
        tainted={},
        early={},
        waived=waived,
    )


# Dagster's run tag: whether the daemon's run retries (dagster.yaml: run_retries) re-execute a run failed by a step;
# a run the gate refuses, or whose blocking check fails, sets it to false (running it again at once changes nothing)
RETRY_ON_STEP_FAILURE_TAG = "dagster/retry_on_asset_or_op_failure"
# on a rebuild for late data: each partition's late changes the rebuild absorbs (JSON), for its materialization
LATE_CHANGES_TAG = "warehouse/late_changes"
DEGRADED = "degraded"  # a materialization's metadata: partition → what it was built without, past a deadline
# a materialization's metadata: partition → the storage id of the newest upstream materialization its run waited
# for (a repair's run waiting for a re-ingested hour), after which it read its inputs
READ_AFTER = "read_after"
STATE = "state"  # a materialization's metadata, of a table with states: partition → the state it was built in


def per_partition(metadata: Mapping[str, Any], name: str, partition: str) -> str | None:
    """A per-partition entry of materialization metadata (``degraded``, ``state``): a ranged run's materializations
    share one metadata, so each partition has its entry in a JSON map."""
    value = metadata.get(name)
    found = value.value.get(partition) if value is not None and isinstance(value.value, dict) else None
    return str(found) if found else None


def state_in(materialization: Any, partition: str) -> str | None:
    """The state ``partition`` was built in by ``materialization`` (None: no state recorded)."""
    return per_partition(materialization.metadata, STATE, partition) if materialization is not None else None


def degraded_description(verdict: Verdict) -> str:
    """What a partition is built without, past its dependencies' deadlines, in words ("" when nothing):
    ``ext.fx_rate 2026-03-05 (missing; deadline 2026-03-06 09:00)``."""
    parts = []
    for edge in verdict.edges:
        if edge.degraded:
            when = f"; deadline {edge.deadline:%Y-%m-%d %H:%M}" if edge.deadline is not None else ""
            states = ", ".join(sorted(set(edge.waived.values())))
            parts.append(f"{edge.dep.table} {span(list(edge.waived))} ({states}{when})")
    return "; ".join(parts)


# --- existence: can the partition run at all now --------------------------------------------------------------


def nonexistent_upstream(
    catalog: Catalog, table: Table, partition: str, current_time: datetime | None = None
) -> list[str]:
    """The upstream tables ``partition`` needs partitions of that do not exist at ``current_time``: such a partition
    cannot run now (a window before the warehouse start never can). A self-dependency's first T-1 is exempt, and so is
    a weak dependency that can run without what is not there: past its deadline, or on enough of its window that
    exists (``any``, ``latest``)."""
    options = (
        [state.deps for state in table.states] if isinstance(table, DerivedTable) and table.states else [table.deps]
    )
    missing: list[str] = []
    for deps in reversed(options):  # a table with states can run when one of its states can
        missing = [
            dep.table
            for dep in deps
            if dep.mode != DEADLINE
            and too_few(dep, upstream_partitions(catalog, table, dep, partition, current_time=current_time))
        ]
        if not missing:
            return []
    return missing


def too_few(dep: Dependency, up: UpstreamPartitions) -> bool:
    """Whether the partitions of ``up`` that exist are not enough for ``dep``: all of them, or ``min`` of an any or
    latest window."""
    return len(up.keys) < dep.min if dep.mode in (ANY, LATEST) else bool(up.nonexistent)


def partitions_in_range(period: str, start: datetime, end: datetime) -> list[str]:
    """The partition keys of ``period`` whose whole window lies in [start, end)."""
    pdef = BY_PERIOD[period]
    return [
        k for k in pdef.get_partition_keys(current_time=end) if pdef.time_window_for_partition_key(k).start >= start
    ]


def table_partitions_in_range(table: Table, start: datetime, end: datetime) -> list[str]:
    """The partition keys of ``table`` whose whole window lies in [start, end): its period's, or for a table with
    regions each region's days (date by date, regions in declared order)."""
    if not (isinstance(table, DerivedTable) and table.is_regional):
        return partitions_in_range(table.period, start, end)
    keys: list[tuple[str, int, str]] = []
    for order, (region, zone) in enumerate(table.regions):
        days = periods().region_days(zone)
        for day in days.get_partition_keys(current_time=end):
            if days.time_window_for_partition_key(day).start >= start:
                keys.append((day, order, regional_key(day, region)))
    return [key for _, _, key in sorted(keys)]


def backfill_partitions(
    catalog: Catalog, start: datetime, end: datetime, current_time: datetime | None = None
) -> dict[str, list[str]]:
    """For a backfill of the whole graph over [start, end): each derived table's partitions that lie wholly
    in the range and whose every upstream partition can exist (D7 retention starts 7 days after the
    warehouse, a 30-day window 29 days after) — existence judged at ``current_time``, by default the range's
    end or now, whichever comes first. Launched per asset, as the UI's ``partitionsByAssets`` does."""
    now = current_time or min(end, datetime.now(UTC))
    plan: dict[str, list[str]] = {}
    for table in catalog.derived():
        keys = [
            k for k in table_partitions_in_range(table, start, end) if not nonexistent_upstream(catalog, table, k, now)
        ]
        if keys:
            plan[table.fqn] = keys
    return plan


# --- messages ------------------------------------------------------------------------------------------------


def span(keys: Sequence[str]) -> str:
    """A run of keys in a few words: the key, or the first and last with the count."""
    if not keys:
        return "(none)"
    return keys[0] if len(keys) == 1 else f"{keys[0]} .. {keys[-1]} ({len(keys)})"


def names(keys: Sequence[str], limit: int = 12) -> str:
    """Every key when there are few, else the first ones and the last."""
    if len(keys) <= limit:
        return ", ".join(keys)
    return ", ".join(keys[: limit - 2]) + f", … ({len(keys) - limit + 1} more), {keys[-1]}"
