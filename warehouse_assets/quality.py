"""Data-quality checks per partition, declared beside each table (``checks:``) and compiled to Dagster.

Every declared check becomes one per-partition asset check (``AssetCheckSpec(partitions_def=...)``),
blocking unless the catalog says ``blocking: false``. A derived table evaluates its checks in the same step,
on the partition it just wrote (read back from Delta) and on the upstream partitions it read; an ODS table's
checks run in their own step whenever the readiness sensor reports the hour (an automation condition on
the checks). Results carry the numbers behind them.

Across runs the gate is the automation condition (:func:`blocking_checks_passed`): a partition runs only
when every mapped upstream partition's blocking checks passed on its latest materialization — except for
dependencies declared ``ignore_dq: true`` (seed 002). The run guard (:mod:`warehouse_assets.gate`) refuses the same.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetCheckSpec,
    AssetKey,
    AssetMaterialization,
    AssetRecordsFilter,
    AssetSelection,
    AutomationCondition,
    DagsterInstance,
    MetadataValue,
)

from warehouse_assets.catalog import Check, Table
from warehouse_assets.partitions import BY_PERIOD

# PySpark is imported inside the functions that evaluate checks: the gates below (read by `warehouse why`) need
# only the Dagster instance.
if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@dataclass(frozen=True)
class Outcome:
    """A check's verdict on one partition, with the numbers behind it."""

    check: Check
    partition: str
    passed: bool
    metadata: Mapping[str, Any]
    description: str


def check_specs(table: Table) -> list[AssetCheckSpec]:
    return [
        AssetCheckSpec(
            check.name,
            asset=AssetKey(table.key),
            description=describe(check),
            blocking=check.blocking,
            partitions_def=BY_PERIOD[table.period],
            metadata={"kind": check.kind, "declared_in": table.path.name},
        )
        for check in table.checks
    ]


def describe(check: Check) -> str:
    if check.kind == "unique":
        return f"no duplicate {', '.join(check.param('columns') or ('primary key',))} in the partition"
    if check.kind == "not_null":
        return f"no null in {', '.join(check.param('columns'))}"
    if check.kind == "range":
        return "values in range: " + ", ".join(f"{c} in [{lo}, {hi}]" for c, lo, hi in check.param("bounds"))
    if check.kind == "references":
        return "keys present in the mapped partitions: " + ", ".join(
            f"{c} → {t}.{rc}" for c, t, rc in check.param("refs")
        )
    if check.kind == "row_count":
        parts = []
        if check.param("min_rows") is not None:
            parts.append(f"at least {int(check.param('min_rows'))} rows")
        if check.param("upstream"):
            parts.append(
                f"rows / rows of {check.param('upstream')}'s mapped partitions in "
                f"[{check.param('min_ratio')}, {check.param('max_ratio')}]"
            )
        return "; ".join(parts)
    return (
        f"{check.param('metric')} within ±{check.param('max_deviation'):.0%} of its trailing "
        f"{check.param('periods')}-period mean"
    )


# --- evaluation on Spark -----------------------------------------------------------------------------------


def _first(df: DataFrame) -> Any:
    row = df.first()
    assert row is not None, "an aggregate returns one row"
    return row


def _columns(table: Table, check: Check) -> list[str]:
    return list(check.param("columns") or table.primary_key)


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
    from pyspark.sql import functions as F

    kind = check.kind
    if kind in GROUPED:
        return evaluate_partitions(table, check, [partition], data.withColumn(PARTITION, F.lit(partition)))[0]
    if kind == "range":
        aggs: list[Any] = [F.count("*").alias("__rows")]
        for c, lo, hi in check.param("bounds"):
            beyond = F.lit(False)
            if lo is not None:
                beyond = beyond | (F.col(c) < F.lit(lo))
            if hi is not None:
                beyond = beyond | (F.col(c) > F.lit(hi))
            aggs += [
                F.count_if(beyond).alias(f"{c}__out"),
                F.min(c).cast("double").alias(f"{c}__min"),
                F.max(c).cast("double").alias(f"{c}__max"),
            ]
        row = _first(data.agg(*aggs))
        per = {
            c: {
                "outside": int(row[f"{c}__out"]),
                "min": row[f"{c}__min"],
                "max": row[f"{c}__max"],
                "low": lo,
                "high": hi,
            }
            for c, lo, hi in check.param("bounds")
        }
        outside = {c: v["outside"] for c, v in per.items() if v["outside"]}
        return Outcome(
            check,
            partition,
            not outside,
            {"rows": int(row["__rows"]), "columns": MetadataValue.json(per), "outside": sum(outside.values())},
            "all values in range"
            if not outside
            else "out of range: " + ", ".join(f"{c} ({n})" for c, n in outside.items()),
        )
    if kind == "references":
        refs: dict[str, Any] = {}
        missing_total = 0
        for c, ref_table, ref_col in check.param("refs"):
            present = data.select(F.col(c).alias("__k")).where("__k IS NOT NULL").distinct()
            ref = inputs[ref_table].select(F.col(ref_col).alias("__k")).distinct()
            orphans = present.join(ref, "__k", "left_anti")
            n = orphans.count()
            refs[c] = {
                "references": f"{ref_table}.{ref_col}",
                "distinct_keys": present.count(),
                "missing": n,
                "examples": [str(r["__k"]) for r in orphans.limit(3).collect()],
            }
            missing_total += n
        return Outcome(
            check,
            partition,
            missing_total == 0,
            {"missing_keys": missing_total, "columns": MetadataValue.json(refs)},
            "every key found"
            if not missing_total
            else f"{missing_total} key(s) missing from the referenced partitions",
        )
    if kind == "row_count":
        rows = data.count()
        meta: dict[str, Any] = {"rows": rows}
        problems = []
        min_rows = check.param("min_rows")
        if min_rows is not None and rows < min_rows:
            problems.append(f"{rows} rows < {int(min_rows)}")
        upstream = check.param("upstream")
        if upstream:
            up_rows = inputs[upstream].count()
            ratio = rows / up_rows if up_rows else (1.0 if rows == 0 else math.inf)
            meta |= {"upstream": upstream, "upstream_rows": up_rows, "ratio": round(ratio, 6)}
            lo, hi = check.param("min_ratio"), check.param("max_ratio")
            if lo is not None and ratio < lo:
                problems.append(f"ratio {ratio:.4f} < {lo}")
            if hi is not None and ratio > hi:
                problems.append(f"ratio {ratio:.4f} > {hi}")
        return Outcome(check, partition, not problems, meta, "; ".join(problems) or f"{rows} rows")
    return _anomaly(table, check, partition, data, history)


# --- many partitions in one pass ------------------------------------------------------------------------------

PARTITION = "__partition"  # the column carrying each row's partition key in evaluate_partitions
GROUPED = ("unique", "not_null")  # kinds evaluated for many partitions by one grouped aggregation


def evaluate_partitions(table: Table, check: Check, keys: Sequence[str], data: DataFrame) -> list[Outcome]:
    """Evaluate ``check`` on every partition in ``keys`` at once; ``data`` holds their rows with the
    partition key in column ``PARTITION``. Row-local kinds (``GROUPED``) take one or two grouped Spark jobs
    for all partitions; the others are evaluated partition by partition (without upstream inputs)."""
    from pyspark.sql import functions as F

    if check.kind == "unique":
        return _unique(table, check, keys, data)
    if check.kind == "not_null":
        return _not_null(check, keys, data)
    return [evaluate(table, check, k, data.where(F.col(PARTITION) == k), {}) for k in keys]


def _unique(table: Table, check: Check, keys: Sequence[str], data: DataFrame) -> list[Outcome]:
    from pyspark.sql import functions as F

    cols = _columns(table, check)
    null_key = F.expr(" OR ".join(f"`{c}` IS NULL" for c in cols))
    stats = {
        r[PARTITION]: r
        for r in data.groupBy(PARTITION)
        .agg(
            F.count("*").alias("rows"),
            F.count_distinct(*[F.col(c) for c in cols]).alias("keys"),
            F.count_if(null_key).alias("nulls"),
        )
        .collect()
    }
    duplicated = {
        r[PARTITION]: r
        for r in data.groupBy(PARTITION, *cols)
        .count()
        .where("count > 1")
        .groupBy(PARTITION)
        .agg(
            F.count("*").alias("duplicated"),
            F.slice(F.collect_list(F.struct(*cols, "count")), 1, 3).alias("examples"),
        )
        .collect()
    }
    out = []
    for key in keys:
        row, dup = stats.get(key), duplicated.get(key)
        rows, distinct, nulls = (int(row["rows"]), int(row["keys"]), int(row["nulls"])) if row else (0, 0, 0)
        duplicated_keys = int(dup["duplicated"]) if dup else 0
        example = [str(e.asDict()) for e in dup["examples"]] if dup else []
        out.append(
            Outcome(
                check,
                key,
                duplicated_keys == 0 and nulls == 0,
                {"rows": rows, "distinct_keys": distinct, "duplicated_keys": duplicated_keys, "null_keys": nulls}
                | ({"examples": MetadataValue.json(example)} if example else {}),
                f"{duplicated_keys} duplicated and {nulls} null key(s) of ({', '.join(cols)}) in {rows} rows",
            )
        )
    return out


def _not_null(check: Check, keys: Sequence[str], data: DataFrame) -> list[Outcome]:
    from pyspark.sql import functions as F

    cols = list(check.param("columns"))
    counted = {
        r[PARTITION]: r
        for r in data.groupBy(PARTITION)
        .agg(F.count("*").alias("__rows"), *[F.count_if(F.col(c).isNull()).alias(c) for c in cols])
        .collect()
    }
    out = []
    for key in keys:
        row = counted.get(key)
        null_counts = {c: int(row[c]) if row else 0 for c in cols}
        bad = {c: n for c, n in null_counts.items() if n}
        out.append(
            Outcome(
                check,
                key,
                not bad,
                {
                    "rows": int(row["__rows"]) if row else 0,
                    "nulls": MetadataValue.json(null_counts),
                    "null_values": sum(null_counts.values()),
                },
                "no nulls" if not bad else "nulls in " + ", ".join(f"{c} ({n})" for c, n in bad.items()),
            )
        )
    return out


_METRIC = re.compile(r"^(?P<fn>sum|avg|min|max)\((?P<col>\w+)\)$")


def _metric(df: DataFrame, metric: str, by: Sequence[str] = ()) -> Any:
    from pyspark.sql import functions as F

    match = _METRIC.match(metric)
    expr = F.count("*") if match is None else getattr(F, match.group("fn"))(match.group("col"))
    return df.groupBy(*by).agg(expr.cast("double").alias("__v"))


def anomaly_history_keys(table: Table, check: Check, partition: str) -> list[str]:
    """The ``periods`` partition keys before ``partition`` (the trailing window of an anomaly check)."""
    pdef = BY_PERIOD[table.period]
    keys: list[str] = []
    window = pdef.time_window_for_partition_key(partition)
    first = pdef.get_first_partition_key()
    while len(keys) < int(check.param("periods")):
        previous = pdef.get_prev_partition_window(window.start)
        if previous is None:
            break
        key = pdef.get_partition_key_for_timestamp(previous.start.timestamp())
        keys.append(key)
        window = previous
        if key == first:
            break
    return keys


def _anomaly(table: Table, check: Check, partition: str, data: DataFrame, history: DataFrame | None) -> Outcome:
    metric = str(check.param("metric"))
    row = _metric(data, metric).first()
    value = float(row["__v"]) if row is not None and row["__v"] is not None else 0.0
    past: list[float] = []
    if history is not None:
        past = [float(r["__v"] or 0.0) for r in _metric(history, metric, table.partition_by).collect()]
    meta: dict[str, Any] = {"metric": metric, "value": value, "history_periods": len(past)}
    if len(past) < int(check.param("min_periods")):
        return Outcome(
            check,
            partition,
            True,
            meta,
            f"{len(past)} of {check.param('periods')} trailing periods: too little history to judge",
        )
    mean = sum(past) / len(past)
    deviation = abs(value - mean) / abs(mean) if mean else (0.0 if value == 0 else math.inf)
    limit = float(check.param("max_deviation"))
    meta |= {"trailing_mean": round(mean, 6), "deviation": round(deviation, 6), "max_deviation": limit}
    passed = deviation <= limit
    return Outcome(
        check,
        partition,
        passed,
        meta,
        f"{metric} = {value:g} vs trailing mean {mean:g}: {deviation:.1%} off (limit {limit:.0%})",
    )


def latest_materialization(instance: DagsterInstance, table: Table, partition: str) -> Any:
    """The partition's latest materialization record, or None."""
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey(table.key), asset_partitions=[partition]), limit=1
    ).records
    return records[0] if records else None


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


def blocking_checks_passed(table: Table) -> AutomationCondition:
    """True when every mapped partition of every dependency (except ``ignore_dq`` ones) passed all its
    blocking checks on its latest materialization.

    Dagster's ``all_deps_blocking_checks_passed()`` is built on ``all_deps_match``, which holds when *some*
    mapped upstream partition matches (design §6.1) — too weak for a day over 24 hours. Its negation of
    ``any_deps_match`` is exact: no mapped partition of any dependency has a blocking check that has not
    passed (failed, never evaluated, or stale after a newer materialization).
    """
    not_passed = AutomationCondition.any_checks_match(
        ~AutomationCondition.check_passed(), blocking_only=True
    ).with_label("a blocking check has not passed")
    condition = AutomationCondition.any_deps_match(not_passed)
    ignored = [AssetKey(d.key) for d in table.deps if d.ignore_dq and d.table != table.fqn]
    if ignored:
        condition = condition.ignore(AssetSelection.assets(*ignored))
    return (~condition).with_label("every upstream partition passed its blocking checks")


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
