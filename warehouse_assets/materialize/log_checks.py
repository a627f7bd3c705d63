"""The checks of a key-scoped or maintained rebuild's partitions, judged over the whole partition without a Spark job.

A key-scoped rebuild replaces a few keys' rows (a maintained total, a few groups'), but its checks still judge the
whole partition. Reading the partition back into Spark costs more than the rebuild itself, so what the Delta log
already knows is read from the log, and what it cannot know is counted by delta-rs's DataFusion reader in this
process, on the columns the check names only (deletion vectors applied):

* ``not_null``: each file's ``nullCount`` of the column; 0 in every file is 0 live nulls (a deletion vector only
  hides rows);
* ``range``: each file's ``min``/``max`` within the bounds is every live value within them;
* ``row_count``: the live rows from the log (each file's ``numRecords`` minus its deletion vector's cardinality);
  an upstream's rows counted by DataFusion on the partitions the build read, at the version it read, with the
  predicates it read them with;
* ``unique``: the rows, distinct keys and null keys counted by DataFusion on the key's columns;
* ``references``: the keys missing from the referenced input, counted by DataFusion on the two columns. A table
  checked unique by the one column it references by (a daily total per user, by user) has both counted in one
  query: the partition's keys read and grouped once for the two checks.

Where the log is not conclusive (a file with nulls, a statistic beyond a bound or missing) or a count finds a
problem, the check is left to the Spark evaluation, which reads the partition and names examples; so is every other
kind. A verdict from here is therefore always a pass, and says it was judged from the log.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from dagster import MetadataValue

from resources.delta_lake import DeltaStore, Predicate
from warehouse_assets.catalog import Catalog, OdsTable, Table, partition_values_of
from warehouse_assets.catalog.checks import Check, NotNull, Outcome, Range, References, RowCount, Unique

JUDGED_BY = "judged_by"  # an outcome's metadata: how a check of a key-scoped rebuild was evaluated
FROM_LOG = "delta log statistics"
BY_DATAFUSION = "DataFusion count of the partition"


class PartitionFacts:
    """One written partition at the write's commit, as the checks of a key-scoped rebuild read it."""

    def __init__(
        self,
        catalog: Catalog,
        table: Table,
        store: DeltaStore,
        partition: str,
        version: int,
        read_from: Mapping[str, Sequence[str]],
        versions: Mapping[str, int],
        files: Sequence[dict[str, Any]] | None = None,
    ):
        """``files``: the partition's live files at ``version``, where the write already read them from the log."""
        self.catalog, self.table, self.store, self.partition, self.version = catalog, table, store, partition, version
        self.read_from, self.versions = read_from, versions
        self.spec = partition_values_of(table, partition)
        self.files = list(files) if files is not None else store.live_files(table.key, [self.spec], version)[0]
        # (column, referenced table, its column) -> the partition's key counts with that reference's, once
        self._references: dict[tuple[str, str, str], tuple[int, int, int, int] | None] = {}

    @property
    def rows(self) -> int:
        return sum(int(f["live_records"]) for f in self.files)

    def stat(self, kind: str, column: str) -> list[Any] | None:
        """Each file's statistic ``kind`` (``null_count``, ``min``, ``max``) of ``column``; None if a file lacks it
        (a column past the table's statistics columns, or a file written without them)."""
        values = [f.get(f"{kind}.{column}") for f in self.files]
        return None if any(v is None and kind == "null_count" for v in values) else values

    def input_read(self, name: str) -> tuple[Table, int, list[dict[str, str]], list[Predicate]] | None:
        """An input as the build read it: its table, the version, the partitions and the row predicates; None for an
        input not read from its own Delta partitions at a recorded version (static, external, windows)."""
        upstream = self.catalog[name]
        if name not in self.versions or name not in self.read_from or upstream.is_static or upstream.is_external:
            return None
        specs = [partition_values_of(upstream, k) for k in self.read_from[name]]
        mirror = isinstance(upstream, OdsTable) and not upstream.changelog  # its CDC tombstones are not read
        return upstream, self.versions[name], specs, [Predicate("_deleted", "=", False)] if mirror else []

    def distinct_keys(self, columns: Sequence[str]) -> tuple[int, int, int]:
        """The rows, the distinct keys of ``columns`` with no null part and the rows with a null part. A key of one
        column that a references check of the table names too is counted with that reference (one read for both)."""
        refs = [r for c in self.table.checks if isinstance(c, References) for r in c.refs if [r[0]] == list(columns)]
        for column, ref_table, ref_column in refs:
            counted = self.references(column, ref_table, ref_column)
            if counted is not None:
                return counted[:3]
        return self.store.distinct_keys(self.table.key, self.version, self.spec, columns)

    def references(self, column: str, ref_table: str, ref_column: str) -> tuple[int, int, int, int] | None:
        """Of ``column`` in the partition: the rows, distinct non-null values, rows holding null, and how many of
        those values the input ``ref_table`` as the build read it lacks in ``ref_column``; None for an input not
        read from its own partitions (:meth:`input_read`). Counted once per reference."""
        wanted = (column, ref_table, ref_column)
        if wanted not in self._references:
            read, counted = self.input_read(ref_table), None
            if read is not None:
                upstream, version, specs, where = read
                referenced = (upstream.key, version, specs, where)
                counted = self.store.key_references(
                    self.table.key, self.version, self.spec, column, referenced, ref_column
                )
            self._references[wanted] = counted
        return self._references[wanted]


def judge(check: Check, facts: PartitionFacts) -> Outcome | None:
    """``check``'s passing verdict on the partition from the log or a DataFusion count, or None: left to Spark."""
    judges: dict[type[Check], Callable[[Any, PartitionFacts], Outcome | None]] = {
        NotNull: _not_null,
        Range: _range,
        RowCount: _row_count,
        Unique: _unique,
        References: _references,
    }
    found = judges.get(type(check))
    return found(check, facts) if found else None


def _passed(check: Check, facts: PartitionFacts, how: str, metadata: dict[str, Any], description: str) -> Outcome:
    return Outcome(check, facts.partition, True, {**metadata, JUDGED_BY: how}, description)


def _not_null(check: NotNull, facts: PartitionFacts) -> Outcome | None:
    counts = {c: facts.stat("null_count", c) for c in check.columns}
    if any(v is None or sum(int(n) for n in v) for v in counts.values()):
        return None
    nulls = dict.fromkeys(check.columns, 0)
    metadata = {"rows": facts.rows, "nulls": MetadataValue.json(nulls), "null_values": 0}
    return _passed(check, facts, FROM_LOG, metadata, "no nulls")


def _range(check: Range, facts: PartitionFacts) -> Outcome | None:
    per: dict[str, dict[str, Any]] = {}
    for column, low, high in check.bounds:
        lows, highs, nulls = facts.stat("min", column), facts.stat("max", column), facts.stat("null_count", column)
        if lows is None or highs is None or nulls is None:
            return None
        for file, lo, hi, n in zip(facts.files, lows, highs, nulls, strict=True):
            if lo is None or hi is None:  # no value to bound it by: fine only where the file holds nulls only
                if int(n) != int(file["num_records"]):
                    return None
                continue
            if not _numbers(lo, hi):
                return None
            if (low is not None and float(lo) < low) or (high is not None and float(hi) > high):
                return None
        lo_values = [float(v) for v in lows if v is not None]
        hi_values = [float(v) for v in highs if v is not None]
        per[column] = {
            "outside": 0,
            "min": min(lo_values) if lo_values else None,
            "max": max(hi_values) if hi_values else None,
            "low": low,
            "high": high,
        }
    metadata = {"rows": facts.rows, "columns": MetadataValue.json(per), "outside": 0}
    return _passed(check, facts, FROM_LOG, metadata, "all values in range")


def _numbers(*values: Any) -> bool:
    """Whether the statistics compare with a range's numeric bounds (a timestamp's or a string's do not)."""
    return all(isinstance(v, int | float | Decimal) and not isinstance(v, bool) for v in values)


def _row_count(check: RowCount, facts: PartitionFacts) -> Outcome | None:
    rows = facts.rows
    meta: dict[str, Any] = {"rows": rows}
    if check.min_rows is not None and rows < check.min_rows:
        return None
    if check.upstream:
        read = facts.input_read(check.upstream)
        if read is None:
            return None
        upstream, version, specs, where = read
        up_rows = facts.store.count_live(upstream.key, version, specs, where)
        ratio = rows / up_rows if up_rows else (1.0 if rows == 0 else float("inf"))
        meta |= {"upstream": check.upstream, "upstream_rows": up_rows, "ratio": round(ratio, 6)}
        if (check.min_ratio is not None and ratio < check.min_ratio) or (
            check.max_ratio is not None and ratio > check.max_ratio
        ):
            return None
    return _passed(check, facts, FROM_LOG if not check.upstream else BY_DATAFUSION, meta, f"{rows} rows")


def _unique(check: Unique, facts: PartitionFacts) -> Outcome | None:
    columns = list(check.columns or facts.table.row_key)
    rows, distinct, nulls = facts.distinct_keys(columns)
    if distinct != rows or nulls:
        return None
    metadata = {"rows": rows, "distinct_keys": distinct, "duplicated_keys": 0, "null_keys": 0}
    description = f"0 duplicated and 0 null key(s) of ({', '.join(columns)}) in {rows} rows"
    return _passed(check, facts, BY_DATAFUSION, metadata, description)


def _references(check: References, facts: PartitionFacts) -> Outcome | None:
    refs: dict[str, Any] = {}
    for column, ref_table, ref_column in check.refs:
        counted = facts.references(column, ref_table, ref_column)
        if counted is None or counted[3]:  # an input not read from its partitions, or keys missing from it
            return None
        refs[column] = {"references": f"{ref_table}.{ref_column}", "distinct_keys": counted[1], "missing": 0}
        refs[column]["examples"] = []
    metadata = {"missing_keys": 0, "columns": MetadataValue.json(refs)}
    return _passed(check, facts, BY_DATAFUSION, metadata, "every key found")
