"""Why is this partition waiting? Its direct upstream partitions with their state, and the root causes.

The root causes are the deepest upstream partitions on the chain that are not ready, each with its reason: an
ODS hour whose shard is behind or rows are missing, an external delivery not arrived, a failed blocking check,
a tainted partition (``tainted: <reason>, from <root>``), a partition that does not exist (before the warehouse
start, or in the future), or a derived partition whose own upstream is all ready but that has not run (or whose run
failed).

The walk rests on the gate (:mod:`warehouse_assets.materialize.gate`, "may P run now, and if not why?"), which judges
the exact upstream partitions of each partition on the chain, and on one question asked per partition,
:meth:`PartitionStates.states` ("is P itself ready, and if not why?"), which is also what the gate reads. It reads
the catalog, the dependency center's partition state store for the partitions on the chain only (the engine's view,
so ``why`` and the engine never disagree), and the lake's ingestion state through delta-rs: no code location and no
PySpark, so ``warehouse why`` answers in about the time of importing Dagster.

Used by ``warehouse why TABLE PARTITION`` and by the ``why_waiting`` job (launch it from the UI with the
table and partition in its config; the answer is in the run's log and output metadata).
"""

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from dagster import (
    AssetKey,
    Config,
    DagsterInstance,
    DagsterRunStatus,
    MetadataValue,
    OpExecutionContext,
    Output,
    PartitionKeyRange,
    RunRecord,
    RunsFilter,
    job,
    op,
)

from resources.delta_lake import DeltaLakeResource, DeltaStore
from resources.external import ExternalResource
from resources.landing import Landing, LandingResource
from warehouse_assets.catalog import (
    BY_PERIOD,
    DEADLINE,
    LATEST,
    REGION_DELIMITER,
    Catalog,
    Dependency,
    DerivedTable,
    OdsTable,
    OdsWindows,
    PartitionKeyError,
    Table,
    UpstreamPartitions,
    business_time,
    check_partition_key,
    partition_window,
    periods,
    split_regional_key,
    upstream_partitions,
)
from warehouse_assets.catalog.key_locality import key_locality
from warehouse_assets.catalog.lineage import WarehouseLineage
from warehouse_assets.center.heartbeat import EngineDown, engine_status
from warehouse_assets.center.late_data import LOOKBACK
from warehouse_assets.center.ledger import open_readonly
from warehouse_assets.center.state_store import PartitionState, PartitionStateStore, StateView, default_path
from warehouse_assets.explain.eta import Prediction, instance_predictor
from warehouse_assets.explain.forecast import timeline_markdown
from warehouse_assets.explain.prediction_log import WHY, record_predictions
from warehouse_assets.ingest.deliveries import external_source
from warehouse_assets.ingest.readiness import WINDOW, Readiness, shard_state, with_counts
from warehouse_assets.instance.lanes import USER_LANE, lane_tags
from warehouse_assets.instance.pools import pools_from_env, waiting_message
from warehouse_assets.materialize.buildable import BuildableSearch, never_buildable
from warehouse_assets.materialize.freshness import deadline as sla_deadline
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
    span,
)
from warehouse_assets.materialize.validity import Taint

READY = "materialized"
QUEUED = "queued"
NEVER = "can never exist"
GONE = "missing from the lake"  # materialized, but the reconciliation found its files gone: built again
NOT_YET = "does not exist yet"
# a run that will build the partition but has not started: Dagster's statuses before STARTED
WAITING_RUN = (DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING)
ROOT_CAUSES_SHOWN = 3  # per table and state: a day behind a lagging shard has up to 24 hours with one reason


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


Follows = Callable[[UpstreamState, UpstreamState], bool]


@dataclass
class WhyReport:
    table: str
    partition: str
    own_state: str
    upstream: list[UpstreamState] = field(default_factory=list)
    root_causes: list[UpstreamState] = field(default_factory=list)
    verdict: str = ""
    own_taint: Taint | None = None  # the partition itself is tainted: its repair rebuilds it
    prediction: Prediction | None = None  # when it is expected to be ready, if it is not built
    sla: str = ""  # the prediction against its SLA deadline
    # whether the second partition follows the first one directly (same table): consecutive upstream lines alike but
    # for their partition are printed as one range; None: each on its own line
    follows: Follows | None = field(default=None, repr=False, compare=False)

    def lines(self) -> list[str]:
        out = [f"{self.table} {self.partition}: {self.own_state}"]
        if self.own_taint is not None:
            out[0] += f", {self.own_taint.describe()}"
        out.extend(_line(run) for run in _runs(self.upstream, self.follows))
        if self.prediction is not None:
            zone = ZoneInfo(BY_PERIOD["daily"].timezone)
            when = self.prediction.at(zone).strftime("%Y-%m-%d %H:%M")
            out.append(f"predicted ready: ~{when}" + (f" ({self.sla})" if self.sla else ""))
            out.append(f"critical path: {self.prediction.chain()}; set by {self.prediction.path[0].describe(zone)}")
        if self.root_causes:
            out.append("root causes:")
            out.extend(_grouped(self.root_causes, self.follows))
        out.append(f"verdict: {self.verdict}")
        return out


def _runs(entries: Sequence[UpstreamState], follows: Follows | None) -> list[list[UpstreamState]]:
    """The entries in runs of consecutive partitions of a table alike in all else (a 30-day window's days before the
    warehouse start); each entry a run of its own when ``follows`` is None."""
    runs: list[list[UpstreamState]] = []
    for entry in entries:
        last = runs[-1][-1] if runs else None
        alike = last is not None and replace(last, partition=entry.partition) == entry
        if alike and follows is not None and follows(last, entry):  # type: ignore[arg-type]
            runs[-1].append(entry)
        else:
            runs.append([entry])
    return runs


def _line(run: Sequence[UpstreamState]) -> str:
    """One line for a run: its entry's, or the range ``first .. last (n)`` in place of the partition."""
    return run[0].line() if len(run) == 1 else replace(run[0], partition=span([r.partition for r in run])).line()


def _follows(catalog: Catalog) -> Follows:
    """Whether partition ``b`` of a table directly follows its partition ``a``: ``a``'s window ends where ``b``'s
    starts (a region's days: of the same region)."""

    def follows(a: UpstreamState, b: UpstreamState) -> bool:
        if a.table != b.table or a.partition.split(REGION_DELIMITER)[1:] != b.partition.split(REGION_DELIMITER)[1:]:
            return False
        table = catalog[a.table]
        try:
            return partition_window(table, a.partition).end == partition_window(table, b.partition).start
        except ValueError:  # not a partition of the table's period: printed as it is
            return False

    return follows


def _grouped(causes: Sequence[UpstreamState], follows: Follows | None = None) -> list[str]:
    """Each cause (a run of consecutive ones alike as one range), but at most a few per table and state, then how
    many more and through which partition."""
    groups: dict[tuple[str, str], list[UpstreamState]] = {}
    for cause in causes:
        groups.setdefault((cause.table, cause.state), []).append(cause)
    out: list[str] = []
    for (table, state), group in groups.items():
        runs = _runs(group, follows)
        out.extend(_line(run) for run in runs[:ROOT_CAUSES_SHOWN])
        if len(runs) > ROOT_CAUSES_SHOWN:
            rest = [c for run in runs[ROOT_CAUSES_SHOWN:] for c in run]
            out.append(f"  … and {len(rest)} more {state} partition(s) of {table}, through {rest[-1].partition}")
    return out


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


def explain(
    instance: DagsterInstance,
    catalog: Catalog,
    store: DeltaStore,
    landing: Landing,
    fqn: str,
    partition: str,
    external: ExternalResource | None = None,
    current_time: datetime | None = None,
) -> WhyReport:
    """Why ``partition`` of ``fqn`` waits. A table the catalog does not know, or a key that is not one of the table's
    (malformed, of another period), raises ValueError saying exactly what is wrong; a partition that does not exist
    (before the warehouse start, not finished yet, in the future) is answered as such."""
    table = catalog.lookup(fqn)
    now = current_time or datetime.now(UTC)
    try:
        check_partition_key(table, partition, now)
    except PartitionKeyError as exc:
        if exc.kind not in ("before_start", "unfinished", "future"):
            raise
        report = WhyReport(fqn, partition, NOT_YET if exc.exists_later else NEVER, verdict=exc.message)
        if exc.exists_later:
            _predict(report, instance, catalog, table, PartitionStateStore(instance).view(), now)
        return report
    states = PartitionStates(instance, catalog, store, landing, external, current_time=now)
    report = WhyReport(fqn, partition, states.status(fqn, [partition])[partition], follows=_follows(catalog))
    report.own_taint = states.states(fqn, [partition])[0].taint
    if (gone := states.states(fqn, [partition])[0]).state == GONE:
        report.own_state = f"{GONE}: {gone.detail}"
    own = states.partitions.states(AssetKey(table.key), [partition])[partition]
    if own.materialized and own.state:
        report.own_state += f", state {own.state}"
    if own.materialized and own.degraded:
        report.own_state += f", degraded: built without {own.degraded}; it is built again when they arrive"
    if own.materialized and (stale := _stale(instance, fqn, partition)) is not None:
        report.own_state += f", {stale}; {_rebuild_kind(catalog, table)}"
    report.upstream = states.upstream(table, partition)
    waiting = [u for u in report.upstream if u.blocks]
    never = never_buildable(catalog, table, partition, states.calendar)
    if report.own_state in ("in progress", QUEUED):
        report.verdict = states.run_detail(fqn, partition) or report.own_state
    elif table.is_source:
        report.verdict = _source_verdict(table, states.states(fqn, [partition])[0])
    elif never:
        # what makes it unbuildable, not what else it waits for: a queued run upstream changes nothing
        never_held = [u for u in waiting if u.state == NONEXISTENT or _cannot_be_built(catalog, u, states)]
        report.root_causes = [c for c in states.root_causes(never_held) if c.state == NONEXISTENT]
        report.verdict = never
    elif (verdict := states.verdict(table, partition)).may_run:
        ready = f"all {len(report.upstream)} upstream partition(s) are materialized"
        last = table.state_names[-1] if verdict.later else ""
        if own.materialized:
            report.verdict = f"{ready} and it is built" + (f", as {own.state}" if own.state else "")
            if not verdict.later:
                report.verdict += ": nothing to build (an upstream change rebuilds it, as its late_data policy says)"
        else:
            report.verdict = f"{ready}; " + _who_builds(instance, table, partition, report.own_state, now)
            if verdict.state is not None:
                report.verdict += f", as {verdict.state}"
        if verdict.later:
            report.verdict += (
                f"; {last} waits: " + "; ".join(verdict.later) + f" (the engine builds it as {last} once they are)"
            )
    else:
        report.root_causes = states.root_causes(waiting)
        first = waiting[0]
        report.verdict = (
            f"waiting for {len(waiting)} of {len(report.upstream)} upstream partition(s); "
            f"first: {first.table} {first.partition} ({first.state})"
        ) + "".join(f"; {note}" for note in _weak_notes(states.verdict(table, partition)))
    if not own.materialized and not never:
        _predict(report, instance, catalog, table, states.partitions, now)
    return report


def _predict(
    report: WhyReport, instance: DagsterInstance, catalog: Catalog, table: Table, view: StateView, now: datetime
) -> None:
    """The partition's predicted finish and critical path (:mod:`warehouse_assets.explain.eta`), and against its SLA."""
    report.prediction = instance_predictor(instance, catalog, view, now).predict(table.fqn, report.partition)
    report.sla = report.prediction.against_sla(table)
    due = {(table.fqn, report.partition): sla_deadline(table, report.partition).timestamp()} if table.sla else {}
    record_predictions(instance, [report.prediction], now.timestamp(), WHY, due)


def _stale(instance: DagsterInstance, fqn: str, partition: str) -> str | None:
    """The partition is behind its inputs (late data waiting for its policy), in words; None if it is not."""
    ledger = open_readonly(default_path(instance))
    if ledger is None:
        return None
    try:
        entry = ledger.stale(fqn, [partition]).get(partition)
    finally:
        ledger.close()
    return None if entry is None else entry.describe(ZoneInfo(BY_PERIOD["daily"].timezone))


def _rebuild_kind(catalog: Catalog, table: Table) -> str:
    """How its late-data rebuild will go: by the changed keys (and which), or the whole partition (and why)."""
    if not isinstance(table, DerivedTable):
        return "rebuilt by its source"
    try:
        return key_locality(table, WarehouseLineage(catalog).input_columns(table)).describe()
    except Exception as exc:  # the explanation must not fail on a lineage it cannot follow
        return f"whole-partition rebuilds: its lineage was not followed ({exc})"


def _waived(edge: EdgeVerdict, entry: UpstreamState) -> str:
    """Why a weak dependency's partition is not waited for, with what it is (missing, ...)."""
    what = entry.state + (f" — {entry.detail}" if entry.detail else "")
    if edge.dep.mode == DEADLINE and edge.deadline is not None:
        return f"past the deadline {edge.deadline:%Y-%m-%d %H:%M}, runs without it (degraded): {what}"
    if edge.dep.mode == LATEST:
        return f"not read: {', '.join(edge.used)} is the latest usable of the window (latest): {what}"
    return f"not needed: {len(edge.used)} of the window are usable (any, min {edge.dep.min}): {what}"


def _weak_notes(verdict: Verdict) -> list[str]:
    """What each weak dependency holding the partition back waits for, and until when."""
    notes = []
    for edge in verdict.edges:
        if edge.ok or not edge.dep.weak:
            continue
        if edge.dep.mode == DEADLINE and edge.deadline is not None:
            notes.append(
                f"{edge.dep.table} is waited for until {edge.deadline:%Y-%m-%d %H:%M}, then the partition runs "
                "without what is missing (degraded) and is built again when it arrives"
            )
        elif edge.dep.mode == LATEST:
            notes.append(f"{edge.dep.table} needs one usable partition of its window; the latest one is read (latest)")
        else:
            notes.append(f"{edge.dep.table} needs {edge.dep.min} usable partition(s) of its window (mode any)")
    return notes


def _cannot_be_built(catalog: Catalog, entry: UpstreamState, states: PartitionStates) -> bool:
    table = catalog[entry.table]
    return not table.is_source and bool(never_buildable(catalog, table, entry.partition, states.calendar))


def _source_verdict(table: Table, state: UpstreamState) -> str:
    """What reports a source partition (an ODS hour, an external delivery) and why it has not yet."""
    if state.state == READY:
        return "reported: nothing waits"
    if state.state in (CHECK_FAILED, TAINTED):
        return f"reported, but {state.detail}: it is usable again once its source reports it anew with passing checks"
    if table.is_ods:
        what = "the ingestion (`ods_ingest`, launched by the `ods_landing` sensor) or the `ods_readiness` sensor"
    elif isinstance(table, OdsWindows):
        what = (
            f"the ingestion of {table.source} (`ods_ingest`) or the `ods_readiness` sensor, once each of its 5-minute "
            "windows is complete,"
        )
    else:
        what = f"the `ext_{table.name}` sensor (or the dependency center's engine, which watches deliveries)"
    reason = state.state + (f" — {state.detail}" if state.detail else "")
    return f"not reported yet ({reason}); {what} reports it once it is complete"


def _who_builds(instance: DagsterInstance, table: Table, partition: str, own_state: str, now: datetime) -> str:
    """What builds a partition whose upstream is all ready, or that nothing will by itself, and why: never "ready"
    alone, which would promise a run that nothing is going to start."""
    if table.is_static:
        if own_state == "failed":
            return (
                "its last build failed: the `static_tables` sensor builds it again only when its SQL changes — read "
                "that run's log, fix the SQL (or materialize it from the UI)"
            )
        return "ready: the `static_tables` sensor builds it on its next tick (every 30 s)"
    if own_state == "failed":
        return (
            "but its last run failed, and the dependency center requests a partition once per state of its upstream: "
            "nothing builds it by itself until an upstream changes — read that run's log, then re-run it (the UI's "
            "Materialize on this partition)"
        )
    if partition_window(table, partition).end < now - LOOKBACK:
        return (
            f"but it ended over {LOOKBACK.days} days ago, before the dependency center's lookback: nothing builds it "
            "by itself — a backfill does (the UI's Materialize or Backfill on this partition)"
        )
    try:
        alive = engine_status(instance, now.timestamp())
    except EngineDown as exc:
        return f"but the dependency center's engine is not running, and nothing else builds it: {exc}"
    return f"ready: the dependency center's engine submits its run ({alive.split(';')[0]})"


def _prediction_metadata(report: WhyReport) -> dict[str, Any]:
    """The prediction as the UI shows it: the finish, and its critical path drawn as a timeline."""
    if report.prediction is None:
        return {}
    zone = ZoneInfo(BY_PERIOD["daily"].timezone)
    title = f"{report.table} {report.partition}"
    return {
        "predicted_finish": report.prediction.at(zone).isoformat(timespec="seconds"),
        "prediction": MetadataValue.md(timeline_markdown([report.prediction], zone, title)),
    }


class WhyConfig(Config):  # type: ignore[misc]
    table: str  # e.g. "dwd.order_detail"
    partition: str  # e.g. "2026-03-02"


def build_why_job(catalog: Catalog):  # type: ignore[no-untyped-def]
    @op(name="explain_partition")
    def explain_partition(
        context: OpExecutionContext,
        config: WhyConfig,
        lake: DeltaLakeResource,
        landing: LandingResource,
        external: ExternalResource,
    ) -> Output[list[str]]:
        report = explain(
            context.instance, catalog, lake.store(), landing.landing(), config.table, config.partition, external
        )
        for line in report.lines():
            context.log.info(line)
        return Output(
            report.lines(),
            metadata={
                "verdict": report.verdict,
                "upstream_partitions": len(report.upstream),
                "waiting_on": sum(1 for u in report.upstream if u.blocks),
                "root_causes": len(report.root_causes),
                "report": "\n".join(report.lines()),
                **_prediction_metadata(report),
            },
        )

    @job(
        name="why_waiting",
        description="Explain why a table partition waits: launch with table and partition.",
        tags=lane_tags(USER_LANE),
    )
    def why_waiting() -> None:
        explain_partition()

    return why_waiting
