"""A table's checks on the partitions of one write, as written: what the runner evaluates after each ranged commit.

A Spark job costs a good fraction of a second however small the partition, and a ranged run writes up to a week of
hours at once: the partitions' rows are read back once, and each kind is evaluated for all of them together, so that
the checks of a ranged write cost a few Spark jobs, not a few per partition:

* the row-local kinds (unique, not_null, range): one grouped job (:func:`quality.evaluate_partitions`);
* ``row_count``: one grouped count of the written rows, and one per upstream it is measured against, of every
  partition's input rows labelled with the partition that read them;
* ``anomaly``: one read of the written partitions and of their trailing periods, one grouped job for their metrics;
* ``references``: per column, one grouped join of the written keys with every partition's referenced input keys
  (labelled the same way), and one more naming a few missing keys where some are missing.

Each kind judges a partition the same way whichever path counted its numbers (its ``judge``): a partition written
alone gets the verdict it would get written in a range.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import reduce
from typing import Protocol

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from resources.delta_lake import DeltaStore
from warehouse_assets.catalog import Table, partition_values_of
from warehouse_assets.catalog.checks import Anomaly, Check, References, RowCount
from warehouse_assets.materialize.quality import PARTITION, Outcome, evaluate, evaluate_partitions


class WrittenPartition(Protocol):
    """A partition of the write: its key, and its inputs by the names its SQL reads, as it read them."""

    @property
    def key(self) -> str: ...

    @property
    def inputs(self) -> Mapping[str, DataFrame]: ...


def check_written(
    table: Table,
    written: Sequence[WrittenPartition],
    spark: SparkSession,
    store: DeltaStore,
    version: int,
    checks: Sequence[Check] | None = None,
) -> list[Outcome]:
    """Evaluate ``checks`` (the table's, by default) on the partitions of one write as written (read back from Delta
    at its commit, ``version``): each partition's verdicts in the order of its checks."""
    keys = [p.key for p in written]
    specs = [partition_values_of(table, k) for k in keys]
    data, _ = store.read(spark, table.key, partitions=specs, version=version)
    data = data.withColumn(PARTITION, partition_key(specs, keys)).persist()
    checks = table.checks if checks is None else checks
    try:
        local = [c for c in checks if c.row_local]
        counts = [c for c in checks if isinstance(c, RowCount)]
        anomalies = [c for c in checks if isinstance(c, Anomaly)]
        references = [c for c in checks if isinstance(c, References)]
        grouped = evaluate_partitions(table, local, keys, data) if local else []
        if counts:
            grouped += _row_counts(counts, written, data)
        if anomalies:
            grouped += _anomalies(table, anomalies, keys, spark, store, version)
        if references:
            grouped += _references(references, written, data)
        judged = {(o.check, o.partition): o for o in grouped}
        out = []
        for planned in written:
            rows = data.where(F.col(PARTITION) == planned.key)
            for check in checks:
                outcome = judged.get((check, planned.key))
                out.append(outcome or evaluate(table, check, planned.key, rows, planned.inputs))
        return out
    finally:
        data.unpersist()


def _row_counts(checks: Sequence[RowCount], written: Sequence[WrittenPartition], data: DataFrame) -> list[Outcome]:
    """``row_count`` on every partition of the write: one grouped count of their rows, and one per upstream compared
    with, of every partition's input rows labelled with the partition that read them."""
    rows = {r[PARTITION]: int(r["count"]) for r in data.groupBy(PARTITION).count().collect()}
    upstream_rows: dict[str, dict[str, int]] = {}
    for upstream in sorted({c.upstream for c in checks if c.upstream}):
        labelled = [p.inputs[upstream].select(F.lit(p.key).alias(PARTITION)) for p in written]
        grouped = reduce(DataFrame.unionByName, labelled).groupBy(PARTITION).count().collect()
        upstream_rows[upstream] = {r[PARTITION]: int(r["count"]) for r in grouped}
    return [
        check.judge(p.key, rows.get(p.key, 0), upstream_rows[check.upstream].get(p.key, 0) if check.upstream else None)
        for p in written
        for check in checks
    ]


def _anomalies(
    table: Table, checks: Sequence[Anomaly], keys: Sequence[str], spark: SparkSession, store: DeltaStore, version: int
) -> list[Outcome]:
    """``anomaly`` on every partition of the write: the written partitions and their trailing periods read once (at
    the write's version), every one's metrics in one grouped job. A partition without rows has no metric: it is no
    history period, and its own value is 0."""
    history = {(c, k): c.history_keys(table, k) for c in checks for k in keys}
    wanted = sorted({*keys, *(h for found in history.values() for h in found)})
    specs = [partition_values_of(table, k) for k in wanted]
    df, _ = store.read(spark, table.key, partitions=specs, version=version)
    metrics = [c.metric_column().alias(f"m{i}") for i, c in enumerate(checks)]
    found = {r[PARTITION]: r for r in df.groupBy(partition_key(specs, wanted).alias(PARTITION)).agg(*metrics).collect()}

    def metric(index: int, key: str) -> float:
        value = found[key][f"m{index}"]
        return float(value) if value is not None else 0.0

    return [
        check.judge(
            key,
            metric(i, key) if key in found else 0.0,
            [metric(i, earlier) for earlier in history[check, key] if earlier in found],
        )
        for key in keys
        for i, check in enumerate(checks)
    ]


def _references(checks: Sequence[References], written: Sequence[WrittenPartition], data: DataFrame) -> list[Outcome]:
    """``references`` on every partition of the write: per column, its distinct keys joined with those of every
    partition's referenced input rows (labelled with the partition that read them), counted in one grouped job, and a
    few missing keys named in one more where some are missing."""
    counted: dict[tuple[References, str], dict[str, tuple[int, int, list[str]]]] = {}
    for check in checks:
        for column, ref_table, ref_column in check.refs:
            present = data.select(PARTITION, F.col(column).alias("__k")).where("__k IS NOT NULL").distinct()
            labelled = [
                p.inputs[ref_table].select(F.lit(p.key).alias(PARTITION), F.col(ref_column).alias("__k"))
                for p in written
            ]
            found = reduce(DataFrame.unionByName, labelled).distinct().withColumn("__found", F.lit(True))
            joined = present.join(found, [PARTITION, "__k"], "left")
            missing = F.col("__found").isNull()
            figures = joined.groupBy(PARTITION).agg(F.count("*").alias("keys"), F.count_if(missing).alias("missing"))
            stats = {r[PARTITION]: (int(r["keys"]), int(r["missing"])) for r in figures.collect()}
            examples: dict[str, list[str]] = {}
            if any(n for _, n in stats.values()):
                order = Window.partitionBy(PARTITION).orderBy("__k")
                named = joined.where(missing).withColumn("__n", F.row_number().over(order)).where("__n <= 3")
                for row in sorted(named.collect(), key=lambda r: r["__n"]):
                    examples.setdefault(row[PARTITION], []).append(str(row["__k"]))
            for p in written:
                keys, n = stats.get(p.key, (0, 0))
                counted.setdefault((check, p.key), {})[column] = (keys, n, examples.get(p.key, []))
    return [check.judge(p.key, counted[check, p.key]) for p in written for check in checks]


def partition_key(specs: Sequence[Mapping[str, str]], keys: Sequence[str]) -> Column:
    """The partition key of each row, from its partition columns' values (``specs[i]`` are ``keys[i]``'s)."""
    found = [
        (reduce(Column.__and__, [F.col(c) == F.lit(v) for c, v in spec.items()]), k)
        for spec, k in zip(specs, keys, strict=True)
    ]
    key = F.when(found[0][0], F.lit(found[0][1]))
    for condition, k in found[1:]:
        key = key.when(condition, F.lit(k))
    return key
