"""The value states of a maintained total's distinct counts and extremes: per argument ``e`` of ``count(DISTINCT e)``,
``min(e)`` or ``max(e)``, a Delta table beside the table, ``<table>__state_<n>``, of the (group, value) pairs of the
partition with their multiplicity (the rows holding the value), as Materialize arranges distinct values.

One table per argument, not one long table of every argument: a value keeps ``e``'s own type there, so Spark orders,
compares and hashes it as the table's query does (a long table would hold every argument's values as one type, and
the string of a number does not order as the number). A whole build writes each partition's pairs (one extra
aggregate of its input per argument). A maintained rebuild adds its images' +1/-1 to the touched pairs only, reading
the stored multiplicity of those pairs alone (narrowed to their values, so Delta and Parquet skip the rest), and moves
the group's state: the distinct count by the pairs that became present minus those that became absent, an extreme to
the least (greatest) of itself and the values that became present; only a group whose extreme became absent reads its
remaining pairs. The touched pairs, held in Arrow, are written back in one ``MERGE`` per argument (a pair at 0
deleted) by delta-rs in this process: no Spark job.

Each partition holds a *stamp* row (group and value NULL, multiplicity NULL) carrying the table's Delta version its
pairs match, updated by every write of the partition in the same commit as the pairs. The pairs are written after
the table's commit and the group states': a crash between those commits leaves the stamp on the older version, and
the next late rebuild, which checks the stamps of the group states and of every value table against the
partition's last build, rebuilds it whole (which writes every state afresh).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from resources.delta_keys import MAX_LITERAL_VALUES
from resources.delta_lake import DeltaStore, Predicate
from resources.spark import arrow_frame
from warehouse_assets.catalog import Table, partition_values_of
from warehouse_assets.catalog.additive import MULTIPLICITY, VALUE, VALUED, Additivity, state_key

VERSION = "__version"  # the table's Delta version a state row (a value table's stamp row) matches
_BEFORE = "__before"  # a touched pair's multiplicity before the change
_LOST = "__lost"  # a group whose extreme's pair went to 0


def _null_safe(a: DataFrame, b: DataFrame, columns: Sequence[str]) -> Column | None:
    parts = [a[c].eqNullSafe(b[c]) for c in columns]
    return reduce(lambda x, y: x & y, parts) if parts else None


def _join(a: DataFrame, b: DataFrame, columns: Sequence[str], how: str) -> DataFrame:
    """``a`` joined with ``b`` on ``columns`` null-safely, ``b``'s copies of them dropped (a cross join without)."""
    on = _null_safe(a, b, columns)
    if on is None:
        return a.crossJoin(b)
    joined = a.join(b, on, how)
    if how in ("left_semi", "left_anti"):
        return joined
    kept = [F.coalesce(a[c], b[c]).alias(c) if how == "full_outer" else a[c] for c in columns]
    return joined.select(
        *kept, *[a[c] for c in a.columns if c not in columns], *[b[c] for c in b.columns if c not in columns]
    )


def _narrowing(values: list[object]) -> list[Predicate]:
    """The touched values as a literal IN, when few and literal: Delta skips the files, Parquet the pages, without
    them."""
    literal = (str, int, date, datetime, Decimal)
    if not 0 < len(values) <= MAX_LITERAL_VALUES or not all(isinstance(v, literal) for v in values):
        return []
    return [Predicate(VALUE, "in", values)]


@dataclass
class ValueStates:
    """The value tables of one table in one run: what its whole builds and maintained rebuilds write to them."""

    spark: SparkSession
    store: DeltaStore
    table: Table
    _written: dict[str, tuple[str, list[DataFrame] | list[pa.Table]]] = field(default_factory=dict)

    def key(self, n: int) -> list[str]:
        return state_key(self.table, n)

    def whole(self, verdict: Additivity, key: str, planned: Callable[[int], DataFrame]) -> None:
        """Keep the partition's pairs of each argument (``planned(n)``: its query over the build's views), checkpointed
        as the group states are, for :meth:`write`."""
        self._written.pop(key, None)
        if verdict.values:
            self._written[key] = ("whole", [planned(n).localCheckpoint(eager=True) for n in range(len(verdict.values))])

    def forget(self, key: str) -> None:
        self._written.pop(key, None)

    def stamped(self, verdict: Additivity, key: str, built: object) -> str:
        """Why the partition's value states do not match its last build (Delta version ``built``), "" when they do."""
        spec = partition_values_of(self.table, key)
        for n, arg in enumerate(verdict.values):
            if not self.store.exists(self.key(n)):
                return f"no value states of {arg} stored"
            rows, _ = self.store.read_rows(self.key(n), [spec], [VERSION], where=f'"{VALUE}" IS NULL')
            stamps = set(rows.column(VERSION).to_pylist())
            if stamps != {built}:
                found = sorted(stamps) or "none"
                return f"the value states of {arg} match version {found}, not its last build's ({built})"
        return ""

    def update(self, verdict: Additivity, key: str, states: pa.Table, deltas: Sequence[DataFrame]) -> pa.Table:
        """The group states ``states`` with their distinct counts and extremes moved by the pairs' changes ``deltas``
        (per argument: group columns, :data:`VALUE`, the change of :data:`MULTIPLICITY`); the touched pairs kept for
        :meth:`write`."""
        touched: list[pa.Table] = []
        for n, delta in enumerate(deltas):
            states, pairs = self._moved(verdict, key, n, states, delta)
            touched.append(pairs)
        self._written[key] = ("pairs", touched)
        return states

    def _moved(
        self, verdict: Additivity, key: str, n: int, states: pa.Table, delta: DataFrame
    ) -> tuple[pa.Table, pa.Table]:
        spark, groups = self.spark, list(verdict.group_columns)
        spec = partition_values_of(self.table, key)
        change = delta.where(F.col(MULTIPLICITY) != 0).toArrow()
        stored = self.store.read(spark, self.key(n), [spec])[0].where(F.col(VALUE).isNotNull())
        stored = stored.select(*groups, VALUE, MULTIPLICITY)
        narrowed = stored
        for predicate in _narrowing(pc.unique(change[VALUE]).to_pylist()):
            narrowed = narrowed.where(predicate.spark_sql())
        # each use of a small frame its own plan: Spark refuses a join of two branches of one frame as ambiguous
        d = arrow_frame(spark, change).withColumnRenamed(MULTIPLICITY, "__d")
        old = _join(narrowed, arrow_frame(spark, change).select(*groups, VALUE), [*groups, VALUE], "left_semi")
        both = _join(old, d, [*groups, VALUE], "full_outer")
        before = F.coalesce(F.col(MULTIPLICITY), F.lit(0)).cast("bigint")
        pairs = both.select(
            *groups, VALUE, before.alias(_BEFORE), (before + F.coalesce("__d", F.lit(0))).alias("__after")
        )
        found = pairs.toArrow()
        if len(found) and pc.min(found["__after"]).as_py() < 0:
            raise ValueError(
                f"a value of {verdict.values[n]} held by fewer than 0 rows: the value states are not the rows'"
            )
        p = arrow_frame(spark, found)
        came = (F.col(_BEFORE) <= 0) & (F.col("__after") > 0)
        went = (F.col(_BEFORE) > 0) & (F.col("__after") <= 0)
        moves = [
            (F.sum(F.when(came, 1).otherwise(0)) - F.sum(F.when(went, 1).otherwise(0))).alias("__dcount"),
            F.min(F.when(came, F.col(VALUE))).alias("__came_min"),
            F.max(F.when(came, F.col(VALUE))).alias("__came_max"),
            F.min(F.when(went, F.col(VALUE))).alias("__went_min"),
            F.max(F.when(went, F.col(VALUE))).alias("__went_max"),
        ]
        summary = p.groupBy(*groups).agg(*moves) if groups else p.agg(*moves)
        own = [q for q in verdict.partials if q.kind in VALUED and q.arg == verdict.values[n]]
        # an extreme is lost when the least (greatest) value that went is the group's extreme itself: none below it
        lost = [
            F.col(q.name) == F.col("__went_min" if q.kind == "min" else "__went_max")
            for q in own
            if q.kind != "distinct"
        ]
        joined = _join(arrow_frame(spark, states), summary, groups, "left")
        flag = F.coalesce(reduce(lambda a, b: a | b, lost), F.lit(False)) if lost else F.lit(False)
        merged = joined.withColumn(_LOST, flag).toArrow()
        lost_groups = merged.filter(merged[_LOST]).select(groups)
        frame = arrow_frame(spark, merged)
        if lost and lost_groups.num_rows:  # only those groups read their remaining pairs
            lost_frame = arrow_frame(spark, lost_groups) if groups else None
            rest = stored if lost_frame is None else _join(stored, lost_frame, groups, "left_semi")
            rest = _join(rest, arrow_frame(spark, found).select(*groups, VALUE), [*groups, VALUE], "left_anti")
            now = arrow_frame(spark, found).where(F.col("__after") > 0).select(*groups, VALUE)
            if lost_frame is not None:
                now = _join(now, arrow_frame(spark, lost_groups), groups, "left_semi")
            remaining = rest.select(*groups, VALUE).unionByName(now)
            ends = [F.min(VALUE).alias("__rest_min"), F.max(VALUE).alias("__rest_max")]
            found_ends = (remaining.groupBy(*groups).agg(*ends) if groups else remaining.agg(*ends)).toArrow()
            frame = _join(frame, arrow_frame(spark, found_ends), groups, "left")
        else:
            frame = frame.withColumn("__rest_min", F.lit(None)).withColumn("__rest_max", F.lit(None))
        items = []
        for name in states.column_names:
            q = next((q for q in own if q.name == name), None)
            kind = frame.schema[name].dataType
            if q is None:
                items.append(F.col(name))
            elif q.kind == "distinct":
                items.append(
                    (F.coalesce(F.col(name), F.lit(0)) + F.coalesce("__dcount", F.lit(0))).cast(kind).alias(name)
                )
            else:
                came_end, rest_end = (f"__came_{q.kind}", f"__rest_{q.kind}")
                merge = F.least if q.kind == "min" else F.greatest
                new = F.when(F.col(_LOST), F.col(rest_end)).otherwise(merge(F.col(name), F.col(came_end)))
                items.append(new.cast(kind).alias(name))
        moved = frame.select(*items).toArrow()
        return moved, found.select([*groups, VALUE, "__after"]).rename_columns([*groups, VALUE, MULTIPLICITY])

    def write(self, verdict: Additivity, keys: Sequence[str], version: int) -> None:
        """Write the kept pairs of ``keys`` with their stamps at the table's ``version``: one commit per argument and
        kind of build (an overwrite of whole builds' partitions by Spark, which computed them; a MERGE of maintained
        rebuilds' touched pairs, held here in Arrow, by delta-rs in this process)."""
        table, spark = self.table, self.spark
        for kind in ("whole", "pairs"):
            mine = [k for k in keys if k in self._written and self._written[k][0] == kind]
            if not mine:
                continue
            specs = [partition_values_of(table, k) for k in mine]
            for n in range(len(verdict.values)):
                if kind == "pairs":
                    held = [self._written[k][1][n] for k in mine]
                    pairs = [
                        _stamped(p, version, spec)
                        for p, spec in zip(held, specs, strict=True)
                        if isinstance(p, pa.Table)
                    ]
                    on = [*verdict.group_columns, VALUE]
                    self.store.merge_counts(self.key(n), pa.concat_tables(pairs), on, MULTIPLICITY, specs)
                    continue
                frames = []
                for k, spec in zip(mine, specs, strict=True):
                    found = self._written[k][1][n]
                    rows = found if isinstance(found, DataFrame) else arrow_frame(spark, found)
                    stamp = spark.range(1).select(*[F.lit(None).cast(t).alias(c) for c, t in rows.dtypes])
                    rows = rows.unionByName(stamp).withColumn(VERSION, F.lit(version).cast("bigint"))
                    frames.append(rows.select(*rows.columns, *[F.lit(v).alias(c) for c, v in spec.items()]))
                union = reduce(DataFrame.unionByName, frames)
                self.store.overwrite(self.key(n), union, table.partition_by, specs, operation="write value states")
        for k in keys:
            self._written.pop(k, None)


def _stamped(pairs: pa.Table, version: int, spec: Mapping[str, str]) -> pa.Table:
    """A partition's touched pairs and its stamp row (every column null), each with the table's ``version`` and the
    partition's values."""
    nullable = pa.schema([f.with_nullable(True) for f in pairs.schema])  # Spark marks a computed count not null
    stamp = pa.table({f.name: pa.nulls(1, f.type) for f in nullable}, schema=nullable)
    rows = pa.concat_tables([pairs.cast(nullable), stamp])
    rows = rows.append_column(VERSION, pa.array([version] * rows.num_rows, pa.int64()))
    for column, value in spec.items():
        rows = rows.append_column(column, pa.array([value] * rows.num_rows, pa.string()))
    return rows
