"""The data-quality check kinds: each kind in one class, holding its parsing (``checks:`` of a declaration),
its description (shown in the UI), its validation against its table and its evaluation on Spark.

``CHECK_KINDS`` is the one table of kinds: the catalog parses ``checks:`` through it, and
:mod:`warehouse_assets.materialize.quality` describes and evaluates each check through the check's own methods.
PySpark is imported inside the evaluating methods: the catalog (read by ``warehouse why``) needs none of it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeGuard

from dagster import MetadataValue

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame

PARTITION = "__partition"  # the column carrying each row's partition key in evaluate_partitions
_METRIC = re.compile(r"^(?:rows|count\(\*\)|(?P<fn>sum|avg|min|max)\((?P<col>[A-Za-z_][A-Za-z0-9_]*)\))$")


class Table(Protocol):
    """What a check reads of the table it guards: the catalog's tables hold checks, so checks name no table class."""

    @property
    def fqn(self) -> str: ...
    @property
    def period(self) -> str: ...
    @property
    def primary_key(self) -> tuple[str, ...]: ...
    @property
    def row_key(self) -> tuple[str, ...]: ...
    @property
    def partition_by(self) -> list[str]: ...
    @property
    def is_ods(self) -> bool: ...
    @property
    def deps(self) -> Sequence[Any]: ...


class CheckSpecError(ValueError):
    """A ``checks:`` entry is wrong; the catalog prefixes the message with the declaring file."""


@dataclass(frozen=True)
class Outcome:
    """A check's verdict on one partition, with the numbers behind it."""

    check: Check
    partition: str
    passed: bool
    metadata: Mapping[str, Any]
    description: str


@dataclass(frozen=True, kw_only=True)
class Check:
    """One check of a table. A subclass per kind; ``blocking`` unless declared ``blocking: false``."""

    kind: ClassVar[str] = ""
    row_local: ClassVar[bool] = False  # its numbers are per-partition aggregates (see _Grouped)
    blocking: bool = True

    @property
    def name(self) -> str:
        return self.kind

    @classmethod
    def parse(cls, value: Any, blocking: bool) -> Check:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def problem_in(self, table: Table) -> str | None:
        """What is wrong with this check on ``table`` (validated once the whole catalog is loaded), or None."""
        return None

    def history_keys(self, table: Table, partition: str) -> list[str]:
        """The earlier partitions the evaluation compares with (none unless the kind needs history)."""
        return []

    def evaluate(
        self,
        table: Table,
        partition: str,
        data: DataFrame,
        inputs: Mapping[str, DataFrame],
        history: DataFrame | None = None,
    ) -> Outcome:
        """The verdict on one partition's rows (``data``); ``inputs`` are the upstream partitions it read (live
        rows), ``history`` the table's partitions of :meth:`history_keys`."""
        raise NotImplementedError

    def evaluate_partitions(self, table: Table, keys: Sequence[str], data: DataFrame) -> list[Outcome]:
        """The verdicts on every partition in ``keys`` at once; ``data`` holds their rows with the partition key
        in column ``PARTITION``. By default partition by partition, without upstream inputs."""
        from pyspark.sql import functions as F

        return [self.evaluate(table, k, data.where(F.col(PARTITION) == k), {}) for k in keys]


# --- parsing helpers ---------------------------------------------------------------------------------------------


def _column_list(value: Any, kind: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise CheckSpecError(f"checks.{kind} needs a list of column names, got {value!r}")
    return tuple(value)


def _number(value: Any, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CheckSpecError(f"{what} must be a number, got {value!r}")
    return float(value)


# --- row-local kinds: many partitions in one grouped aggregation -------------------------------------------------


class _Grouped(Check):
    """A row-local kind: its numbers are aggregates per partition, so several such checks of a table share one
    grouped Spark job (:func:`evaluate_grouped`); one partition is evaluated as a group of one."""

    row_local: ClassVar[bool] = True

    def evaluate(
        self,
        table: Table,
        partition: str,
        data: DataFrame,
        inputs: Mapping[str, DataFrame],
        history: DataFrame | None = None,
    ) -> Outcome:
        from pyspark.sql import functions as F

        return self.evaluate_partitions(table, [partition], data.withColumn(PARTITION, F.lit(partition)))[0]

    def evaluate_partitions(self, table: Table, keys: Sequence[str], data: DataFrame) -> list[Outcome]:
        return evaluate_grouped(table, [self], keys, data)

    def aggregates(self, table: Table, prefix: str) -> list[Column]:
        """The per-partition aggregates this check needs, each aliased ``prefix + name`` (Spark)."""
        raise NotImplementedError

    def arrow_aggregates(self, table: Table, rows: pa.Table, prefix: str) -> dict[str, Any]:
        """The same aggregates over one partition's rows held by Arrow (:func:`evaluate_grouped`'s small path)."""
        raise NotImplementedError

    def outcomes(
        self, table: Table, keys: Sequence[str], stats: Mapping[str, Any], data: DataFrame | pa.Table, prefix: str
    ) -> list[Outcome]:
        """The verdicts from the aggregated rows ``stats`` (partition key -> row; absent: no rows)."""
        raise NotImplementedError


def evaluate_grouped(
    table: Table, checks: Sequence[Check], keys: Sequence[str], data: DataFrame | pa.Table
) -> list[Outcome]:
    """Every check of ``checks`` on every partition in ``keys``; ``data`` holds their rows with the partition key in
    column ``PARTITION``. The row-local checks' aggregates are computed in one grouped Spark job for all of them
    (a Spark job costs a good fraction of a second however small the data: an ODS hour's checks are on the path of
    every handoff); the other kinds are evaluated partition by partition.

    ``data`` may instead be an Arrow table of partitions small enough for the process (only row-local checks then):
    the same aggregates and verdicts are computed by Arrow in milliseconds, without a Spark job
    (``tests/test_quality.py`` holds both engines to the same verdicts)."""
    grouped = [c for c in checks if isinstance(c, _Grouped)]
    stats: dict[str, Any] = {}
    if _is_arrow(data):
        if len(grouped) != len(checks):
            raise ValueError(f"{table.fqn}: only row-local checks are evaluated on Arrow data")
        stats = _arrow_stats(table, grouped, keys, data)
    elif grouped:
        columns = [a for i, c in enumerate(grouped) for a in c.aggregates(table, f"c{i}_")]
        stats = {r[PARTITION]: r for r in data.groupBy(PARTITION).agg(*columns).collect()}
    out: list[Outcome] = []
    for check in checks:
        if isinstance(check, _Grouped):
            out += check.outcomes(table, keys, stats, data, f"c{grouped.index(check)}_")
        else:
            out += check.evaluate_partitions(table, keys, data)
    return out


def _is_arrow(data: Any) -> TypeGuard[pa.Table]:
    import pyarrow as pa

    return isinstance(data, pa.Table)


def _arrow_stats(table: Table, grouped: Sequence[_Grouped], keys: Sequence[str], data: pa.Table) -> dict[str, Any]:
    """Partition key -> the aggregates of every check (as the Spark job's rows hold them); no rows: absent."""
    import pyarrow.compute as pc

    stats: dict[str, Any] = {}
    for key in keys:
        rows = data.filter(pc.equal(data[PARTITION], key))
        if rows.num_rows:
            stats[key] = {
                n: v for i, c in enumerate(grouped) for n, v in c.arrow_aggregates(table, rows, f"c{i}_").items()
            }
    return stats


def _any_null(rows: pa.Table, columns: Sequence[str]) -> pa.ChunkedArray:
    import pyarrow.compute as pc

    mask = pc.is_null(rows[columns[0]])
    for column in columns[1:]:
        mask = pc.or_(mask, pc.is_null(rows[column]))
    return mask


@dataclass(frozen=True, kw_only=True)
class Unique(_Grouped):
    """``unique: [col, ...]``, or ``unique: true`` for the primary key: no duplicated and no null key."""

    kind: ClassVar[str] = "unique"
    columns: tuple[str, ...] | None = None  # None: the table's primary key

    @classmethod
    def parse(cls, value: Any, blocking: bool) -> Check:
        return cls(columns=None if value is True else _column_list(value, cls.kind), blocking=blocking)

    def describe(self) -> str:
        return f"no duplicate {', '.join(self.columns or ('primary key',))} in the partition"

    def problem_in(self, table: Table) -> str | None:
        if self.columns is None and not table.primary_key:
            return f"{table.fqn}: checks.unique: true needs a primary_key"
        return None

    def aggregates(self, table: Table, prefix: str) -> list[Column]:
        from pyspark.sql import functions as F

        cols = list(self.columns or table.row_key)
        null_key = F.expr(" OR ".join(f"`{c}` IS NULL" for c in cols))
        return [
            F.count("*").alias(f"{prefix}rows"),
            F.count_distinct(*[F.col(c) for c in cols]).alias(f"{prefix}keys"),
            F.count_if(null_key).alias(f"{prefix}nulls"),
        ]

    def arrow_aggregates(self, table: Table, rows: pa.Table, prefix: str) -> dict[str, int]:
        import pyarrow.compute as pc

        cols = list(self.columns or table.row_key)
        null_key = _any_null(rows, cols)
        # Spark's count(DISTINCT a, b) counts the distinct keys with no null part
        keyed = rows.select(cols).filter(pc.invert(null_key))
        return {
            f"{prefix}rows": rows.num_rows,
            f"{prefix}keys": keyed.group_by(cols).aggregate([]).num_rows,
            f"{prefix}nulls": int(pc.sum(null_key).as_py() or 0),
        }

    def outcomes(
        self, table: Table, keys: Sequence[str], stats: Mapping[str, Any], data: DataFrame | pa.Table, prefix: str
    ) -> list[Outcome]:
        cols = list(self.columns or table.row_key)
        # a partition with as many distinct keys as rows has no duplicate and no null key: the second pass (which
        # names examples) is needed only when one has fewer; a clean hour costs no job of its own
        suspect = [k for k, r in stats.items() if int(r[f"{prefix}keys"]) < int(r[f"{prefix}rows"])]
        duplicated = _duplicated_keys(cols, suspect, data) if suspect else {}
        out = []
        for key in keys:
            row, dup = stats.get(key), duplicated.get(key)
            rows, distinct, nulls = (
                (int(row[f"{prefix}rows"]), int(row[f"{prefix}keys"]), int(row[f"{prefix}nulls"])) if row else (0, 0, 0)
            )
            duplicated_keys, example = dup if dup else (0, [])
            out.append(
                Outcome(
                    self,
                    key,
                    duplicated_keys == 0 and nulls == 0,
                    {"rows": rows, "distinct_keys": distinct, "duplicated_keys": duplicated_keys, "null_keys": nulls}
                    | ({"examples": MetadataValue.json(example)} if example else {}),
                    f"{duplicated_keys} duplicated and {nulls} null key(s) of ({', '.join(cols)}) in {rows} rows",
                )
            )
        return out


def _duplicated_keys(
    cols: Sequence[str], suspect: Sequence[str], data: DataFrame | pa.Table
) -> dict[str, tuple[int, list[str]]]:
    """Partition key -> (keys of ``cols`` held by more than one row, up to 3 of them with their counts), for the
    ``suspect`` partitions (a null key counts as a key, as in Spark's GROUP BY)."""
    if _is_arrow(data):
        import pyarrow.compute as pc

        found: dict[str, tuple[int, list[str]]] = {}
        for key in suspect:
            rows = data.filter(pc.equal(data[PARTITION], key)).select(list(cols))
            counted = rows.group_by(list(cols)).aggregate([([], "count_all")]).rename_columns([*cols, "count"])
            repeated = counted.filter(pc.greater(counted["count"], 1))
            if repeated.num_rows:
                found[key] = (repeated.num_rows, [str(e) for e in repeated.slice(0, 3).to_pylist()])
        return found
    from pyspark.sql import functions as F

    return {
        r[PARTITION]: (int(r["duplicated"]), [str(e.asDict()) for e in r["examples"]])
        for r in data.where(F.col(PARTITION).isin(list(suspect)))
        .groupBy(PARTITION, *cols)
        .count()
        .where("count > 1")
        .groupBy(PARTITION)
        .agg(
            F.count("*").alias("duplicated"),
            F.slice(F.collect_list(F.struct(*cols, "count")), 1, 3).alias("examples"),
        )
        .collect()
    }


@dataclass(frozen=True, kw_only=True)
class NotNull(_Grouped):
    """``not_null: [col, ...]``: no null in these columns."""

    kind: ClassVar[str] = "not_null"
    columns: tuple[str, ...]

    @classmethod
    def parse(cls, value: Any, blocking: bool) -> Check:
        return cls(columns=_column_list(value, cls.kind), blocking=blocking)

    def describe(self) -> str:
        return f"no null in {', '.join(self.columns)}"

    def aggregates(self, table: Table, prefix: str) -> list[Column]:
        from pyspark.sql import functions as F

        return [
            F.count("*").alias(f"{prefix}rows"),
            *[F.count_if(F.col(c).isNull()).alias(f"{prefix}null_{c}") for c in self.columns],
        ]

    def arrow_aggregates(self, table: Table, rows: pa.Table, prefix: str) -> dict[str, int]:
        return {f"{prefix}rows": rows.num_rows, **{f"{prefix}null_{c}": rows[c].null_count for c in self.columns}}

    def outcomes(
        self, table: Table, keys: Sequence[str], stats: Mapping[str, Any], data: DataFrame | pa.Table, prefix: str
    ) -> list[Outcome]:
        out = []
        for key in keys:
            row = stats.get(key)
            null_counts = {c: int(row[f"{prefix}null_{c}"]) if row else 0 for c in self.columns}
            bad = {c: n for c, n in null_counts.items() if n}
            out.append(
                Outcome(
                    self,
                    key,
                    not bad,
                    {
                        "rows": int(row[f"{prefix}rows"]) if row else 0,
                        "nulls": MetadataValue.json(null_counts),
                        "null_values": sum(null_counts.values()),
                    },
                    "no nulls" if not bad else "nulls in " + ", ".join(f"{c} ({n})" for c, n in bad.items()),
                )
            )
        return out


@dataclass(frozen=True, kw_only=True)
class Range(_Grouped):
    """``range: {col: [low, high]}`` (null for an open end): every value within its bounds."""

    kind: ClassVar[str] = "range"
    bounds: tuple[tuple[str, float | None, float | None], ...]

    @classmethod
    def parse(cls, value: Any, blocking: bool) -> Check:
        if not isinstance(value, Mapping) or not value:
            raise CheckSpecError("checks.range maps columns to [low, high] (null for an open end)")
        bounds = []
        for column, pair in value.items():
            if not isinstance(pair, list) or len(pair) != 2:
                raise CheckSpecError(f"checks.range.{column} must be [low, high], got {pair!r}")
            low = _number(pair[0], f"checks.range.{column} low")
            high = _number(pair[1], f"checks.range.{column} high")
            if low is not None and high is not None and low > high:
                raise CheckSpecError(f"checks.range.{column}: low {low} is above high {high}")
            bounds.append((str(column), low, high))
        return cls(bounds=tuple(bounds), blocking=blocking)

    def describe(self) -> str:
        return "values in range: " + ", ".join(f"{c} in [{lo}, {hi}]" for c, lo, hi in self.bounds)

    def aggregates(self, table: Table, prefix: str) -> list[Column]:
        from pyspark.sql import functions as F

        out = [F.count("*").alias(f"{prefix}rows")]
        for c, lo, hi in self.bounds:
            beyond = F.lit(False)
            if lo is not None:
                beyond = beyond | (F.col(c) < F.lit(lo))
            if hi is not None:
                beyond = beyond | (F.col(c) > F.lit(hi))
            out += [
                F.count_if(beyond).alias(f"{prefix}out_{c}"),
                F.min(c).cast("double").alias(f"{prefix}min_{c}"),
                F.max(c).cast("double").alias(f"{prefix}max_{c}"),
            ]
        return out

    def arrow_aggregates(self, table: Table, rows: pa.Table, prefix: str) -> dict[str, Any]:
        import pyarrow as pa
        import pyarrow.compute as pc

        out: dict[str, Any] = {f"{prefix}rows": rows.num_rows}
        for c, lo, hi in self.bounds:
            values = pc.cast(rows[c], pa.float64())  # compared and reported as doubles, as Spark does
            beyond = pa.array([False] * rows.num_rows, pa.bool_())
            if lo is not None:
                beyond = pc.or_kleene(beyond, pc.less(values, lo))
            if hi is not None:
                beyond = pc.or_kleene(beyond, pc.greater(values, hi))
            extremes = pc.min_max(values).as_py()
            out |= {
                f"{prefix}out_{c}": int(pc.sum(beyond).as_py() or 0),  # a null value is in no range, as in Spark
                f"{prefix}min_{c}": extremes["min"],
                f"{prefix}max_{c}": extremes["max"],
            }
        return out

    def outcomes(
        self, table: Table, keys: Sequence[str], stats: Mapping[str, Any], data: DataFrame | pa.Table, prefix: str
    ) -> list[Outcome]:
        out = []
        for key in keys:
            row = stats.get(key)
            per = {
                c: {
                    "outside": int(row[f"{prefix}out_{c}"]) if row else 0,
                    "min": row[f"{prefix}min_{c}"] if row else None,
                    "max": row[f"{prefix}max_{c}"] if row else None,
                    "low": lo,
                    "high": hi,
                }
                for c, lo, hi in self.bounds
            }
            outside = {c: v["outside"] for c, v in per.items() if v["outside"]}
            out.append(
                Outcome(
                    self,
                    key,
                    not outside,
                    {
                        "rows": int(row[f"{prefix}rows"]) if row else 0,
                        "columns": MetadataValue.json(per),
                        "outside": sum(outside.values()),
                    },
                    "all values in range"
                    if not outside
                    else "out of range: " + ", ".join(f"{c} ({n})" for c, n in outside.items()),
                )
            )
        return out


# --- partition-at-a-time kinds -----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class References(Check):
    """``references: {col: layer.table.column}``: every key present in a dependency's mapped partitions."""

    kind: ClassVar[str] = "references"
    refs: tuple[tuple[str, str, str], ...]  # (column, referenced table, referenced column)

    @classmethod
    def parse(cls, value: Any, blocking: bool) -> Check:
        if not isinstance(value, Mapping) or not value:
            raise CheckSpecError("checks.references maps a column to layer.table.column")
        refs = []
        for column, target in value.items():
            if not isinstance(target, str) or target.count(".") != 2:
                raise CheckSpecError(f"checks.references.{column} must be layer.table.column, got {target!r}")
            table, _, ref_column = target.rpartition(".")
            refs.append((str(column), table, ref_column))
        return cls(refs=tuple(refs), blocking=blocking)

    def describe(self) -> str:
        return "keys present in the mapped partitions: " + ", ".join(f"{c} → {t}.{rc}" for c, t, rc in self.refs)

    def problem_in(self, table: Table) -> str | None:
        deps = {d.table for d in table.deps}
        for column, ref, _ in self.refs:
            if ref not in deps:
                return (
                    f"{table.fqn}: checks.references.{column} points at {ref}, which is not a dependency "
                    f"(references are checked against a dependency's mapped partitions)"
                )
        return None

    def evaluate(
        self,
        table: Table,
        partition: str,
        data: DataFrame,
        inputs: Mapping[str, DataFrame],
        history: DataFrame | None = None,
    ) -> Outcome:
        from pyspark.sql import functions as F

        counted: dict[str, tuple[int, int, list[str]]] = {}
        for c, ref_table, ref_col in self.refs:
            present = data.select(F.col(c).alias("__k")).where("__k IS NOT NULL").distinct()
            ref = inputs[ref_table].select(F.col(ref_col).alias("__k")).distinct()
            orphans = present.join(ref, "__k", "left_anti")
            counted[c] = (present.count(), orphans.count(), [str(r["__k"]) for r in orphans.limit(3).collect()])
        return self.judge(partition, counted)

    def judge(self, partition: str, counted: Mapping[str, tuple[int, int, Sequence[str]]]) -> Outcome:
        """The verdict on a partition whose columns hold, each, ``counted[column]``: its distinct keys, how many of
        them the referenced partitions lack, and a few of those (one partition's jobs, or a ranged run's grouped
        ones)."""
        refs: dict[str, Any] = {}
        missing_total = 0
        for c, ref_table, ref_col in self.refs:
            distinct, missing, examples = counted[c]
            refs[c] = {
                "references": f"{ref_table}.{ref_col}",
                "distinct_keys": distinct,
                "missing": missing,
                "examples": list(examples),
            }
            missing_total += missing
        return Outcome(
            self,
            partition,
            missing_total == 0,
            {"missing_keys": missing_total, "columns": MetadataValue.json(refs)},
            "every key found"
            if not missing_total
            else f"{missing_total} key(s) missing from the referenced partitions",
        )


@dataclass(frozen=True, kw_only=True)
class RowCount(Check):
    """``row_count: {upstream, min_ratio, max_ratio, min_rows}``: enough rows, and/or a ratio of the rows of
    a dependency's mapped partitions."""

    kind: ClassVar[str] = "row_count"
    upstream: str | None = None
    min_ratio: float | None = None
    max_ratio: float | None = None
    min_rows: float | None = None

    @classmethod
    def parse(cls, value: Any, blocking: bool) -> Check:
        if not isinstance(value, Mapping):
            raise CheckSpecError("checks.row_count needs {upstream, min_ratio, max_ratio} and/or min_rows")
        unknown = set(value) - {"upstream", "min_ratio", "max_ratio", "min_rows"}
        if unknown:
            raise CheckSpecError(f"checks.row_count: unknown parameter(s) {sorted(unknown)}")
        check = cls(
            upstream=value.get("upstream"),
            min_ratio=_number(value.get("min_ratio"), "checks.row_count.min_ratio"),
            max_ratio=_number(value.get("max_ratio"), "checks.row_count.max_ratio"),
            min_rows=_number(value.get("min_rows"), "checks.row_count.min_rows"),
            blocking=blocking,
        )
        if (check.min_ratio is not None or check.max_ratio is not None) and not check.upstream:
            raise CheckSpecError("checks.row_count: a ratio needs the upstream table it is measured against")
        return check

    def describe(self) -> str:
        parts = []
        if self.min_rows is not None:
            parts.append(f"at least {int(self.min_rows)} rows")
        if self.upstream:
            parts.append(f"rows / rows of {self.upstream}'s mapped partitions in [{self.min_ratio}, {self.max_ratio}]")
        return "; ".join(parts)

    def problem_in(self, table: Table) -> str | None:
        if self.upstream and self.upstream not in {d.table for d in table.deps}:
            return f"{table.fqn}: checks.row_count.upstream {self.upstream} is not a dependency"
        return None

    def evaluate(
        self,
        table: Table,
        partition: str,
        data: DataFrame,
        inputs: Mapping[str, DataFrame],
        history: DataFrame | None = None,
    ) -> Outcome:
        return self.judge(partition, data.count(), inputs[self.upstream].count() if self.upstream else None)

    def judge(self, partition: str, rows: int, up_rows: int | None) -> Outcome:
        """The verdict on a partition of ``rows`` rows whose upstream's mapped partitions hold ``up_rows`` (None:
        no upstream declared), however they were counted (one partition's job, or a ranged run's grouped one)."""
        meta: dict[str, Any] = {"rows": rows}
        problems = []
        if self.min_rows is not None and rows < self.min_rows:
            problems.append(f"{rows} rows < {int(self.min_rows)}")
        if self.upstream:
            assert up_rows is not None, "a ratio check is judged with its upstream's rows"
            ratio = rows / up_rows if up_rows else (1.0 if rows == 0 else math.inf)
            meta |= {"upstream": self.upstream, "upstream_rows": up_rows, "ratio": round(ratio, 6)}
            lo, hi = self.min_ratio, self.max_ratio
            if lo is not None and ratio < lo:
                problems.append(f"ratio {ratio:.4f} < {lo}")
            if hi is not None and ratio > hi:
                problems.append(f"ratio {ratio:.4f} > {hi}")
        return Outcome(self, partition, not problems, meta, "; ".join(problems) or f"{rows} rows")


@dataclass(frozen=True, kw_only=True)
class Anomaly(Check):
    """``anomaly: {metric, max_deviation, periods, min_periods}``: the partition's metric within a deviation of
    its trailing mean (derived tables only)."""

    kind: ClassVar[str] = "anomaly"
    metric: str
    max_deviation: float = 0.5
    periods: int = 7
    min_periods: int = 3

    @classmethod
    def parse(cls, value: Any, blocking: bool) -> Check:
        if not isinstance(value, Mapping) or "metric" not in value:
            raise CheckSpecError("checks.anomaly needs metric (rows or sum(col)/avg(col)/min(col)/max(col))")
        metric = str(value["metric"]).replace(" ", "")
        if not _METRIC.match(metric):
            raise CheckSpecError(f"checks.anomaly.metric {metric!r}: use rows, sum(col), avg(col), min(col), max(col)")
        deviation = _number(value.get("max_deviation", 0.5), "checks.anomaly.max_deviation")
        if deviation is None:  # an explicit null: no limit would be a check that never fails
            raise CheckSpecError("checks.anomaly.max_deviation must be a number, got None")
        periods, minimum = value.get("periods", 7), value.get("min_periods", 3)
        if not isinstance(periods, int) or not isinstance(minimum, int) or not 1 <= minimum <= periods:
            raise CheckSpecError("checks.anomaly: periods and min_periods are integers, 1 <= min_periods <= periods")
        return cls(metric=metric, max_deviation=deviation, periods=periods, min_periods=minimum, blocking=blocking)

    def describe(self) -> str:
        return f"{self.metric} within ±{self.max_deviation:.0%} of its trailing {self.periods}-period mean"

    def problem_in(self, table: Table) -> str | None:
        return f"{table.fqn}: anomaly checks are for derived tables" if table.is_ods else None

    def history_keys(self, table: Table, partition: str) -> list[str]:
        """The ``periods`` partition keys before ``partition`` (the trailing window)."""
        from warehouse_assets.catalog.calendars import BY_PERIOD

        pdef = BY_PERIOD[table.period]
        keys: list[str] = []
        window = pdef.time_window_for_partition_key(partition)
        first = pdef.get_first_partition_key()
        while len(keys) < self.periods:
            previous = pdef.get_prev_partition_window(window.start)
            if previous is None:
                break
            key = pdef.get_partition_key_for_timestamp(previous.start.timestamp())
            keys.append(key)
            window = previous
            if key == first:
                break
        return keys

    def metric_column(self) -> Column:
        """The metric over a group of rows, as a double (Spark)."""
        from pyspark.sql import functions as F

        match = _METRIC.match(self.metric)
        fn = match.group("fn") if match else None
        expr = F.count("*") if fn is None else getattr(F, fn)(match.group("col") if match else None)
        return expr.cast("double")

    def _value(self, df: DataFrame, by: Sequence[str] = ()) -> DataFrame:
        return df.groupBy(*by).agg(self.metric_column().alias("__v"))

    def evaluate(
        self,
        table: Table,
        partition: str,
        data: DataFrame,
        inputs: Mapping[str, DataFrame],
        history: DataFrame | None = None,
    ) -> Outcome:
        row = self._value(data).first()
        value = float(row["__v"]) if row is not None and row["__v"] is not None else 0.0
        past: list[float] = []
        if history is not None:
            past = [float(r["__v"] or 0.0) for r in self._value(history, table.partition_by).collect()]
        return self.judge(partition, value, past)

    def judge(self, partition: str, value: float, past: Sequence[float]) -> Outcome:
        """The verdict on a partition whose metric is ``value``, against the metrics of those of its trailing periods
        that hold rows (``past``), however they were computed (one partition's jobs, or a ranged run's grouped one)."""
        meta: dict[str, Any] = {"metric": self.metric, "value": value, "history_periods": len(past)}
        if len(past) < self.min_periods:
            return Outcome(
                self,
                partition,
                True,
                meta,
                f"{len(past)} of {self.periods} trailing periods: too little history to judge",
            )
        mean = sum(past) / len(past)
        deviation = abs(value - mean) / abs(mean) if mean else (0.0 if value == 0 else math.inf)
        limit = float(self.max_deviation)
        meta |= {"trailing_mean": round(mean, 6), "deviation": round(deviation, 6), "max_deviation": limit}
        return Outcome(
            self,
            partition,
            deviation <= limit,
            meta,
            f"{self.metric} = {value:g} vs trailing mean {mean:g}: {deviation:.1%} off (limit {limit:.0%})",
        )


# the one table of kinds, in the order the UI lists them
CHECK_KINDS: dict[str, type[Check]] = {
    kind.kind: kind for kind in (Unique, NotNull, Range, References, RowCount, Anomaly)
}


def parse_checks(spec: Any) -> tuple[Check, ...]:
    """``checks:`` of a declaration → one typed check per kind (validation against the table waits for the
    whole catalog: :meth:`Check.problem_in`)."""
    if spec is None:
        return ()
    if not isinstance(spec, Mapping):
        raise CheckSpecError(f"checks must map a check kind ({', '.join(CHECK_KINDS)}) to its parameters")
    checks = []
    for kind, value in spec.items():
        if kind not in CHECK_KINDS:
            raise CheckSpecError(f"unknown check {kind!r} (known: {', '.join(CHECK_KINDS)})")
        blocking = True
        if isinstance(value, Mapping) and "blocking" in value:
            value = dict(value)
            blocking = value.pop("blocking")
            if not isinstance(blocking, bool):
                raise CheckSpecError(f"checks.{kind}.blocking must be true or false")
        checks.append(CHECK_KINDS[kind].parse(value, blocking))
    return tuple(checks)
