"""Why is this partition waiting? Its direct upstream partitions with their state, and the root causes.

The root causes are the deepest upstream partitions on the chain that are not ready, each with its reason: an
ODS hour whose shard is behind or rows are missing, an external delivery not arrived, a failed blocking check,
a tainted partition (``tainted: <reason>, from <root>``), a partition that does not exist (before the warehouse
start, or in the future), or a derived partition whose own upstream is all ready but that has not run (or whose run
failed).

The walk rests on the gate (:mod:`warehouse_assets.materialize.gate`, "may P run now, and if not why?"), which judges
the exact upstream partitions of each partition on the chain, and on one question asked per partition,
:meth:`warehouse_assets.explain.upstream.PartitionStates.states` ("is P itself ready, and if not why?"), which is
also what the gate reads. It reads the catalog, the dependency center's partition state store for the partitions on
the chain only (the engine's view, so ``why`` and the engine never disagree), and the lake's ingestion state through
delta-rs: no code location and no PySpark, so ``warehouse why`` answers in about the time of importing Dagster.

Used by ``warehouse why TABLE PARTITION`` and by the ``why_waiting`` job (launch it from the UI with the
table and partition in its config; the answer is in the run's log and output metadata).
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from dagster import (
    AssetKey,
    Config,
    DagsterInstance,
    MetadataValue,
    OpExecutionContext,
    Output,
    job,
    op,
)

from resources.delta_lake import DeltaLakeResource, DeltaStore
from resources.external import ExternalResource
from resources.landing import Landing, LandingResource
from warehouse_assets.catalog import (
    ANY,
    BY_PERIOD,
    DEADLINE,
    LATEST,
    REGION_DELIMITER,
    Catalog,
    DerivedTable,
    OdsWindows,
    PartitionKeyError,
    Table,
    business_zone,
    check_partition_key,
    partition_window,
)
from warehouse_assets.catalog.additive import WarehouseTypes, rebuild_verdict
from warehouse_assets.catalog.key_locality import key_locality
from warehouse_assets.catalog.lineage import WarehouseLineage
from warehouse_assets.center.heartbeat import EngineDown, engine_status
from warehouse_assets.center.late_data import LOOKBACK
from warehouse_assets.center.latest_wait import LatestWait
from warehouse_assets.center.ledger import open_readonly
from warehouse_assets.center.state_store import PartitionState, PartitionStateStore, StateView, default_path
from warehouse_assets.explain.eta import Prediction
from warehouse_assets.explain.eta_instance import instance_predictor
from warehouse_assets.explain.forecast import timeline_markdown
from warehouse_assets.explain.prediction_log import WHY, record_predictions
from warehouse_assets.explain.upstream import GONE, NEVER, QUEUED, READY, PartitionStates, UpstreamState
from warehouse_assets.instance.lanes import USER_LANE, lane_tags
from warehouse_assets.materialize.buildable import never_buildable
from warehouse_assets.materialize.freshness import deadline as sla_deadline
from warehouse_assets.materialize.gate import (
    CHECK_FAILED,
    NONEXISTENT,
    TAINTED,
    Verdict,
    span,
)
from warehouse_assets.materialize.validity import Taint

NOT_YET = "does not exist yet"
ROOT_CAUSES_SHOWN = 3  # per table and state: a day behind a lagging shard has up to 24 hours with one reason


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
            _predict(report, instance, catalog, table, PartitionStateStore(instance).view(), now, landing)
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
        elif (newer := _latest_wait(catalog, table, partition, verdict, states, now)) is not None:
            report.verdict = f"{ready}; {newer}"
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
        _predict(report, instance, catalog, table, states.partitions, now, landing)
    return report


def _predict(
    report: WhyReport,
    instance: DagsterInstance,
    catalog: Catalog,
    table: Table,
    view: StateView,
    now: datetime,
    landing: Landing,
) -> None:
    """The partition's predicted finish and critical path (:mod:`warehouse_assets.explain.eta`), and against its SLA;
    a source hour landed in ``landing`` waits for the ingestion, not for its source."""
    predictor = instance_predictor(instance, catalog, view, now, landing=landing)
    report.prediction = predictor.predict(table.fqn, report.partition)
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
    """How its late-data rebuild will go: by the changed keys (and which), by the groups a total's changed input rows
    touch, or the whole partition (and why)."""
    if not isinstance(table, DerivedTable):
        return "rebuilt by its source"
    try:
        lineage = WarehouseLineage(catalog)
        locality = key_locality(table, lineage.input_columns(table))
        return rebuild_verdict(locality, WarehouseTypes(catalog, lineage).verdict(table))
    except Exception as exc:  # the explanation must not fail on a lineage it cannot follow
        return f"whole-partition rebuilds: its lineage was not followed ({exc})"


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


def _latest_wait(
    catalog: Catalog, table: Table, partition: str, verdict: Verdict, states: PartitionStates, now: datetime
) -> str | None:
    """The engine's wait for a newer partition of a latest window, or the rest of an any window, in words, when it
    holds the partition back."""
    wait = LatestWait(catalog)

    class _Read:  # the resolver's reader of states, over why's view of the store
        def states(self, upstream: Table, keys: Sequence[str]) -> dict[str, PartitionState]:
            return states.partitions.states(AssetKey(upstream.key), list(keys))

    found = wait.waiting_for(table, partition, verdict, _Read(), now)
    if found is None:
        return None
    upstream, newer, older = found
    until = datetime.fromtimestamp(wait.until(table, partition), business_zone()).strftime("%Y-%m-%d %H:%M")
    if any(edge.dep.table == upstream and edge.dep.mode == ANY for edge in verdict.edges):
        return (
            f"the engine waits until {until} for {upstream} {newer}, a partition of its any window, which is on its "
            f"way: built now it would read the window without it and be built again when it lands"
        )
    return (
        f"the engine waits until {until} for {upstream} {newer}, the newer partition of its latest window, which is "
        f"on its way: built now it would read {older} and be built again when {newer} lands"
    )


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
