"""Additive maintenance: a late change to the inputs of a total rebuilds the changed groups from the changed rows.

A table whose SQL is proven additive (:mod:`warehouse_assets.catalog.additive`: sums and counts of its inputs' rows,
of one table or of an equi-join, per group) keeps, beside its rows, their partial states: a whole build also writes,
per partition and group, each aggregate's mergeable partial and the group's row count to a side Delta table,
``<table>__state`` (same partition columns; not a catalog table, not an asset), each row stamped with the table's
Delta version it matches (whose build record holds the version of every input read). It aggregates those states once
and computes the table's rows from them, so the rows and the states come from one read of the inputs.

A rebuild for late data (where a key-scoped rebuild would be decided) then reads each input's change data feed
between the version the last build read and now, in the partitions it reads (:meth:`DeltaStore.changed_rows`: the
row images, +1 a post-image, -1 a pre-image), and sums the change per group by the delta rule of view maintenance,
in one Spark job: for each changed input, its images joined with the inputs before it as they are now and with those
after it as the last build read them (Delta time travel); the right side of a ``LEFT JOIN`` is the join with it now
minus the join with it then, over the left rows whose join key it changed. An input that did not change adds no
term. Those partial deltas are added to the stored states, the select items of the changed groups computed from their
new states, and exactly those groups' rows replaced in one commit (:meth:`AdditiveMaintainer.write_groups`: deleted
by their values and appended, or merged on the partition and the group columns): a group whose rows are all gone is
deleted. The new states are written after that commit. Distinct counts and extremes move with their (group, value)
pairs' multiplicities, kept in a value state table per argument (:mod:`warehouse_assets.materialize.additive_values`),
written after the group states. A state that is missing, or stamped with another version than the partition's last
build (that build wrote no state, or one of its state writes failed), a feed that does not cover the versions, or too
many changed rows rebuild the partition whole, which writes the states afresh; the run's log says why. Checks judge
the whole partition after the write, as after any build (from the Delta log and DataFusion counts where those prove
a pass, :mod:`warehouse_assets.materialize.log_checks`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from functools import partial, reduce
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from dagster import DagsterInstance
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from resources.delta_keys import NET
from resources.delta_lake import DeltaStore, Predicate, WriteResult
from resources.spark import arrow_frame
from warehouse_assets.catalog import Catalog, DerivedTable, Table, partition_values_of
from warehouse_assets.catalog.additive import (
    MAX_CHANGED_ROWS,
    MULTIPLICITY,
    ROWS,
    VALUE,
    Additivity,
    WarehouseTypes,
    state_key,
)
from warehouse_assets.materialize.additive_values import VERSION, ValueStates
from warehouse_assets.materialize.gate import span
from warehouse_assets.materialize.key_scope import _entry, _previous_build
from warehouse_assets.materialize.sql_text import render_sql, view_name

CHANGED = "__changed"  # a state row whose group the changed rows touched

Logger = Any  # Dagster's run logger: ``warning``


@dataclass(frozen=True)
class GroupChanges:
    """A partition's maintained rebuild: the new states of its groups, those the changed rows touched marked."""

    key: str
    states: pa.Table  # every group of the partition: group columns, partials, :data:`CHANGED`
    images: int  # row images of the inputs read from their change feeds

    @property
    def changed(self) -> int:
        return int(pc.sum(self.states[CHANGED]).as_py() or 0)


class AdditiveMaintainer:
    """For one run of one table: whether its late-data rebuilds are maintained from the changed rows, and the
    state table its whole builds and maintained rebuilds write."""

    def __init__(
        self,
        catalog: Catalog,
        table: Table,
        instance: DagsterInstance,
        spark: SparkSession,
        store: DeltaStore,
        log: Logger,
    ):
        self.catalog, self.table, self.instance, self.spark, self.store = catalog, table, instance, spark, store
        self.log = log
        self._verdict: Additivity | None = None
        self.values = ValueStates(spark, store, table)  # the distinct counts' and extremes' (group, value) pairs

    @property
    def verdict(self) -> Additivity:
        """The table's additivity, proven once per run when first needed."""
        if self._verdict is None:
            table = self.table
            self._verdict = (
                WarehouseTypes(self.catalog).verdict(table)
                if isinstance(table, DerivedTable)
                else Additivity(table.fqn, reason="not a derived table")
            )
        return self._verdict

    def render(self, sql: str, key: str, suffix: str) -> str:
        """A query of the table's (``sql`` for its own) rendered for the partition ``key`` over its inputs' views
        (``suffix``'s), as the runner renders the table's SQL."""

        assert isinstance(self.table, DerivedTable)
        return render_sql(dataclasses.replace(self.table, sql=sql), key, self.catalog, suffix)

    @property
    def state_key(self) -> list[str]:
        return state_key(self.table)

    # --- a whole build --------------------------------------------------------------------------------------------

    def whole_states(self, key: str, suffix: str) -> DataFrame | None:
        """The partition's states, planned over the views its whole build reads (``suffix``'s); None for a table that
        is not additive. States that cannot be planned fail no build: its late-data rebuilds are whole until a build
        writes them."""
        if not self.verdict.additive:
            return None
        try:
            states = self.spark.sql(self.render(self.verdict.state_sql(), key, suffix))
        except Exception as exc:
            self.log.warning(f"{self.table.fqn} {key}: partial states not planned: {exc}")
            return None
        return _with_partition(states, partition_values_of(self.table, key))

    def whole(self, key: str, out: DataFrame, suffix: str) -> tuple[DataFrame, DataFrame | None]:
        """A whole build's rows and states from one read of the input: the states aggregated once (checkpointed, so
        that neither write reads the input again), the rows computed from them as a maintained rebuild computes its
        changed groups' (``out``: the table's query, for its columns and types). A table that is not additive, or
        whose states cannot be computed, is built by its own query, without states."""
        states = self.whole_states(key, suffix)
        self.values.forget(key)
        if states is None:
            return out, None
        try:
            kept = states.localCheckpoint(eager=True)  # the one scan of the input (and one per distinct argument)
            verdict = self.verdict
            self.values.whole(verdict, key, lambda n: self.spark.sql(self.render(verdict.values_sql(n), key, suffix)))
            view = f"__additive_states{suffix}"
            kept.createOrReplaceTempView(view)
            rows = self.spark.sql(self.render(self.verdict.final_sql(view), key, suffix)).toDF(*out.columns)
            rows = rows.select(*[F.col(c).cast(t).alias(c) for c, t in out.dtypes])
        except Exception as exc:
            self.log.warning(f"{self.table.fqn} {key}: partial states not computed: {exc}")
            self.values.forget(key)
            return out, None
        return rows, kept

    def write_states(self, states: Sequence[DataFrame | pa.Table], keys: Sequence[str], version: int) -> None:
        """Replace the partitions ``keys`` of the state table with ``states``, stamped with the table's ``version``:
        one commit, after the table's own. A whole build's (Spark's, computed from its input) are written by Spark; a
        maintained rebuild's, already held here in Arrow, by delta-rs in this process (no Spark job)."""
        if not states:
            return
        table = self.table
        specs = [partition_values_of(table, k) for k in keys]
        try:
            if all(isinstance(s, pa.Table) for s in states):
                held = pa.concat_tables([s for s in states if isinstance(s, pa.Table)])
                held = held.append_column(VERSION, pa.array([version] * held.num_rows, pa.int64()))
                self.store.overwrite_rows(self.state_key, held, specs, operation="write states")
            else:
                frames = [s if isinstance(s, DataFrame) else arrow_frame(self.spark, s) for s in states]
                rows = reduce(DataFrame.unionByName, frames).withColumn(VERSION, F.lit(version).cast("bigint"))
                self.store.overwrite(self.state_key, rows, table.partition_by, specs, operation="write states")
            self.values.write(self.verdict, keys, version)  # after the group states: their stamps say which landed
        except Exception as exc:  # the rows stand: states older than them make the next late rebuild whole
            self.log.warning(f"{table.fqn}: partial states not written: {exc}")
            for k in keys:
                self.values.forget(k)

    # --- a maintained rebuild -------------------------------------------------------------------------------------

    def changes(
        self,
        key: str,
        inputs: Mapping[str, DataFrame],
        read_from: Mapping[str, Sequence[str]],
        versions: Mapping[str, int],
        predicates: Mapping[str, Sequence[Predicate]],
    ) -> tuple[GroupChanges | None, str]:
        """The new states of ``key``'s groups from its inputs' changes since the last build (``inputs``: their rows
        now, read at ``versions`` from the partitions ``read_from``, filtered by ``predicates``), or None and why the
        partition is rebuilt whole."""
        verdict = self.verdict
        if not verdict.additive:
            return None, verdict.describe()
        previous = _previous_build(self.instance, self.table, key)
        entry = _entry(self.instance, self.table, key)
        if previous is None or entry is None:
            return None, "its last build recorded no input versions"
        before_versions, before_read = previous
        for name in verdict.inputs:
            if name not in versions or name not in before_versions or name not in inputs:
                return None, f"the versions of {name} read are not known"
            if before_read.get(name) != span(list(read_from.get(name, []))):
                return None, f"reads other partitions of {name} than its last build ({before_read.get(name)})"
        stored, why = self._stored(key, entry.get("delta_version"))
        why = why or self.values.stamped(verdict, key, entry.get("delta_version"))
        if stored is None or why:
            return None, why
        images: dict[str, pa.Table] = {}
        left = MAX_CHANGED_ROWS  # the images every input's feed may still add
        for name in verdict.inputs:
            after, until = before_versions[name], versions[name]
            if until == after:
                continue  # not changed: its term vanishes
            specs = [partition_values_of(self.catalog[name], k) for k in read_from.get(name, [])]
            found = self.store.changed_rows(self.spark, self.catalog[name].key, specs, after, until, left)
            if found is None:
                return None, f"{name}'s change data feed does not cover versions {after + 1}-{until}"
            if found.num_rows > left:
                return None, f"more than {MAX_CHANGED_ROWS:,} rows of {' and '.join(verdict.inputs)} changed"
            if found.num_rows:
                images[name], left = found, left - found.num_rows
        old = {name: (before_versions[name], read_from.get(name, [])) for name in verdict.inputs}
        try:
            terms = _Terms(inputs, images, old, predicates)
            groups = list(verdict.group_columns)
            sums = [p.name for p in verdict.partials if p.summed]
            delta = self._delta(key, terms, lambda w: verdict.state_sql(w, whole=False), groups, sums)
            states = self._added(stored, delta)
            if verdict.values:  # each argument's pairs changed by the same terms, then the groups' counts and extremes
                pairs = [
                    self._delta(key, terms, partial(verdict.values_sql, n), [*groups, VALUE], [MULTIPLICITY])
                    for n in range(len(verdict.values))
                ]
                states = self.values.update(verdict, key, states, pairs)
        except Exception as exc:  # a rebuild that cannot be maintained is rebuilt whole, not failed
            return None, f"the changed rows could not be added to the partial states: {exc}"
        if verdict.group_by:
            touched = states.filter(states[CHANGED])
            if any(touched.column(g).null_count for g in verdict.group_columns):
                return None, "a changed group is null (a MERGE matches no null)"
            if not touched.num_rows:
                if not states.num_rows:
                    return None, "its partition holds no group"
                # nothing its groups sum changed: one group replaced by the same row still records the rebuild
                flags = pa.array([i == 0 for i in range(states.num_rows)])
                states = states.set_column(states.schema.get_field_index(CHANGED), CHANGED, flags)
        else:  # one total per partition, there with no row too: always the one replaced
            states = states.set_column(states.schema.get_field_index(CHANGED), CHANGED, pa.array([True]))
        return GroupChanges(key, states, sum(t.num_rows for t in images.values())), ""

    def _stored(self, key: str, built: object) -> tuple[pa.Table | None, str]:
        """The partition's stored states, if they match its last build (its Delta version ``built``)."""
        if not self.store.exists(self.state_key):
            return None, "no partial states stored (the table was last built before they were)"
        rows, _ = self.store.read_rows(self.state_key, [partition_values_of(self.table, key)])
        if not rows.num_rows:
            return None, "no partial states stored for the partition"
        stamped = set(rows.column(VERSION).to_pylist())
        if stamped != {built}:
            return None, f"its partial states match version {min(stamped)}, not its last build's ({built})"
        drop = [c for c in rows.column_names if c in self.table.partition_by or c == VERSION]
        return rows.drop_columns(drop), ""

    def _delta(
        self, key: str, terms: _Terms, query: Callable[[str], str], by: Sequence[str], sums: Sequence[str]
    ) -> DataFrame:
        """The partials of the change per group, one Spark job: the delta rule's terms (one per changed input, each
        weighted row counted in its group: ``query(weight)``) in one UNION ALL, summed per ``by``; ``sums``: the
        columns summed."""

        verdict, spark = self.verdict, self.spark
        order = verdict.inputs
        changed = [i for i, name in enumerate(order) if name in terms.images] or [0]  # none: an empty term
        views: list[str] = []
        frames: list[DataFrame] = []

        def planned(suffix: str, frames_of: Mapping[str, DataFrame], weight: str) -> DataFrame:
            for name, frame in frames_of.items():
                views.append(view_name(name, suffix))
                frame.createOrReplaceTempView(views[-1])
            return spark.sql(self.render(query(weight), key, suffix))

        try:  # the views dropped however the terms' planning ends
            for i in changed:
                name = order[i]
                images = terms.changed(spark, name)
                # the inputs joined before the changed one as they are now, those after it as the last build read them
                others = {
                    o: terms.now(o) if j < i else terms.then(spark, self.store, self.catalog, o)
                    for j, o in enumerate(order)
                    if j != i
                }
                join = verdict.joins[i - 1] if i else None
                if join is None or not join.left:  # linear in this input: its images, each weighted +1 or -1
                    frames.append(planned(f"__delta{i}", {**others, name: images}, f"{verdict.aliases[i]}.{NET}"))
                    continue
                # the right side of a LEFT JOIN flips rows of the left between matched and NULL-extended: the join with
                # it now minus the join with it then, over the left rows whose join key is among its changed keys
                alias_of = dict(zip(verdict.aliases, order, strict=True))
                for other_alias in dict.fromkeys(a for _, a, _ in join.keys):
                    pairs = [(own, col) for own, a, col in join.keys if a == other_alias]
                    other = alias_of[other_alias]
                    keys = images.select(*[F.col(own).alias(f"__k{n}") for n, (own, _) in enumerate(pairs)]).distinct()
                    matched = reduce(
                        lambda a, b: a & b, [others[other][c] == keys[f"__k{n}"] for n, (_, c) in enumerate(pairs)]
                    )
                    others[other] = others[other].join(keys, matched, "left_semi")
                then = terms.then(spark, self.store, self.catalog, name)
                frames.append(planned(f"__now{i}", {**others, name: terms.now(name)}, "1"))
                frames.append(planned(f"__then{i}", {**others, name: then}, "-1"))
            union = reduce(DataFrame.unionByName, frames)
            totals = [F.sum(name).alias(name) for name in sums]
            total = union.groupBy(*by).agg(*totals) if by else union.agg(*totals)
            return arrow_frame(spark, total.toArrow())
        finally:
            for view in views:
                spark.catalog.dropTempView(view)

    def _added(self, stored: pa.Table, delta: DataFrame) -> pa.Table:
        """The stored states plus the deltas, per group (groups matched null-safely), in the stored types; the
        groups the deltas touched marked :data:`CHANGED`."""
        verdict = self.verdict
        old = arrow_frame(self.spark, stored)
        groups = verdict.group_columns
        on = [old[g].eqNullSafe(delta[g]) for g in groups]
        joined = old.join(delta, reduce(lambda a, b: a & b, on), "full_outer") if on else old.crossJoin(delta)
        items = [F.coalesce(old[g], delta[g]).alias(g) for g in groups]
        for p in verdict.partials:
            kind = old.schema[p.name].dataType
            if not p.summed:  # a distinct count or an extreme: moved by its value states next
                items.append(old[p.name])
                continue
            total = F.coalesce(old[p.name], F.lit(0)) + F.coalesce(delta[p.name], F.lit(0))
            items.append(total.cast(kind).alias(p.name))
        touched = delta[ROWS].isNotNull() if groups else F.lit(True)
        return joined.select(*items, touched.alias(CHANGED)).toArrow()

    def write_groups(
        self, rows: Sequence[DataFrame], replaced: Sequence[DataFrame], changes: Sequence[GroupChanges]
    ) -> WriteResult:
        """The maintained partitions' one commit of their changed groups' new ``rows`` (``replaced``: those groups, as
        :meth:`rows` names them). A total without ``GROUP BY`` holds one row per partition: its partitions are
        overwritten. One partition's groups of one column whose values are literals are deleted by those values and
        appended (:meth:`DeltaStore.replace_rows_where`: a few Spark jobs, no join against the table, and the values
        recorded in the commit for the readers' key-scoped rebuilds); other groups are merged by their columns."""
        table, verdict, store = self.table, self.verdict, self.store
        specs = [partition_values_of(table, c.key) for c in changes]
        union = reduce(DataFrame.unionByName, rows)
        if not verdict.group_by:
            return store.overwrite(table.key, union, table.partition_by, specs, operation="replace totals")
        one = len(changes) == 1 and len(verdict.group_columns) == 1
        values = _literal_groups(changes[0], verdict.group_columns[0]) if one else None
        if values:
            [column] = verdict.group_outputs
            return store.replace_rows_where(
                self.spark, table.key, union, table.partition_by, specs[0], column, {column: values}
            )
        groups, by = reduce(DataFrame.unionByName, replaced), verdict.group_outputs
        return store.replace_keys(self.spark, table.key, union, groups, by, table.partition_by, specs)

    def rows(self, changes: GroupChanges, out: DataFrame, suffix: str) -> tuple[DataFrame, DataFrame, pa.Table]:
        """The changed groups' new rows (``out``'s columns and types: the table's query planned for the partition),
        the groups its commit replaces (their group columns and the partition's), and the partition's new states."""
        verdict, spark = self.verdict, self.spark
        spec = partition_values_of(self.table, changes.key)
        states = changes.states
        kept = states.filter(pc.greater(states[ROWS], 0)) if verdict.group_by else states
        touched = states.filter(states[CHANGED])
        live = touched.filter(pc.greater(touched[ROWS], 0)) if verdict.group_by else touched
        view = f"__additive_states{suffix}"
        arrow_frame(spark, live.drop_columns([CHANGED])).createOrReplaceTempView(view)
        final = spark.sql(self.render(verdict.final_sql(view), changes.key, suffix)).toDF(*out.columns)
        final = final.select(*[F.col(c).cast(t).alias(c) for c, t in out.dtypes])
        if verdict.group_by:
            groups = arrow_frame(spark, touched.select(list(verdict.group_columns)))
            named = zip(verdict.group_columns, verdict.group_outputs, strict=True)
            changed = _with_partition(groups.select(*[F.col(g).alias(o) for g, o in named]), spec)
        else:
            changed = spark.range(1).select(*[F.lit(v).alias(c) for c, v in spec.items()])
        new_states = kept.drop_columns([CHANGED])
        for column, value in spec.items():
            new_states = new_states.append_column(column, pa.array([value] * new_states.num_rows, pa.string()))
        return final, changed, new_states


@dataclass
class _Terms:
    """What the delta rule's terms read: each input's rows now, the changed inputs' images, and each input's
    version and partitions as its last build read them (read once per rebuild when a term needs them)."""

    inputs: Mapping[str, DataFrame]  # now
    images: Mapping[str, pa.Table]  # the changed inputs' row images, with their weights
    old: Mapping[str, tuple[int, Sequence[str]]]  # the version and the partitions read by the last build
    predicates: Mapping[str, Sequence[Predicate]]
    _then: dict[str, DataFrame] = dataclasses.field(default_factory=dict)

    def now(self, name: str) -> DataFrame:
        return self.inputs[name]

    def then(self, spark: SparkSession, store: DeltaStore, catalog: Catalog, name: str) -> DataFrame:
        """The input's rows as its last build read them: Delta time travel to that version."""
        if name not in self._then:
            version, used = self.old[name]
            upstream = catalog[name]
            specs = [partition_values_of(upstream, k) for k in used]
            self._then[name] = store.read(spark, upstream.key, specs, self.predicates.get(name, ()), version)[0]
        return self._then[name]

    def changed(self, spark: SparkSession, name: str) -> DataFrame:
        """The input's changed row images in its own types, each with its weight (:data:`NET`), filtered as its
        rows are read (a tombstone's images drop out)."""
        schema = self.inputs[name]
        found = self.images.get(name)
        if found is not None and found.num_rows:
            frame = arrow_frame(spark, found)
            frame = frame.select(*[F.col(c).cast(t).alias(c) for c, t in schema.dtypes], F.col(NET).cast("bigint"))
        else:
            frame = schema.limit(0).withColumn(NET, F.lit(0).cast("bigint"))
        for p in self.predicates.get(name, ()):
            frame = frame.where(p.spark_sql())
        return frame


def _literal_groups(changes: GroupChanges, column: str) -> list[Any] | None:
    """The changed groups' values of a table grouped by the one state column ``column``, when each is a literal a
    ``replaceWhere`` can name (a float's text may not compare equal to it); None otherwise."""
    values = changes.states.filter(changes.states[CHANGED]).column(column).unique().to_pylist()
    literal = (str, int, date, datetime, Decimal)
    return values if values and all(isinstance(v, literal) for v in values) else None


def _with_partition(df: DataFrame, spec: Mapping[str, str]) -> DataFrame:
    return df.select(*[c for c in df.columns if c not in spec], *[F.lit(v).alias(c) for c, v in spec.items()])
