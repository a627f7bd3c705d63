"""The one compiler from catalog to Dagster: assets, specs, checks, partition mappings, backfill policies.
It only compiles: loading it imports no PySpark (the code server, the daemon and every
sensor tick import it).

A derived table becomes an ``@asset`` with a single-run backfill policy whose body runs the table's partitions
through :func:`warehouse_assets.materialize.runner.run_table`, imported when a run executes it; an ODS table becomes an
``AssetSpec`` (written by the ingestion job, reported by the readiness sensor) with its declared checks, an
external table an ``AssetSpec`` its sensor reports. Whether a partition may run is the gate's
(:mod:`warehouse_assets.materialize.gate`): the run guard compiled here and the dependency center both ask it. No asset
carries a Dagster automation condition: the dependency center's engine (:mod:`warehouse_assets.center.engine`) starts
downstream runs, and a condition left on an asset would make Dagster add its own automation sensor.
"""

import hashlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetChecksDefinition,
    AssetDep,
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    AssetSpec,
    BackfillPolicy,
    MaterializeResult,
    MetadataValue,
    PartitionMapping,
    TimeWindowPartitionMapping,
    asset,
    multi_asset_check,
)

from resources.delta_lake import DeltaLakeResource
from resources.spark import SparkResource
from warehouse_assets.catalog import (
    BY_PERIOD,
    PERIOD_NOUN,
    Catalog,
    Dependency,
    DerivedTable,
    ExternalTable,
    OdsTable,
    OdsWindows,
    StaticTable,
    Table,
    partition_mapping,
    partition_window,
    partitions_def_of,
    periods,
)
from warehouse_assets.catalog.lineage_markdown import lineage_metadata
from warehouse_assets.instance.pools import compute_asset_tags
from warehouse_assets.materialize.buildable import BuildableSearch, FirstBuildable, first_buildable
from warehouse_assets.materialize.freshness import build_freshness_checks
from warehouse_assets.materialize.lineage_run import with_lineage_events
from warehouse_assets.materialize.quality import (
    check_specs,
    evaluation,
    failed_blocking_checks,
    latest_materialization,
    latest_materializations,
)
from warehouse_assets.materialize.replication import REPLICA_RESOURCE
from warehouse_assets.materialize.validity import taint_evaluation, tainted_in_instance, valid_evaluation, valid_spec

if TYPE_CHECKING:
    from warehouse_assets.catalog.lineage import WarehouseLineage


def code_version(table: DerivedTable | StaticTable) -> str:
    return hashlib.sha1((table.sql or "").encode()).hexdigest()[:12]


def backfill_policy(table: Table) -> BackfillPolicy:
    """How a range of the table's partitions is split into runs: one run builds them in time order (a
    self-dependent table's chain included), for backfills and the dependency center alike."""
    return BackfillPolicy.single_run()


def max_partitions_per_run(table: Table) -> int | None:
    """The run-size policy the dependency center plans runs by: the backfill policy's limit."""
    return backfill_policy(table).max_partitions_per_run


def first_partition_note(catalog: Catalog, table: DerivedTable, since: FirstBuildable | None = None) -> str:
    """What the asset's description adds when the table's partitions do not all begin at the warehouse start: the
    first partition that can be built, and why the earlier ones never can (their window reaches before the start)
    or why there is none before it (a week or a month is a partition only when all of its days can exist). Those
    tables show missing partitions, or none, in the UI for good reason; this says it where the user looks."""
    pdef = BY_PERIOD[table.period]
    since = since or first_buildable(catalog, table)
    start = periods().start
    noun = PERIOD_NOUN[table.period]
    if since.partition is None:
        return f"\n\n**Cannot be built yet:** {since.reason}."
    end = partition_window(table, since.partition).end
    if since.reason:
        return (
            f"\n\n**Built from {since.partition} on** (once that {noun} ends, {end:%Y-%m-%d %H:%M}): {since.reason}, "
            f"so its partitions before {since.partition} can never be built and stay missing."
        )
    if pdef.start.date() > start:
        return (
            f"\n\n**First partition {since.partition}**, built once that {noun} ends ({end:%Y-%m-%d %H:%M}): a {noun} "
            f"is a partition only when all of its days can exist, and the warehouse starts {start:%Y-%m-%d}."
        )
    return ""


def dagster_mapping(catalog: Catalog, table: DerivedTable, dep: Dependency) -> PartitionMapping | None:
    """The partition mapping Dagster draws and backfills by for one edge. An edge into or out of a table with regions
    gets Dagster's own inference between its dates × regions and a period (None): by the business date, exact for a day
    reading every region's day of its date, only approximate for a region's day reading hours, whose window is its own
    zone's day. The exact partitions of every edge are the catalog's, which the gate and the dependency center read."""
    upstream = catalog[dep.table]
    if table.is_regional or (isinstance(upstream, DerivedTable) and upstream.is_regional):
        return None
    return partition_mapping(table, dep, upstream.period)


def build_asset(
    catalog: Catalog,
    table: DerivedTable,
    buildable: BuildableSearch | None = None,
    lineage: "WarehouseLineage | None" = None,
) -> AssetsDefinition:
    """``buildable``: the first buildable partitions found so far, shared by the tables of one compile (each table's
    is found from its upstream tables': without sharing, a deep graph repeats its upstream chains table by table).
    ``lineage``: the tables' column lineage, shown on the asset's page as Markdown (none: not shown)."""
    since = first_buildable(catalog, table, buildable)
    deps = [
        AssetDep(AssetKey(catalog[dep.table].key), partition_mapping=dagster_mapping(catalog, table, dep))
        for dep in table.deps
    ]
    # a static table is unpartitioned: Dagster maps every partition to the whole of it
    deps += [AssetDep(AssetKey(catalog[ref.table].key)) for ref in table.references]
    reads_external = any(catalog[dep.table].is_external for dep in table.deps)
    # a table declared at another site builds on that site's lake, where its replicas are
    lake = {REPLICA_RESOURCE} if table.site else {"lake"}

    decorate = asset(
        key=AssetKey(table.key),
        group_name=table.group,
        partitions_def=partitions_def_of(table),
        deps=deps,
        description=table.description + first_partition_note(catalog, table, since),
        owners=[f"team:{table.owner}"],
        kinds={"spark", "delta"},
        tags=compute_asset_tags(dict(table.compute)),  # the compute pool labels its runs require, from the UI too
        code_version=code_version(table),
        check_specs=[*check_specs(table), valid_spec(table)],
        backfill_policy=backfill_policy(table),
        # one body for every table: the resources are looked up by key, the external one only where read
        required_resource_keys={"spark", *lake, "external"} if reads_external else {"spark", *lake},
        metadata={
            "period": table.period,
            "kind": table.kind,
            "primary_key": ", ".join(table.primary_key),
            "source_file": str(table.path.relative_to(table.path.parents[2])),
            "sql": MetadataValue.md(f"```sql\n{table.sql}\n```"),
            "first_buildable_partition": since.partition or "none within reach",
            "late_data": table.late_data.describe(),  # when late upstream data rebuilds a built partition
            **(lineage_metadata(lineage.of(table.fqn)) if lineage is not None else {}),
        },
    )

    @decorate
    def _build(context: AssetExecutionContext) -> Iterator[MaterializeResult | Any]:
        from warehouse_assets.materialize.runner import run_table  # the run imports PySpark; compiling does not

        resources = context.resources
        external = resources.external if reads_external else None
        store = getattr(resources, REPLICA_RESOURCE).store(table.site) if table.site else resources.lake.store()
        body = run_table(context, catalog, table, resources.spark.session(), store, external)
        yield from with_lineage_events(context, catalog, table, lineage, body)

    return _build


def build_static_asset(table: StaticTable) -> AssetsDefinition:
    """A static table: one unpartitioned asset whose run writes the rows its SQL spells out, the whole table at
    once. Its code version is its SQL's: the ``static_tables`` sensor builds it again when the SQL changes."""

    @asset(
        key=AssetKey(table.key),
        group_name=table.group,
        description=table.description,
        owners=[f"team:{table.owner}"],
        kinds={"spark", "delta"},
        code_version=code_version(table),
        check_specs=[valid_spec(table)],  # a taint marks it; each build is valid again
        required_resource_keys={"spark", "lake"},
        metadata={
            "kind": table.kind,
            "primary_key": ", ".join(table.primary_key),
            "columns": ", ".join(f"{c} {t}" for c, t in table.columns),
            "source_file": str(table.path.relative_to(table.path.parents[2])),
            "sql": MetadataValue.md(f"```sql\n{table.sql}\n```"),
        },
    )
    def _build(context: AssetExecutionContext) -> MaterializeResult:
        from warehouse_assets.materialize.runner import run_static  # the run imports PySpark; compiling does not

        return run_static(context, table, context.resources.spark.session(), context.resources.lake.store())

    return _build


def build_ods_spec(table: OdsTable) -> AssetSpec:
    """ODS tables are written by the ingestion job, which reports their partitions (the readiness sensor as the
    fallback)."""
    return AssetSpec(
        key=AssetKey(table.key),
        group_name=table.group,
        partitions_def=BY_PERIOD[table.period],
        description=table.description,
        owners=[f"team:{table.owner}"],
        kinds={"delta"},
        metadata={
            "source": f"{table.source_database}.{table.source_tables}",
            "kind": table.kind,
            "primary_key": ", ".join(table.primary_key),
            "partition_time": table.partition_time or "",
            "source_file": str(table.path.relative_to(table.path.parents[2])),
        },
    )


def build_windows_spec(catalog: Catalog, table: OdsWindows) -> AssetSpec:
    """An ODS table's completeness windows of a mini-batch period, reported with the ODS table's hours. Its lineage
    edge to the ODS table maps each window to the hour holding it (Dagster's time-window mapping, finer to coarser):
    the window's rows are in that hour's partition."""
    source = catalog[table.source]
    return AssetSpec(
        key=AssetKey(table.key),
        group_name=table.group,
        partitions_def=BY_PERIOD[table.period],
        deps=[AssetDep(AssetKey(source.key), partition_mapping=TimeWindowPartitionMapping())],
        description=table.description,
        owners=[f"team:{source.owner}"],
        metadata={
            "kind": "completeness windows",
            "source": table.source,
            "reported_by": "ods_ingest (the run that completes them), else sensor ods_readiness",
        },
    )


def build_external_spec(table: ExternalTable) -> AssetSpec:
    """An external table: produced outside the platform, its partitions reported by its sensor."""
    return AssetSpec(
        key=AssetKey(table.key),
        group_name=table.group,
        partitions_def=BY_PERIOD[table.period],
        description=table.description,
        owners=[f"team:{table.owner}"],
        kinds={"csv"} if table.external.format == "csv_files" else {"delta"},
        metadata={
            "producer": table.external.producer,
            "format": table.external.format,
            "location": table.external.location,
            "columns": ", ".join(f"{c} {t}" for c, t in table.columns),
            "reported_by": f"sensor ext_{table.name}",
            "source_file": str(table.path.relative_to(table.path.parents[2])),
        },
    )


def build_ods_checks(table: Table) -> AssetChecksDefinition:
    """The ODS table's declared checks, executable by hand from the UI on one hour or a range of hours.

    They carry no automation condition: the ``ods_quality_checks`` sensor checks every newly reported hour
    of every ODS table in one run (warehouse_assets/materialize/hour_checks.py) instead of one Dagster run per
    table and hour.
    """

    @multi_asset_check(name=f"{table.layer}_{table.name}_checks", specs=check_specs(table), can_subset=True)
    def _checks(
        context: AssetCheckExecutionContext, spark: SparkResource, lake: DeltaLakeResource
    ) -> Iterator[AssetCheckEvaluation]:
        from warehouse_assets.materialize.runner import check_ods_hours  # the run imports PySpark; compiling does not

        keys = list(context.partition_keys)  # one hour or a range selected in the UI
        selected = {k.name for k in context.selected_asset_check_keys}
        # the materializations being checked, looked up before the rows are read
        checked = latest_materializations(context.instance, table, keys)
        for outcome in check_ods_hours(table, keys, spark.session(), lake.store()):
            if outcome.check.name in selected:
                # an evaluation naming its hour: in a ranged run Dagster would record partition None
                yield evaluation(context.instance, table, outcome, checked[outcome.partition])

    return _checks


def build_validity_check(table: Table) -> AssetChecksDefinition:
    """The ``valid`` check of a table the warehouse does not build (ODS, external, a replica), executable from the
    UI: it judges the selected partitions again as of now, from the instance. A derived table's ``valid`` check is one
    of its asset's checks, judged by each build."""

    @multi_asset_check(name=f"{table.layer}_{table.name}_validity", specs=[valid_spec(table)], can_subset=True)
    def _validity(context: AssetCheckExecutionContext) -> Iterator[AssetCheckEvaluation]:
        keys = list(context.partition_keys)
        taints = tainted_in_instance(context.instance, table, keys)
        failed = failed_blocking_checks(context.instance, table, keys)
        for key in keys:
            record = latest_materialization(context.instance, table, key)
            if record is None:
                context.log.info(f"{table.fqn} {key}: never materialized, nothing to judge")
            elif key in taints:  # still tainted: the same verdict on the same materialization
                target = (record.storage_id, record.run_id, record.timestamp)
                yield taint_evaluation(table, key, taints[key], target)
            elif key in failed:
                context.log.info(f"{table.fqn} {key}: blocking check(s) failed ({', '.join(failed[key])})")
            else:
                yield valid_evaluation(table, key, record, "not tainted, no blocking check failed")

    return _validity


def build_assets(catalog: Catalog, lineage: "WarehouseLineage | None" = None) -> list[AssetsDefinition | AssetSpec]:
    built: list[AssetsDefinition | AssetSpec] = [build_external_spec(t) for t in catalog.externals()]
    built += [build_ods_spec(t) for t in catalog.ods()]
    built += [build_windows_spec(catalog, t) for t in catalog.windows()]
    built += [build_static_asset(t) for t in catalog.statics()]
    buildable = BuildableSearch()
    built += [build_asset(catalog, t, buildable, lineage) for t in catalog.derived()]
    return built


def build_checks(catalog: Catalog) -> list[AssetChecksDefinition]:
    """The ODS tables' data-quality checks, the validity of the tables the warehouse does not build, and every
    table's freshness SLA check."""
    sources = [*catalog.ods(), *catalog.externals(), *catalog.replicas()]
    return (
        [build_ods_checks(t) for t in catalog.ods() if t.checks]
        + [build_validity_check(t) for t in sources]
        + build_freshness_checks(catalog)
    )


def topological(catalog: Catalog) -> list[Table]:
    """Derived tables in dependency order (self-dependencies ignored)."""
    order: list[Table] = []
    seen: set[str] = set()

    def visit(t: Table) -> None:
        if t.fqn in seen:
            return
        seen.add(t.fqn)
        for dep in t.deps:
            if dep.table != t.fqn and not catalog[dep.table].is_source:
                visit(catalog[dep.table])
        order.append(t)

    for t in sorted(catalog.derived(), key=lambda t: t.fqn):
        visit(t)
    return order
