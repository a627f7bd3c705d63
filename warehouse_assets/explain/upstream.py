"""What ``why`` reads of the warehouse: each partition's state in words (ready, missing, in progress, queued, failed,
tainted, gone, can never be built), its upstream partitions' states with the reasons the gate gives, the root causes
a chain of waiting partitions comes down to, and the run that builds it now (:func:`describe_run`).

:class:`PartitionStates` reads them from the instance and the state store once per question;
:mod:`warehouse_assets.explain.why` puts them into words for people.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from dagster import (
    AssetKey,
    DagsterInstance,
    DagsterRunStatus,
    PartitionKeyRange,
    RunRecord,
    RunsFilter,
)

from resources.delta_lake import DeltaStore
from resources.external import ExternalResource
from resources.landing import Landing
from warehouse_assets.catalog import (
    BY_PERIOD,
    DEADLINE,
    LATEST,
    Catalog,
    Dependency,
    DerivedTable,
    OdsTable,
    OdsWindows,
    Table,
    UpstreamPartitions,
    business_time,
    partition_window,
    periods,
    split_regional_key,
    upstream_partitions,
)
from warehouse_assets.center.state_store import PartitionState, PartitionStateStore, StateView
from warehouse_assets.ingest.deliveries import external_source
from warehouse_assets.ingest.readiness import WINDOW, Readiness, shard_state, with_counts
from warehouse_assets.instance.pools import pools_from_env, waiting_message
from warehouse_assets.materialize.buildable import BuildableSearch
from warehouse_assets.materialize.gate import (
    CHECK_FAILED,
    EARLIER_STATE,
    IN_PROGRESS,
    NONEXISTENT,
    TAINTED,
    WAIVED,
    EdgeVerdict,
    Verdict,
    decide,
)
from warehouse_assets.materialize.validity import Taint

READY = "materialized"


QUEUED = "queued"


NEVER = "can never exist"


GONE = "missing from the lake"  # materialized, but the reconciliation found its files gone: built again


# a run that will build the partition but has not started: Dagster's statuses before STARTED
WAITING_RUN = (DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING)


@dataclass
class UpstreamState:
    table: str
    partition: str
    # materialized | missing | queued | in progress | failed | check failed | tainted | not ready |
    # external not arrived | does not exist
    state: str
    detail: str = ""
    failed_checks: tuple[str, ...] = ()  # blocking checks failed on its latest materialization
    taint: Taint | None = None  # marked tainted on its latest materialization

    @property
    def blocks(self) -> bool:
        return self.state not in (READY, WAIVED)

    def line(self) -> str:
        return f"  {self.table:<28} {self.partition:<18} {self.state}" + (f" — {self.detail}" if self.detail else "")


def _status(state: PartitionState) -> str:
    if state.materialized:
        return READY
    return "in progress" if state.in_progress else "failed" if state.failed else "missing"


class PartitionStates:
    """The state of any partition of the catalog, and why it is not ready, read once per partition.

    Run states and check verdicts are read from the partition state store (:mod:`warehouse_assets.center.state_store`,
    the engine's, with the events it has not applied yet) per table for the partitions asked about (a
    self-dependent table's back to its first partition), an ODS table's readiness (watermarks, counts) once per
    table.
    """

    def __init__(
        self,
        instance: DagsterInstance,
        catalog: Catalog,
        store: DeltaStore,
        landing: Landing,
        external: ExternalResource | None = None,
        current_time: datetime | None = None,
        partitions: StateView | None = None,
    ):
        self.instance, self.catalog, self.external = instance, catalog, external
        # the dependency center's partition state store, up to the latest event: what the engine decides on
        self.partitions = partitions or PartitionStateStore(instance).view()
        self.store, self.landing = store, landing
        self.now = current_time or datetime.now(UTC)
        self._known: dict[tuple[str, str], UpstreamState] = {}
        self._windows: dict[tuple[str, str], list[tuple[Dependency, UpstreamPartitions]]] = {}
        self._shards: dict[str, Readiness] = {}  # per ODS table
        self._readiness: dict[tuple[str, str], Readiness] = {}  # per ODS table and local day
        self._runs: dict[str, RunRecord | None] = {}  # runs waiting to start, by id (None: not waiting)
        self.calendar = BuildableSearch()  # each period's first partition, and which partitions can ever be built

    def status(self, fqn: str, keys: Sequence[str]) -> dict[str, str]:
        """The run status of partitions: materialized, missing, queued, in progress or failed."""
        found = self.partitions.states(AssetKey(self.catalog[fqn].key), keys)
        statuses = {k: _status(found[k]) for k in keys}
        for key in keys:
            run = found[key].latest_run
            if statuses[key] == "missing" and run and self._run(run) is not None:
                statuses[key] = QUEUED  # a run that targets it exists and has not started
        return statuses

    def _run(self, run_id: str) -> RunRecord | None:
        """The record of ``run_id`` if it is waiting to start (queued, starting), else None."""
        if run_id not in self._runs:
            record = self.instance.get_run_record_by_id(run_id)
            self._runs[run_id] = record if record and record.dagster_run.status in WAITING_RUN else None
        return self._runs[run_id]

    def run_detail(self, fqn: str, key: str) -> str:
        """Which run will build (or is building) the partition, for how long it has waited and behind what."""
        state = self.partitions.states(AssetKey(self.catalog[fqn].key), [key])[key]
        if not state.latest_run:
            return ""
        record = self.instance.get_run_record_by_id(state.latest_run)
        if record is None:
            return ""
        return describe_run(self.instance, record, self.now)

    def states(self, fqn: str, keys: Sequence[str]) -> list[UpstreamState]:
        """Is each partition ready (``materialized``, its blocking checks not failed), and if not, why?

        The answer is about the partition itself; what it waits for upstream is the chain walk's business.
        """
        table = self.catalog[fqn]
        todo = [k for k in dict.fromkeys(keys) if (fqn, k) not in self._known]
        if todo and _self_dependent(table):
            # the walk may follow its T-1s back to the first partition: read them all in this one query
            pdef = BY_PERIOD[table.period]
            last = max(todo, key=lambda k: pdef.time_window_for_partition_key(k).start)
            first = pdef.get_first_partition_key()
            back = pdef.get_partition_keys_in_range(PartitionKeyRange(first, last)) if first else []
            todo = [k for k in dict.fromkeys([*back, *todo]) if (fqn, k) not in self._known]
        if todo:
            statuses = self.status(fqn, todo)
            gone = {
                k: s.missing
                for k, s in self.partitions.states(AssetKey(table.key), todo).items()
                if s.missing is not None and statuses[k] == "missing"
            }
            failed = self.partitions.failed_blocking_checks(table, [k for k in todo if statuses[k] == READY])
            tainted = self.partitions.tainted(table, [k for k in todo if statuses[k] == READY])
            for key in todo:
                state = UpstreamState(fqn, key, statuses[key])
                if key in tainted:
                    state.state, state.taint, state.detail = TAINTED, tainted[key], tainted[key].describe()
                    state.failed_checks = tuple(failed.get(key, ()))
                elif key in failed:
                    state.state, state.failed_checks = "check failed", tuple(failed[key])
                    state.detail = f"blocking check(s) failed: {', '.join(failed[key])}"
                elif state.state in (QUEUED, "in progress"):
                    state.detail = self.run_detail(fqn, key)
                elif key in gone:
                    state.state, state.detail = GONE, f"{gone[key]}; {_comes_back(table)}"
                elif state.state == "missing" and table.is_external:
                    state.state = "external not arrived"
                    state.detail = (
                        external_source(self.external, table).describe(key)
                        if self.external is not None
                        else "producer location unknown"
                    )
                elif state.state == "missing" and table.is_ods:
                    state.state, state.detail = self._ods_reason(table, key)
                elif state.state == "missing" and isinstance(table, OdsWindows):
                    state.state, state.detail = self._windows_reason(table, key)
                self._known[(fqn, key)] = state
        return [self._known[(fqn, k)] for k in keys]

    def _counted(self, table: Table, start: datetime) -> Readiness:
        """The readiness of an ODS table with the counts of the local day holding ``start`` (read once for its hours:
        no whole-history read)."""
        if table.fqn not in self._shards:
            self._shards[table.fqn] = shard_state(self.store, self.landing, table)
        day = start.astimezone(ZoneInfo(self.landing.timezone)).replace(hour=0, minute=0, second=0, microsecond=0)
        if (table.fqn, day.date().isoformat()) not in self._readiness:
            counted = with_counts(
                self._shards[table.fqn], self.store, self.landing, table, day, day + timedelta(days=1)
            )
            self._readiness[(table.fqn, day.date().isoformat())] = counted
        return self._readiness[(table.fqn, day.date().isoformat())]

    def _windows_reason(self, table: OdsWindows, key: str) -> tuple[str, str]:
        """Why an ODS table's completeness window has not been reported: a shard behind, or which 5-minute windows
        are short of their count."""
        ods = self.catalog[table.source]
        window = BY_PERIOD[table.period].time_window_for_partition_key(key)
        ods_state = self._counted(ods, window.start)
        if not ods_state.streams:
            return "not ready", f"no shard stream of {table.source} in the landing area"
        behind = [s for s in ods_state.streams if s.watermark is None or s.watermark < window.end]
        if behind:
            streams = len(ods_state.streams)
            return "not ready", f"{len(behind)} of {streams} shard stream(s) not applied past {window.end:%H:%M}"
        starts = [window.start + n * WINDOW for n in range(int((window.end - window.start) / WINDOW))]
        short = [
            f"{w:%H:%M} ({ods_state.window_completeness(ods_state.local_window(w)).describe()})"
            for w in starts
            if not ods_state.window_complete(w)
        ]
        if short:
            return "not ready", f"all shards applied past {window.end:%H:%M} but incomplete: {'; '.join(short)}"
        return "missing", f"complete; reported with {table.source}'s hours (or an earlier window is still incomplete)"

    def _ods_reason(self, table: Table, key: str) -> tuple[str, str]:
        """Why an ODS hour has not been reported: a shard behind, rows missing, or nothing holding it back."""
        assert isinstance(table, OdsTable)
        end = BY_PERIOD[table.period].time_window_for_partition_key(key).end
        ods_state = self._counted(table, end - timedelta(hours=1))
        if not ods_state.streams:
            return "not ready", f"no shard stream of {table.source_database}.{table.source_tables} in the landing area"
        behind = [s for s in ods_state.streams if s.watermark is None or s.watermark < end]
        counts = ods_state.completeness(key)
        shortest = sorted(counts.missing_by_stream.items(), key=lambda kv: -kv[1])
        short = ", ".join(f"{stream} {n:,} missing" for stream, n in shortest[:3])
        if behind:
            worst = ods_state.lagging[0]
            mark = worst.watermark.strftime("%Y-%m-%d %H:%M") if worst.watermark else "nothing yet"
            return "not ready", (
                f"{len(behind)} of {len(ods_state.streams)} shard stream(s) not applied past "
                f"{end:%H:%M}; {worst.stream} is applied through {mark}; {counts.describe()}"
                + (f" ({short})" if short else "")
            )
        if not counts.complete:
            return "not ready", (
                f"all shards applied past {end:%H:%M} but incomplete: {counts.missing:,} row(s) missing — "
                f"{counts.describe()}" + (f" ({short})" if short else "")
            )
        return "missing", (
            "all shards applied past the hour and complete; the ingestion run that completed it reports it as "
            "it ends its table's batch, or the readiness sensor on its next tick (or an earlier hour is still "
            "incomplete)"
        )

    def windows(self, table: Table, partition: str) -> list[tuple[Dependency, UpstreamPartitions]]:
        """The exact upstream partitions of ``partition`` through each dependency."""
        if (table.fqn, partition) not in self._windows:
            self._windows[(table.fqn, partition)] = [
                (dep, upstream_partitions(self.catalog, table, dep, partition, current_time=self.now))
                for dep in table.deps
            ]
        return self._windows[(table.fqn, partition)]

    def prefetch(self, partitions: Iterable[tuple[Table, str]]) -> None:
        """Read the upstream partitions of all ``partitions`` with one instance query per upstream table: a read
        costs about the same for one partition as for hundreds (it loads the asset's status record)."""
        wanted: dict[str, list[str]] = {}
        for table, partition in partitions:
            for dep, up in self.windows(table, partition):
                wanted.setdefault(dep.table, []).extend(up.keys)
        for fqn, keys in wanted.items():
            self.states(fqn, keys)

    def _run_back(self, node: UpstreamState) -> list[UpstreamState]:
        """The T-1, T-2, … of ``node`` that have not run (or failed), nearest first, while they last."""
        table = self.catalog[node.table]
        run: list[UpstreamState] = []
        while _followed(node, table) and _self_dependent(table):
            before = [k for dep, up in self.windows(table, node.partition) if dep.table == table.fqn for k in up.keys]
            if not before:
                break
            node = self.states(table.fqn, before)[0]
            if _followed(node, table):
                run.append(node)
        return run

    def upstream(self, table: Table, partition: str) -> list[UpstreamState]:
        """Every upstream partition ``partition`` of ``table`` needs, as the gate judges it through that
        dependency, with the reason it is not ready."""
        out: list[UpstreamState] = []
        for edge in self.verdict(table, partition).edges:
            for entry in self.states(edge.dep.table, edge.upstream.keys):
                if entry.partition in edge.waived:
                    entry = replace(entry, state=WAIVED, detail=_waived(edge, entry))
                elif entry.partition in edge.early:
                    wanted = " or ".join(edge.accepted)
                    detail = f"it is {edge.early[entry.partition]}; the dependency takes {wanted}"
                    entry = replace(entry, state=EARLIER_STATE, detail=detail)
                elif entry.partition in edge.accepted_taints:
                    detail = f"{entry.detail} (accepted: the dependency says accept_tainted)"
                    entry = replace(entry, state=CHECK_FAILED if entry.failed_checks else READY, detail=detail)
                if entry.partition in edge.ignored_checks and entry.state in (READY, CHECK_FAILED):
                    names = ", ".join(edge.ignored_checks[entry.partition])
                    detail = f"check failed: {names} (ignored: the dependency says ignore_dq)"
                    entry = replace(entry, state=READY, detail=detail)
                out.append(entry)
            out.extend(
                UpstreamState(edge.dep.table, k, NONEXISTENT, self._never(edge.dep.table, k)) for k in edge.nonexistent
            )
        return out

    def verdict(self, table: Table, partition: str) -> Verdict:
        """The gate's verdict on ``partition`` of ``table``, on the states read here."""
        return decide(
            self.catalog, table, partition, self, current_time=self.now, windows=self.windows(table, partition)
        )

    # --- the gate's PartitionStateReader: the instance's partition statuses, read once per partition

    def materialized(self, table: Table, keys: Sequence[str]) -> set[str]:
        return {s.partition for s in self.states(table.fqn, keys) if s.state in (READY, CHECK_FAILED, TAINTED)}

    def in_progress(self, table: Table, keys: Sequence[str]) -> set[str]:
        return {s.partition for s in self.states(table.fqn, keys) if s.state == IN_PROGRESS}

    def failed_blocking_checks(self, table: Table, keys: Sequence[str]) -> dict[str, list[str]]:
        return {s.partition: list(s.failed_checks) for s in self.states(table.fqn, keys) if s.failed_checks}

    def tainted(self, table: Table, keys: Sequence[str]) -> dict[str, Taint]:
        return {s.partition: s.taint for s in self.states(table.fqn, keys) if s.taint is not None}

    def reached_states(self, table: Table, keys: Sequence[str]) -> dict[str, str | None]:
        return self.partitions.reached_states(table, keys)

    def repair_running(self, backfill_id: str) -> bool:
        return self.partitions.repair_running(backfill_id)

    def _never(self, fqn: str, key: str) -> str:
        table = self.catalog[fqn]
        period = table.period
        window = partition_window(table, key)
        if isinstance(table, DerivedTable) and table.is_regional:  # a region's days begin on the warehouse's start date
            start = periods().start.isoformat()
            if split_regional_key(key)[0] < start:
                return f"before {fqn}'s first day {start} (WAREHOUSE_START): it can never exist"
            return f"in the future: a partition once that region's day ends at {business_time(window.end)}"
        # the calendar's first partition, whether or not it has ended yet (Dagster's first key is None until then)
        first = self.calendar.first_key(period)
        if first is None or window.start < self.calendar.start(period, first):
            start = periods().start.isoformat()
            return f"before {fqn}'s first partition {first} (the warehouse starts {start}): it can never exist"
        return f"in the future: a partition once its window ends at {window.end:%Y-%m-%d %H:%M}"

    def root_causes(self, blocked: Iterable[UpstreamState]) -> list[UpstreamState]:
        """The deepest not-ready partitions behind ``blocked``, each once: tables in the order the walk meets them,
        each table's partitions in time order (the earliest not-ready ODS hour is the one holding the others).

        A derived partition that has not run (or failed) is followed to its own upstream; it is a root cause
        itself only when nothing upstream holds it back. Everything else not ready is a root cause as it is.
        """
        roots: dict[tuple[str, str], UpstreamState] = {}
        seen: set[tuple[str, str]] = set()
        frontier = [u for u in blocked if u.blocks]
        while frontier:  # breadth first, iteratively: a self-dependent chain can be a year of T-1s long
            following: list[UpstreamState] = []
            # a self-dependent partition that has not run waits for its T-1s that have not run either: follow
            # that run back now, so that their other dependencies are read together, not one level per day
            frontier = frontier + [
                back for node in frontier if (node.table, node.partition) not in seen for back in self._run_back(node)
            ]
            self.prefetch(
                (self.catalog[n.table], n.partition)
                for n in frontier
                if _followed(n, self.catalog[n.table]) and (n.table, n.partition) not in seen
            )
            for node in frontier:
                if (node.table, node.partition) in seen:
                    continue
                seen.add((node.table, node.partition))
                table = self.catalog[node.table]
                if _followed(node, table):
                    waiting = [u for u in self.upstream(table, node.partition) if u.blocks]
                    if waiting:
                        following.extend(waiting)
                        continue
                    if node.state != GONE:  # what left the lake says so itself, and what brings it back
                        node = replace(node, detail=_unblocked(node.state))
                roots[(node.table, node.partition)] = node
            frontier = following
        tables = {table: n for n, (table, _) in enumerate(roots)}
        return sorted(roots.values(), key=lambda c: (tables[c.table], c.partition))  # keys sort as their times


def _comes_back(table: Table) -> str:
    """How a partition gone from the lake holds data again."""
    if table.is_ods:
        return f"re-ingested from its landing segments (`warehouse reingest {table.fqn} …`) or sent again by its source"
    if table.is_static:
        return "built again from its SQL by the static_tables sensor"
    return "the engine builds it again (within its lookback; older: a backfill)"


def _self_dependent(table: Table) -> bool:
    return any(dep.table == table.fqn for dep in table.deps)


def _followed(node: UpstreamState, table: Table) -> bool:
    """A derived partition that has not run, or failed: what holds it back may lie upstream."""
    return node.state in ("missing", "failed", GONE) and bool(table.deps)


def _unblocked(state: str) -> str:
    if state == "failed":
        return "every upstream partition is ready, but its last run failed: read that run's log, then re-run it"
    return (
        "every upstream partition is ready, and no run of it is queued or running: the dependency center submits "
        "one when it sees the upstream's last change (`warehouse status` says whether its engine is alive), or "
        "materialize it from the UI"
    )


def describe_run(instance: DagsterInstance, record: RunRecord, now: datetime) -> str:
    """A run that builds a partition, as ``why`` names it: its id, its status and for how long, and for a run still
    queued what it waits behind (the runs in progress and the queued ones the queue launches first, by priority and
    then age, as Dagster's queue does)."""
    run = record.dagster_run
    short = run.run_id[:8]
    if run.status not in WAITING_RUN:
        since = record.start_time or record.create_timestamp.timestamp()
        if run.status == DagsterRunStatus.STARTED:
            return f"running for {_ago(now.timestamp() - since)} as run {short}"
        return f"its latest run {short} is {run.status.value.lower()}"
    waited = _ago(now.timestamp() - record.create_timestamp.timestamp())
    active = instance.get_run_records(
        RunsFilter(statuses=[DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING])
    )
    ahead = [
        r
        for r in instance.get_run_records(RunsFilter(statuses=[DagsterRunStatus.QUEUED]))
        if r.dagster_run.run_id != run.run_id and _queue_order(r) < _queue_order(record)
    ]
    running = ", ".join(_run_name(r) for r in active[:3]) + (f" and {len(active) - 3} more" if len(active) > 3 else "")
    behind = f"behind {len(active)} run(s) in progress ({running})" if active else "with no run in progress"
    queued = f" and {len(ahead)} queued ahead of it" if ahead else ""
    status = "queued" if run.status == DagsterRunStatus.QUEUED else run.status.value.lower()
    # with compute pools, what holds it may be the Spark endpoints, not the run slots
    pools = pools_from_env()
    compute = waiting_message(instance, run, pools) if pools and run.status == DagsterRunStatus.QUEUED else None
    return f"{status} for {waited} as run {short}, {behind}{queued}" + (f"; {compute}" if compute else "")


def _queue_order(record: RunRecord) -> tuple[int, float]:
    try:
        priority = int(record.dagster_run.tags.get("dagster/priority", "0"))
    except ValueError:
        priority = 0
    return (-priority, record.create_timestamp.timestamp())


def _run_name(record: RunRecord) -> str:
    run = record.dagster_run
    what = run.job_name
    if run.asset_selection:
        what = ", ".join(sorted(k.to_user_string().replace("/", ".") for k in run.asset_selection))
    partition = run.tags.get("dagster/partition") or run.tags.get("dagster/asset_partition_range_start")
    return f"{run.run_id[:8]} {what}" + (f" {partition}" if partition else "")


def _ago(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 90:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 90:
        return f"{minutes} min {seconds} s"
    return f"{minutes // 60} h {minutes % 60} min"


def _waived(edge: EdgeVerdict, entry: UpstreamState) -> str:
    """Why a weak dependency's partition is not waited for, with what it is (missing, ...)."""
    what = entry.state + (f" — {entry.detail}" if entry.detail else "")
    if edge.dep.mode == DEADLINE and edge.deadline is not None:
        return f"past the deadline {edge.deadline:%Y-%m-%d %H:%M}, runs without it (degraded): {what}"
    if edge.dep.mode == LATEST:
        return f"not read: {', '.join(edge.used)} is the latest usable of the window (latest): {what}"
    return f"not needed: {len(edge.used)} of the window are usable (any, min {edge.dep.min}): {what}"
