"""The partition runtime: what a derived table's asset body and the ODS checks run, with Spark.

Imported by the bodies of the assets and checks the compiler builds (:mod:`warehouse_assets.materialize.compiler`),
never when the code location loads: loading it imports PySpark. For each partition of the run, in time order:

1. the gate (:mod:`warehouse_assets.materialize.gate`) decides whether it may run — every exact upstream partition
   exists, is materialized (or was written earlier in this run) and passed its blocking checks (unless the dependency
   says ``ignore_dq``); if not, the run fails with the gate's reason. Dagster drops nonexistent partitions
   silently, so the guard lives here. A backfill's run held back only by tainted upstream partitions that a running
   repair makes valid (an ODS hour its source, a re-ingest or a release makes valid; a partition another repair
   rebuilds) waits for them instead, as the backfill waits for the partitions it rebuilds itself;
2. the upstream partitions are read from Delta (pruned) — or, for an external table, from its producer's files
   or Delta table through :class:`resources.external.ExternalResource` — and registered under the names its
   SQL uses;
3. the SQL is rendered for the partition; the run's partitions are then written together by Spark, one Delta
   overwrite of exactly those partitions (a self-dependent table reads its earlier partitions of the run from their
   rows computed in the run);
4. the table's declared checks are evaluated on the partition it wrote (:mod:`warehouse_assets.materialize.quality`).

The materialization of every partition is reported first, then one check evaluation per check and partition,
targeting that materialization; a failed blocking check fails the step (Dagster's in-run gate) and the gate
holds back the partition's downstream in later runs. A partition whose blocking checks all passed also gets a passed
``valid`` verdict (:mod:`warehouse_assets.materialize.validity`): the UI then shows a repaired partition valid again.
"""

import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import reduce
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from dagster import (
    AssetCheckResult,
    AssetExecutionContext,
    Failure,
    MaterializeResult,
    MetadataValue,
    Output,
)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from resources.delta_lake import DeltaStore, PartitionWritten, Predicate, ReadStats, WriteResult
from resources.external import ExternalResource
from warehouse_assets.catalog import (
    BY_PERIOD,
    WHOLE,
    Catalog,
    OdsTable,
    OdsWindows,
    StaticTable,
    Table,
    partition_values_of,
    partition_window,
    upstream_partitions,
)
from warehouse_assets.catalog.checks import Check
from warehouse_assets.catalog.lineage import WarehouseLineage
from warehouse_assets.catalog.lineage_markdown import column_lineage_metadata
from warehouse_assets.ingest.deliveries import external_source
from warehouse_assets.materialize.additive import AdditiveMaintainer, GroupChanges
from warehouse_assets.materialize.gate import (
    DEGRADED,
    LATE_CHANGES_TAG,
    READ_AFTER,
    RETRY_ON_STEP_FAILURE_TAG,
    STATE,
    InstanceStates,
    Verdict,
    decide,
    degraded_description,
    span,
)
from warehouse_assets.materialize.key_scope import LAYOUT_MIN_BYTES, KeyScope, KeyScoper, narrowed
from warehouse_assets.materialize.log_checks import PartitionFacts, judge
from warehouse_assets.materialize.quality import (
    PARTITION,
    Outcome,
    evaluate_partitions,
    evaluation,
    latest_materialization,
)
from warehouse_assets.materialize.run_reads import RunReads
from warehouse_assets.materialize.sql_text import read_name, render_sql, view_name
from warehouse_assets.materialize.validity import VALID, valid_evaluation
from warehouse_assets.materialize.written_checks import check_written


def run_table(
    context: AssetExecutionContext,
    catalog: Catalog,
    table: Table,
    spark: SparkSession,
    store: DeltaStore,
    external: ExternalResource | None = None,
) -> Iterator[MaterializeResult | Any]:
    """Build every partition of the run in time order (one Delta commit for all of them), then report the
    materializations and the check results of every partition.

    External inputs are read from their producers (``external`` says where) — only the partitions their
    sensors reported, which the guard checks like any other input.
    """
    outcomes: list[Outcome] = []
    result = _build_partitions(context, catalog, table, spark, store, outcomes, external)
    yield result
    if any(o.check.blocking and not o.passed for o in outcomes):
        not_worth_retrying(context)  # Dagster fails the step on the failed blocking check
    for outcome in outcomes:
        event = evaluation(context.instance, table, outcome)
        (context.log.info if outcome.passed else context.log.warning)(
            f"{table.fqn} {outcome.partition} check {outcome.check.name}: "
            f"{'passed' if outcome.passed else 'FAILED'} — {outcome.description}"
        )
        yield event
    refused = {o.partition for o in outcomes if o.check.blocking and not o.passed}
    blocking = any(c.blocking for c in table.checks)
    detail = "built in this run; its blocking checks passed" if blocking else "built in this run (no blocking check)"
    for key in context.partition_keys:
        record = latest_materialization(context.instance, table, key)
        if key not in refused and record is not None:
            yield valid_evaluation(table, key, record, detail)
    for output_name in context.assets_def.check_specs_by_output_name:
        yield Output(None, output_name=output_name)


def run_static(
    context: AssetExecutionContext, table: StaticTable, spark: SparkSession, store: DeltaStore
) -> MaterializeResult:
    """Build a static table: its SQL's rows replace the whole table, in one Delta commit."""
    started = time.monotonic()
    out = spark.sql(table.sql)
    _check_columns(table, WHOLE, out)
    result = store.overwrite(table.key, out, [], [], operation="replace static table")
    context.log.info(f"{table.fqn}: {result.rows} rows, Delta version {result.version}")
    return MaterializeResult(
        # a build is new data: valid, whatever a taint said of the previous one
        check_results=[
            AssetCheckResult(check_name=VALID, passed=True, metadata={"validity": "valid"}, description="built")
        ],
        metadata={
            "rows": result.rows,
            "files_added": result.files_added,
            "files_removed": result.files_removed,
            "delta_version": result.version,
            "duration_s": round(time.monotonic() - started, 3),
            "table_uri": store.table_uri(table.key),
        },
    )


def not_worth_retrying(context: AssetExecutionContext) -> None:
    """Tell the daemon not to retry this run when it fails: it fails on the data (a blocking check failed, an input is
    not there), which running it again at once does not change; the engine requests it again when its inputs change.
    Runs whose process or Spark died are still retried."""
    context.instance.add_run_tags(context.run_id, {RETRY_ON_STEP_FAILURE_TAG: "false"})


BACKFILL_TAG = "dagster/backfill"  # Dagster's tag on the runs a backfill launched
REPAIR_POLL_S = 2.0  # how often a run waiting for a repair asks the gate again
REPAIR_LOG_S = 300.0  # how often it says it still waits


def _await_repairs(
    context: AssetExecutionContext,
    catalog: Catalog,
    table: Table,
    key: str,
    states: InstanceStates,
    before_waiting: Callable[[], None],
) -> Verdict:
    """The gate's verdict on ``key``; in a backfill's run held back only by tainted upstream partitions that running
    repairs make valid, the verdict once they are (or once something else holds it back: a repair canceled, a check
    that failed on the new data). A backfill launches a run as soon as the partitions it rebuilds itself are done:
    the ODS hour a repair waits for is not one of them. ``before_waiting`` is called once if it waits (the run
    writes the partitions it planned before this one: their inputs were read at the versions of then)."""
    verdict = decide(catalog, table, key, states)
    if verdict.may_run or not verdict.waits_for_repair or BACKFILL_TAG not in context.run.tags:
        return verdict
    awaited = {(edge.dep.table, k) for edge in verdict.edges for k in edge.tainted}
    before_waiting()
    context.log.info(f"{verdict.reasons[0]}; waiting")
    said = time.monotonic()
    while verdict.waits_for_repair:
        time.sleep(REPAIR_POLL_S)
        states.refresh()
        verdict = decide(catalog, table, key, states)
        if verdict.waits_for_repair and time.monotonic() - said > REPAIR_LOG_S:
            context.log.info(f"{verdict.reasons[0]}; still waiting")
            said = time.monotonic()
    if verdict.may_run:
        seen = [latest_materialization(context.instance, catalog[t], k) for t, k in sorted(awaited)]
        ids = [r.storage_id for r in seen if r is not None]
        if ids:
            # the run read its inputs after these materializations, though they came after its start: they are
            # not late data to it (the state store counts late data from here, not from the run's start)
            states.read_after[key] = max(ids)
    return verdict


# At most this many partitions in one Delta write: a ranged run of a year of hours is written in pieces, so that
# one query plan (a union of every partition's query) stays of a size Spark plans quickly.
RANGED_WRITE_MAX_PARTITIONS = 168


@dataclass
class _Planned:
    """A partition of the run whose query is planned, waiting for its write."""

    key: str
    verdict: Verdict
    out: DataFrame
    inputs: dict[str, DataFrame]
    read_from: dict[str, list[str]]
    versions: dict[str, int]  # the Delta version of each input read
    scope: KeyScope | None = None  # the keys it rebuilds, when not the whole partition
    groups: GroupChanges | None = None  # the groups of a total it maintains from the changed rows, when not whole
    replaced: DataFrame | None = None  # those groups, as their commit names them
    states: DataFrame | pa.Table | None = None  # an additive table's partial states, written after its rows

    @property
    def kind(self) -> str:
        """How its commit writes it: by key, by group, or whole."""
        return "keys" if self.scope else "groups" if self.groups else "whole"


def _build_partitions(
    context: AssetExecutionContext,
    catalog: Catalog,
    table: Table,
    spark: SparkSession,
    store: DeltaStore,
    outcomes: list[Outcome],
    external: ExternalResource | None,
) -> MaterializeResult:
    keys = sorted(context.partition_keys, key=lambda k: partition_window(table, k).start)
    build = _RangedBuild(context, catalog, table, spark, store, outcomes, external)
    try:
        for key in keys:
            verdict = _await_repairs(context, catalog, table, key, build.states, before_waiting=build.write)
            if not verdict.may_run:
                build.write()  # the partitions before it are built, as they would be had they run alone
                not_worth_retrying(context)
                raise Failure(verdict.reasons[0])
            build.plan(key, verdict)
        build.write()
    finally:
        if build.reads is not None:
            build.reads.release()
    return build.result()


class _RangedBuild:
    """One run's partitions of a table: planned in time order and written together, one Delta commit per ranged
    write: Spark computes them in one job instead of one job and one commit each. A self-dependent table reads its
    own earlier partitions: those planned in this run are read from their computed rows, each partition's rows
    computed once when it is planned (a local checkpoint, which also keeps a long chain's query plan from growing with
    every day)."""

    def __init__(
        self,
        context: AssetExecutionContext,
        catalog: Catalog,
        table: Table,
        spark: SparkSession,
        store: DeltaStore,
        outcomes: list[Outcome],
        external: ExternalResource | None,
    ):
        self.context, self.catalog, self.table, self.spark, self.store = context, catalog, table, spark, store
        self.outcomes, self.external = outcomes, external
        self.states = InstanceStates(context.instance)
        self.written: list[dict[str, Any]] = []
        self.degraded: dict[str, str] = {}  # partition → what it was built without, past a deadline
        self.reached: dict[str, str] = {}  # partition → the state it is built in, of a table with states
        self.totals = {"rows": 0, "files_added": 0, "files_removed": 0, "bytes_added": 0}
        self.totals.update(files_read=0, files_skipped=0)
        self.started = time.monotonic()
        self.version: int | None = None
        self.self_dependent = any(dep.table == table.fqn for dep in table.deps)
        self.pending: list[_Planned] = []
        self.predicates: dict[str, list[Predicate]] = {}  # input → the row predicates it is read with
        # a rebuild for late data replaces only the changed keys' rows where the table's SQL proves that enough
        self.scoper = KeyScoper(catalog, table, context.instance, context.run.tags, spark, store)
        # ... and a total's changed groups from the changed rows, where its SQL proves it a sum of its input's rows
        self.additive = AdditiveMaintainer(catalog, table, context.instance, spark, store, context.log)
        self.bytes_read = 0  # of the partitioned inputs' files
        # a run of several partitions reads each small input once for all of them (not a table with states, whose
        # partitions' windows are those of the state each reaches)
        several = len(context.partition_keys) > 1 and not table.state_names
        self.reads = RunReads(spark, store, self._span) if several else None

    # --- reading a partition's inputs -------------------------------------------------------------------------

    def _span(self, upstream: str) -> list[str]:
        """The partitions of ``upstream`` that the run's partitions read (their mapped windows)."""
        now = datetime.now(UTC)
        deps = [dep for dep in self.table.deps if dep.table == upstream]
        keys = self.context.partition_keys
        return sorted(
            {k for d in deps for p in keys for k in upstream_partitions(self.catalog, self.table, d, p, now).keys}
        )

    def read_inputs(
        self, key: str, verdict: Verdict
    ) -> tuple[dict[str, DataFrame], dict[str, list[str]], dict[str, int]]:
        """The partition's inputs by the names its SQL reads, the upstream partitions each was read from, and the
        Delta version of each input read."""
        catalog, table, spark, store = self.catalog, self.table, self.spark, self.store
        inputs: dict[str, DataFrame] = {}
        read_from: dict[str, list[str]] = {}
        versions: dict[str, int] = {}
        for edge in verdict.edges:
            dep, used = edge.dep, edge.used  # a weak dependency's waived partitions are not read
            upstream = catalog[dep.table]
            if upstream.is_static:  # read whole, at the version of now (a new one is read by later builds)
                df, at, _ = _read_now(store, spark, f"{table.fqn} {key}", upstream)
                inputs[dep.table], read_from[dep.table], versions[dep.table] = df, [f"v{at}"], at
                continue
            if isinstance(upstream, OdsWindows):  # the ODS table's rows in the windows, from their hours' partitions
                inputs[upstream.source], read_from[dep.table] = _read_windows(catalog, upstream, used, spark, store)
                continue
            if dep.table == table.fqn and any(p.key in used for p in self.pending):
                own = _own_earlier(store, spark, f"{table.fqn} {key}", table, used, self.pending)
                inputs[dep.table], read_from[dep.table] = own, used
                continue
            inputs[dep.table] = self._read_upstream(key, dep.table, upstream, used, versions)
            read_from[dep.table] = used
        for dep in table.deps:  # a dependency the partition's state does not need reads as empty
            name = read_name(catalog, dep.table)
            if name not in inputs:
                inputs[name] = _empty_like(spark, store, catalog[name], external=self.external)
                read_from[dep.table] = []
        return inputs, read_from, versions

    def _read_upstream(
        self, key: str, name: str, upstream: Table, used: list[str], versions: dict[str, int]
    ) -> DataFrame:
        """The partitions ``used`` of a partitioned upstream: from its producer (external), or from Delta at the
        version of now (recorded in ``versions``), or an empty frame when none is used."""
        table, spark, store = self.table, self.spark, self.store
        specs = [partition_values_of(upstream, k) for k in used]
        if upstream.is_external:
            if self.external is None:
                raise Failure(f"{table.fqn} reads the external {name} but has no external resource")
            return external_source(self.external, upstream).read(spark, [s["dt"] for s in specs])
        if not specs:
            return _empty_like(spark, store, upstream, first_of_self=name == table.fqn)
        # skip CDC tombstones, except in a changelog, where a DELETE is a change its snapshot applies
        mirror = isinstance(upstream, OdsTable) and not upstream.changelog
        live = [Predicate("_deleted", "=", False)] if mirror else []
        self.predicates[name] = live
        shared = self.reads.read(upstream, used, live) if self.reads and name != table.fqn else None
        if shared is not None:  # filtered from the run's one read of the input
            df, versions[name], stats = shared
        else:
            df, versions[name], stats = _read_now(store, spark, f"{table.fqn} {key}", upstream, specs, live)
        self.totals["files_read"] += stats.files_read
        self.bytes_read += stats.bytes_read
        self.totals["files_skipped"] += stats.files_in_table - stats.files_read
        return df

    # --- planning a partition's query ---------------------------------------------------------------------------

    def plan(self, key: str, verdict: Verdict) -> None:
        """Read the partition's inputs and plan its query; the pending partitions are written when one commit cannot
        take it too, and when they are as many as one write takes."""
        table, spark = self.table, self.spark
        inputs, read_from, versions = self.read_inputs(key, verdict)
        scope, whole_because = self.scoper.scope(key, read_from, versions)
        groups = None
        if scope is None and key in self.scoper.late:  # not by key: a total's changed groups, else whole
            additive = self.additive.verdict
            groups, why = self.additive.changes(key, inputs, read_from, versions, self.predicates)
            whole_because = why if additive.additive else f"{whole_because}; {why}"
        if groups is None and key in self.scoper.late:  # a late-data rebuild that could not be scoped: say why
            self.context.log.info(f"{table.fqn} {key}: rebuilt whole: {whole_because}")
        kind = "keys" if scope else "groups" if groups else "whole"
        if self.pending and self.pending[0].kind != kind:
            self.write()  # one commit writes partitions one way: by key, by group, or whole
        suffix = f"__{len(self.pending)}"  # the partition's own views: the write plans every partition's query first
        for name, df in inputs.items():
            view = df if scope is None else scope.only_keys(spark, name, df, self.predicates.get(name, ()))
            view.createOrReplaceTempView(view_name(name, suffix))
        out = spark.sql(render_sql(table, key, self.catalog, suffix))
        _check_columns(table, key, out)
        replaced = states = None
        if groups is not None:  # the changed groups' rows from their new states, in the query's columns
            out, replaced, states = self.additive.rows(groups, out, suffix)
        elif scope is None:  # a total's rows from its states: its input read once for both
            out, states = self.additive.whole(key, out, suffix)
        spec = partition_values_of(table, key)
        out = out.select(*[c for c in out.columns if c not in spec], *[F.lit(v).alias(c) for c, v in spec.items()])
        if self.self_dependent:
            out = out.localCheckpoint(eager=True)
            self.states.written.setdefault(table.fqn, set()).add(key)  # the gate of its next partition finds it built
        self.pending.append(_Planned(key, verdict, out, inputs, read_from, versions, scope, groups, replaced, states))
        if len(self.pending) >= RANGED_WRITE_MAX_PARTITIONS:
            self.write()

    # --- the ranged write ---------------------------------------------------------------------------------------

    def write(self) -> None:
        """Write the pending partitions in one Delta commit, record each, and evaluate the table's checks on them."""
        if not self.pending:
            return
        result = self._commit()
        self.version = result.version
        for name in ("rows", "files_added", "files_removed", "bytes_added"):
            self.totals[name] += int(getattr(result, name))
        alone = PartitionWritten(rows=result.rows, files=result.files_added, bytes=result.bytes_added)
        for planned, figures in zip(self.pending, result.by_partition or [alone], strict=True):
            self._written(planned, figures, result.version)
        stated = {p.key: p.states for p in self.pending if p.states is not None}  # an additive table's: after its rows
        self.additive.write_states(list(stated.values()), list(stated), result.version)
        if self.table.checks:
            self.outcomes.extend(self._check(result.version, result.by_partition))
        self.pending.clear()
        if self.reads is not None:  # the next partitions read their inputs at the version of then
            self.reads.release()

    def _check(self, version: int, written: Sequence[PartitionWritten] = ()) -> list[Outcome]:
        """The table's checks on the pending partitions as written at ``version`` (``written``: each one's figures,
        in order, with its live files where the write read them). After a key-scoped or maintained write (a few keys'
        or groups' rows replaced), what the Delta log or a DataFusion count proves passed over the whole partition
        needs no Spark job; the rest is evaluated on Spark, which reads the partitions back."""
        table, pending = self.table, self.pending
        judged: dict[tuple[Check, str], Outcome] = {}
        if pending[0].kind != "whole":
            files = [w.live_files for w in written] if len(written) == len(pending) else [None] * len(pending)
            for p, live in zip(pending, files, strict=True):
                facts = PartitionFacts(self.catalog, table, self.store, p.key, version, p.read_from, p.versions, live)
                for check in table.checks:
                    outcome = judge(check, facts)
                    if outcome is not None:
                        judged[check, p.key] = outcome
        left = [c for c in table.checks if any((c, p.key) not in judged for p in pending)]
        if left:
            for outcome in check_written(table, pending, self.spark, self.store, version, left):
                judged.setdefault((outcome.check, outcome.partition), outcome)
        return [judged[c, p.key] for p in pending for c in table.checks]

    def _commit(self) -> WriteResult:
        """The pending partitions' one commit: one partition's keys of one column replaced by a ``replaceWhere``
        naming them, other key-scoped ones a MERGE of their keys, else an overwrite of exactly those partitions."""
        table, spark, store, pending = self.table, self.spark, self.store, self.pending
        specs = [partition_values_of(table, p.key) for p in pending]
        frames = [p.out for p in pending]
        scope = pending[0].scope
        where = scope.replaced_where() if scope is not None and len(pending) == 1 else {}
        if scope is not None and where:
            # one partition's keys of one column: deleted by them and appended, not merged
            return store.replace_rows_where(
                spark, table.key, frames[0], table.partition_by, specs[0], scope.key_columns[0], where
            )
        if scope is not None:  # every pending partition is key-scoped: one MERGE of their keys
            changed = [p.scope.changed(spark, spec) for p, spec in zip(pending, specs, strict=True) if p.scope]
            return store.replace_keys(
                spark,
                table.key,
                reduce(DataFrame.unionByName, frames),
                reduce(DataFrame.unionByName, changed),
                scope.key_columns,
                table.partition_by,
                specs,
                narrow=narrowed([p.scope for p in pending if p.scope]),
            )
        if pending[0].groups is not None:  # every pending partition is a maintained total: its changed groups
            replaced = [p.replaced for p in pending if p.replaced is not None]
            return self.additive.write_groups(frames, replaced, [p.groups for p in pending if p.groups])
        # a derived table records its changes from its first commit: a key-scoped rebuild below reads them
        rows = reduce(DataFrame.unionByName, frames)
        if self.bytes_read >= LAYOUT_MIN_BYTES:  # a few keys' rows in few files and pages, for key-scoped rebuilds
            rows = self.scoper.laid_out(rows, table.partition_by)
        properties = self.scoper.table_properties() if not store.exists(table.key) else None
        return store.overwrite(table.key, rows, table.partition_by, specs, configuration=properties)

    def _written(self, planned: _Planned, figures: PartitionWritten, at: int) -> None:
        table, log = self.table, self.context.log
        key, verdict, read_from, scope = planned.key, planned.verdict, planned.read_from, planned.scope
        groups = planned.groups
        self.states.written.setdefault(table.fqn, set()).add(key)
        lacking = degraded_description(verdict)
        if lacking:
            self.degraded[key] = lacking
        if verdict.state is not None:
            self.reached[key] = verdict.state
        self.written.append(
            {
                "partition": key,
                "rows": figures.rows,
                "files_added": figures.files,
                "delta_version": at,
                "upstream": {t: span(k) for t, k in read_from.items()},
                "read_versions": planned.versions,
                **({"keys_rebuilt": scope.keys.num_rows} if scope else {}),
                # a maintained total: the groups replaced (what changed for the next table down), the images read
                **({"keys_rebuilt": groups.changed, "changed_rows_read": groups.images} if groups else {}),
                # the inputs whose changed keys' rows came from their change feed, not a scan of their partitions
                **({"key_rows_from_feed": sorted(scope.rows)} if scope and scope.rows else {}),
                # ... and those whose changed keys their own key-scoped commits recorded: no change feed read
                **({"keys_from_commits": sorted(scope.recorded)} if scope and scope.recorded else {}),
                **({"degraded": lacking} if lacking else {}),
                **({"state": verdict.state} if verdict.state else {}),
            }
        )
        rebuilt = f", the rows of {scope.keys.num_rows} changed {'/'.join(scope.key_columns)}" if scope else ""
        if groups:
            rebuilt = f", {groups.changed} groups maintained from {groups.images} changed rows"
        log.info(
            f"{table.fqn} {key}: {figures.rows} rows{rebuilt}, {figures.files} files, "
            f"Delta version {at}, read {', '.join(f'{t} {span(k)}' for t, k in read_from.items())}"
        )
        if lacking:
            log.warning(f"{table.fqn} {key} is degraded: {lacking}; it is built again when they arrive")

    # --- the materialization ----------------------------------------------------------------------------------

    def result(self) -> MaterializeResult:
        """The run's one materialization of the partitions written, with each partition's figures."""
        context, table = self.context, self.table
        # a rebuild for late data: how many late changes each partition absorbed (the dependency center's count)
        late = {
            k: n
            for k, n in json.loads(context.run.tags.get(LATE_CHANGES_TAG, "{}")).items()
            if k in {w["partition"] for w in self.written}
        }
        return MaterializeResult(
            metadata={
                # first, where the UI's partition page shows them at the top; per partition, as a ranged run's
                # materializations share one metadata: the state store reads its own
                **({STATE: MetadataValue.json(self.reached)} if self.reached else {}),
                **({DEGRADED: MetadataValue.json(self.degraded)} if self.degraded else {}),
                **({READ_AFTER: MetadataValue.json(self.states.read_after)} if self.states.read_after else {}),
                **({"late_changes_absorbed": MetadataValue.json(late)} if late else {}),
                **self.totals,
                "partitions_written": len(self.written),
                "delta_version": self.version,
                "duration_s": round(time.monotonic() - self.started, 3),
                "table_uri": self.store.table_uri(table.key),
                "partitions": MetadataValue.json(self.written),
                **_column_lineage(context, self.catalog, table),
            }
        )


def _read_now(
    store: DeltaStore,
    spark: SparkSession,
    reader: str,
    upstream: Table,
    partitions: list[dict[str, str]] | None = None,
    predicates: Sequence[Predicate] = (),
) -> tuple[DataFrame, int, ReadStats]:
    """``upstream``'s rows (of ``partitions``, all without) at the version of now, and that version. One version for
    the build and for its checks, which evaluate the inputs again after the write: an ingestion merging late changes
    into these partitions meanwhile (the rest of a backlog) must not make them compare the partition with other rows;
    the late change re-reports the upstream, and the partition is built again. ``reader`` names the partition that
    reads, for the failure of a table Dagster has materialized but Delta lacks."""
    at = store.version(upstream.key)  # None: no table (one opening of the log answers both)
    if at is None:
        raise Failure(
            f"{reader}: the Delta table of {upstream.fqn} does not exist at {store.table_uri(upstream.key)} "
            "although Dagster has it materialized"
        )
    df, stats = store.read(spark, upstream.key, partitions=partitions, predicates=predicates, version=at)
    return df, at, stats


def _own_earlier(
    store: DeltaStore, spark: SparkSession, reader: str, table: Table, used: list[str], pending: list[_Planned]
) -> DataFrame:
    """A self-dependent table's partitions ``used``: those planned in this run (not written yet) from their computed
    rows, the others from Delta at the version of now."""
    planned = {p.key: p.out for p in pending}
    frames = [planned[k] for k in used if k in planned]
    written = [k for k in used if k not in planned]
    if written:
        frames.append(_read_now(store, spark, reader, table, [partition_values_of(table, k) for k in written])[0])
    return reduce(lambda a, b: a.unionByName(b), frames)


def _read_windows(
    catalog: Catalog, windows: OdsWindows, keys: list[str], spark: SparkSession, store: DeltaStore
) -> tuple[DataFrame, list[str]]:
    """The live rows of the ODS table whose partition time falls in the windows ``keys`` (consecutive, in time order):
    its hours' partitions holding them, pruned to the windows by the partition time."""
    source = catalog[windows.source]
    assert isinstance(source, OdsTable)
    if not keys:
        return _empty_like(spark, store, source), []
    pdef = BY_PERIOD[windows.period]
    start, end = pdef.time_window_for_partition_key(keys[0]).start, pdef.time_window_for_partition_key(keys[-1]).end
    specs: list[dict[str, str]] = []
    hour = start.replace(minute=0, second=0, microsecond=0)
    while hour < end:  # the hours' partitions holding the windows
        specs.append({"dt": hour.strftime("%Y-%m-%d"), "hh": hour.strftime("%H")})
        hour += timedelta(hours=1)
    if not store.exists(source.key):
        return _empty_like(spark, store, source), keys
    live = [] if source.changelog else [Predicate("_deleted", "=", False)]
    window = [Predicate(source.partition_time, ">=", start), Predicate(source.partition_time, "<", end)]
    at = store.version(source.key)
    df, _ = store.read(spark, source.key, partitions=specs, predicates=[*live, *window], version=at)
    return df, keys


def _column_lineage(context: AssetExecutionContext, catalog: Catalog, table: Table) -> dict[str, Any]:
    """The materialization's column lineage (Dagster's ``dagster/column_lineage``), the columns it could not follow
    named in the run's log. The partitions are written by then: a lineage that fails says so and the build stands."""
    try:
        lineage = WarehouseLineage(catalog).of(table.fqn)  # this table's, and what names its inputs' columns
    except Exception as exc:  # the SQL ran on Spark: a parser's failure here is no reason to fail the build
        context.log.warning(f"column lineage of {table.fqn} not computed: {exc}")
        return {"column_lineage_unresolved": f"not computed: {exc}"}
    for line in lineage.describe_unresolved():
        context.log.warning(f"column lineage: {line}")
    return column_lineage_metadata(lineage, catalog)


def _empty_like(
    spark: SparkSession,
    store: DeltaStore,
    upstream: Table,
    first_of_self: bool = False,
    external: ExternalResource | None = None,
) -> DataFrame:
    """No partition of ``upstream`` is needed: an empty frame of its shape (a self-dependency's first T-1, a
    dependency a partition's state does without)."""
    if upstream.is_external and external is not None:
        return external_source(external, upstream).read(spark, [])
    if store.exists(upstream.key):
        df, _ = store.read(spark, upstream.key, partitions=[])
        return df
    if first_of_self and upstream.columns:
        ddl = ", ".join(f"`{name}` {ctype}" for name, ctype in [*upstream.columns, *_partition_ddl(upstream)])
        return spark.createDataFrame([], ddl)
    raise Failure(f"{upstream.fqn} has no Delta table yet at {store.table_uri(upstream.key)}")


def _partition_ddl(table: Table) -> list[tuple[str, str]]:
    return [(c, "string") for c in table.partition_by if c not in dict(table.columns)]


def _check_columns(table: Table, key: str, out: DataFrame) -> None:
    """A table that declares its columns (a self-dependent one reads them back as T-1) must produce them."""
    if not table.columns:
        return
    produced = [(name, ctype) for name, ctype in out.dtypes if name not in table.partition_by]
    if produced != list(table.columns):
        raise Failure(
            f"{table.fqn} {key}: the SQL produces columns {produced}, but {table.path.name} declares "
            f"{list(table.columns)} (names, types and order must match)"
        )


# Above this many bytes of Parquet an ODS hour's row-local checks run on Spark; below, Arrow reads the hours' files
# in this process (delta-rs) and evaluates them in milliseconds. A Spark job costs 0.5-1 s however small the data,
# and the checks are on the path of every ODS handoff; 64 MiB of Parquet stays well within a run
# worker's memory.
ARROW_CHECKS_MAX_BYTES = 64 * 1024 * 1024


def check_ods_hours(
    table: Table,
    keys: Sequence[str],
    spark: SparkSession,
    store: DeltaStore,
    arrow_max_bytes: int = ARROW_CHECKS_MAX_BYTES,
) -> list[Outcome]:
    """The declared checks of ODS hours on their rows as merged (tombstones included): one pruned read of all the
    hours, and one grouped pass for all the row-local checks (:func:`evaluate_partitions`) — by Arrow when they are
    all row-local and the hours' files hold at most ``arrow_max_bytes``, else by one Spark job."""
    if not store.exists(table.key):
        raise Failure(f"{table.fqn} has no Delta table at {store.table_uri(table.key)}")
    specs = [partition_values_of(table, k) for k in keys]
    if all(c.row_local for c in table.checks):
        _, files = store.live_files(table.key, specs, deletions=False)  # its bytes: no deletion vector read
        if files.bytes_read <= arrow_max_bytes:
            rows, _ = store.read_rows(table.key, specs, version=files.version)
            hour = pc.binary_join_element_wise(rows["dt"], pc.binary_join_element_wise(rows["hh"], ":00", ""), "-")
            return evaluate_partitions(table, table.checks, keys, rows.append_column(PARTITION, hour))
    data, _ = store.read(spark, table.key, partitions=specs)
    data = data.withColumn(PARTITION, F.concat_ws("-", "dt", F.concat("hh", F.lit(":00")))).persist()
    try:
        return evaluate_partitions(table, table.checks, keys, data)
    finally:
        data.unpersist()
