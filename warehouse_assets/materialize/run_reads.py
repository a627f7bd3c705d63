"""A ranged run's reads of its partitioned Delta inputs: each small input read once for the run, not once per partition.

Each partition of a ranged run reads its inputs' partitions at the version of now. Read one by one, each partition's
read is a Delta scan of its own in the run's query (a union of every partition's query) and again in its checks:
Delta lists a scan's files in a Spark job of its own, a good fraction of a second however small the partitions, and
the rows are scanned once per query that reads them. A small input is instead read once for every partition of the
run that reads it, its rows kept by Spark (persisted): each partition's rows are filtered from them by its own
partitions, with no Delta scan of its own.

What each partition reads and records stays its own: a shared read is used only for partitions it holds, at the
version of now (an input changed since is read afresh), and each partition's live files are counted from the log as
its own read counts them. An input larger than :data:`SHARED_READ_MAX_BYTES` (the Parquet of the run's partitions)
is read partition by partition, as before: its scans cost more than their planning, and its rows stay out of memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from resources.delta_lake import DeltaStore, Predicate, ReadStats
from resources.delta_sql import partition_columns, sql_partition_predicate
from warehouse_assets.catalog import Table, partition_values_of

SHARED_READ_MAX_BYTES = 64 * 1024 * 1024
SHARED_READ_PIECE_BYTES = 16 * 1024 * 1024  # of Parquet per piece of the rows kept (at most 4 pieces)


@dataclass(frozen=True)
class _Shared:
    """An input's rows read once: the partitions it holds, at which version, and its live files."""

    version: int
    keys: frozenset[str]
    predicates: tuple[Predicate, ...]
    rows: DataFrame
    files: dict[str, list[dict[str, Any]]]  # upstream partition → its live files
    files_in_table: int


class RunReads:
    """The shared reads of one ranged run. ``span(upstream)`` lists the partitions of ``upstream`` that the run's
    partitions read (a superset of any one partition's); :meth:`release` lets Spark drop the rows kept."""

    def __init__(self, spark: SparkSession, store: DeltaStore, span: Callable[[str], list[str]]):
        self.spark, self.store, self.span = spark, store, span
        self.shared: dict[str, _Shared] = {}
        self.kept: list[DataFrame] = []
        self.too_large: set[str] = set()  # read partition by partition for the rest of the run

    def read(
        self, upstream: Table, used: Sequence[str], predicates: Sequence[Predicate]
    ) -> tuple[DataFrame, int, ReadStats] | None:
        """The rows of ``upstream``'s partitions ``used`` at the version of now, that version and the read's figures,
        filtered from the run's shared read of ``upstream``; None when it has none to share (the partition reads its
        own)."""
        if upstream.fqn in self.too_large:
            return None
        at = self.store.version(upstream.key)
        if at is None:
            return None
        shared = self.shared.get(upstream.fqn)
        if (
            shared is None
            or (shared.version, shared.predicates) != (at, tuple(predicates))
            or not shared.keys >= {*used}
        ):
            shared = self._share(upstream, at, {*self.span(upstream.fqn), *used}, predicates)
            if shared is None:
                return None
        specs = [partition_values_of(upstream, k) for k in used]
        rows = shared.rows.where(sql_partition_predicate(None, specs, partition_columns(specs)))
        files = [f for k in used for f in shared.files.get(k, [])]
        stats = ReadStats(
            files_in_table=shared.files_in_table,
            files_after_partition_pruning=len(files),
            files_read=len(files),
            bytes_read=sum(int(f["size_bytes"]) for f in files),
            version=at,
        )
        return rows, at, stats

    def _share(self, upstream: Table, at: int, keys: set[str], predicates: Sequence[Predicate]) -> _Shared | None:
        ordered = sorted(keys)
        specs = [partition_values_of(upstream, k) for k in ordered]
        actions, stats = self.store.live_files(upstream.key, specs, version=at, deletions=False)
        if stats.bytes_read > SHARED_READ_MAX_BYTES:
            self.too_large.add(upstream.fqn)
            return None
        key_of = {tuple(sorted(spec.items())): k for spec, k in zip(specs, ordered, strict=True)}
        files: dict[str, list[dict[str, Any]]] = {}
        for action in actions:
            spec = tuple(sorted((c, str(action.get(f"partition.{c}"))) for c in partition_columns(specs)))
            if spec in key_of:
                files.setdefault(key_of[spec], []).append(action)
        rows, _ = self.store.read(self.spark, upstream.key, partitions=specs, predicates=predicates, version=at)
        # in few pieces: every partition's scan of the rows kept runs a task per piece, however few rows it keeps
        rows = rows.coalesce(max(1, min(4, math.ceil(stats.bytes_read / SHARED_READ_PIECE_BYTES)))).persist()
        self.kept.append(rows)
        shared = _Shared(at, frozenset(ordered), tuple(predicates), rows, files, stats.files_in_table)
        self.shared[upstream.fqn] = shared
        return shared

    def release(self) -> None:
        """Let Spark drop every shared read's rows (the partitions reading them are written and checked)."""
        for rows in self.kept:
            rows.unpersist()
        self.kept.clear()
        self.shared.clear()
