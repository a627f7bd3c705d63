"""Key-scoped rebuilds: a late change to a few keys rebuilds those keys' rows, not the whole partition.

A rebuild for late data (the dependency center's run tagged with the late changes it absorbs) of a table whose SQL is
proven key-local (:mod:`warehouse_assets.catalog.key_locality`: its rows for a key are computed only from input rows
carrying that key) asks each input what changed since the partition's last build read it: Delta's change data feed
between the version that build read (recorded in its materialization) and the version read now, in the input
partitions it reads, gives the values of the columns carrying the key, before and after each change (a row moved from
one user to another names both users). The partition's query then runs on those keys' input rows only, and one
commit replaces exactly those keys' rows: an overwrite whose ``replaceWhere`` names the partition and the keys as
literals (:meth:`resources.delta_lake.DeltaStore.replace_rows_where`; Delta deletes by it with deletion vectors and
appends, a few Spark jobs, however many keys: a long list is a hash set to Spark) for one partition's keys of one
column; else a ``MERGE`` of the keys (:meth:`resources.delta_lake.DeltaStore.replace_keys`), whose joins against the
table cost tens of jobs and two reads of the partition. Of an input
unique by the columns carrying the key (a row-local table over its input's primary key) the feed holds each changed
key's one row as it is now, so those rows are taken from it, not from a scan of the input's partitions. The table's own
commit is in its change feed in turn, so the next table down reads the keys that changed from it.

What a key-scoped rebuild reads is what holds its keys: a whole write of a key-local table lays each partition out by
the columns its rows are looked up by (:meth:`KeyScoper.laid_out`: its Z-order columns, which its readers' rebuilds
scan by, else its key), and the keys go to Delta as literals: on the ``MERGE``'s target with, for a table copying the
column its files are ordered by from its input, that column's values in the input's rows as the last build read them
(where the replaced rows sit), and on a scan of an input for the changed keys. Delta then skips the files, and
Parquet the pages, that hold none of them.

Whatever cannot be proven is rebuilt whole, as before, and the run's log says why: not a late-data rebuild, an input
the last build did not record or read otherwise, an input whose change feed does not cover the versions (a table
written before it recorded changes), a changed key that is null, or so many changed keys that a whole rebuild costs
less. Checks still judge the whole partition after the write: from the Delta log's statistics and DataFusion counts
where those prove a pass (:mod:`warehouse_assets.materialize.log_checks`), else on Spark, which reads it back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from dagster import DagsterInstance
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from sqlglot import exp
from sqlglot.errors import SqlglotError

from resources.delta_keys import MAX_LITERAL_VALUES, NET
from resources.delta_lake import CHANGE_FEED, CHANGE_TRACKING, DeltaStore, Predicate
from resources.spark import arrow_frame
from warehouse_assets.catalog import Catalog, DerivedTable, Table, partition_values_of
from warehouse_assets.catalog.key_locality import MAX_KEYS, MAX_SHARE, SMALL_PARTITION, KeyLocality, key_locality
from warehouse_assets.catalog.lineage import WarehouseLineage, qualified_scope
from warehouse_assets.materialize.gate import LATE_CHANGES_TAG, span
from warehouse_assets.materialize.quality import latest_materialization

# A whole write reading at least this much is laid out for key-scoped rebuilds (:meth:`KeyScoper.laid_out`): below,
# its partition is a file or two that a rebuild reads in a moment anyway, not worth the range shuffle
LAYOUT_MIN_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class KeyScope:
    """The keys whose rows a partition's rebuild replaces: the output key's columns, one row per key."""

    key_columns: tuple[str, ...]
    keys: pa.Table
    carried_from: Mapping[str, tuple[str, ...]]
    # input → the changed keys' rows in it now, taken from its change feed (an input unique by the key)
    rows: Mapping[str, pa.Table] = field(default_factory=dict)
    # output column → the values the rows the rebuild replaces hold in it, beyond the keys' own (where they sit)
    sits: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    # the inputs whose changed keys came from what their commits recorded, not from their change feed
    recorded: tuple[str, ...] = ()

    def narrow(self) -> dict[str, list[Any]]:
        """Column → values every row the rebuild replaces holds there: each key column's changed values, and where
        those rows sit; given to the MERGE as literals on its target, so that it reads only the files and Parquet
        pages that hold them. Empty past :data:`MAX_LITERAL_VALUES` values (the MERGE then reads the partition)."""
        found = {c: self.keys.column(c).unique().to_pylist() for c in self.key_columns}
        found |= {c: list(v) for c, v in self.sits.items()}
        return {c: v for c, v in found.items() if 0 < len(v) <= MAX_LITERAL_VALUES and None not in v}

    def replaced_where(self) -> dict[str, list[Any]]:
        """What a write replacing these keys' rows names them by (:meth:`DeltaStore.replace_rows_where`): the one key
        column's values however many (a long literal list is a hash set to Spark, which reads the key column once
        to delete by it: no join, cheaper than a MERGE), with where the rows sit when :meth:`narrow` names it. Empty
        for a key of several columns or no keys: those are merged."""
        if len(self.key_columns) != 1 or not self.keys.num_rows:
            return {}
        [column] = self.key_columns
        return {**self.narrow(), column: self.keys.column(column).unique().to_pylist()}

    def only_keys(
        self, spark: SparkSession, name: str, df: DataFrame, predicates: Sequence[Predicate] = ()
    ) -> DataFrame:
        """The rows of the input ``name`` (``df``, read with ``predicates``) that carry one of the keys: from the
        change feed when it holds them all, else ``df`` joined with the keys (a scan of the partitions read)."""
        if name in self.rows:
            if not self.rows[name].num_rows:
                return df.limit(0)
            frame = arrow_frame(spark, self.rows[name])
            frame = frame.select(*[F.col(c).cast(t).alias(c) for c, t in df.dtypes])  # the input's own types
            for p in predicates:
                frame = frame.where(p.spark_sql())
            return frame
        columns = self.carried_from[name]
        wanted = self.keys.rename_columns(list(columns))
        named = 0
        for column in columns:  # literals first: Delta skips files, Parquet pages, that hold none of the keys
            values = wanted.column(column).drop_null().unique().to_pylist()
            if len(values) <= MAX_LITERAL_VALUES:
                df = df.where(F.col(column).isin(values))
                named += 1
        if len(columns) == 1 and named:  # the literals are the keys: a join with them would add a job, not a filter
            return df
        return df.join(F.broadcast(arrow_frame(spark, wanted)), list(columns), "left_semi")

    def changed(self, spark: SparkSession, partition: Mapping[str, str]) -> DataFrame:
        """The keys with the partition's column values: what :meth:`DeltaStore.replace_keys` replaces."""
        frame = arrow_frame(spark, self.keys)
        return frame.select(*self.key_columns, *[F.lit(v).alias(c) for c, v in partition.items()])


class KeyScoper:
    """For one run of one table: which of its partitions are rebuilt by key, and which keys."""

    def __init__(
        self,
        catalog: Catalog,
        table: Table,
        instance: DagsterInstance,
        tags: Mapping[str, str],
        spark: SparkSession,
        store: DeltaStore,
    ):
        self.catalog, self.table, self.instance, self.spark, self.store = catalog, table, instance, spark, store
        self.late = set(json.loads(tags.get(LATE_CHANGES_TAG, "{}")))
        self._locality: KeyLocality | None = None
        self._inputs: dict[str, tuple[str, ...]] | None = None

    @property
    def locality(self) -> KeyLocality | None:
        """The table's key locality, proven once per run when first needed (None: not a derived table)."""
        table = self.table
        if self._locality is None and isinstance(table, DerivedTable):
            try:
                self._locality = key_locality(table, self._input_columns(table))
            except Exception as exc:  # as the build's column lineage: a proof that fails is no reason to fail it
                self._locality = KeyLocality(table.fqn, table.primary_key, reason=f"lineage not followed: {exc!r}")
        return self._locality

    def _input_columns(self, table: DerivedTable) -> dict[str, tuple[str, ...]]:
        """The columns of each table ``table`` reads, from the lineage: followed once per run."""
        if self._inputs is None:
            self._inputs = WarehouseLineage(self.catalog).input_columns(table)
        return self._inputs

    def cluster_columns(self) -> tuple[str, ...]:
        """What a key-local table's partitions are written ordered by, so that a few keys' rows sit in few files and
        Parquet pages: the columns it is Z-ordered by, which its readers look rows up by (a reader's key-scoped
        rebuild reads the changed keys' rows by them); else its primary key, which its own key-scoped rebuilds
        replace rows by. None for a table rebuilt whole."""
        locality = self.locality
        if locality is None or not locality.key_local:
            return ()
        return tuple(self.table.zorder) or tuple(locality.key)

    def laid_out(self, df: DataFrame, partition_by: Sequence[str]) -> DataFrame:
        """``df`` (a whole write's rows) ordered for :meth:`cluster_columns`: ranges of them to each file, sorted
        within it, so each file's statistics and each Parquet page's column index span a narrow range of them."""
        columns = [c for c in self.cluster_columns() if c in df.columns]
        if not columns:
            return df
        order = [*partition_by, *columns]
        return df.repartitionByRange(*order).sortWithinPartitions(*order)

    def table_properties(self) -> dict[str, str]:
        """What the table is created with: every derived table records its changes (its readers' key-scoped rebuilds
        read them); a key-local one also has deletion vectors, which its own key-scoped rebuilds mark replaced rows
        in (Spark and delta-rs's DataFusion reader apply them; delta-rs's Arrow reader refuses such tables)."""
        locality = self.locality
        return dict(CHANGE_TRACKING) if locality and locality.key_local else {CHANGE_FEED: "true"}

    def scope(
        self, partition: str, read_from: Mapping[str, Sequence[str]], versions: Mapping[str, int]
    ) -> tuple[KeyScope | None, str]:
        """The keys of ``partition``'s rebuild (its inputs read at ``versions``, their partitions ``read_from``), or
        None and why the partition is rebuilt whole."""
        if partition not in self.late:
            return None, "not a rebuild for late data"
        locality = self.locality
        if locality is None or not locality.key_local:
            return None, locality.reason if locality else "not a derived table"
        previous = _previous_build(self.instance, self.table, partition)
        if previous is None:
            return None, "its last build recorded no input versions"
        before_versions, before_read = previous
        frames: list[pa.Table] = []
        for name in read_from:
            if name not in locality.carried_from:
                return None, f"reads {name}, which does not carry the key"
        feed = self._rows_from_feed(locality, read_from, versions, before_versions, before_read)
        if isinstance(feed, str):
            return None, feed
        current: dict[str, pa.Table] = {}
        sits: dict[str, tuple[Any, ...]] = {}
        recorded: list[str] = []
        if feed is not None:  # the keys are those of the feed's rows
            name, images = feed
            frames.append(images.select(list(locality.carried_from[name])).rename_columns(list(locality.key)))
            current[name] = images.filter(pc.greater(images[NET], 0)).drop_columns([NET])
            sits = self._sits(name, images.filter(pc.less(images[NET], 0)))
        for name, columns in locality.carried_from.items() if feed is None else ():
            used = list(read_from.get(name, []))
            if name not in versions or name not in before_versions:
                return None, f"the versions of {name} read are not known"
            if before_read.get(name) != span(used):
                return None, f"reads other partitions of {name} than its last build ({before_read.get(name)})"
            upstream = self.catalog[name]
            specs = [partition_values_of(upstream, k) for k in used]
            found = self._recorded(upstream, columns, specs, before_versions[name], versions[name])
            if found is not None:
                recorded.append(name)
            else:
                found = self.store.changed_values(
                    self.spark, upstream.key, columns, specs, before_versions[name], versions[name], MAX_KEYS
                )
            if found is None:
                return None, (
                    f"{name}'s change data feed does not cover versions {before_versions[name] + 1}-{versions[name]}"
                )
            frames.append(found.rename_columns(list(locality.key)))
        keys = _distinct(frames, locality.key)
        if keys is None:
            return None, "the changed keys' types differ between inputs"
        if any(keys.column(c).null_count for c in locality.key):
            return None, "a changed key is null"
        if keys.num_rows > MAX_KEYS:
            return None, f"more than {MAX_KEYS:,} keys changed"
        rows = _rows_before(self.instance, self.table, partition)
        if rows is not None and rows >= SMALL_PARTITION and keys.num_rows > MAX_SHARE * rows:
            return None, f"{keys.num_rows:,} keys changed of {rows:,} rows: a whole rebuild costs less"
        return KeyScope(locality.key, keys, locality.carried_from, current, sits, tuple(recorded)), ""

    def _recorded(
        self, upstream: Table, columns: Sequence[str], specs: Sequence[Mapping[str, str]], after: int, until: int
    ) -> pa.Table | None:
        """The changed values of the one column ``columns`` names, as the key-scoped writes of ``upstream`` between
        the versions recorded them in their commits (:meth:`DeltaStore.replaced_values`): known from the log, where
        the change data feed costs a Spark job that reads the rows those commits replaced. None when they did not
        record them all (the feed says then)."""
        if len(columns) != 1:
            return None
        values = self.store.replaced_values(upstream.key, columns[0], specs, after, until)
        if values is None:
            return None
        try:
            return pa.table({columns[0]: pa.array(values) if values else pa.array([], pa.string())})
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return None

    def _sits(self, name: str, before: pa.Table) -> dict[str, tuple[Any, ...]]:
        """Where the rows a rebuild replaces sit, from the input ``name``'s rows as the last build read them
        (``before``: the feed's images of the changed keys then): an output column the table's files are ordered by
        (:meth:`cluster_columns`) that copies an input column holds, in each of those rows, that input row's value.
        Only the leading one, only when every value is known (a null is never matched by ``IN``)."""
        table = self.table
        if not isinstance(table, DerivedTable) or not self.cluster_columns():
            return {}
        leading = self.cluster_columns()[0]
        copied = copied_columns(table, self._input_columns(table)).get(leading)
        if copied is None or copied[0] != name or copied[1] not in before.column_names:
            return {}
        values = before.column(copied[1]).unique()
        if values.null_count or not 0 < len(values) <= MAX_LITERAL_VALUES:
            return {}
        return {leading: tuple(values.to_pylist())}

    def _rows_from_feed(
        self,
        locality: KeyLocality,
        read_from: Mapping[str, Sequence[str]],
        versions: Mapping[str, int],
        before_versions: Mapping[str, int],
        before_read: Mapping[str, str],
    ) -> tuple[str, pa.Table] | str | None:
        """For a table reading one input whose rows are unique by the columns carrying the key (a row-local table
        over its input's primary key), that input's changed rows from its change feed: each changed key's one row is
        there as it is now (or gone), so the keys' rows need no scan of the partitions read. None when the table
        reads otherwise; a string: why the partition is rebuilt whole."""
        if len(locality.carried_from) != 1:
            return None
        [(name, columns)] = locality.carried_from.items()
        upstream = self.catalog[name]
        plain = not (upstream.is_static or upstream.is_external or name == self.table.fqn)
        if not plain or set(columns) != set(upstream.row_key) or name not in read_from:
            return None
        used = list(read_from[name])
        if name not in versions or name not in before_versions:
            return f"the versions of {name} read are not known"
        if before_read.get(name) != span(used):
            return f"reads other partitions of {name} than its last build ({before_read.get(name)})"
        specs = [partition_values_of(upstream, k) for k in used]
        images = self.store.changed_rows(
            self.spark, upstream.key, specs, before_versions[name], versions[name], 2 * MAX_KEYS
        )
        if images is None:
            return f"{name}'s change data feed does not cover versions {before_versions[name] + 1}-{versions[name]}"
        if images.num_rows > 2 * MAX_KEYS:
            return f"more than {2 * MAX_KEYS:,} rows of {name} changed"
        if not images.num_rows:  # nothing changed: no columns to select the keys from
            return name, pa.table({**{c: pa.array([], pa.null()) for c in columns}, NET: pa.array([], pa.int64())})
        return name, images


def copied_columns(table: DerivedTable, inputs: Mapping[str, Sequence[str]]) -> dict[str, tuple[str, str]]:
    """Output column → (input table, its column) the column is a plain copy of, for a table whose SQL is one
    ``SELECT`` of one table (no join, no grouping, no subquery): each of its rows is one input row, so the column holds
    that row's value. Empty for any other SQL."""
    try:
        scope = qualified_scope(table.sql, inputs)
    except (SqlglotError, ValueError):
        return {}
    query = scope.expression
    if not isinstance(query, exp.Select) or query.args.get("group") or query.args.get("joins"):
        return {}
    if scope.subquery_scopes or scope.derived_table_scopes or len(scope.selected_sources) != 1:
        return {}
    [(node, source)] = scope.selected_sources.values()
    if not isinstance(source, exp.Table) or f"{source.db}.{source.name}" not in inputs:
        return {}
    name = f"{source.db}.{source.name}"
    return {s.alias_or_name: (name, s.unalias().name) for s in query.selects if isinstance(s.unalias(), exp.Column)}


def narrowed(scopes: Sequence[KeyScope]) -> dict[str, list[Any]]:
    """What one MERGE of several partitions' keys may narrow its target by: the columns every partition narrows, with
    the values of all of them (a column one partition cannot narrow would lose that partition's rows)."""
    each = [s.narrow() for s in scopes]
    common = set.intersection(*(set(n) for n in each)) if each else set()
    merged = {c: list(dict.fromkeys(v for n in each for v in n[c])) for c in sorted(common)}
    return {c: v for c, v in merged.items() if len(v) <= MAX_LITERAL_VALUES}


def _distinct(frames: list[pa.Table], key: Sequence[str]) -> pa.Table | None:
    if not frames:
        return pa.table({c: pa.array([], pa.string()) for c in key})
    try:
        first = frames[0].schema
        merged = pa.concat_tables([f.cast(first) for f in frames])
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return merged.group_by(list(key)).aggregate([]).select(list(key))


def _entry(instance: DagsterInstance, table: Table, partition: str) -> dict[str, Any] | None:
    """The partition's entry in its latest build's per-partition metadata."""
    record = latest_materialization(instance, table, partition)
    if record is None:
        return None
    value = record.asset_materialization.metadata.get("partitions") if record.asset_materialization else None
    entries = getattr(value, "value", None) or getattr(value, "data", None) or []
    return next((e for e in entries if isinstance(e, dict) and e.get("partition") == partition), None)


def _previous_build(
    instance: DagsterInstance, table: Table, partition: str
) -> tuple[dict[str, int], dict[str, str]] | None:
    """The versions of its inputs the partition's latest build read, and the partitions (as spans) it read of each."""
    entry = _entry(instance, table, partition)
    if entry is None or not isinstance(entry.get("read_versions"), dict):
        return None
    return {k: int(v) for k, v in entry["read_versions"].items()}, dict(entry.get("upstream") or {})


def _rows_before(instance: DagsterInstance, table: Table, partition: str) -> int | None:
    entry = _entry(instance, table, partition)
    return int(entry["rows"]) if entry and entry.get("rows") is not None else None
