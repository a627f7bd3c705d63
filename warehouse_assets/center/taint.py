"""Taint and repair: mark bad partitions and everything built from them tainted, then rebuild exactly those.

``warehouse taint TABLE START END --reason "…"`` and the ``taint_repair`` job (the UI's Launchpad: table, range,
reason, apply) compute the same plan:

1. the **closure**: every partition built, directly or not, from the partitions START … END of TABLE, across periods,
   offsets, sliding windows and self-dependencies (:meth:`warehouse_assets.center.reverse_index.ReverseIndex.closure`:
   the exact mappings inverted, by runs of partitions, no scan);
2. what to **mark**: the closure's materialized partitions. A partition never built holds no bad data: it waits for
   its repaired upstream like any other (``not built yet``), or can never be built because its window reaches before
   the warehouse start (named, left out). A root partition re-materialized after every partition built from it (the
   corrected source re-ingested before the taint was applied) holds the corrected data: it is named and not marked;
3. what to **rebuild**: the marked partitions of derived tables, in one Dagster asset backfill (the UI shows it; the
   backfill daemon runs them in dependency order, each table's runs as its backfill policy says). A marked ODS hour or
   external delivery is valid again once reported anew with passing checks, and the backfill's runs reading it wait
   for that (the run guard, :mod:`warehouse_assets.materialize.runner`). An ODS hour is reported anew when its source
   sends it again, or at once with ``reingest``: rebuilt from the landing area's retained segments
   (:mod:`warehouse_assets.ingest.reingest`), reported and judged in the same run.

Two more actions of the same job: ``reingest`` re-ingests ODS hours on their own (the repair waiting for them goes on),
and ``release`` accepts tainted partitions as they are, with a reason (a passed ``valid`` verdict saying so,
:func:`warehouse_assets.materialize.validity.release_evaluation`): for an hour its source will never send again. The
repair waiting for them then builds; with no repair running, the release launches one of what was built from them.

With ``apply`` the job marks every partition (a failed ``valid`` verdict each,
:mod:`warehouse_assets.materialize.validity`,
naming the backfill) and launches the backfill; the dependency center leaves those partitions to it while it runs.
Without, it only prints the plan: tables × partitions as ranges, and the runs the repair needs.

The engine uses the same job when late data fails a blocking check (:func:`late_verdict`, asked by the resolver): the
partitions built from the hour's previous data are marked, with the hour and the failed check as root, and no backfill:
the engine rebuilds them itself once the hour is fixed.
"""

import getpass
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol
from zoneinfo import ZoneInfo

from dagster import (
    AssetKey,
    Config,
    DagsterInstance,
    Failure,
    MetadataValue,
    OpExecutionContext,
    Output,
    PartitionKeyRange,
    RunsFilter,
    job,
    op,
)

from warehouse_assets.catalog import (
    BY_PERIOD,
    WHOLE,
    Catalog,
    DerivedTable,
    OdsTable,
    Table,
    partitions_def_of,
    regional_keys_between,
)
from warehouse_assets.center.plans import RunPlan, Trigger
from warehouse_assets.center.reverse_index import ReverseIndex
from warehouse_assets.center.state_store import PartitionState, PartitionStateStore, StateView
from warehouse_assets.instance.lanes import REBUILD_LANE, USER_LANE, lane_tags
from warehouse_assets.materialize.buildable import BuildableSearch, never_buildable
from warehouse_assets.materialize.compiler import max_partitions_per_run, topological
from warehouse_assets.materialize.gate import backfill_running, span
from warehouse_assets.materialize.validity import TAINT_TAG, Taint, release_evaluation, taint_evaluation

if TYPE_CHECKING:
    from warehouse_assets.catalog.lineage import ColumnImpact

JOB = "taint_repair"
TAINT, REINGEST, RELEASE = "taint", "reingest", "release"  # the job's actions
LAKE_RESOURCES = {"spark", "lake", "landing"}  # what re-ingesting needs


@dataclass
class TablePlan:
    """One table of a plan: its partitions in the closure, by what happens to them."""

    table: str
    marked: list[str] = field(default_factory=list)  # materialized: marked tainted
    rebuilt: list[str] = field(default_factory=list)  # of those, rebuilt by the backfill (derived tables)
    waiting: list[str] = field(default_factory=list)  # never built: they wait for the repaired upstream
    never: list[str] = field(default_factory=list)  # can never be built (a window before the warehouse start)
    corrected: list[str] = field(default_factory=list)  # roots re-materialized since: not marked
    runs: int = 0  # the runs rebuilding them


@dataclass
class TaintPlan:
    table: str
    start: str
    end: str
    taint: Taint
    roots: list[str]
    tables: list[TablePlan]
    index: ReverseIndex = field(repr=False)
    now: datetime = field(repr=False)
    backfill: bool = True  # the repair is one backfill; False: the engine rebuilds them once the root is fixed
    reingest: bool = False  # the ODS roots are re-ingested from the landing area by the repair itself
    # a column taint: the columns named, what they reach, and the partitions a taint of the whole table would have
    # marked that this one does not (table → partitions)
    columns: tuple[str, ...] = ()
    impact: "ColumnImpact | None" = field(default=None, repr=False)
    spared: dict[str, list[str]] = field(default_factory=dict)

    @property
    def marked(self) -> int:
        return sum(len(t.marked) for t in self.tables)

    @property
    def rebuilt(self) -> int:
        return sum(len(t.rebuilt) for t in self.tables)

    @property
    def runs(self) -> int:
        return sum(t.runs for t in self.tables)

    def rebuild(self) -> dict[str, list[str]]:
        """Derived table → its partitions the repair backfill rebuilds."""
        return {t.table: t.rebuilt for t in self.tables if t.rebuilt}

    def ranges(self, table: str, keys: Sequence[str]) -> str:
        """``keys`` as runs of consecutive partitions: ``2026-01-05 .. 2026-01-09 (5), 2026-01-12``."""
        runs = self.index.runs(table, keys, self.now)
        shown = [span(run) for run in runs[:6]]
        if len(runs) > 6:
            shown.append(f"… {len(runs) - 6} more runs, through {runs[-1][-1]}")
        return ", ".join(shown)

    @property
    def title(self) -> str:
        keys = self.start if self.start == self.end else f"{self.start} .. {self.end}"
        named = f"{self.table} {keys}" if keys else f"{self.table} (static, whole)"
        if self.columns:
            named += f", column(s) {', '.join(self.columns)}"
        return f"{named}: {self.taint.reason} (by {self.taint.by})"

    def spared_summary(self) -> str:
        """How many partitions the column restriction spared against a taint of the whole table, and where."""
        if not self.columns:
            return ""
        count = sum(len(keys) for keys in self.spared.values())
        named = ", ".join(f"{table} ({len(keys)})" for table, keys in self.spared.items())
        columns = ", ".join(self.columns)
        if not count:
            return (
                f"the column restriction spared no partition: every table a taint of the whole {self.table} would "
                f"mark reads {columns}, or is built from one that does"
            )
        return (
            f"the column restriction spared {count} partition(s) of {len(self.spared)} table(s) that a taint of the "
            f"whole {self.table} would mark, as they do not read {columns}: {named}"
        )

    def summary(self) -> str:
        tables = sum(1 for t in self.tables if t.marked)
        rebuilt = sum(1 for t in self.tables if t.rebuilt)
        if not self.backfill:
            return (
                f"{self.marked} partition(s) of {tables} table(s) to mark tainted; the engine rebuilds {self.rebuilt} "
                f"partition(s) of {rebuilt} table(s) once {self.table} {self.start} is fixed"
            )
        return (
            f"{self.marked} partition(s) of {tables} table(s) to mark tainted; the repair rebuilds {self.rebuilt} "
            f"partition(s) of {rebuilt} table(s) in {self.runs} run(s), one asset backfill"
        )

    def _how(self, t: TablePlan) -> str:
        if not t.rebuilt and self.index.is_static(t.table):
            return "repaired by correcting its SQL (the static_tables sensor builds it again)"
        if not t.rebuilt and self.reingest and t.table == self.table:
            return "re-ingested from its retained landing segments"
        if not t.rebuilt:
            return "valid again once its source reports it again (or re-ingested, or released)"
        return f"rebuilt in {t.runs} run(s)" if self.backfill else "rebuilt by the engine"

    def lines(self) -> list[str]:
        out = [f"taint {self.title}"]
        for t in self.tables:
            if t.marked:
                how = self._how(t)
                out.append(f"  {t.table:<28} {self.ranges(t.table, t.marked):<44} {how}")
        out.append(self.summary())
        if self.columns:
            out.append(self.spared_summary())
            if self.impact is not None:
                reached = [t.table for t in self.tables if t.table != self.table]
                out.extend(f"  {table:<28} {self.impact.describe(table)}" for table in reached)
        for label, attr in [
            ("re-materialized since what was built from it (taken as corrected, not marked)", "corrected"),
            ("not built yet (they wait for the repair)", "waiting"),
            (
                "can never be built (their window reaches before the warehouse start or its first week or month; "
                "`warehouse why` says how), left out",
                "never",
            ),
        ]:
            named = [(t.table, getattr(t, attr)) for t in self.tables if getattr(t, attr)]
            if named:
                out.append(f"{label}:")
                out.extend(f"  {table:<28} {self.ranges(table, keys)}" for table, keys in named)
        return out

    def markdown(self) -> str:
        out = [
            f"**Taint** {self.title}",
            "",
            "| table | tainted partitions | count | repair |",
            "|---|---|---|---|",
        ]
        for t in self.tables:
            if t.marked:
                how = self._how(t)
                out.append(f"| `{t.table}` | {self.ranges(t.table, t.marked)} | {len(t.marked)} | {how} |")
        out += ["", self.summary()]
        if self.columns:
            out += ["", self.spared_summary()]
        for label, attr in [
            ("Corrected roots", "corrected"),
            ("Not built yet", "waiting"),
            ("Never buildable", "never"),
        ]:
            for t in self.tables:
                if getattr(t, attr):
                    out.append(f"- {label}: `{t.table}` {self.ranges(t.table, getattr(t, attr))}")
        return "\n".join(out)


def new_taint(
    table: str,
    start: str,
    end: str,
    reason: str,
    by: str = "",
    root_check: str = "",
    columns: Sequence[str] = (),
) -> Taint:
    """The taint of partitions START … END of ``table`` (of its ``columns`` only, when named): its root names them
    (and the failed check, for the engine's taint after a late verdict); ``by`` defaults to the user running the
    process."""
    root = f"{table} {start}" if start == end else f"{table} {start} .. {end}"
    if start in ("", WHOLE):  # a static table: the whole of it
        root = table
    if columns:
        root += f" (column(s) {', '.join(columns)})"
    return Taint(
        reason=reason,
        root=f"{root} (check {root_check} failed)" if root_check else root,
        by=by or getpass.getuser(),
        at=time.time(),
    )


def root_keys(catalog: Catalog, table: str, start: str, end: str) -> list[str]:
    """The partitions START … END of ``table``, validated."""
    if table not in catalog.tables:
        raise ValueError(f"unknown table {table!r}; known: {', '.join(sorted(catalog.tables))}")
    if catalog[table].is_static:
        if {start, end} - {"", WHOLE}:
            raise ValueError(f"{table} is a static table: it has no partitions, so name no START and END")
        return [WHOLE]
    if not start or not end:
        raise ValueError(f"{table} is partitioned ({catalog[table].period}): name the first and last partition")
    derived = catalog[table]
    if isinstance(derived, DerivedTable) and derived.is_regional:  # a date names every region's day of it
        return regional_keys_between(derived, start, end)
    pdef = BY_PERIOD[catalog[table].period]
    for key in (start, end):
        if not pdef.has_partition_key(key):
            example = pdef.get_first_partition_key()
            raise ValueError(f"{key!r} is not a partition of {table} ({catalog[table].period}, e.g. {example})")
    keys = list(pdef.get_partition_keys_in_range(PartitionKeyRange(start, end)))
    if not keys:
        raise ValueError(f"{start} .. {end} is empty: START must not come after END")
    return keys


def plan_taint(
    catalog: Catalog,
    index: ReverseIndex,
    states: StateView | PartitionStateStore,
    table: str,
    start: str,
    end: str,
    taint: Taint,
    mark_roots: bool = True,
    now: datetime | None = None,
    backfill: bool = True,
    columns: Sequence[str] = (),
) -> TaintPlan:
    """The plan of tainting partitions START … END of ``table`` (inclusive) with ``taint`` (see the module's doc).
    ``mark_roots=False``: only what was built from them is marked (a late verdict taints downstream, not the hour).
    ``columns``: only those columns are bad, so the closure goes only to the tables reading them, transitively through
    the columns each computes from them (a table whose rows depend on them, by a filter, a join, a grouping, is bad in
    every column); the plan counts what a taint of the whole table would have marked besides."""
    now = now or datetime.now(UTC)
    roots = root_keys(catalog, table, start, end)
    impact = None
    if columns:  # the SQL of the tables downstream is parsed only for a column taint
        from warehouse_assets.catalog.lineage import WarehouseLineage

        impact = WarehouseLineage(catalog).impact(table, list(dict.fromkeys(columns)))
    closure = index.closure({table: roots}, now, follows=impact.follows if impact is not None else None)
    buildable = BuildableSearch()
    plans: list[TablePlan] = []
    for fqn in _in_dependency_order(catalog, closure):
        keys = closure[fqn]
        t = catalog[fqn]
        found = states.states(AssetKey(t.key), keys)
        plan = TablePlan(fqn)
        for key in keys:
            state = found[key]
            if fqn == table and key in roots:
                if not mark_roots or not state.materialized:
                    continue
                if _corrected(catalog, index, states, fqn, key, state, now):
                    plan.corrected.append(key)
                    continue
            if state.materialized:
                plan.marked.append(key)
            elif t.is_source:
                continue  # an ODS hour or a delivery not reported yet: nothing built from it either
            elif never_buildable(catalog, t, key, buildable):  # the rule `warehouse why` and the descriptions give
                plan.never.append(key)
            else:
                plan.waiting.append(key)
        # a static table is repaired by correcting its SQL (the static_tables sensor builds it again), as an ODS hour
        # is at its source; the backfill's runs reading it wait for that through the run guard
        if not t.is_source and not t.is_static:
            plan.rebuilt = list(plan.marked)
            limit = max_partitions_per_run(t)
            plan.runs = sum(-(-len(run) // (limit or len(run))) for run in index.runs(fqn, plan.rebuilt, now))
        plans.append(plan)
    taint_plan = TaintPlan(table, start, end, taint, roots, plans, index, now, backfill)
    if impact is not None:
        taint_plan.columns, taint_plan.impact = impact.columns, impact
        taint_plan.spared = _spared(catalog, states, index.closure({table: roots}, now), closure)
    return taint_plan


def _spared(
    catalog: Catalog,
    states: StateView | PartitionStateStore,
    whole: dict[str, list[str]],
    closure: dict[str, list[str]],
) -> dict[str, list[str]]:
    """Table → its materialized partitions a taint of the whole table would mark (``whole``) and a column taint's
    ``closure`` leaves alone, in dependency order."""
    spared: dict[str, list[str]] = {}
    for fqn in _in_dependency_order(catalog, whole):
        kept = set(closure.get(fqn, ()))
        left = [key for key in whole[fqn] if key not in kept]
        if not left:
            continue
        found = states.states(AssetKey(catalog[fqn].key), left)
        built = [key for key in left if found[key].materialized]
        if built:
            spared[fqn] = built
    return spared


def _corrected(
    catalog: Catalog,
    index: ReverseIndex,
    states: StateView | PartitionStateStore,
    table: str,
    key: str,
    state: PartitionState,
    now: datetime,
) -> bool:
    """A root materialized again after every partition that read it was built: its data is newer than what they
    used (the corrected source re-ingested before the taint), so it is not what is bad."""
    built: list[int] = []
    for downstream, keys in index.downstream_of(table, key, now).items():
        found = states.states(AssetKey(catalog[downstream].key), keys)
        built.extend(s.storage_id for s in found.values() if s.storage_id is not None)
    return bool(built) and state.storage_id is not None and state.storage_id > max(built)


def _in_dependency_order(catalog: Catalog, closure: dict[str, list[str]]) -> list[str]:
    sources = [*catalog.statics(), *catalog.ods(), *catalog.externals()]
    rank = {fqn: i for i, fqn in enumerate(t.fqn for t in sources)}
    rank.update({t.fqn: len(rank) + i for i, t in enumerate(topological(catalog))})
    return sorted(closure, key=lambda fqn: rank.get(fqn, len(rank)))


# --- applying: the marks are events of the job's run, the repair is one asset backfill --------------------------


def mark(context: OpExecutionContext, catalog: Catalog, plan: TaintPlan, states: StateView, taint: Taint) -> int:
    """Log the failed ``valid`` verdict of every partition the plan marks, in this run, on its latest
    materialization; returns how many."""
    marked = 0
    for t in plan.tables:
        table = catalog[t.table]
        found = states.states(AssetKey(table.key), t.marked)
        for key in t.marked:
            state = found[key]
            assert state.storage_id is not None
            target = (state.storage_id, state.run_id or "", state.timestamp or 0.0)
            # log_event accepts check evaluations at run time (its annotation lags behind)
            context.log_event(taint_evaluation(table, key, taint, target))  # type: ignore[arg-type]
            marked += 1
    return marked


def launch_backfill(
    instance: DagsterInstance, catalog: Catalog, plan: TaintPlan, backfill_id: str, run_id: str
) -> None:
    """The repair: one asset backfill of the plan's derived partitions, the kind the UI's ``launchPartitionBackfill``
    creates (partitions per asset) and a sensor's ``RunRequest.for_asset_graph_subset`` too, so the UI lists it and the
    backfill daemon runs it. Built from the catalog's partitions definitions: launching it needs no code location."""
    from dagster._core.definitions.assets.graph.asset_graph_subset import AssetGraphSubset
    from dagster._core.execution.backfill import PartitionBackfill

    subsets = {
        AssetKey(catalog[fqn].key): partitions_def_of(catalog[fqn]).subset_with_partition_keys(keys)
        for fqn, keys in plan.rebuild().items()
    }
    backfill = PartitionBackfill.from_asset_graph_subset(
        backfill_id=backfill_id,
        backfill_timestamp=time.time(),
        tags={TAINT_TAG: run_id, **lane_tags(REBUILD_LANE)},  # a repair rebuilds: it goes in the rebuild lane
        dynamic_partitions_store=instance,
        # the serdes decorator hides the NamedTuple's fields from mypy
        asset_graph_subset=AssetGraphSubset(partitions_subsets_by_asset_key=subsets),  # type: ignore[call-arg]
        title=f"repair: {plan.table} {plan.start} .. {plan.end}"
        + (f", column(s) {', '.join(plan.columns)}" if plan.columns else ""),
        description=f"{plan.taint.reason} (by {plan.taint.by}); {plan.summary()}",
        run_config=None,
    )
    instance.add_backfill(backfill)


class TaintConfig(Config):  # type: ignore[misc]
    table: str  # e.g. "ods.order"
    start: str = ""  # first partition, e.g. "2026-01-05-08:00" (none of a static table)
    end: str = ""  # last partition (inclusive)
    reason: str = ""  # why (taint, release): shown on every partition it marks or releases
    apply: bool = False  # False: show the plan only
    by: str = ""  # who marks it (default: the user running the job's process)
    rebuild: bool = True  # launch the repair backfill
    root_check: str = ""  # set by the engine: a late verdict of this check taints what was built before it
    # "taint" (mark and repair), "reingest" (re-ingest ODS hours from the landing area and report them again) or
    # "release" (accept tainted partitions as they are, with the reason)
    action: str = TAINT
    reingest: bool = False  # with taint and apply: re-ingest the ODS hours START … END after marking them
    # with taint: only these columns of the table are bad; what does not read them, even through other tables, is
    # left alone
    columns: list[str] = []


def build_taint_job(catalog: Catalog, lake: bool = False):  # type: ignore[no-untyped-def]
    """The ``taint_repair`` job; ``lake``: its op gets the lake's resources (Spark, the Delta lake, the landing area),
    which re-ingesting needs."""

    @op(name="taint_and_repair", required_resource_keys=LAKE_RESOURCES if lake else set())
    def taint_and_repair(context: OpExecutionContext, config: TaintConfig) -> Output[dict[str, Any]]:
        if config.action not in (TAINT, REINGEST, RELEASE):
            raise Failure(f"action {config.action!r}: expected {TAINT}, {REINGEST} or {RELEASE}")
        if config.action in (TAINT, RELEASE) and not config.reason.strip():
            raise Failure(f"{config.action} needs a reason: it is shown on every partition it marks or releases")
        reingest = config.action == REINGEST or (config.reingest and config.apply)
        if reingest and config.table in catalog.tables and not catalog[config.table].is_ods:
            raise Failure(f"{config.table} is not an ODS table: only ODS hours are re-ingested from the landing area")
        if reingest and not lake:
            raise Failure("this taint_repair job has no lake resources (spark, lake, landing): it cannot re-ingest")
        store = PartitionStateStore(context.instance)
        try:
            states = store.view()  # the engine's view, with the events it has not applied yet
            if config.action == REINGEST:
                lines = _reingest(context, catalog, config.table, _roots(catalog, config))
                return Output({"marked": 0, "rebuilt": 0, "runs": 0, "backfill": "", "lines": lines})
            if config.action == RELEASE:
                return _release(context, catalog, states, config)
            return _taint(context, catalog, states, config, reingest)
        finally:
            store.close()

    @job(
        name=JOB,
        description="Mark a table's partitions tainted with everything built from them, and rebuild exactly those: "
        "launch with table, start, end, reason (and apply: true to act; without, the run shows the plan). "
        "action: reingest re-ingests ODS hours from the landing area; release accepts tainted partitions as they are.",
        # launched by someone (the Launchpad, the CLI); the engine's own taint runs override it with the rebuild lane
        tags={"warehouse/taint": "plan", **lane_tags(USER_LANE)},
    )
    def taint_repair() -> None:
        taint_and_repair()

    return taint_repair


def reingest_in_flight(instance: DagsterInstance) -> str | None:
    """The id of a ``taint_repair`` run queued or running that re-ingests ODS hours: between its merge and its report
    the hours' partitions are changed and not reported yet, which a reporter looking then would report itself."""
    from warehouse_assets.ingest.job import IN_FLIGHT

    for run in instance.get_runs(RunsFilter(job_name=JOB, statuses=IN_FLIGHT)):
        ops: Any = run.run_config.get("ops") or {}
        config = ops.get("taint_and_repair", {}).get("config", {})
        if config.get("action") == REINGEST or (config.get("reingest") and config.get("apply")):
            return run.run_id
    return None


def _roots(catalog: Catalog, config: TaintConfig) -> list[str]:
    try:
        return root_keys(catalog, config.table, config.start, config.end)
    except ValueError as exc:
        raise Failure(str(exc)) from exc


def _taint(
    context: OpExecutionContext, catalog: Catalog, states: StateView, config: TaintConfig, reingest: bool
) -> Output[dict[str, Any]]:
    index = ReverseIndex.build(catalog)
    automatic = bool(config.root_check)
    taint = new_taint(
        config.table, config.start, config.end, config.reason, config.by, config.root_check, config.columns
    )
    try:
        plan = plan_taint(
            catalog,
            index,
            states,
            config.table,
            config.start,
            config.end,
            taint,
            mark_roots=not automatic,
            backfill=config.rebuild,
            columns=config.columns,
        )
    except ValueError as exc:
        raise Failure(str(exc)) from exc
    plan.reingest = reingest
    for line in plan.lines():
        context.log.info(line)
    lines = plan.lines()
    backfill_id = ""
    if config.apply:
        backfill_id = _apply(context, catalog, plan, states, taint, config.rebuild)
        if reingest:
            lines += _reingest(context, catalog, config.table, plan.roots)
    return _output(plan, lines, backfill_id, config.apply)


def _apply(
    context: OpExecutionContext, catalog: Catalog, plan: TaintPlan, states: StateView, taint: Taint, rebuild: bool
) -> str:
    """Mark the plan's partitions and launch its repair backfill (when it rebuilds anything); the backfill's id."""
    backfill_id = ""
    if rebuild and plan.rebuild():
        from dagster._core.utils import make_new_backfill_id

        backfill_id = make_new_backfill_id()
        taint = Taint(taint.reason, taint.root, taint.by, taint.at, repair=backfill_id)
    marked = mark(context, catalog, plan, states, taint)
    if backfill_id:
        # launched before any re-ingest: its runs reading the hours wait for them (the run guard)
        launch_backfill(context.instance, catalog, plan, backfill_id, context.run_id)
        context.log.info(f"marked {marked} partition(s) tainted; repair backfill {backfill_id}")
    else:
        context.log.info(f"marked {marked} partition(s) tainted; no backfill")
    return backfill_id


def _output(plan: TaintPlan, lines: list[str], backfill_id: str, applied: bool) -> Output[dict[str, Any]]:
    counts = {"marked": plan.marked, "rebuilt": plan.rebuilt, "runs": plan.runs}
    if plan.columns:
        counts["spared"] = sum(len(keys) for keys in plan.spared.values())
    metadata: dict[str, Any] = {
        "plan": MetadataValue.md(plan.markdown()),
        **counts,
        "applied": applied,
        "backfill": backfill_id,
    }
    return Output({**counts, "backfill": backfill_id, "lines": lines}, metadata=metadata)


def _reingest(context: OpExecutionContext, catalog: Catalog, table: str, keys: list[str]) -> list[str]:
    """Re-ingest the ODS hours ``keys`` from the landing area, report them again and judge their checks in this run;
    what happened, in lines."""
    from warehouse_assets.ingest.job import report_completed_hours
    from warehouse_assets.ingest.merge import committed_positions
    from warehouse_assets.ingest.reingest import reingest_hours
    from warehouse_assets.materialize.hour_checks import judge_hours
    from warehouse_assets.materialize.quality import failed_blocking_checks
    from warehouse_assets.materialize.validity import taint_times

    t = catalog[table]
    assert isinstance(t, OdsTable)  # the op refused any other table
    session = context.resources.spark.session()
    store, land = context.resources.lake.store(), context.resources.landing.landing()
    before = committed_positions(store, t, land.streams(t.source_database, t.source_tables))
    try:
        done = reingest_hours(session, store, land, t, keys)
    except ValueError as exc:
        raise Failure(str(exc)) from exc
    context.log.info(done.describe())
    numbers = report_completed_hours(
        context, t, before, session, store, land, judge_hours, changed=keys, tainted_at=taint_times
    )
    failed = failed_blocking_checks(context.instance, t, keys)
    lines = [done.describe(), f"{table}: {int(numbers['hours_reported'])} hour(s) reported again, checks judged"]
    for key, checks in failed.items():
        lines.append(
            f"{table} {key} failed {', '.join(checks)} on the re-ingested data: what reads it waits for data that "
            "passes (the source sending it corrected), unless its dependency says ignore_dq"
        )
    for line in lines[1:]:
        context.log.info(line)
    return lines


def releasable(
    catalog: Catalog, states: StateView, table: str, start: str, end: str
) -> tuple[list[str], dict[str, PartitionState]]:
    """The partitions START … END of ``table``, and those of them a release would accept (tainted and built); raises
    ValueError, saying so, for a bad table or range, or when none is tainted. The ``release`` action and the CLI's
    check before it launches a run share it."""
    keys = root_keys(catalog, table, start, end)
    found = states.states(AssetKey(catalog[table].key), keys)
    tainted = {k: s for k, s in found.items() if s.taint is not None and s.storage_id is not None}
    if not tainted:
        raise ValueError(f"{table} {span(keys)}: no partition there is tainted, nothing to release")
    return keys, tainted


def _release(
    context: OpExecutionContext, catalog: Catalog, states: StateView, config: TaintConfig
) -> Output[dict[str, Any]]:
    """Accept the tainted partitions START … END of the table as they are: a passed ``valid`` verdict each, with the
    reason. A repair waiting for them goes on; with none running, one is launched of what was built from them."""
    try:
        keys, tainted = releasable(catalog, states, config.table, config.start, config.end)
    except ValueError as exc:
        raise Failure(str(exc)) from exc
    table = catalog[config.table]
    by = config.by or getpass.getuser()
    for key, state in tainted.items():
        assert state.taint is not None and state.storage_id is not None
        target = (state.storage_id, state.run_id or "", state.timestamp or 0.0)
        event = release_evaluation(table, key, target, config.reason, by, state.taint)
        context.log_event(event)  # type: ignore[arg-type]
    released = list(tainted)
    lines = [f"released {config.table} {span(released)}: accepted as is: {config.reason} (by {by})"]
    left = [k for k in keys if k not in tainted]
    if left:
        lines.append(f"not tainted, left as they are: {config.table} {span(left)}")
    repairs = sorted({s.taint.repair for s in tainted.values() if s.taint and s.taint.repair})
    running = [r for r in repairs if backfill_running(context.instance, r)]
    backfill_id = ""
    plan: TaintPlan | None = None
    if running:
        lines.append(f"the repair backfill {', '.join(running)} waiting for it goes on with what was built from it")
    else:
        # nothing rebuilds what was built from it: a repair of that, from the data now accepted
        reason = f"rebuilt from {config.table} {span(released)}, released: {config.reason}"
        taint = new_taint(config.table, released[0], released[-1], reason, by)
        index = ReverseIndex.build(catalog)
        plan = plan_taint(catalog, index, states, config.table, released[0], released[-1], taint, mark_roots=False)
        backfill_id = _apply(context, catalog, plan, states, taint, rebuild=True) if plan.rebuild() else ""
        what = f"repair backfill {backfill_id}" if backfill_id else "nothing was built from it: no backfill"
        lines.append(f"what was built from it is rebuilt: {what}")
    for line in lines:
        context.log.info(line)
    counts = {"marked": 0, "rebuilt": 0, "runs": 0}
    if plan is not None:
        counts = {"marked": plan.marked, "rebuilt": plan.rebuilt, "runs": plan.runs}
    metadata: dict[str, Any] = {"released": len(released), **counts, "backfill": backfill_id}
    return Output({**counts, "backfill": backfill_id, "lines": lines, "released": released}, metadata=metadata)


# --- late data that fails its checks -----------------------------------------------------------------------------


class HeldSnapshot(Protocol):
    """What the late verdict reads of the resolver's snapshot of the store and the ledger, and holds in it."""

    def pending_roots(self) -> set[tuple[str, str, int]]: ...

    def states(self, table: Table, keys: Sequence[str]) -> dict[str, PartitionState]: ...

    def hold(self, key: tuple[str, str, int], taint: Taint, marked: list[tuple[str, str, int]]) -> None: ...


def late_verdict(
    catalog: Catalog,
    index: ReverseIndex,
    table: Table,
    state: PartitionState,
    trigger: Trigger,
    states: HeldSnapshot,
    now: datetime,
) -> list[RunPlan]:
    """A blocking check failed on ``state``'s materialization while downstream partitions were built from an
    earlier one: plan the taint of everything built from it (once per materialization), and hold it back now."""
    failed = [c.name for c in table.checks if c.blocking and state.checks.get(c.name) is False]
    if not failed or state.storage_id is None:
        return []
    key = (table.fqn, state.partition, state.storage_id)
    if key in states.pending_roots():
        return []
    built_before = False
    for downstream, keys in index.downstream_of(table.fqn, state.partition, now).items():
        found = states.states(catalog[downstream], keys).values()
        built_before |= any(s.storage_id is not None and s.storage_id < state.storage_id for s in found)
    if not built_before:
        return []  # its first data failed: nothing was built from it, the gate holds its downstream back
    closure = index.closure({table.fqn: [state.partition]}, now)
    marked = [
        (fqn, k, s.storage_id)
        for fqn, keys in closure.items()
        for k, s in states.states(catalog[fqn], keys).items()
        if s.storage_id is not None and (fqn, k) != (table.fqn, state.partition)
    ]
    when = datetime.fromtimestamp(state.timestamp or 0, ZoneInfo(BY_PERIOD[table.period].timezone))
    reason = f"late data: {', '.join(failed)} failed on its materialization of {when:%Y-%m-%d %H:%M}"
    config = {
        "table": table.fqn,
        "start": state.partition,
        "end": state.partition,
        "reason": reason,
        "apply": True,
        "rebuild": False,  # the engine rebuilds them once the partition is fixed, as late data
        "by": "engine",
        "root_check": ", ".join(failed),
    }
    root = f"{table.fqn} {state.partition} (check {', '.join(failed)} failed)"
    states.hold(key, Taint(reason, root, "engine", now.timestamp()), marked)
    run_config = {"ops": {"taint_and_repair": {"config": config}}}
    return [RunPlan(table.fqn, (state.partition,), trigger, job=JOB, run_config=json.dumps(run_config))]
