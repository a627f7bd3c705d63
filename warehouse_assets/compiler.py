"""The one compiler from catalog to Dagster: assets, partition mappings, backfill policies, automation.

A derived table becomes an ``@asset`` whose body, for each of its partitions in time order:

1. maps the partition to the exact upstream partitions (Dagster's own partition mappings) and refuses to
   run if one of them does not exist, was never materialized, or failed a blocking data-quality check
   (unless the dependency says ``ignore_dq``) — Dagster drops nonexistent partitions silently (design
   §6.2), so the guard lives here;
2. reads those upstream partitions from Delta (pruned) — or, for an external table, from its producer's
   files or Delta table through :class:`resources.external.ExternalSource` — and registers them under the
   names its SQL uses;
3. runs the SQL with Spark and overwrites exactly its own partition;
4. evaluates the table's declared checks on the partition it wrote (:mod:`warehouse_assets.quality`).

The materialization of every partition is reported first, then one check evaluation per check and
partition, targeting that materialization; a failed blocking check fails the step (Dagster's in-run gate)
and the automation condition holds back the partition's downstream in later runs.
"""

import hashlib
import time
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

import sqlglot
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
    DagsterInstance,
    Failure,
    MaterializeResult,
    MetadataValue,
    Output,
    TimeWindowPartitionsDefinition,
    asset,
    multi_asset_check,
)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from sqlglot import exp

from resources.delta_lake import DeltaLakeResource, DeltaStore, Predicate
from resources.external import ExternalResource
from resources.spark import SparkResource
from warehouse_assets.automation import ready_when_upstream_complete
from warehouse_assets.catalog import Catalog, Dependency, Table
from warehouse_assets.external import external_source
from warehouse_assets.freshness import build_freshness_checks
from warehouse_assets.partitions import BY_PERIOD, UpstreamPartitions, partition_mapping, upstream_partitions
from warehouse_assets.quality import (
    PARTITION,
    Outcome,
    anomaly_history_keys,
    blocking_checks_passed,
    check_specs,
    evaluate,
    evaluate_partitions,
    evaluation,
    failed_blocking_checks,
    latest_materialization,
)


def partition_spec(period: str, partition_key: str) -> dict[str, str]:
    """The Delta partition values of a Dagster partition key (local time of the window start)."""
    start = BY_PERIOD[period].time_window_for_partition_key(partition_key).start
    if period == "hourly":
        return {"dt": start.strftime("%Y-%m-%d"), "hh": start.strftime("%H")}
    return {"dt": start.strftime("%Y-%m-%d")}


def _start(pdef: TimeWindowPartitionsDefinition, key: str) -> datetime:
    return pdef.time_window_for_partition_key(key).start


def view_name(fqn: str) -> str:
    return "__in_" + fqn.replace(".", "__")


def render_sql(table: Table, partition_key: str) -> str:
    """The table's SQL with partition variables substituted and inputs renamed to their views."""
    assert table.sql is not None
    window = BY_PERIOD[table.period].time_window_for_partition_key(partition_key)
    variables = {
        "ds": window.start.strftime("%Y-%m-%d"),
        "hour": window.start.strftime("%H"),
        "start": window.start.strftime("%Y-%m-%d %H:%M:%S"),
        "end": window.end.strftime("%Y-%m-%d %H:%M:%S"),
        "partition_key": partition_key,
    }
    sql = table.sql
    for name, value in variables.items():
        sql = sql.replace("${" + name + "}", value)
    tree = sqlglot.parse_one(sql, read="spark")
    deps = {dep.table for dep in table.deps}

    def swap(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Table) and f"{node.db}.{node.name}" in deps:
            alias = node.alias or node.name
            return exp.Table(
                this=exp.to_identifier(view_name(f"{node.db}.{node.name}")),
                alias=exp.TableAlias(this=exp.to_identifier(alias, quoted=True)),
            )
        return node

    return tree.transform(swap).sql(dialect="spark")


def run_table(
    context: AssetExecutionContext,
    catalog: Catalog,
    table: Table,
    spark: SparkSession,
    store: DeltaStore,
    external: ExternalResource | None = None,
) -> Iterator[MaterializeResult | Any]:
    """Build every partition of the run in time order (one Delta commit each), then report the
    materializations and the check results of every partition.

    External inputs are read from their producers (``external`` says where) — only the partitions their
    sensors reported, which the guard checks like any other input.
    """
    outcomes: list[Outcome] = []
    result = _build_partitions(context, catalog, table, spark, store, outcomes, external)
    yield result
    for outcome in outcomes:
        event = evaluation(context.instance, table, outcome)
        (context.log.info if outcome.passed else context.log.warning)(
            f"{table.fqn} {outcome.partition} check {outcome.check.name}: "
            f"{'passed' if outcome.passed else 'FAILED'} — {outcome.description}"
        )
        yield event
    for output_name in context.assets_def.check_specs_by_output_name:
        yield Output(None, output_name=output_name)


def _build_partitions(
    context: AssetExecutionContext,
    catalog: Catalog,
    table: Table,
    spark: SparkSession,
    store: DeltaStore,
    outcomes: list[Outcome],
    external: ExternalResource | None,
) -> MaterializeResult:
    pdef = BY_PERIOD[table.period]
    keys = sorted(context.partition_keys, key=lambda k: _start(pdef, k))
    materialized = {
        dep.table: set(context.instance.get_materialized_partitions(AssetKey(catalog[dep.table].key)))
        for dep in table.deps
    }
    written: list[dict[str, Any]] = []
    totals = {"rows": 0, "files_added": 0, "files_removed": 0, "bytes_added": 0, "files_read": 0, "files_skipped": 0}
    started = time.monotonic()
    version = None
    for key in keys:
        inputs: dict[str, DataFrame] = {}
        read_from: dict[str, list[str]] = {}
        for dep in table.deps:
            up = upstream_partitions(catalog, table, dep, key)
            present = materialized[dep.table] | ({w["partition"] for w in written} if dep.table == table.fqn else set())
            _guard(table, key, dep, up, present, context.instance, catalog)
            upstream = catalog[dep.table]
            specs = [partition_spec(upstream.period, k) for k in up.keys]
            if upstream.is_external:
                if external is None:
                    raise Failure(f"{table.fqn} reads the external {dep.table} but has no external resource")
                df = external_source(external, upstream).read(spark, [s["dt"] for s in specs])
            elif specs and store.exists(upstream.key):
                live = [Predicate("_deleted", "=", False)] if upstream.is_ods else []  # skip CDC tombstones
                df, stats = store.read(spark, upstream.key, partitions=specs, predicates=live)
                totals["files_read"] += stats.files_read
                totals["files_skipped"] += stats.files_in_table - stats.files_read
            elif specs:
                raise Failure(
                    f"{table.fqn} {key}: the Delta table of {dep.table} does not exist at "
                    f"{store.table_uri(upstream.key)} although Dagster has it materialized"
                )
            else:
                df = _empty_like(spark, store, upstream, first_of_self=dep.table == table.fqn)
            inputs[dep.table] = df
            read_from[dep.table] = up.keys
        for name, df in inputs.items():
            df.createOrReplaceTempView(view_name(name))
        out = spark.sql(render_sql(table, key))
        _check_columns(table, key, out)
        spec = partition_spec(table.period, key)
        out = out.select(*[c for c in out.columns if c not in spec], *[F.lit(v).alias(c) for c, v in spec.items()])
        result = store.overwrite(table.key, out, table.partition_by, [spec], description=table.description)
        version = result.version
        for name in ("rows", "files_added", "files_removed", "bytes_added"):
            totals[name] += int(getattr(result, name))
        written.append(
            {
                "partition": key,
                "rows": result.rows,
                "files_added": result.files_added,
                "delta_version": result.version,
                "upstream": {t: _span(k) for t, k in read_from.items()},
            }
        )
        context.log.info(
            f"{table.fqn} {key}: {result.rows} rows, +{result.files_added}/-{result.files_removed} files, "
            f"Delta version {result.version}, read {', '.join(f'{t} {_span(k)}' for t, k in read_from.items())}"
        )
        if table.checks:
            outcomes.extend(_check_partition(table, key, spark, store, inputs))
    return MaterializeResult(
        metadata={
            **totals,
            "partitions_written": len(written),
            "delta_version": version,
            "duration_s": round(time.monotonic() - started, 3),
            "table_uri": store.table_uri(table.key),
            "partitions": MetadataValue.json(written),
        }
    )


def _check_partition(
    table: Table, key: str, spark: SparkSession, store: DeltaStore, inputs: dict[str, DataFrame]
) -> list[Outcome]:
    """Evaluate the table's checks on the partition as written (read back from Delta)."""
    data, _ = store.read(spark, table.key, partitions=[partition_spec(table.period, key)])
    data = data.persist()
    try:
        out = []
        for check in table.checks:
            history = None
            if check.kind == "anomaly":
                keys = anomaly_history_keys(table, check, key)
                if keys:
                    history, _ = store.read(
                        spark, table.key, partitions=[partition_spec(table.period, k) for k in keys]
                    )
            out.append(evaluate(table, check, key, data, inputs, history))
        return out
    finally:
        data.unpersist()


def _span(keys: Sequence[str]) -> str:
    if not keys:
        return "(none)"
    return keys[0] if len(keys) == 1 else f"{keys[0]} .. {keys[-1]} ({len(keys)})"


def _guard(
    table: Table,
    key: str,
    dep: Dependency,
    up: UpstreamPartitions,
    present: set[str],
    instance: DagsterInstance | None = None,
    catalog: Catalog | None = None,
) -> None:
    """Refuse to compute on an incomplete window (a self-dependency before the first partition is fine) or
    on upstream partitions whose blocking checks failed, unless the dependency says ``ignore_dq``."""
    if up.nonexistent:
        raise Failure(
            f"{table.fqn} {key} needs {len(up.nonexistent)} partition(s) of {dep.table} that do not exist "
            f"(in the future or before its first partition): {_names(up.nonexistent)}"
        )
    missing = [k for k in up.keys if k not in present]
    if missing:
        raise Failure(
            f"{table.fqn} {key} waits for {len(missing)} partition(s) of {dep.table} that are not "
            f"materialized: {_names(missing)}"
        )
    if instance is not None and catalog is not None and not dep.ignore_dq and dep.table != table.fqn:
        failed = failed_blocking_checks(instance, catalog[dep.table], up.keys)
        if failed:
            first, names = next(iter(failed.items()))
            raise Failure(
                f"{table.fqn} {key} refuses to run: {len(failed)} partition(s) of {dep.table} failed a blocking "
                f"data-quality check ({_span(list(failed))}; {first}: {', '.join(names)}). Fix and re-run "
                f"{dep.table}, or declare `ignore_dq: true` on the dependency to proceed anyway."
            )


def _names(keys: Sequence[str], limit: int = 12) -> str:
    """Every key when there are few, else the first ones and the last."""
    if len(keys) <= limit:
        return ", ".join(keys)
    return ", ".join(keys[: limit - 2]) + f", … ({len(keys) - limit + 1} more), {keys[-1]}"


def _empty_like(spark: SparkSession, store: DeltaStore, upstream: Table, first_of_self: bool = False) -> DataFrame:
    """No partition of ``upstream`` is needed: an empty frame of its shape (a self-dependency's first T-1)."""
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


def _code_version(table: Table) -> str:
    return hashlib.sha1((table.sql or "").encode()).hexdigest()[:12]


def build_asset(catalog: Catalog, table: Table) -> AssetsDefinition:
    deps = [
        AssetDep(AssetKey(dep.key), partition_mapping=partition_mapping(table, dep, catalog[dep.table].period))
        for dep in table.deps
    ]
    reads_external = any(catalog[dep.table].is_external for dep in table.deps)

    decorate = asset(
        key=AssetKey(table.key),
        group_name=table.layer,
        partitions_def=BY_PERIOD[table.period],
        deps=deps,
        description=table.description,
        owners=[f"team:{table.owner}"],
        kinds={"spark", "delta"},
        code_version=_code_version(table),
        automation_condition=(ready_when_upstream_complete() & blocking_checks_passed(table)).with_label(
            "all upstream partitions ready and valid"
        ),
        check_specs=check_specs(table),
        backfill_policy=BackfillPolicy.single_run(),
        metadata={
            "period": table.period,
            "primary_key": ", ".join(table.primary_key),
            "source_file": str(table.path.relative_to(table.path.parents[2])),
            "sql": MetadataValue.md(f"```sql\n{table.sql}\n```"),
        },
    )

    def _build(
        context: AssetExecutionContext, spark: SparkResource, lake: DeltaLakeResource
    ) -> Iterator[MaterializeResult | Any]:
        yield from run_table(context, catalog, table, spark.session(), lake.store())

    def _build_with_external(
        context: AssetExecutionContext, spark: SparkResource, lake: DeltaLakeResource, external: ExternalResource
    ) -> Iterator[MaterializeResult | Any]:
        yield from run_table(context, catalog, table, spark.session(), lake.store(), external)

    return decorate(_build_with_external if reads_external else _build)


def build_ods_spec(table: Table) -> AssetSpec:
    """ODS tables are written by the ingestion job; the readiness sensor reports their partitions."""
    return AssetSpec(
        key=AssetKey(table.key),
        group_name=table.layer,
        partitions_def=BY_PERIOD[table.period],
        description=table.description,
        owners=[f"team:{table.owner}"],
        kinds={"delta"},
        metadata={
            "source": f"{table.source_database}.{table.source_tables}",
            "primary_key": ", ".join(table.primary_key),
            "partition_time": table.partition_time or "",
            "source_file": str(table.path.relative_to(table.path.parents[2])),
        },
    )


def build_external_spec(table: Table) -> AssetSpec:
    """An external table: produced outside the platform, its partitions reported by its sensor."""
    assert table.external is not None
    return AssetSpec(
        key=AssetKey(table.key),
        group_name=table.layer,
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


def check_ods_hours(table: Table, keys: Sequence[str], spark: SparkSession, store: DeltaStore) -> list[Outcome]:
    """The declared checks of ODS hours on their rows as merged (tombstones included): one pruned read of
    all the hours, and one grouped pass per check (:func:`warehouse_assets.quality.evaluate_partitions`)."""
    if not store.exists(table.key):
        raise Failure(f"{table.fqn} has no Delta table at {store.table_uri(table.key)}")
    data, _ = store.read(spark, table.key, partitions=[partition_spec(table.period, k) for k in keys])
    data = data.withColumn(PARTITION, F.concat_ws("-", "dt", F.concat("hh", F.lit(":00")))).persist()
    try:
        return [o for check in table.checks for o in evaluate_partitions(table, check, keys, data)]
    finally:
        data.unpersist()


def build_ods_checks(table: Table) -> AssetChecksDefinition:
    """The ODS table's declared checks, executable by hand from the UI on one hour or a range of hours.

    They carry no automation condition: the ``ods_quality_checks`` sensor checks every newly reported hour
    of every ODS table in one run (sensors/ods_checks.py) instead of one Dagster run per table and hour.
    """

    @multi_asset_check(name=f"{table.layer}_{table.name}_checks", specs=check_specs(table), can_subset=True)
    def _checks(
        context: AssetCheckExecutionContext, spark: SparkResource, lake: DeltaLakeResource
    ) -> Iterator[AssetCheckEvaluation]:
        keys = list(context.partition_keys)  # one hour or a range selected in the UI
        selected = {k.name for k in context.selected_asset_check_keys}
        # the materializations being checked, looked up before the rows are read
        checked = {k: latest_materialization(context.instance, table, k) for k in keys}
        for outcome in check_ods_hours(table, keys, spark.session(), lake.store()):
            if outcome.check.name in selected:
                # an evaluation naming its hour: in a ranged run Dagster would record partition None (§6.23)
                yield evaluation(context.instance, table, outcome, checked[outcome.partition])

    return _checks


def build_assets(catalog: Catalog) -> list[AssetsDefinition | AssetSpec]:
    built: list[AssetsDefinition | AssetSpec] = [build_external_spec(t) for t in catalog.externals()]
    built += [build_ods_spec(t) for t in catalog.ods()]
    built += [build_asset(catalog, t) for t in catalog.derived()]
    return built


def build_checks(catalog: Catalog) -> list[AssetChecksDefinition]:
    """The ODS tables' data-quality checks and every table's freshness SLA check."""
    return [build_ods_checks(t) for t in catalog.ods() if t.checks] + build_freshness_checks(catalog)


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


def backfill_partitions(catalog: Catalog, start: datetime, end: datetime) -> dict[str, list[str]]:
    """For a backfill of the whole graph over [start, end): each derived table's partitions that lie wholly
    in the range and whose every upstream partition can exist (D7 retention starts 7 days after the
    warehouse, a 30-day window 29 days after). Launched per asset, as the UI's ``partitionsByAssets`` does."""
    plan: dict[str, list[str]] = {}
    for table in catalog.derived():
        pdef = BY_PERIOD[table.period]
        keys = [
            k
            for k in pdef.get_partition_keys(current_time=end)
            if pdef.time_window_for_partition_key(k).start >= start
            and not any(upstream_partitions(catalog, table, dep, k, current_time=end).nonexistent for dep in table.deps)
        ]
        if keys:
            plan[table.fqn] = keys
    return plan
