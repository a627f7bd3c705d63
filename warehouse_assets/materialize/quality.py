"""Data-quality checks per partition, declared beside each table (``checks:``) and compiled to Dagster.

Every declared check becomes one per-partition asset check (``AssetCheckSpec(partitions_def=...)``),
blocking unless the catalog says ``blocking: false``. A derived table evaluates its checks in the same step,
on the partition it just wrote (read back from Delta) and on the upstream partitions it read; an ODS table's
checks run in the ingestion run that reports its hours (or, as the fallback, in an ``ods_quality_checks`` run).
Results carry the numbers behind them.

Across runs the dependency center (:mod:`warehouse_assets.center.resolver`) starts a partition only when every mapped
upstream partition's blocking checks passed on its latest materialization — except for dependencies declared
``ignore_dq: true``. The run guard (:mod:`warehouse_assets.materialize.gate`) refuses a failed one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetCheckSpec,
    AssetKey,
    AssetMaterialization,
    AssetRecordsFilter,
    DagsterInstance,
)

from warehouse_assets.catalog import Table, partitions_def_of
from warehouse_assets.catalog.checks import PARTITION as PARTITION  # re-exported: the compiler's grouped ODS reads
from warehouse_assets.catalog.checks import Check, Outcome, evaluate_grouped

# PySpark is imported inside the functions that evaluate checks: the gates below (read by `warehouse why`) need
# only the Dagster instance.
if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame


def check_specs(table: Table) -> list[AssetCheckSpec]:
    return [
        AssetCheckSpec(
            check.name,
            asset=AssetKey(table.key),
            description=check.describe(),
            blocking=check.blocking,
            partitions_def=partitions_def_of(table),
            metadata={"kind": check.kind, "declared_in": table.path.name},
        )
        for check in table.checks
    ]


# --- evaluation on Spark: each kind evaluates itself (warehouse_assets.catalog.checks) ------------------------------


def evaluate(
    table: Table,
    check: Check,
    partition: str,
    data: DataFrame,
    inputs: Mapping[str, DataFrame],
    history: DataFrame | None = None,
) -> Outcome:
    """Evaluate ``check`` on one partition's rows (``data``); ``inputs`` are the upstream partitions it read
    (live rows), ``history`` the table's previous partitions for an anomaly check."""
    return check.evaluate(table, partition, data, inputs, history)


def evaluate_partitions(
    table: Table, checks: Sequence[Check], keys: Sequence[str], data: DataFrame | pa.Table
) -> list[Outcome]:
    """Evaluate ``checks`` on every partition in ``keys`` at once; ``data`` holds their rows with the
    partition key in column ``PARTITION``. The row-local kinds (unique, not_null, range) share one grouped Spark job for
    all partitions (plus one to name duplicated keys where there are some), or one Arrow pass when ``data`` is an
    Arrow table; the others are evaluated partition by partition (without upstream inputs)."""
    return evaluate_grouped(table, checks, keys, data)


def anomaly_history_keys(table: Table, check: Check, partition: str) -> list[str]:
    """The partition keys before ``partition`` that ``check`` compares with (an anomaly's trailing window)."""
    return check.history_keys(table, partition)


def latest_materialization(instance: DagsterInstance, table: Table, partition: str) -> Any:
    """The partition's latest materialization record, or None (a static table's: its asset's latest)."""
    partitions = None if table.is_static else [partition]
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey(table.key), asset_partitions=partitions), limit=1
    ).records
    return records[0] if records else None


def latest_materializations(instance: DagsterInstance, table: Table, partitions: Sequence[str]) -> dict[str, Any]:
    """Each partition's latest materialization record (None where there is none), in two queries whatever the
    number of partitions: an ingestion run reporting a month of hours would otherwise pay one query per hour."""
    from dagster import DagsterEventType

    key = AssetKey(table.key)
    latest = instance.event_log_storage.get_latest_storage_id_by_partition(
        key, DagsterEventType.ASSET_MATERIALIZATION, set(partitions)
    )
    found: dict[str, Any] = dict.fromkeys(partitions)
    if latest:
        ids = sorted(latest.values())
        records = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=key, storage_ids=ids), limit=len(ids)
        ).records
        found.update({r.partition_key: r for r in records if r.partition_key in found})
    return found


def evaluation(
    instance: DagsterInstance, table: Table, outcome: Outcome, materialization: Any = None
) -> AssetCheckEvaluation:
    """The Dagster event of an outcome, targeting the partition's latest materialization (so the result is
    current for the automation and the UI) — or ``materialization``, the record looked up before the rows
    were read, so that a newer report arriving meanwhile is not marked as checked."""
    from dagster._core.definitions.asset_checks.asset_check_evaluation import (
        AssetCheckEvaluationTargetMaterializationData,
    )

    record = materialization or latest_materialization(instance, table, outcome.partition)
    target = (
        AssetCheckEvaluationTargetMaterializationData(
            storage_id=record.storage_id, run_id=record.run_id, timestamp=record.timestamp
        )
        if record
        else None
    )
    return AssetCheckEvaluation(
        asset_key=AssetKey(table.key),
        check_name=outcome.check.name,
        passed=outcome.passed,
        metadata={**outcome.metadata, "partition": outcome.partition, "result": outcome.description},
        target_materialization_data=target,
        partition=outcome.partition,
        blocking=outcome.check.blocking,
        description=outcome.description,
    )


def report_valid(instance: DagsterInstance, table: Table, partition: str, reason: str) -> None:
    """Report ``partition`` of ``table`` as there and valid outside any run: a materialization, then a passed
    verdict of each blocking check on it. For data that was loaded by other means — a lake seeded by a test
    or a bench — so that the gates downstream open as they would after a checked run."""
    instance.report_runless_asset_event(AssetMaterialization(asset_key=AssetKey(table.key), partition=partition))
    record = latest_materialization(instance, table, partition)
    for check in table.checks:
        if check.blocking:
            outcome = Outcome(check, partition, True, {}, reason)
            instance.report_runless_asset_event(evaluation(instance, table, outcome, record))


# --- gates ---------------------------------------------------------------------------------------------------


def failed_blocking_checks(
    instance: DagsterInstance, upstream: Table, partitions: Sequence[str]
) -> dict[str, list[str]]:
    """Partition → names of its blocking checks whose latest evaluation on its latest materialization failed."""
    blocking = [c.name for c in upstream.checks if c.blocking]
    if not blocking or not partitions:
        return {}
    from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

    keys = [AssetCheckKey(AssetKey(upstream.key), name) for name in blocking]
    wanted = set(partitions)
    failed: dict[str, list[str]] = {}
    for info in instance.event_log_storage.get_asset_check_partition_info(keys, partition_keys=sorted(wanted)):
        failed_now = info.latest_execution_status == AssetCheckExecutionRecordStatus.FAILED
        if info.partition_key in wanted and info.is_current and failed_now:
            failed.setdefault(str(info.partition_key), []).append(info.check_key.name)
    return {k: sorted(v) for k, v in sorted(failed.items())}
